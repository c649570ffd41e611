/* What the C attention kernels share: the online-softmax update of one row for a tile of keys, and the
 * dispatch to bodies with the GQA group and head_dim as compile-time constants.
 *
 * The bodies are always_inline functions whose per-row arrays are sized by (group, head_dim); with both
 * known at compile time the compiler keeps them in registers and unrolls the vector loops. The caller
 * defines ATTEND(G, D) as the call of its body and writes LORAPLEX_SPECIALISED(group, head_dim): groups
 * 1-8 with heads of 64 or 128 get their own copy, any other shape the generic one. */
#ifndef LORAPLEX_ATTENTION_COMMON_H
#define LORAPLEX_ATTENTION_COMMON_H

#include <math.h>
#include <stdint.h>

#include "vec8.h"

/* One row's online-softmax step over a tile of 16 scores s0, s1 (masked lanes -inf, at least one finite
 * on the row's first tile): when the tile raises the running maximum, the running sum and the nv value
 * accumulators are rescaled; the tile's weights e^(s - max) go to p[0..16) and into the running sum. */
static inline __attribute__((always_inline)) void softmax_tile(v8 s0, v8 s1, float *run_max, float *run_sum,
                                                               v8 *acc, int64_t nv, float *p)
{
    const float tile_max = hmax2x8(s0, s1);
    if (tile_max > *run_max) {
        const float corr = expf(*run_max - tile_max);  /* 0 on the first tile */
        *run_sum *= corr;
        for (int64_t c = 0; c < nv; ++c) acc[c] *= corr;
        *run_max = tile_max;
    }
    const v8 e0 = exp8_nonpositive(s0 - *run_max), e1 = exp8_nonpositive(s1 - *run_max);
    *run_sum += hsum8(e0 + e1);
    store8(p, e0);
    store8(p + 8, e1);
}

/* Gemma 2's soft-capping of eight scores: cap * tanh(s / cap), which keeps every score inside (-cap, cap). */
static inline v8 softcap8(v8 s, const float cap)
{
    for (int i = 0; i < 8; ++i) s[i] = cap * tanhf(s[i] / cap);
    return s;
}

#define LORAPLEX_BY_GROUP(group, D)                                                                           \
    switch (group) {                                                                                          \
    case 1: ATTEND(1, D); break;                                                                              \
    case 2: ATTEND(2, D); break;                                                                              \
    case 3: ATTEND(3, D); break;                                                                              \
    case 4: ATTEND(4, D); break;                                                                              \
    case 5: ATTEND(5, D); break;                                                                              \
    case 6: ATTEND(6, D); break;                                                                              \
    case 7: ATTEND(7, D); break;                                                                              \
    case 8: ATTEND(8, D); break;                                                                              \
    default: ATTEND(group, D); break;                                                                         \
    }

#define LORAPLEX_SPECIALISED(group, head_dim)                                                                 \
    if ((head_dim) == 64) {                                                                                   \
        LORAPLEX_BY_GROUP(group, 64)                                                                          \
    } else if ((head_dim) == 128) {                                                                           \
        LORAPLEX_BY_GROUP(group, 128)                                                                         \
    } else {                                                                                                  \
        ATTEND(group, head_dim);                                                                              \
    }

#endif
