/* The prefill-attention body for one element type, included by paged_prefill_attention.c once per type
 * (see there and bf16.h for the parameters ET, ELOAD8, ESTORE8, E_SUFFIX, which are #undef'd at the end).
 * The tile's queries are widened (and scaled) into float32 scratch once; keys and values are widened on load. */

/* Scores of query rows q0 and q1 against the tile's n key rows (KT lanes each; lanes >= n are junk
 * that the caller masks). Four key rows at a time for both query rows: eight 8-wide partial sums (they
 * and the operands fit AVX2's sixteen registers), reduced together by reduce8. */
static inline __attribute__((always_inline)) void E(score_pair)(
    const int64_t nv, const float *q0, const float *q1, const ET *kt, const int64_t n,
    const int64_t slot_stride, float *s0, float *s1)
{
    for (int64_t j0 = 0; j0 < KT; j0 += 4) {
        v8 acc[8];
        for (int j = 0; j < 8; ++j) acc[j] = (v8){0};
        if (j0 < n) {
            const ET *k[4];
            for (int64_t j = 0; j < 4; ++j) k[j] = kt + (j0 + j < n ? j0 + j : n - 1) * slot_stride;
            for (int64_t c = 0; c < nv; ++c) {
                const v8 x0 = load8(q0 + 8 * c), x1 = load8(q1 + 8 * c);
                for (int j = 0; j < 4; ++j) {
                    const v8 kv = ELOAD8(k[j] + 8 * c);
                    acc[j] += x0 * kv;
                    acc[4 + j] += x1 * kv;
                }
            }
        }
        const v8 r = reduce8(acc);  /* lanes 0-3: q0 against keys j0..j0+3; lanes 4-7: q1 */
        memcpy(s0 + j0, &r, 4 * sizeof(float));
        memcpy(s1 + j0, (const float *)&r + 4, 4 * sizeof(float));
    }
}

/* One task: ntok consecutive query tokens of one chunk (q and out point at the first, which sits at
 * absolute position pos0) and kv head h. Row r is token r / group, query head h * group + r % group. */
static inline __attribute__((always_inline)) void E(attend_task)(
    const int64_t group, const int64_t head_dim, const ET *q, const int64_t q_stride, ET *out,
    const int64_t out_stride, const int64_t h, const int64_t ntok, const int64_t pos0, const ET *k_cache,
    const ET *v_cache, const int32_t *table, const int64_t block_size, const int64_t num_kv_heads,
    const float scale, const int64_t window, const float softcap)
{
    const int64_t nv = head_dim / 8, rows = ntok * group;
    const int64_t prows = (rows + 1) / 2 * 2;  /* scores go in pairs of rows; a padding row repeats the last */
    const int64_t slot_stride = num_kv_heads * head_dim, block_elems = block_size * slot_stride;
    float qb[prows * head_dim];
    v8 acc[prows * nv];
    float s[prows][KT];
    float run_max[prows], run_sum[prows];
    int64_t limit[prows];
    for (int64_t r = 0; r < prows; ++r) {
        const int64_t rr = r < rows ? r : rows - 1, t = rr / group;
        const ET *src = q + t * q_stride + (h * group + rr % group) * head_dim;
        for (int64_t c = 0; c < nv; ++c) {
            store8(qb + r * head_dim + 8 * c, ELOAD8(src + 8 * c) * scale);
            acc[r * nv + c] = (v8){0};
        }
        run_max[r] = -INFINITY;
        run_sum[r] = 0.0f;
        limit[r] = pos0 + t;
    }
    const v8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    const v8 neg_inf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const int64_t end = pos0 + ntok;  /* keys lo .. end - 1 */
    const int64_t lo = window > 0 && pos0 + 1 > window ? pos0 + 1 - window : 0;  /* the first row's first key */
    const int64_t strip = nv % 8 == 0 ? 8 : nv % 4 == 0 ? 4 : nv % 2 == 0 ? 2 : 1;  /* divides nv */
    for (int64_t b0 = lo / block_size * block_size; b0 < end; b0 += block_size) {
        const int64_t base = (int64_t)table[b0 / block_size] * block_elems + h * head_dim;
        const int64_t in_block = end - b0 < block_size ? end - b0 : block_size;
        for (int64_t i0 = lo > b0 ? lo - b0 : 0; i0 < in_block; i0 += KT) {
            const int64_t n = in_block - i0 < KT ? in_block - i0 : KT, k0 = b0 + i0;
            const ET *kt = k_cache + base + i0 * slot_stride, *vt = v_cache + base + i0 * slot_stride;
            for (int64_t r = 0; r < prows; r += 2)
                E(score_pair)(nv, qb + r * head_dim, qb + (r + 1) * head_dim, kt, n, slot_stride, s[r], s[r + 1]);
            for (int64_t r = 0; r < prows; ++r) {
                v8 s0 = load8(s[r]), s1 = load8(s[r] + 8);
                if (softcap > 0.0f) {
                    s0 = softcap8(s0, softcap);
                    s1 = softcap8(s1, softcap);
                }
                /* the first and last keys this row sees, relative to the tile. Without a window every row
                 * sees key 0, so a row's first tile always has a finite maximum; with one, a tile wholly
                 * before the row's window adds nothing (weights 0) and its first seen tile has a finite one */
                const int64_t first = window > 0 ? limit[r] - window + 1 - k0 : 0;
                if (first >= n) {
                    memset(s[r], 0, sizeof(s[r]));
                    continue;
                }
                const int64_t last = limit[r] - k0 < n - 1 ? limit[r] - k0 : n - 1;
                if (last < KT - 1) {
                    const v8 lastv = {last, last, last, last, last, last, last, last};
                    const v8i m0 = lane > lastv, m1 = lane + 8.0f > lastv;
                    s0 = (v8)(((v8i)s0 & ~m0) | ((v8i)neg_inf & m0));
                    s1 = (v8)(((v8i)s1 & ~m1) | ((v8i)neg_inf & m1));
                }
                if (first > 0) {
                    const v8 firstv = {first, first, first, first, first, first, first, first};
                    const v8i m0 = lane < firstv, m1 = lane + 8.0f < firstv;
                    s0 = (v8)(((v8i)s0 & ~m0) | ((v8i)neg_inf & m0));
                    s1 = (v8)(((v8i)s1 & ~m1) | ((v8i)neg_inf & m1));
                }
                softmax_tile(s0, s1, &run_max[r], &run_sum[r], acc + r * nv, nv, s[r]);
            }
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t c0 = 0; c0 < nv; c0 += strip) {
                    v8 ra[PV_STRIP];
                    for (int c = 0; c < PV_STRIP; ++c) ra[c] = c < strip ? acc[r * nv + c0 + c] : (v8){0};
                    for (int64_t j = 0; j < n; ++j) {
                        const ET *vp = vt + j * slot_stride + 8 * c0;
                        const float p = s[r][j];
                        for (int c = 0; c < PV_STRIP; ++c)
                            if (c < strip) ra[c] += p * ELOAD8(vp + 8 * c);
                    }
                    for (int c = 0; c < PV_STRIP; ++c)
                        if (c < strip) acc[r * nv + c0 + c] = ra[c];
                }
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.0f / run_sum[r];
        ET *dst = out + (r / group) * out_stride + (h * group + r % group) * head_dim;
        for (int64_t c = 0; c < nv; ++c) ESTORE8(dst + 8 * c, acc[r * nv + c] * inv);
    }
}

