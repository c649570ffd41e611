/* The multi-LoRA kernel's body for one weight type and one activation type, included by lora_apply.c once per
 * pair (see there). Before including: WT, the stored weight type; WLOAD8(p), eight weights from p as a float
 * v8; WLOADW(p), VW weights as a float vw (the prefill tiles' width); WGET(p), one weight as a float; W(name),
 * name with the pair's suffix; XT, the activations' type (float or uint16_t for bfloat16: then a task widens
 * its tile's x and y rows into float32 scratch and rounds the y rows back once at its end). All are #undef'd
 * at the end, ready for the next pair. Arithmetic is float32. */

/* How far ahead the decode loops prefetch the weight row they stream: one core keeps only so many misses
 * in flight on its own, and a decode step reads each adapter's rows once, from memory (bench/README.md). */
#ifndef PF_BYTES
#define PF_BYTES 2048
#endif
static inline void W(axpy)(float *y, const WT *b, float c, int64_t n)
{
    int64_t i = 0;
    const v8 cv = {c, c, c, c, c, c, c, c};
    for (; i + 8 <= n; i += 8) store8(y + i, load8(y + i) + cv * WLOAD8(b + i));
    for (; i < n; ++i) y[i] += c * WGET(b + i);
}

/* out[j * stride] = a . x_j for the n < TILE tokens of a short segment (decodes): each vector of the row
 * is loaded once for all of them. N is a compile-time count so the sums stay in registers; one token
 * gets two sums (even and odd vectors) so that it is not bound by the FMA latency. Rows go one at a
 * time: several rows side by side (more streams, fewer loads of x) are slower. */
#define DEFINE_DOT_N(N)                                                                                      \
    static inline void W(dot_n##N)(const WT *a, const float *const *xs, int64_t len, float *out,             \
                                int64_t stride)                                                              \
    {                                                                                                        \
        v8 acc[N], acc2[N];                                                                                  \
        for (int j = 0; j < N; ++j) acc[j] = acc2[j] = (v8){0};                                              \
        int64_t i = 0;                                                                                       \
        for (; i + 16 <= len; i += 16) {                                                                     \
            __builtin_prefetch((const char *)(a + i) + PF_BYTES, 0, 3);                                      \
            const v8 av = WLOAD8(a + i), av2 = WLOAD8(a + i + 8);                                            \
            for (int j = 0; j < N; ++j) {                                                                    \
                acc[j] += av * load8(xs[j] + i);                                                             \
                acc2[j] += av2 * load8(xs[j] + i + 8);                                                       \
            }                                                                                                \
        }                                                                                                    \
        for (; i + 8 <= len; i += 8) {                                                                       \
            const v8 av = WLOAD8(a + i);                                                                     \
            for (int j = 0; j < N; ++j) acc[j] += av * load8(xs[j] + i);                                     \
        }                                                                                                    \
        for (int j = 0; j < N; ++j) {                                                                        \
            float r = hsum8(acc[j] + acc2[j]);                                                               \
            for (int64_t k = i; k < len; ++k) r += WGET(a + k) * xs[j][k];                                   \
            out[j * stride] = r;                                                                             \
        }                                                                                                    \
    }
DEFINE_DOT_N(1)
DEFINE_DOT_N(2)
DEFINE_DOT_N(3)
DEFINE_DOT_N(4)

static inline void W(dot_few)(const WT *a, const float *const *xs, int64_t n, int64_t len, float *out,
                           int64_t stride)
{
    for (; n >= 4; n -= 4, xs += 4, out += 4 * stride) W(dot_n4)(a, xs, len, out, stride);
    switch (n) {
    case 3: W(dot_n3)(a, xs, len, out, stride); break;
    case 2: W(dot_n2)(a, xs, len, out, stride); break;
    case 1: W(dot_n1)(a, xs, len, out, stride); break;
    default: break;
    }
}

/* y[0:n] += c[0] b[0][0:n] + ... + c[3] b[3][0:n] (rows b + k * bstride): y read and written once for four
 * rank rows */
static inline void W(axpy4)(float *y, const WT *b, int64_t bstride, const float *c, int64_t n)
{
    const float c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    const WT *b0 = b, *b1 = b + bstride, *b2 = b + 2 * bstride, *b3 = b + 3 * bstride;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __builtin_prefetch((const char *)(b3 + i) + PF_BYTES, 0, 3);
        const v8 lo = c0 * WLOAD8(b0 + i) + c1 * WLOAD8(b1 + i), hi = c2 * WLOAD8(b2 + i) + c3 * WLOAD8(b3 + i);
        store8(y + i, load8(y + i) + (lo + hi));
    }
    for (; i < n; ++i)
        y[i] += (c0 * WGET(b0 + i) + c1 * WGET(b1 + i)) + (c2 * WGET(b2 + i) + c3 * WGET(b3 + i));
}

/* out[j * stride] = a . x_j for a full tile of TILE rows: a is loaded once per VW columns for all rows */
static inline void W(dot_tile)(const WT *a, const float *const *xs, int64_t n, float *out, int64_t stride)
{
    vw acc[TILE];
    for (int j = 0; j < TILE; ++j) acc[j] = (vw){0};
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        const vw av = WLOADW(a + i);
        for (int j = 0; j < TILE; ++j) acc[j] += av * loadw(xs[j] + i);
    }
    for (int j = 0; j < TILE; ++j) {
        float r = hsumw(acc[j]);
        for (int64_t k = i; k < n; ++k) r += WGET(a + k) * xs[j][k];
        out[j * stride] = r;
    }
}

