/* Multi-LoRA delta on the CPU, float32: y[t] += B[slot(t)] (A[slot(t)] x[t]) for every token with an adapter.
 *
 * Tokens arrive grouped by adapter slot (segments, as kernels/lora_mapping.py builds them); one task per
 * segment reads its slot's A and B exactly once, at the slot's own rank (a rank-8 adapter in a rank-16 slot
 * reads half), for all the segment's tokens. Decode batches spread a few tokens over many adapters, so the
 * cost is reading adapter weights: the batched-matmul path reads the padded weights through strided slice
 * views and moves every delta through padding, concatenation and scatter copies; this reads each weight
 * row once and adds straight into y.
 *
 * Layout (kernels/lora.py; all contiguous):
 *   x [T, in_features]; y [T, out_total], updated in place
 *   a [num_slots, num_slices, max_rank, in_features]; bt [num_slots, max_rank, out_total] (B transposed,
 *   scaling folded in); slice s covers y columns slice_offsets[s] .. slice_offsets[s + 1] and uses the
 *   shrink rows of slice s.
 *   segment i: slot seg_slots[i], tokens token_ids[seg_starts[i] .. seg_starts[i] + seg_lens[i]] (rows of x/y)
 *   slot_ranks [num_slots]: rows >= rank of a slot are zero and skipped.
 * The caller checks shapes and index ranges.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

static inline float dot(const float *a, const float *b, int64_t n)
{
    v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 += load8(a + i) * load8(b + i);
        s1 += load8(a + i + 8) * load8(b + i + 8);
        s2 += load8(a + i + 16) * load8(b + i + 16);
        s3 += load8(a + i + 24) * load8(b + i + 24);
    }
    for (; i + 8 <= n; i += 8) s0 += load8(a + i) * load8(b + i);
    const v8 s = (s0 + s1) + (s2 + s3);
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; ++i) r += a[i] * b[i];
    return r;
}

static inline void axpy(float *y, const float *x, float c, int64_t n)
{
    int64_t i = 0;
    const v8 cv = {c, c, c, c, c, c, c, c};
    for (; i + 8 <= n; i += 8) store8(y + i, load8(y + i) + cv * load8(x + i));
    for (; i < n; ++i) y[i] += c * x[i];
}

int loraplex_lora_apply_f32(
    const float *x, float *y, const float *a, const float *bt, const int64_t *slice_offsets, int64_t num_slices,
    int64_t in_features, int64_t out_total, int64_t max_rank, const int64_t *seg_slots, const int64_t *seg_starts,
    const int64_t *seg_lens, int64_t num_segs, const int64_t *token_ids, const int32_t *slot_ranks,
    int num_threads)
{
    int64_t max_len = 1;
    for (int64_t i = 0; i < num_segs; ++i)
        if (seg_lens[i] > max_len) max_len = seg_lens[i];
    int failed = 0;

#pragma omp parallel num_threads(num_threads)
    {
        float *buf = malloc(sizeof(float) * (size_t)(max_len * num_slices * max_rank)); /* [tokens][slices][rank] */
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t seg = 0; seg < num_segs; ++seg) {
            if (buf == NULL) continue;
            const int64_t slot = seg_slots[seg], n = seg_lens[seg];
            const int64_t *tokens = token_ids + seg_starts[seg];
            int64_t rank = slot_ranks[slot];
            if (rank > max_rank) rank = max_rank;
            for (int64_t s = 0; s < num_slices; ++s)
                for (int64_t r = 0; r < rank; ++r) {
                    const float *arow = a + ((slot * num_slices + s) * max_rank + r) * in_features;
                    for (int64_t j = 0; j < n; ++j)
                        buf[(j * num_slices + s) * max_rank + r] = dot(arow, x + tokens[j] * in_features,
                                                                        in_features);
                }
            for (int64_t r = 0; r < rank; ++r) {
                const float *brow = bt + (slot * max_rank + r) * out_total;
                for (int64_t j = 0; j < n; ++j) {
                    float *yrow = y + tokens[j] * out_total;
                    for (int64_t s = 0; s < num_slices; ++s) {
                        const int64_t lo = slice_offsets[s], hi = slice_offsets[s + 1];
                        axpy(yrow + lo, brow + lo, buf[(j * num_slices + s) * max_rank + r], hi - lo);
                    }
                }
            }
        }
        free(buf);
    }
    return failed ? -1 : 0;
}
