/* Paged attention for single-token decodes on the CPU, float32.
 *
 * One task per sequence: it reads the sequence's keys and values straight from the paged cache through
 * the block table (no gathered copy; a slot's kv heads are one contiguous row), scores every query head
 * against each key row, then accumulates the values weighted by the softmax. Every cache row is read
 * once per step, which is what bounds decode attention: the torch path gathers the blocks into a
 * padded copy first and reads that copy again in SDPA, about three times the memory traffic.
 *
 * Layout (as kernels/attention.py documents it):
 *   q, out        [num_seqs, num_heads, head_dim]
 *   k/v_cache     [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_tables  [num_seqs, max_blocks] int32; seq_lens [num_seqs] int32 (context incl. the query)
 * All contiguous; head_dim a multiple of 8; the caller checks shapes and that every table entry read
 * lies inside the cache.
 *
 * Vectors are GCC vector extensions (8 floats), lowered to AVX2/SSE on x86 and NEON on Arm. The GQA group
 * size is a compile-time constant for 1..8 (the task body is inlined per size), so the per-head
 * accumulators live in registers; other sizes take the generic body.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }
static inline float hsum8(v8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

typedef int32_t v8i __attribute__((vector_size(32)));

/* e^x for x <= 0 (softmax arguments), 8 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6
 * polynomial (relative error ~2e-7, like expf's), 2^n through the exponent bits; x < -87 gives 0. */
static inline v8 exp8_nonpositive(v8 x)
{
    const v8i tiny = x < -87.0f;  /* lanes of all ones where e^x underflows */
    const v8 floor87 = {-87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f};
    x = (v8)(((v8i)x & ~tiny) | ((v8i)floor87 & tiny));
    const v8 n = __builtin_convertvector(__builtin_convertvector(x * 1.44269504088896341f - 0.5f, v8i), v8);
    const v8 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  /* ln2 split in two for exactness */
    v8 p = (v8){1.9875691500e-4f, 1.9875691500e-4f, 1.9875691500e-4f, 1.9875691500e-4f, 1.9875691500e-4f,
                1.9875691500e-4f, 1.9875691500e-4f, 1.9875691500e-4f};
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    v8 scale;
    memcpy(&scale, &bits, sizeof scale);
    return (v8)((v8i)(p * scale) & ~tiny);
}

/* One sequence, all kv heads (a cache slot's heads are one contiguous row, read once).
 * scratch: scores [num_heads * max_len], qs [num_heads * head_dim] (q pre-scaled), row_max / inv_sum
 * [num_heads]. Heads h*group .. h*group+group-1 share kv head h. */
static inline __attribute__((always_inline)) void attend(
    const int64_t group, const float *qrow, const float *k_cache, const float *v_cache, const int32_t *table,
    const int64_t len, float *orow, const int64_t num_kv_heads, const int64_t head_dim, const int64_t block_size,
    const float scale, float *scores, float *qs, float *row_max, float *inv_sum)
{
    const int64_t num_heads = group * num_kv_heads, slot_stride = num_kv_heads * head_dim;
    for (int64_t i = 0; i < num_heads * head_dim; ++i) qs[i] = qrow[i] * scale;
    for (int64_t j = 0; j < num_heads; ++j) row_max[j] = -INFINITY;

    for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const float *kb = k_cache + (int64_t)table[t0 / block_size] * block_size * slot_stride;
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t h = 0; h < num_kv_heads; ++h) {
                const float *kp = kb + i * slot_stride + h * head_dim;
                const float *qh = qs + h * group * head_dim;
                v8 acc[group];
                for (int64_t g = 0; g < group; ++g) acc[g] = (v8){0};
                for (int64_t d = 0; d < head_dim; d += 8) {
                    const v8 k = load8(kp + d);
                    for (int64_t g = 0; g < group; ++g) acc[g] += load8(qh + g * head_dim + d) * k;
                }
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t j = h * group + g;
                    const float sc = hsum8(acc[g]);
                    scores[j * len + t0 + i] = sc;
                    if (sc > row_max[j]) row_max[j] = sc;
                }
            }
        }
    }
    for (int64_t j = 0; j < num_heads; ++j) {
        float *sj = scores + j * len;
        const float m = row_max[j];
        v8 vsum = {0};
        int64_t t = 0;
        for (; t + 8 <= len; t += 8) {
            const v8 e = exp8_nonpositive(load8(sj + t) - m);
            store8(sj + t, e);
            vsum += e;
        }
        float sum = hsum8(vsum);
        for (; t < len; ++t) {
            sj[t] = expf(sj[t] - m);
            sum += sj[t];
        }
        inv_sum[j] = 1.0f / sum;
    }
    for (int64_t i = 0; i < num_heads * head_dim; ++i) orow[i] = 0.0f;
    for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const float *vb = v_cache + (int64_t)table[t0 / block_size] * block_size * slot_stride;
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        for (int64_t h = 0; h < num_kv_heads; ++h) {
            for (int64_t d = 0; d < head_dim; d += 8) {  /* an 8-wide strip, the group's accumulators in registers */
                float *oh = orow + h * group * head_dim + d;
                v8 acc[group];
                for (int64_t g = 0; g < group; ++g) acc[g] = load8(oh + g * head_dim);
                for (int64_t i = 0; i < n; ++i) {
                    const v8 v = load8(vb + i * slot_stride + h * head_dim + d);
                    for (int64_t g = 0; g < group; ++g) acc[g] += scores[(h * group + g) * len + t0 + i] * v;
                }
                for (int64_t g = 0; g < group; ++g) store8(oh + g * head_dim, acc[g]);
            }
        }
    }
    for (int64_t j = 0; j < num_heads; ++j)
        for (int64_t d = 0; d < head_dim; ++d) orow[j * head_dim + d] *= inv_sum[j];
}

int loraplex_paged_decode_attention_f32(
    const float *q, const float *k_cache, const float *v_cache, const int32_t *block_tables,
    const int32_t *seq_lens, float *out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
    int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale, int num_threads)
{
    if (head_dim % 8 != 0 || num_heads % num_kv_heads != 0) return -2;
    const int64_t group = num_heads / num_kv_heads;
    int64_t max_len = 1;
    for (int64_t s = 0; s < num_seqs; ++s)
        if (seq_lens[s] > max_len) max_len = seq_lens[s];
    int failed = 0;

#pragma omp parallel num_threads(num_threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)(num_heads * (max_len + head_dim + 2)));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        float *qs = scores + num_heads * max_len, *row_max = qs + num_heads * head_dim, *inv_sum = row_max + num_heads;

#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < num_seqs; ++s) {
            if (scores == NULL) continue;
            const float *qrow = q + s * num_heads * head_dim;
            float *orow = out + s * num_heads * head_dim;
            const int32_t *table = block_tables + s * max_blocks;
#define ATTEND(G) attend(G, qrow, k_cache, v_cache, table, seq_lens[s], orow, num_kv_heads, head_dim, block_size, \
                         scale, scores, qs, row_max, inv_sum)
            switch (group) {
            case 1: ATTEND(1); break;
            case 2: ATTEND(2); break;
            case 3: ATTEND(3); break;
            case 4: ATTEND(4); break;
            case 5: ATTEND(5); break;
            case 6: ATTEND(6); break;
            case 7: ATTEND(7); break;
            case 8: ATTEND(8); break;
            default: ATTEND(group); break;
            }
#undef ATTEND
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
