/* y[m, n] = x[m, k] . (scale[n] * Q[n, k])^T for int8 weights quantized per output channel (one float32 scale a
 * row, symmetric: --quantization int8). x and y float32, or bfloat16 (x widened once into float32 scratch, y
 * computed in float32 and rounded once); row i of y at y + i ldy (ldy >= n: y may be columns of a wider matrix).
 * kernels/int8_channel.py holds the torch reference and checks shapes before calling.
 *
 * Float activations: each row's sum scaled once at the end. One row of x (decode): each weight row read straight
 * through, widened in registers (interleaving 4 rows here ran at a third of the speed on a 28 MB LM head). Up to
 * FUSED_MAX_M rows: 4 weight rows by the rows of x in registers; beyond, a thread widens its 4 weight rows once
 * into float scratch (4 k floats: L1 or L2) and dots them with every row of x, 4 by 4.
 * Decode reads one byte a weight (float32: four).
 *
 * int8 activations (int8_x): x quantized per group of 32 to int8 as llama.cpp's Q8_0 (d = max|x| / 127 rounded to
 * float16, q = round(x / d) halves away from zero: quantize_activations in kernels/quant.py), each group's product
 * with the weight's integers an exact integer sum, then y = scale * sum over groups of d * isum in float32.
 * Paths: vpdpbusd on 512-bit vectors (two groups a vector) or 256-bit ones (AVX-VNNI / AVX512-VL), AVX2's
 * vpmaddubsw (llama.cpp's sign trick: |w| times x with w's sign), plain C. vpdpbusd multiplies unsigned by signed
 * bytes, so the weight is read as w + 128 (its sign bit flipped) and 128 times each group's sum of x, scaled by
 * its d, is taken off once per row of x.
 *
 * -DLORAPLEX_QUANT_VW8 (8-float vectors on AVX-512), -DLORAPLEX_QUANT_NO_VNNI (AVX2's int8 products) and
 * -DLORAPLEX_QUANT_SCALAR (plain C) build the other paths, as for quant_matmul.c, so the tests check each. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(LORAPLEX_QUANT_SCALAR)
#define QVW 0
#elif defined(__AVX512F__) && !defined(LORAPLEX_QUANT_VW8)
#define QVW 16
#else
#define QVW 8
#endif

#if defined(LORAPLEX_QUANT_SCALAR) || !defined(__AVX2__)
#define I8_PATH 0 /* plain C */
#elif !defined(LORAPLEX_QUANT_NO_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && QVW == 16
#define I8_PATH 3 /* vpdpbusd on 512-bit vectors */
#elif !defined(LORAPLEX_QUANT_NO_VNNI) && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
#define I8_PATH 2 /* vpdpbusd on 256-bit vectors */
#else
#define I8_PATH 1 /* AVX2: vpmaddubsw + vpmaddwd */
#endif

enum {
    TILE = 4,               /* weight rows widened at a time (float path), and rows of x dotted at a time */
    FUSED_MAX_M = 4,        /* rows of x up to which the float path widens the weight in registers only */
    PARALLEL_MIN = 1 << 15, /* below this many weights (n k) one thread does the call: no pool wake-up */
};

/* ---- float activations ---- */
#if QVW
typedef float vf __attribute__((vector_size(QVW * 4)));
typedef int8_t vi8 __attribute__((vector_size(QVW)));
typedef int32_t vi32 __attribute__((vector_size(QVW * 4)));

