/* The elementwise kernels' bodies for one element type, included by elementwise.c once per type (see there
 * and bf16.h; parameters ET, ELOAD8, ESTORE8, EGET(p), EPUT(p, f), EROUND(f) / EROUND8(v) (a float rounded to
 * the element type and back: the identity for float32), E_SUFFIX, all #undef'd at the end). Arithmetic is
 * float32; a bfloat16 result is rounded where transformers' bfloat16 modules round (the normalised row
 * before the weight, SiLU and GELU before the product). */

void E(loraplex_add_rms_norm)(ET *residual, const ET *delta, const ET *weight, ET *out, int64_t rows,
                               int64_t dim, float eps, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * dim >= PARALLEL_MIN_FLOATS)
    for (int64_t r = 0; r < rows; ++r) {
        ET *x = residual + r * dim;
        ET *o = out + r * dim;
        float ss = 0.0f;
        if (delta != 0) {
            const ET *d = delta + r * dim;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < dim; ++i) {
                EPUT(x + i, EGET(x + i) + EGET(d + i));
                const float xi = EGET(x + i);  /* the residual as stored */
                ss += xi * xi;
            }
        } else {
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < dim; ++i) ss += EGET(x + i) * EGET(x + i);
        }
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) EPUT(o + i, EGET(weight + i) * EROUND(EGET(x + i) * inv));
    }
}

void E(loraplex_rope)(ET *qkv, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
                       const ET *cos_table, const ET *sin_table, const int64_t *positions, int num_threads)
{
    const int64_t half = head_dim / 2;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * heads * head_dim >= PARALLEL_MIN_FLOATS)
    for (int64_t r = 0; r < rows; ++r) {
        const ET *c = cos_table + positions[r] * head_dim, *s = sin_table + positions[r] * head_dim;
        for (int64_t h = 0; h < heads; ++h) {
            ET *x = qkv + r * row_stride + h * head_dim;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
                const float x1 = EGET(x + i), x2 = EGET(x + i + half);
                EPUT(x + i, x1 * EGET(c + i) - x2 * EGET(s + i));
                EPUT(x + i + half, x2 * EGET(c + i + half) + x1 * EGET(s + i + half));
            }
        }
    }
}

/* One row of out = act(gate) * up, the activation rounded to the element type before the product; act8 / act1
 * are constants at both call sites, so the always_inline body is specialised for each (called inside each
 * function's own parallel loop: a parallel region in this helper would be outlined with the activations as
 * pointers, called indirectly for every vector) */
static inline __attribute__((always_inline)) void E(gated_row)(const ET *g, ET *o, int64_t inter, v8 (*act8)(v8),
                                                                float (*act1)(float))
{
    const ET *u = g + inter;
    int64_t i = 0;
    for (; i + 8 <= inter; i += 8) ESTORE8(o + i, EROUND8(act8(ELOAD8(g + i))) * ELOAD8(u + i));
    for (; i < inter; ++i) EPUT(o + i, EROUND(act1(EGET(g + i))) * EGET(u + i));
}

void E(loraplex_silu_mul)(const ET *gate_up, ET *out, int64_t rows, int64_t inter, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * inter >= PARALLEL_MIN_FLOATS)
    for (int64_t r = 0; r < rows; ++r) E(gated_row)(gate_up + r * 2 * inter, out + r * inter, inter, silu8, silu1);
}

void E(loraplex_gelu_tanh_mul)(const ET *gate_up, ET *out, int64_t rows, int64_t inter, int num_threads)
{
#pragma omp parallel for num_threads(num_threads) schedule(static) if (rows * inter >= PARALLEL_MIN_FLOATS)
    for (int64_t r = 0; r < rows; ++r)
        E(gated_row)(gate_up + r * 2 * inter, out + r * inter, inter, gelu_tanh8, gelu_tanh1);
}

#undef ET
#undef ELOAD8
#undef ESTORE8
#undef EGET
#undef EPUT
#undef EROUND
#undef EROUND8
#undef E_SUFFIX
