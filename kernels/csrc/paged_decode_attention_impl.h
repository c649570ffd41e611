/* The decode-attention body for one element type, included by paged_decode_attention.c once per type (see
 * there and bf16.h for the parameters ET, ELOAD8, ESTORE8, E_SUFFIX, which are #undef'd at the end). */

/* One tile (n <= TILE tokens) of one kv head: scores for the group's query heads, the online-softmax
 * update of their running maximum / denominator, and the weighted values added into acc ([group][nv]). */
static inline __attribute__((always_inline)) void E(attend_tile)(
    const int64_t group, const int64_t head_dim, const v8 *qs, const ET *kt, const ET *vt, const int64_t n,
    const int64_t slot_stride, v8 *acc, float *run_max, float *run_sum, const char *pf_k, const char *pf_v,
    const int64_t pf_lines, const float softcap)
{
    const int64_t nv = head_dim / 8;
    v8 part[group][TILE];
    /* two key rows at a time, so each query vector loaded serves both */
    for (int64_t i = 0; i < TILE; i += 2) {
        v8 a0[group], a1[group];
        for (int64_t g = 0; g < group; ++g) a0[g] = a1[g] = (v8){0};
        if (i < n) {
            const ET *k0 = kt + i * slot_stride, *k1 = i + 1 < n ? k0 + slot_stride : k0;
            for (int64_t l = 0; l < pf_lines; ++l) __builtin_prefetch(pf_k + (i * pf_lines + l) * 64, 0, 1);
            for (int64_t l = 0; l < pf_lines; ++l) __builtin_prefetch(pf_k + ((i + 1) * pf_lines + l) * 64, 0, 1);
            for (int64_t c = 0; c < nv; ++c) {
                const v8 x0 = ELOAD8(k0 + 8 * c), x1 = ELOAD8(k1 + 8 * c);
                for (int64_t g = 0; g < group; ++g) {
                    const v8 qv = qs[g * nv + c];
                    a0[g] += qv * x0;
                    a1[g] += qv * x1;
                }
            }
        }
        for (int64_t g = 0; g < group; ++g) {
            part[g][i] = a0[g];
            part[g][i + 1] = a1[g];
        }
    }
    float p[group][TILE];
    for (int64_t g = 0; g < group; ++g) {
        v8 s0 = reduce8(&part[g][0]), s1 = reduce8(&part[g][8]);
        if (softcap > 0.0f) {
            s0 = softcap8(s0, softcap);
            s1 = softcap8(s1, softcap);
        }
        for (int64_t i = n; i < TILE; ++i) {  /* lanes past the tile's end never win the max */
            if (i < 8) s0[i] = -INFINITY; else s1[i - 8] = -INFINITY;
        }
        softmax_tile(s0, s1, &run_max[g], &run_sum[g], acc + g * nv, nv, p[g]);
    }
    for (int64_t i = 0; i < n; ++i)
        for (int64_t l = 0; l < pf_lines; ++l) __builtin_prefetch(pf_v + (i * pf_lines + l) * 64, 0, 1);
    /* strips of PV_STRIP vectors: a strip's accumulators for the group live in registers over the tile */
    const int64_t strip = nv % PV_STRIP == 0 ? PV_STRIP : 1;
    for (int64_t c0 = 0; c0 < nv; c0 += strip) {
        v8 r[group][PV_STRIP];
        for (int64_t g = 0; g < group; ++g)
            for (int64_t c = 0; c < PV_STRIP; ++c) r[g][c] = c < strip ? acc[g * nv + c0 + c] : (v8){0};
        for (int64_t i = 0; i < n; ++i) {
            const ET *vp = vt + i * slot_stride + 8 * c0;
            for (int64_t c = 0; c < PV_STRIP; ++c) {
                if (c < strip) {
                    const v8 v = ELOAD8(vp + 8 * c);
                    for (int64_t g = 0; g < group; ++g) r[g][c] += p[g][i] * v;
                }
            }
        }
        for (int64_t g = 0; g < group; ++g)
            for (int64_t c = 0; c < PV_STRIP; ++c)
                if (c < strip) acc[g * nv + c0 + c] = r[g][c];
    }
}

