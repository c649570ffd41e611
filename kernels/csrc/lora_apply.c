/* Multi-LoRA delta on the CPU: y[t] += B[slot(t)] (A[slot(t)] x[t]) for every token with an adapter; float32
 * activations and arithmetic, weights stored as float32 (loraplex_lora_apply_f32) or bfloat16
 * (loraplex_lora_apply_bf16w: each weight widened exactly on load, so a step reads half the bytes).
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

#define W_CAT2(name, suffix) name##_##suffix
#define W_CAT(name, suffix) W_CAT2(name, suffix)
#define W(name) W_CAT(name, W_SUFFIX)

#define WT float
#define WLOAD8(p) load8(p)
#define WGET(p) (*(p))
#define W_SUFFIX f32
#include "lora_apply_impl.h"
#undef WT
#undef WLOAD8
#undef WGET
#undef W_SUFFIX

/* bfloat16 is the top half of a float32: widening is a 16-bit shift, exact */
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
static inline v8 load8_bf16(const uint16_t *p)
{
    v8u16 h;
    memcpy(&h, p, sizeof h);
    return (v8)(__builtin_convertvector(h, v8u32) << 16);
}
static inline float bf16_to_float(const uint16_t *p)
{
    const uint32_t bits = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define WT uint16_t
#define WLOAD8(p) load8_bf16(p)
#define WGET(p) bf16_to_float(p)
#define W_SUFFIX bf16w
#include "lora_apply_impl.h"
#undef WT
#undef WLOAD8
#undef WGET
#undef W_SUFFIX