/* y_j[0:width] += sum_r c[j * cstride + r] * b[r * bstride + 0:width] for a full tile, width a multiple of VW:
 * each VW-column strip of the tile's rows stays in registers over all ranks */
static inline void W(expand_tile)(float *const *ys, const WT *b, int64_t bstride, const float *c, int64_t cstride,
                               int64_t rank, int64_t width)
{
    for (int64_t i = 0; i < width; i += VW) {
        vw acc[TILE];
        for (int j = 0; j < TILE; ++j) acc[j] = loadw(ys[j] + i);
        for (int64_t r = 0; r < rank; ++r) {
            const vw bv = WLOADW(b + r * bstride + i);
            for (int j = 0; j < TILE; ++j) acc[j] += c[j * cstride + r] * bv;
        }
        for (int j = 0; j < TILE; ++j) storew(ys[j] + i, acc[j]);
    }
}

int W(loraplex_lora_apply)(
    const XT *x, XT *y, const WT *a, const WT *bt, const int64_t *slice_offsets, int64_t num_slices,
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
        /* [tile][slices][rank], then for bfloat16 activations the tile's x and y rows widened */
        const size_t wide = X_IS_BF16 ? (size_t)(TILE * (in_features + out_total)) : 0;
        float *buf = malloc(sizeof(float) * ((size_t)(TILE * num_slices * max_rank) + wide));
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
#if X_IS_BF16
                float *xw = buf + TILE * num_slices * max_rank + j * in_features;
                float *yw = buf + TILE * num_slices * max_rank + TILE * in_features + j * out_total;
                widen_bf16(xw, x + tokens[j] * in_features, in_features);
                widen_bf16(yw, y + tokens[j] * out_total, out_total);
                xs[j] = xw;
                ys[j] = yw;
#else
                xs[j] = x + tokens[j] * in_features;
                ys[j] = y + tokens[j] * out_total;
#endif
            }
            const int64_t bstride = num_slices * max_rank;  /* buf floats per token */
            /* shrink: each A row once per tile, against the tile's x rows */
            for (int64_t s = 0; s < num_slices; ++s) {
                const WT *aslice = a + (slot * num_slices + s) * max_rank * in_features;
                if (n < TILE) {
                    for (int64_t r = 0; r < rank; ++r)
                        W(dot_few)(aslice + r * in_features, xs, n, in_features, buf + s * max_rank + r, bstride);
                    continue;
                }
                for (int64_t r = 0; r < rank; ++r)
                    W(dot_tile)(aslice + r * in_features, xs, in_features, buf + s * max_rank + r, bstride);
            }
            if (n < TILE) {
                /* a few tokens (decodes): B's used rows are one contiguous block (rank x out_total), read
                 * front to back four rows at a time (each y row then read and written once per four ranks),
                 * every slice's columns of a row with that slice's coefficient; short per-slice sweeps
                 * instead leave the prefetchers idle (bench/README.md) */
                int64_t r = 0;
                for (; r + 4 <= rank; r += 4) {
                    const WT *brow = bt + (slot * max_rank + r) * out_total;
                    for (int64_t s = 0; s < num_slices; ++s) {
                        const int64_t lo = slice_offsets[s], hi = slice_offsets[s + 1];
                        for (int64_t j = 0; j < n; ++j)
                            W(axpy4)(ys[j] + lo, brow + lo, out_total, buf + j * bstride + s * max_rank + r, hi - lo);
                    }
                }
                for (; r < rank; ++r) {
                    const WT *brow = bt + (slot * max_rank + r) * out_total;
                    for (int64_t s = 0; s < num_slices; ++s) {
                        const int64_t lo = slice_offsets[s], hi = slice_offsets[s + 1];
                        for (int64_t j = 0; j < n; ++j)
                            W(axpy)(ys[j] + lo, brow + lo, buf[j * bstride + s * max_rank + r], hi - lo);
                    }
                }
            } else {
                /* expand, full tiles: in registers VW columns at a time, so the tile's y rows are read and
                 * written once per strip; a slice's last (hi - lo) % VW columns row by row */
                for (int64_t s = 0; s < num_slices; ++s) {
                    const int64_t lo = slice_offsets[s], hi = slice_offsets[s + 1];
                    const WT *bslice = bt + slot * max_rank * out_total + lo;
                    const float *c = buf + s * max_rank;
                    float *yl[TILE];
                    for (int j = 0; j < TILE; ++j) yl[j] = ys[j] + lo;
                    const int64_t width = (hi - lo) / VW * VW;
                    W(expand_tile)(yl, bslice, out_total, c, bstride, rank, width);
                    for (int64_t r = 0; r < rank; ++r)
                        for (int j = 0; j < TILE; ++j)
                            W(axpy)(yl[j] + width, bslice + r * out_total + width, c[j * bstride + r], hi - lo - width);
                }
            }
#if X_IS_BF16
            for (int64_t j = 0; j < n; ++j) narrow_bf16(y + tokens[j] * out_total, ys[j], out_total);
#endif
        }
        free(buf);
    }
    free(task_seg);
    return failed ? -1 : 0;
}

#undef DEFINE_DOT_N
#undef WT
#undef WLOAD8
#undef WLOADW
#undef WGET
#undef W_SUFFIX
#undef XT
#undef X_IS_BF16