static inline vf load_i8_to_f32(const int8_t *p) /* sign-extended by the intrinsic: GCC widens lane by lane */
{
#if QVW == 16
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    vi8 q;
    memcpy(&q, p, sizeof q);
    return __builtin_convertvector(__builtin_convertvector(q, vi32), vf);
#endif
}
static inline vf loadv(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void storev(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline float hsumv(vf v) /* in shuffles: a loop over the lanes cost as much as a small product */
{
#if QVW == 16
    return _mm512_reduce_add_ps((__m512)v);
#elif defined(__AVX__)
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
#else
    float s = 0.0f;
    for (int l = 0; l < QVW; ++l) s += v[l];
    return s;
#endif
}
#endif

static void widen_row(const int8_t *w, float *out, int64_t k)
{
    int64_t e = 0;
#if QVW
    for (; e + QVW <= k; e += QVW) storev(out + e, load_i8_to_f32(w + e));
#endif
    for (; e < k; ++e) out[e] = (float)w[e];
}

/* out[a][r] = x[a] . w[r] for MI rows of x (compile-time: the sums stay in registers) and TILE weight rows */
static inline __attribute__((always_inline)) void tile_dot(const int MI, const float *x, int64_t k,
                                                           const float *const w[TILE], float out[TILE][TILE])
{
    int64_t e = 0;
#if QVW
    vf acc[TILE][TILE];
    for (int a = 0; a < MI; ++a)
        for (int r = 0; r < TILE; ++r) acc[a][r] = (vf){0};
    for (; e + QVW <= k; e += QVW) {
        vf wv[TILE];
        for (int r = 0; r < TILE; ++r) wv[r] = loadv(w[r] + e);
        for (int a = 0; a < MI; ++a) {
            const vf xv = loadv(x + a * k + e);
            for (int r = 0; r < TILE; ++r) acc[a][r] += xv * wv[r];
        }
    }
    for (int a = 0; a < MI; ++a)
        for (int r = 0; r < TILE; ++r) out[a][r] = hsumv(acc[a][r]);
#else
    for (int a = 0; a < MI; ++a)
        for (int r = 0; r < TILE; ++r) out[a][r] = 0.0f;
#endif
    for (; e < k; ++e)
        for (int a = 0; a < MI; ++a)
            for (int r = 0; r < TILE; ++r) out[a][r] += x[a * k + e] * w[r][e];
}

/* the same straight from TILE int8 rows, widened in registers: for up to FUSED_MAX_M rows of x (decode), where
 * widening once into scratch costs more than widening for each row of x */
static inline __attribute__((always_inline)) void fused_dot(const int MI, const float *x, int64_t k,
                                                            const int8_t *const w[TILE], float out[TILE][TILE])
{
    int64_t e = 0;
#if QVW
    vf acc[TILE][TILE];
    for (int a = 0; a < MI; ++a)
        for (int r = 0; r < TILE; ++r) acc[a][r] = (vf){0};
    for (; e + QVW <= k; e += QVW) {
        vf wv[TILE];
        for (int r = 0; r < TILE; ++r) wv[r] = load_i8_to_f32(w[r] + e);
        for (int a = 0; a < MI; ++a) {
            const vf xv = loadv(x + a * k + e);
            for (int r = 0; r < TILE; ++r) acc[a][r] += xv * wv[r];
        }
    }
    for (int a = 0; a < MI; ++a)
        for (int r = 0; r < TILE; ++r) out[a][r] = hsumv(acc[a][r]);
#else
    for (int a = 0; a < MI; ++a)
        for (int r = 0; r < TILE; ++r) out[a][r] = 0.0f;
#endif
    for (; e < k; ++e)
        for (int a = 0; a < MI; ++a)
            for (int r = 0; r < TILE; ++r) out[a][r] += x[a * k + e] * (float)w[r][e];
}

/* one weight row with one row of x, read straight through: two sums against the FMA's latency */
static float row_dot(const int8_t *w, const float *x, int64_t k)
{
    int64_t e = 0;
    float s = 0.0f;
#if QVW
    vf a0 = {0}, a1 = {0};
    for (; e + 2 * QVW <= k; e += 2 * QVW) {
        a0 += load_i8_to_f32(w + e) * loadv(x + e);
        a1 += load_i8_to_f32(w + e + QVW) * loadv(x + e + QVW);
    }
    for (; e + QVW <= k; e += QVW) a0 += load_i8_to_f32(w + e) * loadv(x + e);
    s = hsumv(a0 + a1);
#endif
    for (; e < k; ++e) s += x[e] * (float)w[e];
    return s;
}

static void matmul_fused(const float *x, const int8_t *wq, const float *scale, int64_t m, int64_t n, int64_t k,
                         float *y, int64_t ldy, int num_threads)
{
    if (m == 1) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n * k >= PARALLEL_MIN)
        for (int64_t r = 0; r < n; ++r) y[r] = row_dot(wq + r * k, x, k) * scale[r];
        return;
    }
    const int64_t tiles = (n + TILE - 1) / TILE;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n * k >= PARALLEL_MIN)
    for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r0 = t * TILE, rows = n - r0 < TILE ? n - r0 : TILE;
        const int8_t *w[TILE];
        for (int64_t r = 0; r < TILE; ++r) w[r] = wq + (r0 + (r < rows ? r : 0)) * k; /* a short tile repeats */
        float out[TILE][TILE];
        switch (m) {
        case 4: fused_dot(4, x, k, w, out); break;
        case 3: fused_dot(3, x, k, w, out); break;
        case 2: fused_dot(2, x, k, w, out); break;
        default: fused_dot(1, x, k, w, out); break;
        }
        for (int64_t a = 0; a < m; ++a)
            for (int64_t r = 0; r < rows; ++r) y[a * ldy + r0 + r] = out[a][r] * scale[r0 + r];
    }
}

