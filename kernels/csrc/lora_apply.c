/* Multi-LoRA delta on the CPU: y[t] += B[slot(t)] (A[slot(t)] x[t]) for every token with an adapter; float32
 * arithmetic, weights stored as float32 (loraplex_lora_apply_f32), bfloat16 (loraplex_lora_apply_bf16w) or
 * float16 (loraplex_lora_apply_f16w); 16-bit weights are widened exactly on load, so a step reads half the
 * bytes. Activations float32, or bfloat16 (loraplex_lora_apply_bf16a_f32w / _bf16a_bf16w / _bf16a_f16w: a
 * task widens its tokens' x and y rows into float32 scratch and rounds y once, after the whole delta).
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

#include "bf16.h"
#include "vec8.h"
#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

enum { TILE = 8 }; /* tokens per task */

/* The prefill tiles' vectors: 16 floats where the compiler targets AVX-512 (one instruction does twice the
 * work of AVX2's; with 32 registers a tile's accumulators still fit), else the 8-float v8. */
#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
typedef float vw __attribute__((vector_size(VW * 4))); /* v8 itself when VW is 8 */
static inline vw loadw(const float *p) { vw v; memcpy(&v, p, sizeof v); return v; }
static inline void storew(float *p, vw v) { memcpy(p, &v, sizeof v); }
static inline float hsumw(vw v)
{
#if VW == 16
    return hsum8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
                 + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
#else
    return hsum8(v);
#endif
}

#define W_CAT2(name, suffix) name##_##suffix
#define W_CAT(name, suffix) W_CAT2(name, suffix)
#define W(name) W_CAT(name, W_SUFFIX)


/* bfloat16 weights: widened exactly on load (bf16.h) */
static inline vw loadw_bf16(const uint16_t *p)
{
#if VW == 16
    return (vw)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
#else
    return load8_bf16(p);
#endif
}


/* float16 weights: 11 significant bits against bfloat16's 8, the same bytes. Widening is exact; F16C (x86)
 * does eight or sixteen in one instruction, elsewhere the compiler's _Float16 conversion. */
static inline float f16_to_float(const uint16_t *p)
{
#if defined(__F16C__)
    return _cvtsh_ss(*p);
#else
    _Float16 h;
    memcpy(&h, p, sizeof h);
    return (float)h;
#endif
}
static inline v8 load8_f16(const uint16_t *p)
{
#if defined(__F16C__)
    return (v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    v8 v;
    for (int i = 0; i < 8; ++i) v[i] = f16_to_float(p + i);
    return v;
#endif
}
static inline vw loadw_f16(const uint16_t *p)
{
#if VW == 16
    return (vw)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    return load8_f16(p);
#endif
}

/* every (activations, weights) pair: float32 activations with each weight type, then bfloat16 ones */
#define WT float
#define WLOAD8(p) load8(p)
#define WLOADW(p) loadw(p)
#define WGET(p) (*(p))
#define XT float
#define X_IS_BF16 0
#define W_SUFFIX f32
#include "lora_apply_impl.h" /* #undefs its parameters */

#define WT uint16_t
#define WLOAD8(p) load8_bf16(p)
#define WLOADW(p) loadw_bf16(p)
#define WGET(p) bf16_to_float(p)
#define XT float
#define X_IS_BF16 0
#define W_SUFFIX bf16w
#include "lora_apply_impl.h" /* #undefs its parameters */

#define WT uint16_t
#define WLOAD8(p) load8_f16(p)
#define WLOADW(p) loadw_f16(p)
#define WGET(p) f16_to_float(p)
#define XT float
#define X_IS_BF16 0
#define W_SUFFIX f16w
#include "lora_apply_impl.h" /* #undefs its parameters */

#define WT float
#define WLOAD8(p) load8(p)
#define WLOADW(p) loadw(p)
#define WGET(p) (*(p))
#define XT uint16_t
#define X_IS_BF16 1
#define W_SUFFIX bf16a_f32w
#include "lora_apply_impl.h" /* #undefs its parameters */

#define WT uint16_t
#define WLOAD8(p) load8_bf16(p)
#define WLOADW(p) loadw_bf16(p)
#define WGET(p) bf16_to_float(p)
#define XT uint16_t
#define X_IS_BF16 1
#define W_SUFFIX bf16a_bf16w
#include "lora_apply_impl.h" /* #undefs its parameters */

#define WT uint16_t
#define WLOAD8(p) load8_f16(p)
#define WLOADW(p) loadw_f16(p)
#define WGET(p) f16_to_float(p)
#define XT uint16_t
#define X_IS_BF16 1
#define W_SUFFIX bf16a_f16w
#include "lora_apply_impl.h" /* #undefs its parameters */