int E(loraplex_paged_prefill_attention)(
    const ET *q, int64_t q_stride, const ET *k_cache, const ET *v_cache, const int32_t *block_tables,
    int64_t max_blocks, const int32_t *seq_lens, const int32_t *query_start_loc, int64_t num_seqs,
    int64_t min_q_len, ET *out, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
    float scale, int64_t window, float softcap, int num_threads)
{
    if (head_dim % 8 != 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP) return -2;
    const int64_t group = num_heads / num_kv_heads;
    const int64_t qt = TARGET_ROWS / group > 0 ? TARGET_ROWS / group : 1;  /* query tokens per task */
    int64_t num_tasks = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
        const int64_t q_len = query_start_loc[s + 1] - query_start_loc[s];
        if (q_len >= min_q_len && q_len > 0) num_tasks += (q_len + qt - 1) / qt * num_kv_heads;
    }
    if (num_tasks == 0) return 0;
    int64_t *task_seq = malloc(sizeof(int64_t) * (size_t)(2 * num_tasks));
    if (task_seq == NULL) return -1;
    int64_t *task_tok = task_seq + num_tasks;  /* first query token of the tile, times num_kv_heads + h */
    /* each chunk's last tiles first: they see the most keys, and dynamic scheduling then ends evenly */
    for (int64_t s = 0, k = 0; s < num_seqs; ++s) {
        const int64_t q_len = query_start_loc[s + 1] - query_start_loc[s];
        if (q_len < min_q_len || q_len == 0) continue;
        for (int64_t t0 = (q_len - 1) / qt * qt; t0 >= 0; t0 -= qt)
            for (int64_t h = 0; h < num_kv_heads; ++h, ++k) {
                task_seq[k] = s;
                task_tok[k] = t0 * num_kv_heads + h;
            }
    }
    const int64_t out_stride = num_heads * head_dim;

#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
        const int64_t s = task_seq[task], t0 = task_tok[task] / num_kv_heads, h = task_tok[task] % num_kv_heads;
        const int64_t q_len = query_start_loc[s + 1] - query_start_loc[s];
        const int64_t ntok = q_len - t0 < qt ? q_len - t0 : qt;
        const int64_t row = query_start_loc[s] + t0, pos0 = seq_lens[s] - q_len + t0;
        const ET *qs = q + row * q_stride;
        ET *os = out + row * out_stride;
        const int32_t *table = block_tables + s * max_blocks;
#define ATTEND(G, D) E(attend_task)(G, D, qs, q_stride, os, out_stride, h, ntok, pos0, k_cache, v_cache, table, \
                                 block_size, num_kv_heads, scale, window, softcap)
        LORAPLEX_SPECIALISED(group, head_dim)
#undef ATTEND
    }
    free(task_seq);
    return 0;
}

#undef ET
#undef ELOAD8
#undef ESTORE8
#undef E_SUFFIX