static int matmul_float(const float *x, const int8_t *wq, const float *scale, int64_t m, int64_t n, int64_t k,
                        float *y, int64_t ldy, int num_threads)
{
    if (m <= FUSED_MAX_M) {
        matmul_fused(x, wq, scale, m, n, k, y, ldy, num_threads);
        return 0;
    }
    const int64_t tiles = (n + TILE - 1) / TILE;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (n * k >= PARALLEL_MIN)
    {
        float *buf = malloc((size_t)(TILE * k) * sizeof(float));
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
            if (buf == NULL) continue;
            const int64_t r0 = t * TILE, rows = n - r0 < TILE ? n - r0 : TILE;
            const float *w[TILE];
            for (int64_t r = 0; r < TILE; ++r) w[r] = buf + (r < rows ? r : 0) * k; /* a short tile repeats */
            for (int64_t r = 0; r < rows; ++r) widen_row(wq + (r0 + r) * k, buf + r * k, k);
            for (int64_t i = 0; i < m; i += TILE) {
                const int64_t mi = m - i < TILE ? m - i : TILE;
                float out[TILE][TILE];
                switch (mi) {
                case 4: tile_dot(4, x + i * k, k, w, out); break;
                case 3: tile_dot(3, x + i * k, k, w, out); break;
                case 2: tile_dot(2, x + i * k, k, w, out); break;
                default: tile_dot(1, x + i * k, k, w, out); break;
                }
                for (int64_t a = 0; a < mi; ++a)
                    for (int64_t r = 0; r < rows; ++r) y[(i + a) * ldy + r0 + r] = out[a][r] * scale[r0 + r];
            }
        }
        free(buf);
    }
    return failed;
}

/* ---- int8 activations ---- */
static inline float f16_round(float f) /* to the nearest float16 (ties to even), as torch's .to(float16) */
{
#if defined(__F16C__)
    return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
    return (float)(_Float16)f;
#endif
}

typedef struct {
    int8_t *q;   /* [m][k] */
    float *d;    /* [m][groups][8]: each group's float16 scale as float, repeated for 8 lanes */
    float *corr; /* [m]: -128 * sum over groups of d * the group's sum of q (the vpdpbusd paths' offset) */
} qx_t;

static void quantize_x(const float *x, int64_t m, int64_t k, qx_t *a)
{
    const int64_t groups = k / 32;
    for (int64_t i = 0; i < m; ++i) {
        float corr = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
            const float *v = x + i * k + g * 32;
            int8_t *q = a->q + i * k + g * 32;
            float amax = 0.0f;
            for (int e = 0; e < 32; ++e) amax = fabsf(v[e]) > amax ? fabsf(v[e]) : amax;
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int e = 0; e < 32; ++e) {
                const float t = v[e] * id;
                const int r = (int)(fabsf(t) + 0.5f); /* exact: |t| <= 127 */
                q[e] = (int8_t)(t < 0.0f ? -r : r);
                sum += q[e];
            }
            const float dh = f16_round(d);
            for (int l = 0; l < 8; ++l) a->d[(i * groups + g) * 8 + l] = dh;
            corr += dh * (float)(-128 * sum);
        }
        a->corr[i] = corr;
    }
}

#if I8_PATH
static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static inline float hsum256(__m256 v)
{
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* one group: 8 int32 lanes holding (w + 128) . x (vpdpbusd paths) or w . x (AVX2), 4 bytes a lane */
static inline __m256i group_dot(const int8_t *w, const int8_t *xq)
{
    const __m256i wv = load256(w), xv = load256(xq);
#if I8_PATH >= 2
    const __m256i u = _mm256_xor_si256(wv, _mm256_set1_epi8(-128));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, xv);
#else
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, xv);
#endif
#else /* |w| (at most 128 as unsigned) times x with w's sign: pairs at most 2 * 128 * 127, within int16 */
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