/* One sequence, all kv heads. Blocks are walked in order and each block's key rows, then value rows,
 * are read front to back (one contiguous stretch each), while the next block is prefetched. */
static inline __attribute__((always_inline)) void E(attend_seq)(
    const int64_t group, const int64_t head_dim, const int64_t num_kv_heads, const ET *q, const ET *k_cache,
    const ET *v_cache, const int32_t *table, const int64_t len, ET *out, const int64_t block_size,
    const float scale, const int64_t window, const float softcap)
{
    const int64_t nv = head_dim / 8, num_heads = group * num_kv_heads, slot_stride = num_kv_heads * head_dim;
    v8 qs[num_heads * nv], acc[num_heads * nv];
    float run_max[num_heads], run_sum[num_heads];
    for (int64_t j = 0; j < num_heads; ++j) {
        for (int64_t c = 0; c < nv; ++c) {
            qs[j * nv + c] = ELOAD8(q + j * head_dim + 8 * c) * scale;
            acc[j * nv + c] = (v8){0};
        }
        run_max[j] = -INFINITY;
        run_sum[j] = 0.0f;
    }
    const int64_t block_elems = block_size * slot_stride;
    const int64_t pf_lines = (slot_stride * (int64_t)sizeof(ET) / num_kv_heads + 63) / 64;  /* a slot's lines, over the kv heads' passes */
    const int64_t start = window > 0 && len > window ? len - window : 0;  /* the first key the query sees */
    for (int64_t t0 = start / block_size * block_size; t0 < len; t0 += block_size) {
        const ET *kb = k_cache + (int64_t)table[t0 / block_size] * block_elems;
        const ET *vb = v_cache + (int64_t)table[t0 / block_size] * block_elems;
        const int64_t in_block = len - t0 < block_size ? len - t0 : block_size;
        const int64_t first = start > t0 ? start - t0 : 0;
        /* the next block is prefetched into L2 a few lines per token, spread over this block's work */
        const int64_t ahead = t0 + block_size < len ? table[t0 / block_size + 1] : table[t0 / block_size];
        const char *pk = (const char *)(k_cache + ahead * block_elems), *pv = (const char *)(v_cache + ahead * block_elems);
        for (int64_t i0 = first; i0 < in_block; i0 += TILE) {
            const int64_t n = in_block - i0 < TILE ? in_block - i0 : TILE;
            for (int64_t h = 0; h < num_kv_heads; ++h) {
                const int64_t off = i0 * slot_stride + h * head_dim;
                const int64_t pf_off = (i0 * num_kv_heads + h * n) * pf_lines * 64;
                E(attend_tile)(group, head_dim, qs + h * group * nv, kb + off, vb + off, n, slot_stride,
                            acc + h * group * nv, run_max + h * group, run_sum + h * group, pk + pf_off, pv + pf_off,
                            pf_lines, softcap);
            }
        }
    }
    for (int64_t j = 0; j < num_heads; ++j) {
        const float inv = 1.0f / run_sum[j];
        for (int64_t c = 0; c < nv; ++c) ESTORE8(out + j * head_dim + 8 * c, acc[j * nv + c] * inv);
    }
}

int E(loraplex_paged_decode_attention)(
    const ET *q, const ET *k_cache, const ET *v_cache, const int32_t *block_tables,
    const int32_t *seq_lens, ET *out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
    int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale, int64_t window, float softcap,
    int num_threads)
{
    if (head_dim % 8 != 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP) return -2;
    const int64_t group = num_heads / num_kv_heads;

    /* threads split the sequences: one sequence (a lone decode) wakes no team (~8 us a call, 30 calls a token) */
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) if (num_seqs > 1)
    for (int64_t s = 0; s < num_seqs; ++s) {
        const ET *qs = q + s * num_heads * head_dim;
        ET *os = out + s * num_heads * head_dim;
        const int32_t *table = block_tables + s * max_blocks;
#define ATTEND(G, D) \
    E(attend_seq)(G, D, num_kv_heads, qs, k_cache, v_cache, table, seq_lens[s], os, block_size, scale, window, softcap)
        LORAPLEX_SPECIALISED(group, head_dim)
#undef ATTEND
    }
    return 0;
}

#undef ET
#undef ELOAD8
#undef ESTORE8
#undef E_SUFFIX
