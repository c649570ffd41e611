/* Multi-LoRA delta on the CPU, float32: y[t] += B[slot(t)] (A[slot(t)] x[t]) for every token with an adapter.
 *
 * Tokens arrive grouped by adapter slot (segments, as kernels/lora_mapping.py builds them); a task takes a
 * tile of up to TILE tokens of one segment and reads its slot's A and B once for them, at the slot's own
 * rank (a rank-8 adapter in a rank-16 slot reads half). Decode batches spread a few tokens over many adapters, so the
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

#include "vec8.h"

enum { TILE = 8 }; /* tokens per task */

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
    float r = hsum8((s0 + s1) + (s2 + s3));
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

/* out[j * stride] = a . x_j for a full tile of TILE rows: a is loaded once per 8 columns for all rows */
static inline void dot_tile(const float *a, const float *const *xs, int64_t n, float *out, int64_t stride)
{
    v8 acc[TILE];
    for (int j = 0; j < TILE; ++j) acc[j] = (v8){0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8 av = load8(a + i);
        for (int j = 0; j < TILE; ++j) acc[j] += av * load8(xs[j] + i);
    }
    for (int j = 0; j < TILE; ++j) {
        float r = hsum8(acc[j]);
        for (int64_t k = i; k < n; ++k) r += a[k] * xs[j][k];
        out[j * stride] = r;
    }
}

/* y_j[0:width] += sum_r c[j * cstride + r] * b[r * bstride + 0:width] for a full tile, width a multiple of 8:
 * each 8-column strip of the tile's rows stays in registers over all ranks */
static inline void expand_tile(float *const *ys, const float *b, int64_t bstride, const float *c, int64_t cstride,
                               int64_t rank, int64_t width)
{
    for (int64_t i = 0; i < width; i += 8) {
        v8 acc[TILE];
        for (int j = 0; j < TILE; ++j) acc[j] = load8(ys[j] + i);
        for (int64_t r = 0; r < rank; ++r) {
            const v8 bv = load8(b + r * bstride + i);
            for (int j = 0; j < TILE; ++j) acc[j] += c[j * cstride + r] * bv;
        }
        for (int j = 0; j < TILE; ++j) store8(ys[j] + i, acc[j]);
    }
}

int loraplex_lora_apply_f32(
    const float *x, float *y, const float *a, const float *bt, const int64_t *slice_offsets, int64_t num_slices,
    int64_t in_features, int64_t out_total, int64_t max_rank, const int64_t *seg_slots, const int64_t *seg_starts,
    const int64_t *seg_lens, int64_t num_segs, const int64_t *token_ids, const int32_t *slot_ranks,
    int num_threads)
{
    /* tasks: tiles of up to TILE tokens of one segment (a long prefill run splits over the threads) */
    int64_t num_tasks = 0;
    for (int64_t i = 0; i < num_segs; ++i) num_tasks += (seg_lens[i] + TILE - 1) / TILE;
    int64_t *task_seg = malloc(sizeof(int64_t) * (size_t)(2 * num_tasks + 1));
    if (task_seg == NULL) return -1;
    int64_t *task_first = task_seg + num_tasks;
    for (int64_t i = 0, k = 0; i < num_segs; ++i)
        for (int64_t j = 0; j < seg_lens[i]; j += TILE, ++k) {
            task_seg[k] = i;
            task_first[k] = j;
        }
    int failed = 0;

#pragma omp parallel num_threads(num_threads)
    {
        float *buf = malloc(sizeof(float) * (size_t)(TILE * num_slices * max_rank)); /* [tile][slices][rank] */
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_tasks; ++task) {
            if (buf == NULL) continue;
            const int64_t seg = task_seg[task], j0 = task_first[task];
            const int64_t slot = seg_slots[seg];
            const int64_t n = seg_lens[seg] - j0 < TILE ? seg_lens[seg] - j0 : TILE;
            const int64_t *tokens = token_ids + seg_starts[seg] + j0;
            int64_t rank = slot_ranks[slot];
            if (rank > max_rank) rank = max_rank;
            const float *xs[TILE];
            float *ys[TILE];
            for (int64_t j = 0; j < n; ++j) {
                xs[j] = x + tokens[j] * in_features;
                ys[j] = y + tokens[j] * out_total;
            }
            const int64_t bstride = num_slices * max_rank;  /* buf floats per token */
            /* shrink: each A row once per tile, against the tile's x rows */
            for (int64_t s = 0; s < num_slices; ++s)
                for (int64_t r = 0; r < rank; ++r) {
                    const float *arow = a + ((slot * num_slices + s) * max_rank + r) * in_features;
                    if (n == TILE) {
                        dot_tile(arow, xs, in_features, buf + s * max_rank + r, bstride);
                    } else {
                        for (int64_t j = 0; j < n; ++j)
                            buf[j * bstride + s * max_rank + r] = dot(arow, xs[j], in_features);
                    }
                }
            if (n < TILE) {
                /* a few tokens (decodes): B's used rows are one contiguous block (rank x out_total), read
                 * front to back in a single stream, every slice's columns of a row with that slice's
                 * coefficient; short per-slice sweeps instead left the prefetchers idle (~1.5x slower) */
                for (int64_t r = 0; r < rank; ++r) {
                    const float *brow = bt + (slot * max_rank + r) * out_total;
                    for (int64_t s = 0; s < num_slices; ++s) {
                        const int64_t lo = slice_offsets[s], hi = slice_offsets[s + 1];
                        for (int64_t j = 0; j < n; ++j)
                            axpy(ys[j] + lo, brow + lo, buf[j * bstride + s * max_rank + r], hi - lo);
                    }
                }
                continue;
            }
            /* expand, full tiles: in registers 8 columns at a time, so the tile's y rows are read and
             * written once per strip; a slice's last (hi - lo) % 8 columns row by row */
            for (int64_t s = 0; s < num_slices; ++s) {
                const int64_t lo = slice_offsets[s], hi = slice_offsets[s + 1];
                const float *bslice = bt + slot * max_rank * out_total + lo;
                const float *c = buf + s * max_rank;
                float *yl[TILE];
                for (int j = 0; j < TILE; ++j) yl[j] = ys[j] + lo;
                const int64_t width = (hi - lo) / 8 * 8;
                expand_tile(yl, bslice, out_total, c, bstride, rank, width);
                for (int64_t r = 0; r < rank; ++r)
                    for (int j = 0; j < TILE; ++j)
                        axpy(yl[j] + width, bslice + r * out_total + width, c[j * bstride + r], hi - lo - width);
            }
        }
        free(buf);
    }
    free(task_seg);
    return failed ? -1 : 0;
}