static float row_dot_i8(const int8_t *w, const qx_t *a, int64_t i, int64_t k)
{
    const int64_t groups = k / 32;
    const int8_t *xq = a->q + i * k;
    const float *d = a->d + i * groups * 8;
    __m256 f = _mm256_setzero_ps();
    int64_t g = 0;
#if I8_PATH == 3
    __m512 f2 = _mm512_setzero_ps();
    for (; g + 2 <= groups; g += 2) {
        const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(w + g * 32), _mm512_set1_epi8(-128));
        const __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(xq + g * 32));
        f2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps(d + g * 8), f2);
    }
    f = _mm256_add_ps(_mm512_castps512_ps256(f2), _mm512_extractf32x8_ps(f2, 1));
#endif
    for (; g < groups; ++g)
        f = _mm256_add_ps(f, _mm256_mul_ps(_mm256_cvtepi32_ps(group_dot(w + g * 32, xq + g * 32)), _mm256_loadu_ps(d + g * 8)));
    return I8_PATH >= 2 ? hsum256(f) + a->corr[i] : hsum256(f);
}
#else
static float row_dot_i8(const int8_t *w, const qx_t *a, int64_t i, int64_t k)
{
    const int64_t groups = k / 32;
    const int8_t *xq = a->q + i * k;
    float s = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
        int32_t isum = 0;
        for (int e = 0; e < 32; ++e) isum += (int32_t)w[g * 32 + e] * xq[g * 32 + e];
        s += a->d[(i * groups + g) * 8] * (float)isum;
    }
    return s;
}
#endif

static int matmul_int8(const float *x, const int8_t *wq, const float *scale, int64_t m, int64_t n, int64_t k,
                       float *y, int64_t ldy, int num_threads)
{
    if (k % 32) return 2;
    const int64_t groups = k / 32;
    float *scratch = malloc((size_t)(m * groups * 8 + m) * sizeof(float) + (size_t)(m * k));
    if (scratch == NULL) return 1;
    qx_t a = {.d = scratch, .corr = scratch + m * groups * 8, .q = (int8_t *)(scratch + m * groups * 8 + m)};
    quantize_x(x, m, k, &a);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n * k >= PARALLEL_MIN)
    for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < m; ++i) y[i * ldy + r] = scale[r] * row_dot_i8(wq + r * k, &a, i, k);
    free(scratch);
    return 0;
}

/* 16 where the AVX-512 vectors are built, 8 for the 8-float ones, 0 for the plain C build */
int loraplex_int8_vector_width(void) { return QVW; }

/* the int8-activation path built: 0 plain C, 1 AVX2, 2 VNNI on 256-bit vectors, 3 on 512-bit ones */
int loraplex_int8_int8_path(void) { return I8_PATH; }

/* y = x . (scale * W)^T; x and y bfloat16 where x_bf16, else float32; int8_x: x quantized per group of 32 (k a
 * multiple of 32). Returns 0, 1 when scratch could not be allocated, 2 for int8_x with k not a multiple of 32. */
int loraplex_int8_matmul(const void *x_in, int x_bf16, const int8_t *wq, const float *scale, int64_t m, int64_t n,
                         int64_t k, void *y_out, int64_t ldy, int int8_x, int num_threads)
{
    int (*fn)(const float *, const int8_t *, const float *, int64_t, int64_t, int64_t, float *, int64_t, int) =
        int8_x ? matmul_int8 : matmul_float;
    if (!x_bf16) return fn(x_in, wq, scale, m, n, k, y_out, ldy, num_threads);
    float *scratch = malloc((size_t)(m * k + m * n) * sizeof(float));
    if (scratch == NULL) return 1;
    widen_bf16(scratch, x_in, m * k);
    const int failed = fn(scratch, wq, scale, m, n, k, scratch + m * k, n, num_threads);
    if (!failed)
        for (int64_t i = 0; i < m; ++i) narrow_bf16((uint16_t *)y_out + i * ldy, scratch + m * k + i * n, n);
    free(scratch);
    return failed;
}
