/* The per-layer elementwise steps of a Llama block on the CPU, float32, each in one pass over memory:
 *
 *   loraplex_add_rms_norm_f32  residual += delta (when delta is given), then
 *                              out = weight * (residual * 1/sqrt(mean(residual^2) + eps))
 *   loraplex_rope_f32          rotary embedding in place on the first `heads` heads of each row (the q and
 *                              k heads at the front of a fused qkv row), rotate-half convention, cos/sin
 *                              tables indexed by each row's position
 *   loraplex_silu_mul_f32      out = silu(gate) * up for a fused [rows, 2 * inter] gate_up output
 *
 * The torch versions of these take 2-6 operators each (a temporary per operator); in the model they were
 * a tenth of a prefill step and, at 64 decode rows, mostly per-operator overhead. Rows are independent;
 * large calls split them over OpenMP threads. Layouts: residual/delta/out [rows, dim] contiguous;
 * qkv rows `row_stride` floats apart; cos/sin [max_positions, head_dim]; positions int64 [rows] (the
 * caller checks them against max_positions).
 */
#include <math.h>
#include <stdint.h>

#include "vec8.h"

#define PARALLEL_MIN_FLOATS (1 << 16) /* below this a call runs on one thread: a team costs more than it saves */

void loraplex_add_rms_norm_f32(float *residual, const float *delta, const float *weight, float *out, int64_t rows,
                               int64_t dim, float eps, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * dim >= PARALLEL_MIN_FLOATS)
    for (int64_t r = 0; r < rows; ++r) {
        float *x = residual + r * dim;
        float *o = out + r * dim;
        float ss = 0.0f;
        if (delta != 0) {
            const float *d = delta + r * dim;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < dim; ++i) {
                x[i] += d[i];
                ss += x[i] * x[i];
            }
        } else {
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < dim; ++i) ss += x[i] * x[i];
        }
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) o[i] = weight[i] * (x[i] * inv);
    }
}

void loraplex_rope_f32(float *qkv, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
                       const float *cos_table, const float *sin_table, const int64_t *positions, int num_threads)
{
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * heads * head_dim >= PARALLEL_MIN_FLOATS)
    for (int64_t r = 0; r < rows; ++r) {
        const float *c = cos_table + positions[r] * head_dim, *s = sin_table + positions[r] * head_dim;
        for (int64_t h = 0; h < heads; ++h) {
            float *x = qkv + r * row_stride + h * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
                const float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i + half] + x1 * s[i + half];
            }
        }
    }
}

/* silu(g) = g * sigmoid(g), with sigmoid from e^-|g| (never overflows): 1/(1+e) for g >= 0, e/(1+e) below. */
static inline v8 silu8(v8 g)
{
    const v8i neg = g < 0.0f;
    const v8 e = exp8_nonpositive((v8)((v8i)g | (v8i)(v8){-0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f, -0.0f}));
    const v8 num = (v8)(((v8i)e & neg) | ((v8i)(v8){1, 1, 1, 1, 1, 1, 1, 1} & ~neg));
    return g * (num / (1.0f + e));
}

void loraplex_silu_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t inter, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * inter >= PARALLEL_MIN_FLOATS)
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) store8(o + i, silu8(load8(g + i)) * load8(u + i));
        for (; i < inter; ++i) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}
