/* The per-layer elementwise steps of a Llama block on the CPU, float32 or bfloat16 (every tensor of a call
 * one type; _f32 / _bf16 suffixes), each in one pass over memory:
 *
 *   loraplex_add_rms_norm_f32  residual += delta (when delta is given), then
 *                              out = weight * (residual * 1/sqrt(mean(residual^2) + eps))
 *   loraplex_rope_f32          rotary embedding in place on the first `heads` heads of each row (the q and
 *                              k heads at the front of a fused qkv row), rotate-half convention, cos/sin
 *                              tables indexed by each row's position
 *   loraplex_silu_mul_f32      out = silu(gate) * up for a fused [rows, 2 * inter] gate_up output
 *   loraplex_gelu_tanh_mul_f32 out = gelu_tanh(gate) * up, the same for GeGLU (Gemma)
 *
 * The torch versions of these take 2-6 operators each (a temporary per operator); in the model they were
 * a tenth of a prefill step and, at 64 decode rows, mostly per-operator overhead. Rows are independent;
 * large calls split them over OpenMP threads. Layouts: residual/delta/out [rows, dim] contiguous;
 * qkv rows `row_stride` floats apart; cos/sin [max_positions, head_dim]; positions int64 [rows] (the
 * caller checks them against max_positions).
 */
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "vec8.h"

#define PARALLEL_MIN_FLOATS (1 << 16) /* below this a call runs on one thread: a team costs more than it saves */

/* silu(g) = g * sigmoid(g), with sigmoid from e^-|g| (never overflows): 1/(1+e) for g >= 0, e/(1+e) below. */
static inline v8 silu8(v8 g)
{
    const v8i neg = g < 0.0f;
    const v8 e = exp8_nonpositive((v8)((v8i)g | (v8i)(v8){-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f}));
    const v8 num = (v8)(((v8i)e & neg) | ((v8i)(v8){1, 1, 1, 1, 1, 1, 1, 1} & ~neg));
    return g * (num / (1.0f + e));
}

static inline float silu1(float g) { return g / (1.0f + expf(-g)); }

/* transformers' gelu_pytorch_tanh: 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3), computed as
 * g * sigmoid(2u) (the same function: 1 + tanh(u) = 2 sigmoid(2u)) with the sigmoid as silu8 takes it. */
static inline v8 gelu_tanh8(v8 g)
{
    const v8 z = 1.5957691216057308f * (g + 0.044715f * g * g * g); /* 2u */
    const v8i neg = z < 0.0f;
    const v8 e = exp8_nonpositive((v8)((v8i)z | (v8i)(v8){-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f}));
    const v8 num = (v8)(((v8i)e & neg) | ((v8i)(v8){1, 1, 1, 1, 1, 1, 1, 1} & ~neg));
    return g * (num / (1.0f + e));
}

static inline float gelu_tanh1(float g)
{
    const float z = 1.5957691216057308f * (g + 0.044715f * g * g * g);
    return g / (1.0f + expf(-z));
}

static inline float f32_round(float f) { return f; }
static inline v8 f32_round8(v8 v) { return v; }
static inline float bf16_round(float f)
{
    uint16_t h;
    float_to_bf16(&h, f);
    return bf16_to_float(&h);
}
static inline v8 bf16_round8(v8 v)
{
    uint16_t h[8];
    store8_bf16(h, v);
    return load8_bf16(h);
}

#define ET float
#define ELOAD8(p) load8(p)
#define ESTORE8(p, v) store8(p, v)
#define EGET(p) (*(p))
#define EPUT(p, f) (*(p) = (f))
#define EROUND(f) f32_round(f)
#define EROUND8(v) f32_round8(v)
#define E_SUFFIX f32
#include "elementwise_impl.h"

#define ET uint16_t
#define ELOAD8(p) load8_bf16(p)
#define ESTORE8(p, v) store8_bf16(p, v)
#define EGET(p) bf16_to_float(p)
#define EPUT(p, f) float_to_bf16(p, f)
#define EROUND(f) bf16_round(f)
#define EROUND8(v) bf16_round8(v)
#define E_SUFFIX bf16
#include "elementwise_impl.h"
