/* y[m, n] = x[m, k] . W[n, k]^T with W stored as rows of GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K),
 * one row of k / block elements per output, exactly as a GGUF file holds a 2-D weight [n out, k in]. float32
 * arithmetic; x and y float32, or bfloat16 (x widened once into float32 scratch, y computed in float32 and
 * rounded once).
 * kernels/quant.py holds the torch reference (dequantize_ref) and checks shapes before calling.
 *
 * Block formats (element e of a block; d, dmin, m are float16):
 *   Q8_0  32 el, 34 B: d, 32 int8 q.                     x = d * q
 *   Q4_0  32 el, 18 B: d, 16 B nibbles.                  x = d * (q - 8)
 *   Q4_1  32 el, 20 B: d, m, 16 B nibbles.               x = d * q + m
 *   Q5_0  32 el, 22 B: d, 4 B qh, 16 B nibbles.          x = d * ((q | h << 4) - 16)
 *   Q5_1  32 el, 24 B: d, m, 4 B qh, 16 B nibbles.       x = d * (q | h << 4) + m
 *         nibbles: byte j holds element j (low nibble) and element j + 16 (high nibble); h, element j's fifth
 *         bit, is bit j of qh read as a little-endian uint32.
 *   Q4_K 256 el, 144 B: d, dmin, 12 B of 6-bit scales and mins for 8 sub-blocks of 32, 128 B nibbles.
 *         x = d * scale[s] * q - dmin * min[s], s = e / 32; byte 32 g + l holds element 64 g + l (low nibble)
 *         and 64 g + 32 + l (high nibble).
 *   Q6_K 256 el, 210 B: 128 B ql (low 4 bits), 64 B qh (high 2 bits), 16 int8 scales (one per 16 elements), d.
 *         For e = 128 h + r: low bits = nibble r / 64 of ql[64 h + r % 64], high bits = bit pair r / 32 of
 *         qh[32 h + r % 32]; x = d * scale[e / 16] * (q - 32).
 *
 * Decode is bound by reading the weights, so each weight block is read once per call. For up to FUSED_MAX_M
 * rows of x and the 32-element formats, a block is widened into vector registers and multiplied straight into
 * the sums of every row of x. For more rows, and for the K formats, a thread widens a tile of TILE_ROWS weight
 * rows into float scratch and forms the tile's dot products with all rows of x, 4 weight rows by up to 4 rows
 * of x at a time in registers: beyond 4 rows of x this beat the fused path, whose widening work grows with the
 * rows (bench/quant_matmul.py). From GEMM_MIN_M rows (prefill) a blocked GEMM on widened, transposed weight
 * panels takes over (matmul_gemm). Threads (OpenMP, torch's pool) split the output rows n.
 *
 * Vector code is GCC vector extensions: 16-float vectors where the compiler targets AVX-512, else 8 (AVX2,
 * NEON, or SSE in two halves). -DLORAPLEX_QUANT_VW8 forces 8 on AVX-512 hardware and -DLORAPLEX_QUANT_SCALAR
 * builds the plain C path only, so that the tests can check every path on one machine.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, Q5_0, Q5_1, NUM_TYPES }; /* the order of QUANT_TYPES in kernels/quant.py */
static const int64_t BLOCK_ELEMS[NUM_TYPES] = {32, 32, 32, 256, 256, 32, 32};
static const int64_t BLOCK_BYTES[NUM_TYPES] = {34, 18, 20, 144, 210, 22, 24};

#if defined(LORAPLEX_QUANT_SCALAR)
#define QVW 0
#elif defined(__AVX512F__) && !defined(LORAPLEX_QUANT_VW8)
#define QVW 16
#else
#define QVW 8
#endif

enum {
    FUSED_MAX_M = 4,         /* rows of x up to which the fused path runs (its sums stay in registers) */
    TILE_ROWS = 4,           /* weight rows a thread widens at a time (the large-m path; 8 were slower) */
    PARALLEL_MIN = 1 << 15,  /* below this many weights (n k) one thread does the call: no pool wake-up */
    GEMM_MIN_M = 48,         /* rows of x from which the GEMM path runs (below it, packing costs what it saves) */
};

static inline float f16_to_f32(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
#if defined(__F16C__) /* through vmovd, not _cvtsh_ss: GCC merges that into a register a loop's chain runs through */
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
#else
    _Float16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
#endif
}

#if QVW
#define UNUSED_IN_VECTOR_BUILDS __attribute__((unused)) /* the vector builds widen these formats in registers */
#else
#define UNUSED_IN_VECTOR_BUILDS
#endif

/* ---- plain C: one block of each format widened into out[0 .. block elements) ---- */

UNUSED_IN_VECTOR_BUILDS static void dequant_q8_0(const uint8_t *b, float *out)
{
    const float d = f16_to_f32(b);
    for (int e = 0; e < 32; ++e) out[e] = (float)(int8_t)b[2 + e] * d;
}

UNUSED_IN_VECTOR_BUILDS static void dequant_q4_0(const uint8_t *b, float *out)
{
    const float d = f16_to_f32(b);
    for (int j = 0; j < 16; ++j) {
        out[j] = (float)((b[2 + j] & 15) - 8) * d;
        out[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

UNUSED_IN_VECTOR_BUILDS static void dequant_q4_1(const uint8_t *b, float *out)
{
    const float d = f16_to_f32(b), m = f16_to_f32(b + 2);
    for (int j = 0; j < 16; ++j) {
        out[j] = (float)(b[4 + j] & 15) * d + m;
        out[j + 16] = (float)(b[4 + j] >> 4) * d + m;
    }
}

static inline uint32_t load_u32(const uint8_t *p) /* little-endian, as GGUF stores qh */
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

UNUSED_IN_VECTOR_BUILDS static void dequant_q5_0(const uint8_t *b, float *out)
{
    const float d = f16_to_f32(b);
    const uint32_t qh = load_u32(b + 2);
    for (int j = 0; j < 16; ++j) {
        out[j] = (float)((int)((b[6 + j] & 15) | ((qh >> j & 1) << 4)) - 16) * d;
        out[j + 16] = (float)((int)((b[6 + j] >> 4) | ((qh >> (j + 16) & 1) << 4)) - 16) * d;
    }
}

UNUSED_IN_VECTOR_BUILDS static void dequant_q5_1(const uint8_t *b, float *out)
{
    const float d = f16_to_f32(b), m = f16_to_f32(b + 2);
    const uint32_t qh = load_u32(b + 4);
    for (int j = 0; j < 16; ++j) {
        out[j] = (float)((b[8 + j] & 15) | ((qh >> j & 1) << 4)) * d + m;
        out[j + 16] = (float)((b[8 + j] >> 4) | ((qh >> (j + 16) & 1) << 4)) * d + m;
    }
}

/* Q4_K's 12 scale bytes: sub-blocks 0-3 have their 6-bit scale and min in the low bits of bytes 0-3 and 4-7;
 * sub-blocks 4-7 have their low 4 bits in the nibbles of bytes 8-11 (scale low, min high) and their top 2 bits
 * in the top bits of bytes 0-3 (scale) and 4-7 (min). */
static void q4_k_scale_min(const uint8_t *s, int sub, int *scale, int *min)
{
    if (sub < 4) {
        *scale = s[sub] & 63;
        *min = s[sub + 4] & 63;
    } else {
        *scale = (s[sub + 4] & 15) | ((s[sub - 4] >> 6) << 4);
        *min = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
    }
}

UNUSED_IN_VECTOR_BUILDS static void dequant_q4_k(const uint8_t *b, float *out)
{
    const float d = f16_to_f32(b), dmin = f16_to_f32(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int g = 0; g < 4; ++g) {
        int sc_lo, mn_lo, sc_hi, mn_hi;
        q4_k_scale_min(scales, 2 * g, &sc_lo, &mn_lo);
        q4_k_scale_min(scales, 2 * g + 1, &sc_hi, &mn_hi);
        const float d_lo = d * (float)sc_lo, m_lo = dmin * (float)mn_lo;
        const float d_hi = d * (float)sc_hi, m_hi = dmin * (float)mn_hi;
        for (int l = 0; l < 32; ++l) {
            out[64 * g + l] = d_lo * (float)(qs[32 * g + l] & 15) - m_lo;
            out[64 * g + 32 + l] = d_hi * (float)(qs[32 * g + l] >> 4) - m_hi;
        }
    }
}

UNUSED_IN_VECTOR_BUILDS static void dequant_q6_k(const uint8_t *b, float *out)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    const float d = f16_to_f32(b + 208);
    for (int h = 0; h < 2; ++h)
        for (int s = 0; s < 4; ++s) /* elements 128 h + 32 s + l: one ql nibble, one qh bit pair */
            for (int half = 0; half < 2; ++half) {
                const float dl = d * (float)scales[8 * h + 2 * s + half];
                for (int l = 16 * half; l < 16 * half + 16; ++l) {
                    const int lo = (ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15;
                    const int hi = (qh[32 * h + l] >> (2 * s)) & 3;
                    out[128 * h + 32 * s + l] = dl * (float)((lo | (hi << 4)) - 32);
                }
            }
}

typedef void (*dequant_block_fn)(const uint8_t *, float *);

#if QVW
/* ---- vectors: a 32-element block widened into NV float vectors (element e: lane e % QVW of vector e / QVW) ---- */
typedef float vf __attribute__((vector_size(QVW * 4)));
typedef int8_t vi8 __attribute__((vector_size(QVW)));
typedef uint8_t vu8 __attribute__((vector_size(QVW)));
typedef int32_t vi32 __attribute__((vector_size(QVW * 4)));
typedef uint32_t vu32 __attribute__((vector_size(QVW * 4)));
enum { NV = 32 / QVW };
#if QVW == 16
#define LANE_INDEX ((vu32){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
#else
#define LANE_INDEX ((vu32){0, 1, 2, 3, 4, 5, 6, 7})
#endif

/* Bytes to floats through int32: GCC 12 converts bytes straight to floats one lane at a time, but unsigned bytes
 * to int32 (vpmovzxbd) and int32 to float (vcvtdq2ps) a vector at a time. Signed bytes loaded from memory it
 * also widens one at a time, so on x86 they are loaded and sign-extended by the intrinsic. */
static inline vu32 u8_to_u32(vu8 q)
{
#if QVW == 8 && defined(__AVX2__) /* a computed 8-byte vector GCC widened a byte at a time (vpextrb, vpinsrd) */
    return (vu32)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&q));
#else
    return __builtin_convertvector(q, vu32);
#endif
}
static inline vf u8_to_f32(vu8 q) { return __builtin_convertvector((vi32)u8_to_u32(q), vf); }
static inline vf load_i8_to_f32(const uint8_t *p)
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

/* Each byte shifted: on x86 GCC has no vector mode for 8-byte vectors (AVX2's QVW 8), so it shifted their bytes
 * one lane at a time through general registers (Q6_K at one row ran at a seventeenth of float32 F.linear on an
 * AVX2 host); there they go through one 16-bit lane shift and a mask that drops the bits from a neighbour byte. */
static inline vu8 shr_u8(vu8 q, int s)
{
#if QVW == 8 && defined(__AVX2__)
    __m128i x = _mm_loadl_epi64((const __m128i *)&q);
    x = _mm_and_si128(_mm_srli_epi16(x, s), _mm_set1_epi8((char)(0xFFu >> s)));
    _mm_storel_epi64((__m128i *)&q, x);
    return q;
#else
    return q >> s;
#endif
}
static inline vu8 shl_u8(vu8 q, int s)
{
#if QVW == 8 && defined(__AVX2__)
    __m128i x = _mm_loadl_epi64((const __m128i *)&q);
    x = _mm_and_si128(_mm_slli_epi16(x, s), _mm_set1_epi8((char)((0xFFu << s) & 0xFFu)));
    _mm_storel_epi64((__m128i *)&q, x);
    return q;
#else
    return q << s;
#endif
}

static inline vf loadv(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void storev(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline float hsumv(vf v)
{
#if QVW == 16
    return hsum8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
                 + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
#else
    return hsum8(v);
#endif
}

static inline void vdequant_Q8_0(const uint8_t *b, vf w[NV])
{
    const float d = f16_to_f32(b);
    for (int v = 0; v < NV; ++v) w[v] = load_i8_to_f32(b + 2 + v * QVW) * d;
}

/* 16 bytes of nibbles as 32 floats 0..15: the low nibbles are elements 0-15, the high ones 16-31 */
static inline void vnibbles(const uint8_t *qs, vf w[NV])
{
    for (int v = 0; v < NV / 2; ++v) {
        vu8 q;
        memcpy(&q, qs + v * QVW, sizeof q);
        w[v] = u8_to_f32(q & 15);
        w[v + NV / 2] = u8_to_f32(shr_u8(q, 4));
    }
}

static inline void vdequant_Q4_0(const uint8_t *b, vf w[NV])
{
    const float d = f16_to_f32(b);
    vnibbles(b + 2, w);
    for (int v = 0; v < NV; ++v) w[v] = (w[v] - 8.0f) * d;
}

static inline void vdequant_Q4_1(const uint8_t *b, vf w[NV])
{
    const float d = f16_to_f32(b), m = f16_to_f32(b + 2);
    vnibbles(b + 4, w);
    for (int v = 0; v < NV; ++v) w[v] = w[v] * d + m;
}

/* Q5's 32 values 0..31: the nibbles with bit e of qh as element e's fifth bit (AVX-512: 16 added where qh's
 * bits mask it in, ~10% faster at one row than a variable shift a lane) */
static inline void vfive_bits(const uint8_t *qh_bytes, const uint8_t *qs, vf w[NV])
{
    const uint32_t qh = load_u32(qh_bytes);
#if QVW == 16
    vu8 q;
    memcpy(&q, qs, sizeof q);
    w[0] = u8_to_f32(q & 15) + (vf)_mm512_maskz_mov_ps((__mmask16)qh, _mm512_set1_ps(16.0f));
    w[1] = u8_to_f32(q >> 4) + (vf)_mm512_maskz_mov_ps((__mmask16)(qh >> 16), _mm512_set1_ps(16.0f));
#else
    for (int v = 0; v < NV / 2; ++v) {
        vu8 q;
        memcpy(&q, qs + v * QVW, sizeof q);
        const vu32 lo = (vu32){0} + (qh >> (v * QVW)), hi = (vu32){0} + (qh >> (16 + v * QVW));
        const vu32 nib_lo = u8_to_u32(q & 15), nib_hi = u8_to_u32(shr_u8(q, 4));
        w[v] = __builtin_convertvector((vi32)(nib_lo | ((lo >> LANE_INDEX) & 1) << 4), vf);
        w[v + NV / 2] = __builtin_convertvector((vi32)(nib_hi | ((hi >> LANE_INDEX) & 1) << 4), vf);
    }
#endif
}

static inline void vdequant_Q5_0(const uint8_t *b, vf w[NV])
{
    const float d = f16_to_f32(b);
    vfive_bits(b + 2, b + 6, w);
    for (int v = 0; v < NV; ++v) w[v] = (w[v] - 16.0f) * d;
}

static inline void vdequant_Q5_1(const uint8_t *b, vf w[NV])
{
    const float d = f16_to_f32(b), m = f16_to_f32(b + 2);
    vfive_bits(b + 4, b + 8, w);
    for (int v = 0; v < NV; ++v) w[v] = w[v] * d + m;
}

/* y[j * ldy] = row . x[j] for N rows of x (a compile-time count, so the sums stay in registers; two sums a
 * row, so that one row is not bound by the FMA latency) */
#define DEFINE_FUSED_N(T, N)                                                                                  \
    static inline void fused_##T##_n##N(const uint8_t *row, const float *x, int64_t k, float *y, int64_t ldy) \
    {                                                                                                         \
        vf acc[N][2];                                                                                         \
        for (int j = 0; j < N; ++j) acc[j][0] = acc[j][1] = (vf){0};                                          \
        for (int64_t e = 0; e < k; e += 32, row += BLOCK_BYTES[T]) {                                          \
            vf w[NV];                                                                                         \
            vdequant_##T(row, w);                                                                             \
            for (int j = 0; j < N; ++j)                                                                       \
                for (int v = 0; v < NV; ++v) acc[j][v & 1] += w[v] * loadv(x + j * k + e + v * QVW);          \
        }                                                                                                     \
        for (int j = 0; j < N; ++j) y[j * ldy] = hsumv(acc[j][0] + acc[j][1]);                                \
    }

/* every row of x (m <= FUSED_MAX_M) against one weight row */
#define DEFINE_FUSED(T)                                                                                       \
    DEFINE_FUSED_N(T, 1)                                                                                      \
    DEFINE_FUSED_N(T, 2)                                                                                      \
    DEFINE_FUSED_N(T, 3)                                                                                      \
    DEFINE_FUSED_N(T, 4)                                                                                      \
    static void fused_##T(const uint8_t *row, const float *x, int64_t m, int64_t k, float *y, int64_t ldy)    \
    {                                                                                                         \
        switch (m) {                                                                                          \
        case 4: fused_##T##_n4(row, x, k, y, ldy); break;                                                     \
        case 3: fused_##T##_n3(row, x, k, y, ldy); break;                                                     \
        case 2: fused_##T##_n2(row, x, k, y, ldy); break;                                                     \
        default: fused_##T##_n1(row, x, k, y, ldy); break;                                                    \
        }                                                                                                     \
    }
DEFINE_FUSED(Q8_0)
DEFINE_FUSED(Q4_0)
DEFINE_FUSED(Q4_1)
DEFINE_FUSED(Q5_0)
DEFINE_FUSED(Q5_1)

typedef void (*fused_fn)(const uint8_t *, const float *, int64_t, int64_t, float *, int64_t);
static const fused_fn FUSED[NUM_TYPES] = {fused_Q8_0, fused_Q4_0, fused_Q4_1, NULL, NULL, fused_Q5_0, fused_Q5_1};

/* the same 32-element blocks widened into memory (the tiles of the large-m path) */
#define DEFINE_VDEQUANT_STORE(T, name)                                                                        \
    static void name(const uint8_t *b, float *out)                                                            \
    {                                                                                                         \
        vf w[NV];                                                                                             \
        vdequant_##T(b, w);                                                                                   \
        for (int v = 0; v < NV; ++v) storev(out + v * QVW, w[v]);                                             \
    }
DEFINE_VDEQUANT_STORE(Q8_0, vstore_q8_0)
DEFINE_VDEQUANT_STORE(Q4_0, vstore_q4_0)
DEFINE_VDEQUANT_STORE(Q4_1, vstore_q4_1)
DEFINE_VDEQUANT_STORE(Q5_0, vstore_q5_0)
DEFINE_VDEQUANT_STORE(Q5_1, vstore_q5_1)

/* the K formats' super-blocks, QVW elements at a time (layouts: dequant_q4_k and dequant_q6_k above) */
static void vstore_q4_k(const uint8_t *b, float *out)
{
    const float d = f16_to_f32(b), dmin = f16_to_f32(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int g = 0; g < 4; ++g) {
        int sc_lo, mn_lo, sc_hi, mn_hi;
        q4_k_scale_min(scales, 2 * g, &sc_lo, &mn_lo);
        q4_k_scale_min(scales, 2 * g + 1, &sc_hi, &mn_hi);
        const float d_lo = d * (float)sc_lo, m_lo = dmin * (float)mn_lo;
        const float d_hi = d * (float)sc_hi, m_hi = dmin * (float)mn_hi;
        for (int l = 0; l < 32; l += QVW) {
            vu8 q;
            memcpy(&q, qs + 32 * g + l, sizeof q);
            storev(out + 64 * g + l, u8_to_f32(q & 15) * d_lo - m_lo);
            storev(out + 64 * g + 32 + l, u8_to_f32(shr_u8(q, 4)) * d_hi - m_hi);
        }
    }
}

static void vstore_q6_k(const uint8_t *b, float *out)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    const float d = f16_to_f32(b + 208);
    for (int h = 0; h < 2; ++h)
        for (int s = 0; s < 4; ++s)
            for (int l = 0; l < 32; l += QVW) {
                vu8 lo, hi;
                memcpy(&lo, ql + 64 * h + 32 * (s & 1) + l, sizeof lo);
                memcpy(&hi, qh + 32 * h + l, sizeof hi);
                const vu8 q = (shr_u8(lo, 4 * (s >> 1)) & 15) | shl_u8(shr_u8(hi, 2 * s) & 3, 4);
                const float dl = d * (float)scales[8 * h + 2 * s + l / 16];
                storev(out + 128 * h + 32 * s + l, (u8_to_f32(q) - 32.0f) * dl);
            }
}

static const dequant_block_fn DEQUANT_TILE[NUM_TYPES] = {vstore_q8_0, vstore_q4_0, vstore_q4_1, vstore_q4_k,
                                                         vstore_q6_k, vstore_q5_0, vstore_q5_1};

/* the 8-float v8 whose lanes sum to v's */
static inline v8 fold8(vf v)
{
#if QVW == 16
    return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
         + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
    return v;
#endif
}

/* out[i][c] = x[i] . w[c] for MI rows of x (stride k) and the 4 weight rows w[0..3], over k (a multiple of
 * 32): each vector of a weight row is loaded once for the MI rows. out has an even number of rows: the sums
 * are reduced two rows at a time, 8 horizontal sums in one vector (reduce8), a third of the work of one
 * horizontal sum each (~15% of the time at k = 576). */
#define DEFINE_TILE_DOT(MI)                                                                                   \
    static void tile_dot_##MI(const float *x, int64_t k, const float *const w[4], float out[][4])             \
    {                                                                                                         \
        vf acc[MI][4];                                                                                        \
        for (int i = 0; i < MI; ++i)                                                                          \
            for (int c = 0; c < 4; ++c) acc[i][c] = (vf){0};                                                  \
        for (int64_t e = 0; e < k; e += QVW) {                                                                \
            const vf w0 = loadv(w[0] + e), w1 = loadv(w[1] + e), w2 = loadv(w[2] + e), w3 = loadv(w[3] + e);  \
            for (int i = 0; i < MI; ++i) {                                                                    \
                const vf xv = loadv(x + i * k + e);                                                           \
                acc[i][0] += xv * w0;                                                                         \
                acc[i][1] += xv * w1;                                                                         \
                acc[i][2] += xv * w2;                                                                         \
                acc[i][3] += xv * w3;                                                                         \
            }                                                                                                 \
        }                                                                                                     \
        for (int i = 0; i < MI; i += 2) { /* two rows' 8 sums at once */                                      \
            v8 h[8];                                                                                          \
            for (int c = 0; c < 4; ++c) {                                                                     \
                h[c] = fold8(acc[i][c]);                                                                      \
                h[4 + c] = i + 1 < MI ? fold8(acc[i + 1 < MI ? i + 1 : i][c]) : (v8){0};                      \
            }                                                                                                 \
            store8(out[i], reduce8(h));                                                                       \
        }                                                                                                     \
    }
DEFINE_TILE_DOT(1)
DEFINE_TILE_DOT(2)
DEFINE_TILE_DOT(3)
/* rows of x a tile_dot call takes: 12 sums in registers on AVX2's 16, 16 on AVX-512's 32 */
#if QVW == 16
DEFINE_TILE_DOT(4)
#define TILE_MI 4
#else
#define TILE_MI 3
#endif

static void tile_dot(const float *x, int64_t mi, int64_t k, const float *const w[4], float out[][4])
{
    switch (mi) {
#if TILE_MI == 4
    case 4: tile_dot_4(x, k, w, out); break;
#endif
    case 3: tile_dot_3(x, k, w, out); break;
    case 2: tile_dot_2(x, k, w, out); break;
    default: tile_dot_1(x, k, w, out); break;
    }
}

/* ---- many rows of x (prefill): a blocked GEMM on widened, transposed panels of the weight ----
 *
 * A thread widens a panel of GEMM_NR weight rows over a chunk of at most GEMM_KC elements of k into scratch,
 * transposed (element e of the NR rows: one contiguous row of NR floats; 32 KB at most on AVX-512: L1), then
 * sweeps every row of x over it: GEMM_MR rows of x by NR outputs in registers, each weight vector loaded once
 * for the MR rows and each x element broadcast once for the NR outputs. No horizontal sums, and x is read once
 * a panel, 8 times less often than by the dot-product tiles (their x rows are reloaded every 4 weight rows).
 * The dot-product tiles reached ~0.5-0.7x of F.linear at 256-512 rows, this ~0.9-1.0x (bench/README.md). */
#if QVW == 16
#define GEMM_MR 12 /* 24 sums + 2 weight vectors + a broadcast: 27 of AVX-512's 32 registers */
#else
#define GEMM_MR 6 /* 12 sums + 2 + 1: 15 of AVX2's 16 */
#endif
enum {
    GEMM_NR = 2 * QVW, /* weight rows a panel: two vectors */
    GEMM_KC = 256,     /* elements of k a chunk at most (whole blocks) */
    GEMM_AHEAD = 512,  /* the micro-kernel prefetches packed x this many floats ahead (~40 steps; 2-3% faster) */
};

/* dst[j * ld + i] = src[i * ls + j] for an 8 x 8 tile */
static inline void transpose8(const float *src, int64_t ls, float *dst, int64_t ld)
{
    v8 r[8], t[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = load8(src + i * ls);
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; ++h) {
            u[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[i + 2 * h + 1] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int j = 0; j < 4; ++j) {
        store8(dst + j * ld, __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11));
        store8(dst + (j + 4) * ld, __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15));
    }
}

/* wp[e][0 .. NR) = the panel's rows (rb bytes each; rows >= cols as zeros) widened over blocks b0 .. b0 + nbc,
 * eight rows at a time through tmp (8 blocks of be floats) */
static void pack_panel(const uint8_t *rows_q, int64_t rb, int64_t cols, int qtype, int64_t b0, int64_t nbc,
                       float *tmp, float *wp)
{
    const int64_t be = BLOCK_ELEMS[qtype], bb = BLOCK_BYTES[qtype];
    const dequant_block_fn dequant = DEQUANT_TILE[qtype];
    for (int64_t r0 = 0; r0 < GEMM_NR; r0 += 8)
        for (int64_t b = 0; b < nbc; ++b) {
            for (int64_t r = 0; r < 8; ++r) {
                if (r0 + r < cols)
                    dequant(rows_q + (r0 + r) * rb + (b0 + b) * bb, tmp + r * be);
                else
                    memset(tmp + r * be, 0, (size_t)be * sizeof(float));
            }
            for (int64_t e = 0; e < be; e += 8)
                transpose8(tmp + e, be, wp + (b * be + e) * GEMM_NR + r0, GEMM_NR);
        }
}

/* c[i][0 .. NR) = (c[i] if accumulate, else 0) + x[i] . the panel over kc, for MR rows of x packed as
 * xp[e][MR] (every broadcast from one sequential stream) */
#define DEFINE_GEMM_MICRO(MR)                                                                                 \
    static void gemm_micro_##MR(const float *xp, const float *wp, int64_t kc, float *c, int64_t ldc,          \
                                int accumulate)                                                               \
    {                                                                                                         \
        vf acc[MR][2];                                                                                        \
        for (int i = 0; i < MR; ++i)                                                                          \
            for (int h = 0; h < 2; ++h) acc[i][h] = accumulate ? loadv(c + i * ldc + h * QVW) : (vf){0};      \
        for (int64_t e = 0; e < kc; ++e, wp += GEMM_NR, xp += MR) {                                           \
            __builtin_prefetch(xp + GEMM_AHEAD);                                                              \
            const vf w0 = loadv(wp), w1 = loadv(wp + QVW);                                                    \
            for (int i = 0; i < MR; ++i) {                                                                    \
                acc[i][0] += w0 * xp[i];                                                                      \
                acc[i][1] += w1 * xp[i];                                                                      \
            }                                                                                                 \
        }                                                                                                     \
        for (int i = 0; i < MR; ++i)                                                                          \
            for (int h = 0; h < 2; ++h) storev(c + i * ldc + h * QVW, acc[i][h]);                             \
    }
DEFINE_GEMM_MICRO(1)
DEFINE_GEMM_MICRO(2)
DEFINE_GEMM_MICRO(3)
DEFINE_GEMM_MICRO(4)
DEFINE_GEMM_MICRO(5)
DEFINE_GEMM_MICRO(6)
#if GEMM_MR == 12
DEFINE_GEMM_MICRO(7)
DEFINE_GEMM_MICRO(8)
DEFINE_GEMM_MICRO(9)
DEFINE_GEMM_MICRO(10)
DEFINE_GEMM_MICRO(11)
DEFINE_GEMM_MICRO(12)
#endif

typedef void (*gemm_micro_fn)(const float *, const float *, int64_t, float *, int64_t, int);
static const gemm_micro_fn GEMM_MICRO[GEMM_MR + 1] = {
    NULL, gemm_micro_1, gemm_micro_2, gemm_micro_3, gemm_micro_4, gemm_micro_5, gemm_micro_6,
#if GEMM_MR == 12
    gemm_micro_7, gemm_micro_8, gemm_micro_9, gemm_micro_10, gemm_micro_11, gemm_micro_12,
#endif
};

/* Chunks of k outermost, so that x's chunk (packed once, by all threads) stays in L2 while the threads split
 * the weight panels; y is summed over the chunks. Returns nonzero if scratch could not be allocated. */
static int matmul_gemm(const float *x, const uint8_t *wq, int qtype, int64_t m, int64_t n, int64_t k, float *y,
                       int64_t ldy, int num_threads)
{
    const int64_t be = BLOCK_ELEMS[qtype], nb = k / be, rb = nb * BLOCK_BYTES[qtype];
    const int64_t chunks = (k + GEMM_KC - 1) / GEMM_KC, per_chunk = (nb + chunks - 1) / chunks; /* in blocks */
    const int64_t kc_max = per_chunk * be, panels = (n + GEMM_NR - 1) / GEMM_NR;
    const int64_t row_panels = (m + GEMM_MR - 1) / GEMM_MR;
    float *xp = malloc((size_t)(row_panels * GEMM_MR * kc_max) * sizeof(float));
    if (xp == NULL) return 1;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (m * n * k >= PARALLEL_MIN)
    {
        float *wp = malloc((size_t)(GEMM_NR * kc_max + 8 * be) * sizeof(float)); /* then tmp: 8 blocks */
        float *tmp = wp + GEMM_NR * kc_max;
        if (wp == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        for (int64_t b0 = 0; b0 < nb; b0 += per_chunk) {
            const int64_t kc = (nb - b0 < per_chunk ? nb - b0 : per_chunk) * be, k0 = b0 * be;
#pragma omp for schedule(static)
            for (int64_t ip = 0; ip < row_panels; ++ip) { /* xp[ip][e][mr] = x[ip MR + i][k0 + e] */
                const int64_t i0 = ip * GEMM_MR, mr = m - i0 < GEMM_MR ? m - i0 : GEMM_MR;
                float *dst = xp + i0 * kc;
                for (int64_t e = 0; e < kc; ++e)
                    for (int64_t i = 0; i < mr; ++i) *dst++ = x[(i0 + i) * k + k0 + e];
            }
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; ++p) {
                if (wp == NULL) continue;
                const int64_t r0 = p * GEMM_NR, cols = n - r0 < GEMM_NR ? n - r0 : GEMM_NR;
                pack_panel(wq + r0 * rb, rb, cols, qtype, b0, kc / be, tmp, wp);
                for (int64_t i0 = 0; i0 < m; i0 += GEMM_MR) {
                    const int64_t mr = m - i0 < GEMM_MR ? m - i0 : GEMM_MR;
                    float *c = y + i0 * ldy + r0;
                    /* the next tile of y, summed over the chunks, is in L3 by now (a 5-10% stall at 512 rows) */
                    for (int64_t a = GEMM_MR; a < 2 * GEMM_MR && i0 + a < m; ++a)
                        for (int64_t h = 0; h < cols; h += 16) __builtin_prefetch(c + a * ldy + h, 1);
                    if (cols == GEMM_NR) {
                        GEMM_MICRO[mr](xp + i0 * kc, wp, kc, c, ldy, b0 > 0);
                        continue;
                    }
                    float part[GEMM_MR * GEMM_NR]; /* a short panel's outputs, copied in and out */
                    for (int64_t a = 0; a < mr && b0 > 0; ++a)
                        memcpy(part + a * GEMM_NR, c + a * ldy, (size_t)cols * sizeof(float));
                    GEMM_MICRO[mr](xp + i0 * kc, wp, kc, part, GEMM_NR, b0 > 0);
                    for (int64_t a = 0; a < mr; ++a)
                        memcpy(c + a * ldy, part + a * GEMM_NR, (size_t)cols * sizeof(float));
                }
            }
        }
        free(wp);
    }
    free(xp);
    return failed;
}

#else /* plain C */
#define TILE_MI 1
static const dequant_block_fn DEQUANT_TILE[NUM_TYPES] = {dequant_q8_0, dequant_q4_0, dequant_q4_1, dequant_q4_k,
                                                         dequant_q6_k, dequant_q5_0, dequant_q5_1};

static void tile_dot(const float *x, int64_t mi, int64_t k, const float *const w[4], float out[][4])
{
    (void)mi; /* always 1 */
    for (int c = 0; c < 4; ++c) {
        float s = 0.0f;
        for (int64_t e = 0; e < k; ++e) s += x[e] * w[c][e];
        out[0][c] = s;
    }
}
#endif

/* Tiles of TILE_ROWS weight rows, each widened into a thread's scratch (4 k floats: L1 or L2) and dotted with
 * every row of x, TILE_MI rows at a time. Returns nonzero if a thread's scratch could not be allocated. */
_Static_assert(TILE_ROWS == 4, "tile_dot takes 4 weight rows");
static int matmul_tiled(const float *x, const uint8_t *wq, int qtype, int64_t m, int64_t n, int64_t k, float *y,
                        int64_t ldy, int num_threads)
{
    const int64_t be = BLOCK_ELEMS[qtype], bb = BLOCK_BYTES[qtype], rb = k / be * bb;
    const dequant_block_fn dequant = DEQUANT_TILE[qtype];
    const int64_t tiles = (n + TILE_ROWS - 1) / TILE_ROWS;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (n * k >= PARALLEL_MIN)
    {
        float *buf = malloc((size_t)(TILE_ROWS * k) * sizeof(float));
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) {
            if (buf == NULL) continue;
            const int64_t r0 = t * TILE_ROWS, rows = n - r0 < TILE_ROWS ? n - r0 : TILE_ROWS;
            const float *w[TILE_ROWS];
            for (int64_t r = 0; r < TILE_ROWS; ++r) w[r] = buf + (r < rows ? r : 0) * k; /* a short tile repeats */
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t b = 0; b < k / be; ++b) dequant(wq + (r0 + r) * rb + b * bb, buf + r * k + b * be);
            for (int64_t i = 0; i < m; i += TILE_MI) {
                const int64_t mi = m - i < TILE_MI ? m - i : TILE_MI;
                float out[4][4]; /* TILE_MI rows, rounded up to even */
                tile_dot(x + i * k, mi, k, w, out);
                for (int64_t a = 0; a < mi; ++a)
                    for (int64_t r = 0; r < rows; ++r) y[(i + a) * ldy + r0 + r] = out[a][r];
            }
        }
        free(buf);
    }
    return failed;
}

/* ---- int8 activations (loraplex_quant_matmul_int8), as llama.cpp computes its CPU products ----
 *
 * Each row of x is quantized per group of 32 elements to int8 with a float16 scale, exactly as quantize_q8_0 in
 * kernels/quant.py (llama.cpp's Q8_0): d = max|x| / 127, q = round(x * (1 / d)), halves away from zero. A group's
 * product with the weight is an exact integer sum over the weight's integers (integer_groups in kernels/quant.py),
 * scaled in float32: y = sum over groups of dx (scale isum + low xsum).
 *
 * The vector paths decode a group of the weight into 32 unsigned bytes in a register (i8_decode) and sum its 32
 * products with each of up to 4 rows of x in int32 lanes, 4 bytes to a lane: vpdpbusd on AVX-512 VNNI (from 2 rows of
 * x, two groups a 512-bit vector) or AVX-VNNI, or vpmaddubsw then vpmaddwd on AVX2. All multiply unsigned bytes (the
 * weight) by signed bytes (x), so a weight with an offset (Q4_0's q - 8, Q5_0's - 16, Q6_K's - 32, and on VNNI Q8_0
 * read unsigned by flipping its sign bit: + 128) is multiplied unsigned and each lane starts from -offset times the
 * sum of its 4 x bytes, precomputed with x: the subtraction stays in exact integers. AVX2's 16-bit pair sums would
 * saturate on an unsigned Q8_0 byte (2 * 255 * 127), so there Q8_0 takes llama.cpp's sign trick instead (|w| times x
 * with w's sign). Q6_K's per-16 integer scales then multiply the int32 lanes (lanes 0-3 hold the first 16 elements).
 * The plain C path sums signed integers directly. */
#if defined(LORAPLEX_QUANT_SCALAR) || !defined(__AVX2__)
#define I8_PATH 0 /* plain C */
#elif !defined(LORAPLEX_QUANT_NO_VNNI) && defined(__AVX512VNNI__) && defined(__AVX512BW__) && QVW == 16
#define I8_PATH 3 /* vpdpbusd on 512-bit vectors */
#elif !defined(LORAPLEX_QUANT_NO_VNNI) && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
#define I8_PATH 2 /* vpdpbusd on 256-bit vectors */
#else
#define I8_PATH 1 /* AVX2: vpmaddubsw + vpmaddwd */
#endif
#if I8_PATH
#define I8_SCALAR_ONLY __attribute__((unused))
#else
#define I8_SCALAR_ONLY
#endif

typedef struct {   /* x quantized: row i, group g */
    int8_t *q;     /* [m][k] */
    float *d;      /* [m][groups]: the float16 scale, as float (the vector paths: [m][groups][8], repeated) */
    float *dsum;   /* [m][groups]: d * the sum of the group's q (for the weight's low term) */
    int32_t *bias; /* the vector paths: [m][groups][8]: -offset * the sum of each lane's 4 q */
    int32_t *gbias; /* the int8 GEMM (else NULL): [m][groups][2]: -offset * the sum of each half group's q */
} qx_t;

static inline float f16_round(float f) /* to the nearest float16 (ties to even), as torch's .to(float16) */
{
#if defined(__F16C__)
    return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
    return (float)(_Float16)f;
#endif
}

/* the weight's offset (see above): what the vector paths subtract from their unsigned products */
static int i8_offset(int qtype)
{
    switch (qtype) {
    case Q8_0: return I8_PATH >= 2 ? 128 : 0;
    case Q4_0: return 8;
    case Q5_0: return 16;
    case Q6_K: return 32;
    default: return 0;
    }
}

static inline int i8_has_low(int qtype) { return qtype == Q4_1 || qtype == Q5_1 || qtype == Q4_K; }

static void quantize_x(const float *x, int64_t m, int64_t k, int offset, const qx_t *a)
{
    const int64_t groups = k / 32;
    for (int64_t i = 0; i < m; ++i)
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
            const int64_t ig = i * groups + g;
            const float dh = f16_round(d);
            a->dsum[ig] = dh * (float)sum;
            if (a->gbias != NULL) {
                int half = 0;
                for (int e = 0; e < 16; ++e) half += q[e];
                a->gbias[2 * ig] = -offset * half, a->gbias[2 * ig + 1] = -offset * (sum - half);
            }
            if (a->bias == NULL) {
                a->d[ig] = dh;
                continue;
            }
            for (int l = 0; l < 8; ++l) {
                a->d[ig * 8 + l] = dh;
                a->bias[ig * 8 + l] = -offset * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
            }
        }
}

/* ---- plain C: a group's signed integers (Q6_K's scales folded in), its scale and low ---- */
I8_SCALAR_ONLY static void i8_group_scalar(int qtype, const uint8_t *row, int64_t g, int32_t q[32], float *scale,
                                           float *low)
{
    *low = 0.0f;
    const uint8_t *b;
    switch (qtype) {
    case Q8_0:
        b = row + g * 34;
        *scale = f16_to_f32(b);
        for (int e = 0; e < 32; ++e) q[e] = (int8_t)b[2 + e];
        return;
    case Q4_0:
    case Q4_1: {
        b = row + g * BLOCK_BYTES[qtype];
        const uint8_t *qs = b + (qtype == Q4_0 ? 2 : 4);
        *scale = f16_to_f32(b);
        for (int j = 0; j < 16; ++j) q[j] = qs[j] & 15, q[j + 16] = qs[j] >> 4;
        if (qtype == Q4_0)
            for (int e = 0; e < 32; ++e) q[e] -= 8;
        else
            *low = f16_to_f32(b + 2);
        return;
    }
    case Q5_0:
    case Q5_1: {
        b = row + g * BLOCK_BYTES[qtype];
        const uint8_t *qh = b + (qtype == Q5_0 ? 2 : 4), *qs = qh + 4;
        const uint32_t bits = load_u32(qh);
        *scale = f16_to_f32(b);
        for (int j = 0; j < 16; ++j) {
            q[j] = (qs[j] & 15) | (int)((bits >> j & 1) << 4);
            q[j + 16] = (qs[j] >> 4) | (int)((bits >> (j + 16) & 1) << 4);
        }
        if (qtype == Q5_0)
            for (int e = 0; e < 32; ++e) q[e] -= 16;
        else
            *low = f16_to_f32(b + 2);
        return;
    }
    case Q4_K: {
        b = row + g / 8 * 144;
        const int s = (int)(g % 8);
        int sc, mn;
        q4_k_scale_min(b + 4, s, &sc, &mn);
        *scale = f16_to_f32(b) * (float)sc;
        *low = -(f16_to_f32(b + 2) * (float)mn);
        for (int l = 0; l < 32; ++l) q[l] = (b[16 + 32 * (s / 2) + l] >> (4 * (s & 1))) & 15;
        return;
    }
    default: { /* Q6_K: group g % 8 = 4 h + s holds elements 128 h + 32 s + l (layout: dequant_q6_k) */
        b = row + g / 8 * 210;
        const int h = (int)(g % 8) / 4, s = (int)(g % 4);
        *scale = f16_to_f32(b + 208);
        for (int l = 0; l < 32; ++l) {
            const int lo = (b[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15;
            const int hi = (b[128 + 32 * h + l] >> (2 * s)) & 3;
            q[l] = ((lo | (hi << 4)) - 32) * (int8_t)b[192 + 8 * h + 2 * s + l / 16];
        }
        return;
    }
    }
}

I8_SCALAR_ONLY static void i8_row_scalar(int qtype, const uint8_t *row, int64_t groups, const qx_t *a, int64_t m,
                                         int64_t k, float *y, int64_t ldy)
{
    for (int64_t i = 0; i < m; ++i) y[i * ldy] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
        int32_t q[32];
        float scale, low;
        i8_group_scalar(qtype, row, g, q, &scale, &low);
        for (int64_t i = 0; i < m; ++i) {
            const int8_t *xq = a->q + i * k + g * 32;
            int32_t isum = 0;
            for (int e = 0; e < 32; ++e) isum += q[e] * xq[e];
            y[i * ldy] += scale * a->d[i * groups + g] * (float)isum + low * a->dsum[i * groups + g];
        }
    }
}

#if I8_PATH
/* ---- vectors: a group of the weight as 32 unsigned bytes in a register, its products with up to 4 rows of x ---- */
static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static inline __m256i nibbles32(const uint8_t *qs) /* 16 bytes -> 32: low nibbles (elements 0-15), high ones */
{
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
}

static inline __m256i fifth_bits32(const uint8_t *qh) /* bit e of the little-endian uint32 -> 16 in byte e */
{
    const uint32_t bits = load_u32(qh);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8((__mmask32)bits, _mm256_set1_epi8(16));
#else /* byte e gets byte e / 8 of bits, then all its bits but e % 8 set: all ones iff bit e was set */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0));
    const __m256i all = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(all, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16));
#endif
}

static inline __m256i low_bits(__m256i v, int shift, int mask) /* (v >> shift) & mask, bytewise */
{
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8((char)mask));
}

typedef struct {
    __m256i u;    /* the integers as unsigned bytes (AVX2's Q8_0: signed) */
    float scale, low;
    __m256i lane; /* Q6_K: the per-16 scales of lanes 0-3 and 4-7 */
} i8_group;

/* the K formats' scales and lows of a super-block's 8 groups, decoded once for them */
typedef struct {
    float scale[8], low[8];
} i8_super;

static inline void i8_decode_super(int qtype, const uint8_t *row, int64_t sb, i8_super *o)
{
    if (qtype != Q4_K) return;
    /* the 8 6-bit scales into bytes 0-7 of t, the mins into 8-15, 4 bytes at a time (q4_k_scale_min's layout) */
    const uint8_t *b = row + sb * 144;
    uint32_t s[3], t[4];
    memcpy(s, b + 4, sizeof s);
    t[0] = s[0] & 0x3f3f3f3f;
    t[1] = (s[2] & 0x0f0f0f0f) | ((s[0] >> 6) & 0x03030303) << 4;
    t[2] = s[1] & 0x3f3f3f3f;
    t[3] = ((s[2] >> 4) & 0x0f0f0f0f) | ((s[1] >> 6) & 0x03030303) << 4;
    const __m128i bytes = _mm_loadu_si128((const __m128i *)t);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    _mm256_storeu_ps(o->scale, _mm256_mul_ps(sc, _mm256_set1_ps(f16_to_f32(b))));
    const __m256 low = _mm256_mul_ps(mn, _mm256_set1_ps(f16_to_f32(b + 2)));
    _mm256_storeu_ps(o->low, _mm256_sub_ps(_mm256_setzero_ps(), low));
}

/* b: the group's block (the 32-element formats), or its super-block with s the group in it (the K formats) */
static inline __attribute__((always_inline)) void i8_decode(const int qtype, const uint8_t *b, int s,
                                                            const i8_super *sup, i8_group *o)
{
    o->low = 0.0f;
    switch (qtype) {
    case Q8_0:
        o->scale = f16_to_f32(b), o->u = load256(b + 2);
        if (I8_PATH >= 2) o->u = _mm256_xor_si256(o->u, _mm256_set1_epi8(-128)); /* w + 128 */
        return;
    case Q4_0: o->scale = f16_to_f32(b), o->u = nibbles32(b + 2); return;
    case Q4_1: o->scale = f16_to_f32(b), o->low = f16_to_f32(b + 2), o->u = nibbles32(b + 4); return;
    case Q5_0: o->scale = f16_to_f32(b), o->u = _mm256_or_si256(nibbles32(b + 6), fifth_bits32(b + 2)); return;
    case Q5_1:
        o->scale = f16_to_f32(b), o->low = f16_to_f32(b + 2);
        o->u = _mm256_or_si256(nibbles32(b + 8), fifth_bits32(b + 4));
        return;
    case Q4_K:
        o->scale = sup->scale[s], o->low = sup->low[s];
        o->u = low_bits(load256(b + 16 + 32 * (s / 2)), 4 * (s & 1), 15);
        return;
    default: { /* Q6_K (layout: i8_group_scalar) */
        const int h = s / 4, t = s % 4;
        const __m256i hi = low_bits(load256(b + 128 + 32 * h), 2 * t, 3);
        o->u = _mm256_or_si256(low_bits(load256(b + 64 * h + 32 * (t & 1)), 4 * (t >> 1), 15),
                               _mm256_slli_epi16(hi, 4));
        o->scale = f16_to_f32(b + 208);
        uint16_t pair;
        memcpy(&pair, b + 192 + 8 * h + 2 * t, sizeof pair); /* its two int8 scales */
        const __m128i sc = _mm_cvtsi32_si128(pair);
        o->lane = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(sc, _mm_set_epi32(0, 0, 0x01010101, 0)));
        return;
    }
    }
}

/* acc + the lanes' sums of u (unsigned) times x (signed), 4 bytes to a lane */
static inline __m256i dot_u8_s8(__m256i acc, __m256i u, __m256i x)
{
#if I8_PATH >= 2 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, x);
#elif I8_PATH >= 2
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else /* pairs of products: at most 2 * 63 * 127 or 2 * 128 * 127, within int16 */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

/* sum + a decoded group's products with one row of x (xq: its group; ig: its index in a), in float lanes */
static inline __attribute__((always_inline)) __m256 i8_group_dot(const int qtype, __m256 sum, const i8_group *w,
                                                                 const qx_t *a, const int8_t *xq, int64_t ig)
{
    const __m256i x = load256(xq);
    __m256i acc;
    if (qtype == Q8_0 && I8_PATH == 1) /* the sign trick */
        acc = dot_u8_s8(_mm256_setzero_si256(), _mm256_sign_epi8(w->u, w->u), _mm256_sign_epi8(x, w->u));
    else
        acc = dot_u8_s8(i8_offset(qtype) ? load256(a->bias + ig * 8) : _mm256_setzero_si256(), w->u, x);
    if (qtype == Q6_K) acc = _mm256_mullo_epi32(acc, w->lane);
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(w->scale), _mm256_loadu_ps(a->d + ig * 8));
    return _mm256_add_ps(sum, _mm256_mul_ps(_mm256_cvtepi32_ps(acc), scale));
}

static inline float hsum256(__m256 v)
{
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* f[j] (float lanes) and low[j] + a decoded group's products with rows i0 + j of x, j < MJ */
static inline __attribute__((always_inline)) void i8_step(const int qtype, const int MJ, const i8_group *w,
                                                          const qx_t *a, int64_t i0, int64_t groups, int64_t k,
                                                          int64_t g, __m256 f[], float low[])
{
    for (int j = 0; j < MJ; ++j) {
        const int64_t ig = (i0 + j) * groups + g;
        f[j] = i8_group_dot(qtype, f[j], w, a, a->q + (i0 + j) * k + g * 32, ig);
        if (i8_has_low(qtype)) low[j] += w->low * a->dsum[ig];
    }
}

#if I8_PATH == 3
/* the same for groups g and g + 1 in one 512-bit vector (their bytes, x's and its precomputed lanes lie side by
 * side); for one row of x the joining costs what it saves, so only from two rows */
static inline __attribute__((always_inline)) void i8_step2(const int qtype, const int MJ, const i8_group *w0,
                                                           const i8_group *w1, const qx_t *a, int64_t i0,
                                                           int64_t groups, int64_t k, int64_t g, __m512 f[],
                                                           float low[])
{
    const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(w0->u), w1->u, 1);
    const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(w0->scale), _mm256_set1_ps(w1->scale), 1);
    const __m512i lane = qtype == Q6_K ? _mm512_inserti64x4(_mm512_castsi256_si512(w0->lane), w1->lane, 1)
                                       : _mm512_setzero_si512();
    for (int j = 0; j < MJ; ++j) {
        const int64_t ig = (i0 + j) * groups + g;
        __m512i acc = i8_offset(qtype) ? _mm512_loadu_si512(a->bias + ig * 8) : _mm512_setzero_si512();
        acc = _mm512_dpbusd_epi32(acc, u, _mm512_loadu_si512(a->q + (i0 + j) * k + g * 32));
        if (qtype == Q6_K) acc = _mm512_mullo_epi32(acc, lane);
        const __m512 dx = _mm512_loadu_ps(a->d + ig * 8);
        f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(scale, dx), f[j]);
        if (i8_has_low(qtype)) low[j] += w0->low * a->dsum[ig] + w1->low * a->dsum[ig + 1];
    }
}
#define I8_PAIRS(MJ) ((MJ) > 1)
#else
#define I8_PAIRS(MJ) 0
#endif

/* y[j * ldy] = row . x[i0 + j] for MJ rows of x (compile-time: the sums stay in registers). A K format's
 * super-block is unrolled, so that its groups' shifts and offsets are constants (40% faster). */
static inline __attribute__((always_inline)) void i8_rows(const int qtype, const int MJ, const uint8_t *row,
                                                          int64_t groups, const qx_t *a, int64_t i0, int64_t k,
                                                          float *y, int64_t ldy)
{
    const int64_t bb = BLOCK_BYTES[qtype];
    __m256 f[4];
    float low[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < MJ; ++j) f[j] = _mm256_setzero_ps();
#if I8_PATH == 3
    __m512 f2[4];
    for (int j = 0; j < MJ; ++j) f2[j] = _mm512_setzero_ps();
#define I8_STEP2(w0, w1, g) i8_step2(qtype, MJ, w0, w1, a, i0, groups, k, g, f2, low)
#else
#define I8_STEP2(w0, w1, g) (void)0
#endif
    i8_group w, w1;
    i8_super sup;
    if (qtype == Q4_K || qtype == Q6_K) {
        for (int64_t g = 0; g < groups; g += 8) {
            const uint8_t *b = row + g / 8 * bb;
            i8_decode_super(qtype, row, g / 8, &sup);
            if (I8_PAIRS(MJ)) {
#pragma GCC unroll 4
                for (int s = 0; s < 8; s += 2) {
                    i8_decode(qtype, b, s, &sup, &w), i8_decode(qtype, b, s + 1, &sup, &w1);
                    I8_STEP2(&w, &w1, g + s);
                }
            } else {
#pragma GCC unroll 8
                for (int s = 0; s < 8; ++s) {
                    i8_decode(qtype, b, s, &sup, &w);
                    i8_step(qtype, MJ, &w, a, i0, groups, k, g + s, f, low);
                }
            }
        }
    } else {
        int64_t g = 0;
        if (I8_PAIRS(MJ))
            for (; g + 2 <= groups; g += 2) {
                i8_decode(qtype, row + g * bb, 0, &sup, &w), i8_decode(qtype, row + (g + 1) * bb, 0, &sup, &w1);
                I8_STEP2(&w, &w1, g);
            }
        for (; g < groups; ++g) {
            i8_decode(qtype, row + g * bb, 0, &sup, &w);
            i8_step(qtype, MJ, &w, a, i0, groups, k, g, f, low);
        }
    }
#undef I8_STEP2
#if I8_PATH == 3
    for (int j = 0; j < MJ; ++j)
        f[j] = _mm256_add_ps(f[j], _mm256_add_ps(_mm512_castps512_ps256(f2[j]), _mm512_extractf32x8_ps(f2[j], 1)));
#endif
    for (int j = 0; j < MJ; ++j) y[j * ldy] = hsum256(f[j]) + low[j];
}

#define DEFINE_I8_ROW(T)                                                                                      \
    static void i8_row_##T(const uint8_t *row, int64_t groups, const qx_t *a, int64_t m, int64_t k, float *y, \
                           int64_t ldy)                                                                       \
    {                                                                                                         \
        int64_t i = 0;                                                                                        \
        for (; i + 4 <= m; i += 4) i8_rows(T, 4, row, groups, a, i, k, y + i * ldy, ldy);                     \
        switch (m - i) {                                                                                      \
        case 3: i8_rows(T, 3, row, groups, a, i, k, y + i * ldy, ldy); break;                                 \
        case 2: i8_rows(T, 2, row, groups, a, i, k, y + i * ldy, ldy); break;                                 \
        case 1: i8_rows(T, 1, row, groups, a, i, k, y + i * ldy, ldy); break;                                 \
        default: break;                                                                                       \
        }                                                                                                     \
    }
DEFINE_I8_ROW(Q8_0)
DEFINE_I8_ROW(Q4_0)
DEFINE_I8_ROW(Q4_1)
DEFINE_I8_ROW(Q4_K)
DEFINE_I8_ROW(Q6_K)
DEFINE_I8_ROW(Q5_0)
DEFINE_I8_ROW(Q5_1)
typedef void (*i8_row_fn)(const uint8_t *, int64_t, const qx_t *, int64_t, int64_t, float *, int64_t);
static const i8_row_fn I8_ROW[NUM_TYPES] = {i8_row_Q8_0, i8_row_Q4_0, i8_row_Q4_1, i8_row_Q4_K,
                                            i8_row_Q6_K, i8_row_Q5_0, i8_row_Q5_1};
#endif

#if I8_PATH == 3
/* ---- int8 GEMM (from I8_GEMM_MIN_M rows of x: decode batches, prefill chunks), lanes over output columns ----
 *
 * The row kernels above sum each group of a weight row in the lanes of one vector, then convert, scale and add
 * per row of x: 3-4 vector operations for each vpdpbusd, and the weight row is decoded again for every 4 rows of
 * x, so from a few rows they are bound by that overhead, not by the integer products. Here a thread decodes a
 * panel of I8G_NC weight rows (output columns) once per call into unsigned bytes laid out for vpdpbusd: for each
 * group and each 4 elements ("quad") of it, the panel's columns side by side (32 columns: two 512-bit vectors).
 * A quad of a row of x is broadcast to every lane, so one vpdpbusd adds 4 products to each of 16 columns' sums;
 * a group's 8 quads give each (row of x, column) its exact integer sum of 32 products, converted and scaled once
 * per group: y += dw dx isum (+ low dsum). A weight with an offset (see i8_offset) starts each sum at -offset times
 * the sum of x's integers it multiplies (gbias), which keeps it exact. Q6_K's integer scales change every 16
 * elements, so its groups are summed and scaled in halves of 4 quads (d times the half's scale). I8G_MR rows of
 * x by 32 columns stay in registers (8 integer and 8 float sums). */
enum {
    I8G_NC = 32,        /* columns of a panel (two vectors) */
    I8G_MR = 4,         /* rows of x a tile holds in registers (4 x 2 x 2 sums + weights and scales: ~24 of 32) */
    I8_GEMM_MIN_M = 8,  /* rows of x from which the GEMM runs (bench/quant_matmul.py) */
};

typedef struct {
    uint32_t *q; /* [groups][8][I8G_NC]: quad t of the group, for each column */
    float *d;    /* [groups][subs][I8G_NC]: the weight's scale of each column's group (Q6_K: half group) */
    float *low;  /* [groups][I8G_NC]: its low (Q4_1, Q5_1: m; Q4_K: -dmin min), else 0 */
} i8_panel;

/* the 8 x 8 transpose of 32-bit words: r[c] holds column c's 8 quads; after, r[t] holds quad t of 8 columns */
static inline void transpose8_epi32(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

/* decodes columns c0 .. c0 + nc - 1 of the weight into the panel (columns from nc on: zero) */
static void i8_pack_panel(int qtype, const uint8_t *wq, int64_t rb, int64_t c0, int64_t nc, int64_t groups,
                          i8_panel *p)
{
    const int64_t bb = BLOCK_BYTES[qtype], subs = qtype == Q6_K ? 2 : 1;
    const int ksuper = qtype == Q4_K || qtype == Q6_K;
    for (int64_t c8 = 0; c8 < I8G_NC; c8 += 8) {
        i8_super sup[8];
        for (int64_t g = 0; g < groups; ++g) {
            __m256i r[8];
            float *d = p->d + g * subs * I8G_NC, *low = p->low + g * I8G_NC;
            for (int c = 0; c < 8; ++c) {
                const int64_t col = c8 + c;
                if (col >= nc) {
                    r[c] = _mm256_setzero_si256();
                    for (int64_t h = 0; h < subs; ++h) d[h * I8G_NC + col] = 0.0f;
                    low[col] = 0.0f;
                    continue;
                }
                const uint8_t *row = wq + (c0 + col) * rb;
                const uint8_t *b = ksuper ? row + g / 8 * bb : row + g * bb;
                const int s = ksuper ? (int)(g % 8) : 0;
                i8_group w;
                if (ksuper && s == 0) i8_decode_super(qtype, row, g / 8, &sup[c]);
                i8_decode(qtype, b, s, &sup[c], &w);
                r[c] = w.u;
                low[col] = w.low;
                if (qtype == Q6_K) { /* the half groups' int8 scales (layout: i8_group_scalar) */
                    const int8_t *sc = (const int8_t *)b + 192 + 8 * (s / 4) + 2 * (s % 4);
                    d[col] = w.scale * (float)sc[0], d[I8G_NC + col] = w.scale * (float)sc[1];
                } else {
                    d[col] = w.scale;
                }
            }
            transpose8_epi32(r);
            for (int t = 0; t < 8; ++t) _mm256_storeu_si256((__m256i *)(p->q + (g * 8 + t) * I8G_NC + c8), r[t]);
        }
    }
}

/* y[i][0 .. nc) for MR rows of x from i0 (compile-time MR: the sums stay in registers); LOW: the weight has a low
 * term, OFF: an offset, SUBS: 2 where a group is scaled in halves (Q6_K) */
static inline __attribute__((always_inline)) void i8_gemm_tile(const int MR, const int LOW, const int OFF,
                                                               const int SUBS, const i8_panel *p, const qx_t *a,
                                                               int64_t i0, int64_t groups, int64_t k, float *y,
                                                               int64_t ldy, int64_t nc)
{
    __m512 f[I8G_MR][2];
    for (int r = 0; r < MR; ++r) f[r][0] = f[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        for (int h = 0; h < SUBS; ++h) {
            __m512i acc[I8G_MR][2];
            for (int r = 0; r < MR; ++r) {
                const int32_t *gb = a->gbias + 2 * ((i0 + r) * groups + g);
                acc[r][0] = acc[r][1] = !OFF      ? _mm512_setzero_si512()
                                        : SUBS == 2 ? _mm512_set1_epi32(gb[h])
                                                    : _mm512_set1_epi32(gb[0] + gb[1]);
            }
            const int t0 = h * 8 / SUBS;
#pragma GCC unroll 8
            for (int t = t0; t < t0 + 8 / SUBS; ++t) {
                const uint32_t *qt = p->q + (g * 8 + t) * I8G_NC;
                const __m512i w0 = _mm512_loadu_si512(qt), w1 = _mm512_loadu_si512(qt + 16);
                for (int r = 0; r < MR; ++r) {
                    int32_t quad;
                    memcpy(&quad, a->q + (i0 + r) * k + g * 32 + 4 * t, sizeof quad);
                    const __m512i xb = _mm512_set1_epi32(quad);
                    acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, xb);
                    acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, xb);
                }
            }
            const float *dg = p->d + (g * SUBS + h) * I8G_NC;
            const __m512 d0 = _mm512_loadu_ps(dg), d1 = _mm512_loadu_ps(dg + 16);
            for (int r = 0; r < MR; ++r) {
                const __m512 dx = _mm512_set1_ps(a->d[((i0 + r) * groups + g) * 8]);
                f[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), _mm512_mul_ps(d0, dx), f[r][0]);
                f[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), _mm512_mul_ps(d1, dx), f[r][1]);
            }
        }
        if (LOW) {
            const __m512 l0 = _mm512_loadu_ps(p->low + g * I8G_NC), l1 = _mm512_loadu_ps(p->low + g * I8G_NC + 16);
            for (int r = 0; r < MR; ++r) {
                const __m512 ds = _mm512_set1_ps(a->dsum[(i0 + r) * groups + g]);
                f[r][0] = _mm512_fmadd_ps(l0, ds, f[r][0]);
                f[r][1] = _mm512_fmadd_ps(l1, ds, f[r][1]);
            }
        }
    }
    const __mmask16 m0 = nc >= 16 ? 0xffff : (__mmask16)((1u << nc) - 1);
    const __mmask16 m1 = nc >= 32 ? 0xffff : nc <= 16 ? 0 : (__mmask16)((1u << (nc - 16)) - 1);
    for (int r = 0; r < MR; ++r) {
        _mm512_mask_storeu_ps(y + (i0 + r) * ldy, m0, f[r][0]);
        _mm512_mask_storeu_ps(y + (i0 + r) * ldy + 16, m1, f[r][1]);
    }
}

#define DEFINE_I8_GEMM_ROWS(NAME, LOW, OFF, SUBS)                                                             \
    static void NAME(const i8_panel *p, const qx_t *a, int64_t m, int64_t groups, int64_t k, float *y,        \
                     int64_t ldy, int64_t nc)                                                                 \
    {                                                                                                         \
        int64_t i = 0;                                                                                        \
        for (; i + I8G_MR <= m; i += I8G_MR)                                                                  \
            i8_gemm_tile(I8G_MR, LOW, OFF, SUBS, p, a, i, groups, k, y, ldy, nc);                             \
        switch (m - i) {                                                                                      \
        case 3: i8_gemm_tile(3, LOW, OFF, SUBS, p, a, i, groups, k, y, ldy, nc); break;                       \
        case 2: i8_gemm_tile(2, LOW, OFF, SUBS, p, a, i, groups, k, y, ldy, nc); break;                       \
        case 1: i8_gemm_tile(1, LOW, OFF, SUBS, p, a, i, groups, k, y, ldy, nc); break;                       \
        default: break;                                                                                       \
        }                                                                                                     \
    }
DEFINE_I8_GEMM_ROWS(i8_gemm_rows_plain, 0, 0, 1)
DEFINE_I8_GEMM_ROWS(i8_gemm_rows_low, 1, 0, 1)
DEFINE_I8_GEMM_ROWS(i8_gemm_rows_offset, 0, 1, 1)
DEFINE_I8_GEMM_ROWS(i8_gemm_rows_halves, 0, 1, 2)

/* Threads split the panels; each decodes its panel once and multiplies it with every row of x. Returns nonzero
 * if scratch could not be allocated. */
static int i8_gemm(int qtype, const uint8_t *wq, int64_t m, int64_t n, int64_t k, const qx_t *a, float *y,
                   int64_t ldy, int num_threads)
{
    const int64_t groups = k / 32, rb = k / BLOCK_ELEMS[qtype] * BLOCK_BYTES[qtype];
    const int64_t panels = (n + I8G_NC - 1) / I8G_NC;
    void (*rows)(const i8_panel *, const qx_t *, int64_t, int64_t, int64_t, float *, int64_t, int64_t) =
        qtype == Q6_K         ? i8_gemm_rows_halves
        : i8_offset(qtype)    ? i8_gemm_rows_offset
        : i8_has_low(qtype)   ? i8_gemm_rows_low
                              : i8_gemm_rows_plain;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) if (m * n * k >= PARALLEL_MIN)
    {
        const size_t quads = (size_t)(groups * 8 * I8G_NC) * sizeof(uint32_t);
        uint8_t *scratch = malloc(quads + 3 * (size_t)(groups * I8G_NC) * sizeof(float)); /* q, d (2), low */
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        float *scales = (float *)(scratch + quads);
        i8_panel p = {(uint32_t *)scratch, scales, scales + 2 * groups * I8G_NC};
#pragma omp for schedule(static)
        for (int64_t pi = 0; pi < panels; ++pi) {
            if (scratch == NULL) continue;
            const int64_t c0 = pi * I8G_NC, nc = n - c0 < I8G_NC ? n - c0 : I8G_NC;
            i8_pack_panel(qtype, wq, rb, c0, nc, groups, &p);
            rows(&p, a, m, groups, k, y + c0, ldy, nc);
        }
        free(scratch);
    }
    return failed;
}
#endif

/* x quantized into fresh scratch (a's arrays point into it; the caller frees it), or NULL */
static float *quantized_x(const float *x, int64_t m, int64_t k, int qtype, qx_t *a)
{
    const int64_t groups = k / 32;
    const int vector = I8_PATH != 0, per_group = vector ? 19 : 2; /* a group: d (8 or 1), dsum, bias (8), gbias (2) */
    float *scratch = malloc((size_t)(m * groups * per_group) * sizeof(float) + (size_t)(m * k));
    if (scratch == NULL) return NULL;
    *a = (qx_t){
        .d = scratch,
        .dsum = scratch + m * groups * (vector ? 8 : 1),
        .bias = vector ? (int32_t *)(scratch + m * groups * 9) : NULL,
        .gbias = vector ? (int32_t *)(scratch + m * groups * 17) : NULL,
        .q = (int8_t *)(scratch + m * groups * per_group),
    };
    quantize_x(x, m, k, i8_offset(qtype), a);
    return scratch;
}

/* Threads split the weight rows; a row is read once for every 4 rows of x (from I8_GEMM_MIN_M rows on 512-bit
 * VNNI, the int8 GEMM). Returns nonzero if scratch could not be allocated. */
static int matmul_int8(const float *x, const uint8_t *wq, int qtype, int64_t m, int64_t n, int64_t k, float *y,
                       int64_t ldy, int num_threads)
{
    const int64_t groups = k / 32, rb = k / BLOCK_ELEMS[qtype] * BLOCK_BYTES[qtype];
    qx_t a;
    float *scratch = quantized_x(x, m, k, qtype, &a);
    if (scratch == NULL) return 1;
#if I8_PATH == 3
    if (m >= I8_GEMM_MIN_M) {
        const int failed = i8_gemm(qtype, wq, m, n, k, &a, y, ldy, num_threads);
        free(scratch);
        return failed;
    }
#endif
#if I8_PATH
    const i8_row_fn row_fn = I8_ROW[qtype];
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n * k >= PARALLEL_MIN)
    for (int64_t r = 0; r < n; ++r) row_fn(wq + r * rb, groups, &a, m, k, y + r, ldy);
#else
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n * k >= PARALLEL_MIN)
    for (int64_t r = 0; r < n; ++r) i8_row_scalar(qtype, wq + r * rb, groups, &a, m, k, y + r, ldy);
#endif
    free(scratch);
    return 0;
}

/* ---- int8 activations on interleaved weights (loraplex_quant_matmul_int8_x16; 512-bit VNNI builds) ----
 *
 * The row kernels spend most of their work on a group's scales, once per weight row; here each group's scaling is
 * one vector operation for 16 weight rows. kernels/quant.py's interleave_x16 lays a Q8_0, Q4_0 or Q4_1 weight out
 * in panels of 16 rows (output columns), group after group, each panel-group the same bytes as its 16 blocks:
 *   d: the 16 rows' float16 scales (32 B); Q4_1: then their m (32 B);
 *   then the quants as 32-bit words, word t of the 16 rows side by side (64 B a word): Q8_0's 8 words (elements
 *   4t .. 4t + 3), the 4-bit formats' 4 words of nibbles (the low nibbles elements 4t .. 4t + 3, the high ones
 *   16 + 4t .. 16 + 4t + 3: the block's own bytes, so a word splits into two quads with a shift and a mask).
 * So a panel-group is 8 unsigned quad vectors for vpdpbusd against x's broadcast quads, with no decoding per call
 * and no packing (the int8 GEMM's panels, decoded once a call, are this layout's unpacked form). Each tile
 * unpacks a panel-group once for up to I8G_MR rows of x. */
static int x16_supported(int qtype) { return qtype == Q8_0 || qtype == Q4_0 || qtype == Q4_1; }

#if I8_PATH == 3
/* y[i][0 .. 16 NP) for MR rows of x from i0 and NP panels (1 or 2) from `panel` (compile-time MR and NP: the
 * sums stay in registers). A quant word is unpacked once for every row of x; 2 panels give even a lone row two
 * independent chains of vpdpbusd. */
static inline __attribute__((always_inline)) void x16_tile(const int qtype, const int MR, const int NP,
                                                           const uint8_t *panel, int64_t pb, int64_t groups,
                                                           const qx_t *a, int64_t i0, int64_t k, float *y,
                                                           int64_t ldy)
{
    const int64_t pg = 16 * BLOCK_BYTES[qtype];
    const int off = i8_offset(qtype), q4 = qtype != Q8_0, words = q4 ? 4 : 8;
    const int64_t qs = qtype == Q4_1 ? 64 : 32; /* where the quant words start in a panel-group */
    __m512 f[I8G_MR][2];
    for (int r = 0; r < MR; ++r)
        for (int p = 0; p < NP; ++p) f[r][p] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *b[2] = {panel + g * pg, panel + pb + g * pg};
        __m512i acc[I8G_MR][2];
        for (int r = 0; r < MR; ++r) {
            const int64_t ig = (i0 + r) * groups + g;
            const __m512i init =
                off ? _mm512_set1_epi32(a->gbias[2 * ig] + a->gbias[2 * ig + 1]) : _mm512_setzero_si512();
            for (int p = 0; p < NP; ++p) acc[r][p] = init;
        }
#pragma GCC unroll 8
        for (int t = 0; t < words; ++t) {
            __m512i lo[2], hi[2];
            for (int p = 0; p < NP; ++p) {
                const __m512i v = _mm512_loadu_si512(b[p] + qs + 64 * t);
                if (q4) {
                    lo[p] = _mm512_and_si512(v, _mm512_set1_epi8(15));
                    hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15));
                } else {
                    lo[p] = _mm512_xor_si512(v, _mm512_set1_epi8(-128)); /* w + 128 (i8_offset) */
                }
            }
            for (int r = 0; r < MR; ++r) {
                const int8_t *xq = a->q + (i0 + r) * k + g * 32;
                int32_t xlo, xhi; /* x's quads t and (nibble formats) t + 4, the high nibbles' elements */
                memcpy(&xlo, xq + 4 * t, sizeof xlo);
                const __m512i blo = _mm512_set1_epi32(xlo);
                for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], lo[p], blo);
                if (q4) {
                    memcpy(&xhi, xq + 16 + 4 * t, sizeof xhi);
                    const __m512i bhi = _mm512_set1_epi32(xhi);
                    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], hi[p], bhi);
                }
            }
        }
        for (int p = 0; p < NP; ++p) {
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b[p]));
            const __m512 low =
                qtype == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b[p] + 32))) : d;
            for (int r = 0; r < MR; ++r) {
                const int64_t ig = (i0 + r) * groups + g;
                const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a->d[ig * 8]));
                f[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][p]), scale, f[r][p]);
                if (qtype == Q4_1) f[r][p] = _mm512_fmadd_ps(low, _mm512_set1_ps(a->dsum[ig]), f[r][p]);
            }
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int p = 0; p < NP; ++p) _mm512_storeu_ps(y + (i0 + r) * ldy + 16 * p, f[r][p]);
}

/* rows of x in tiles of I8G_MR (then 1-3), for NP panels */
#define X16_ROWS_BODY(T, NP)                                                                                  \
    do {                                                                                                      \
        int64_t i = 0;                                                                                        \
        for (; i + I8G_MR <= m; i += I8G_MR) x16_tile(T, I8G_MR, NP, panel, pb, groups, a, i, k, y, ldy);    \
        switch (m - i) {                                                                                      \
        case 3: x16_tile(T, 3, NP, panel, pb, groups, a, i, k, y, ldy); break;                                \
        case 2: x16_tile(T, 2, NP, panel, pb, groups, a, i, k, y, ldy); break;                                \
        case 1: x16_tile(T, 1, NP, panel, pb, groups, a, i, k, y, ldy); break;                                \
        default: break;                                                                                       \
        }                                                                                                     \
    } while (0)
#define DEFINE_X16_ROWS(T)                                                                                    \
    static void x16_rows_##T(const uint8_t *panel, int64_t pb, int np, int64_t groups, const qx_t *a,         \
                             int64_t m, int64_t k, float *y, int64_t ldy)                                     \
    {                                                                                                         \
        if (np == 2)                                                                                          \
            X16_ROWS_BODY(T, 2);                                                                              \
        else                                                                                                  \
            X16_ROWS_BODY(T, 1);                                                                              \
    }
DEFINE_X16_ROWS(Q8_0)
DEFINE_X16_ROWS(Q4_0)
DEFINE_X16_ROWS(Q4_1)
#endif

/* Threads split the panels. Returns 3 where this build or format has no interleaved kernel (n not a multiple of
 * 16, another format, or no 512-bit VNNI), 1 if scratch could not be allocated. */
static int matmul_int8_x16(const float *x, const uint8_t *wq, int qtype, int64_t m, int64_t n, int64_t k, float *y,
                           int64_t ldy, int num_threads)
{
#if I8_PATH == 3
    if (!x16_supported(qtype) || n % 16 != 0) return 3;
    const int64_t groups = k / 32, pb = groups * 16 * BLOCK_BYTES[qtype]; /* bytes a panel */
    void (*rows)(const uint8_t *, int64_t, int, int64_t, const qx_t *, int64_t, int64_t, float *, int64_t) =
        qtype == Q8_0 ? x16_rows_Q8_0 : qtype == Q4_0 ? x16_rows_Q4_0 : x16_rows_Q4_1;
    qx_t a;
    float *scratch = quantized_x(x, m, k, qtype, &a);
    if (scratch == NULL) return 1;
    const int64_t pairs = (n / 16 + 1) / 2; /* two panels a tile (the last alone where the count is odd) */
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n * k >= PARALLEL_MIN)
    for (int64_t j = 0; j < pairs; ++j) {
        const int np = 2 * j + 1 < n / 16 ? 2 : 1;
        rows(wq + 2 * j * pb, pb, np, groups, &a, m, k, y + 32 * j, ldy);
    }
    free(scratch);
    return 0;
#else
    (void)x, (void)wq, (void)qtype, (void)m, (void)n, (void)k, (void)y, (void)ldy, (void)num_threads;
    return 3;
#endif
}

/* 16 where the AVX-512 vectors are built, 8 for the 8-float ones, 0 for the plain C build */
int loraplex_quant_vector_width(void) { return QVW; }

/* the int8 path built: 0 plain C, 1 AVX2, 2 VNNI on 256-bit vectors, 3 on 512-bit ones */
int loraplex_quant_int8_path(void) { return I8_PATH; }

static int matmul_float(const float *x, const uint8_t *wq, int qtype, int64_t m, int64_t n, int64_t k, float *y,
                        int64_t ldy, int num_threads)
{
#if QVW
    if (m <= FUSED_MAX_M && FUSED[qtype] != NULL) {
        const fused_fn fused = FUSED[qtype];
        const int64_t rb = k / BLOCK_ELEMS[qtype] * BLOCK_BYTES[qtype];
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n * k >= PARALLEL_MIN)
        for (int64_t r = 0; r < n; ++r) fused(wq + r * rb, x, m, k, y + r, ldy);
        return 0;
    }
    if (m >= GEMM_MIN_M) return matmul_gemm(x, wq, qtype, m, n, k, y, ldy, num_threads);
#endif
    return matmul_tiled(x, wq, qtype, m, n, k, y, ldy, num_threads);
}

typedef int (*matmul_fn)(const float *, const uint8_t *, int, int64_t, int64_t, int64_t, float *, int64_t, int);

/* fn on float32 x and y: a bfloat16 x widened into scratch, y summed there in float32 and rounded once */
static int with_float32(matmul_fn fn, const void *x_in, int x_bf16, const uint8_t *wq, int qtype, int64_t m,
                        int64_t n, int64_t k, void *y_out, int64_t ldy, int num_threads)
{
    if (qtype < 0 || qtype >= NUM_TYPES) return 2;
    if (!x_bf16) return fn(x_in, wq, qtype, m, n, k, y_out, ldy, num_threads);
    float *scratch = malloc((size_t)(m * k + m * n) * sizeof(float));
    if (scratch == NULL) return 1;
    widen_bf16(scratch, x_in, m * k);
    const int failed = fn(scratch, wq, qtype, m, n, k, scratch + m * k, n, num_threads);
    if (!failed)
        for (int64_t i = 0; i < m; ++i) narrow_bf16((uint16_t *)y_out + i * ldy, scratch + m * k + i * n, n);
    free(scratch);
    return failed;
}

/* y[m, n] = x[m, k] . W^T, row i of y at y + i ldy (ldy >= n: y may be columns of a wider matrix); qtype indexes
 * QUANT_TYPES; x and y are bfloat16 where x_bf16, else float32. Returns 0, 1 when scratch could not be
 * allocated, 2 for an unknown qtype. */
int loraplex_quant_matmul(const void *x_in, int x_bf16, const uint8_t *wq, int qtype, int64_t m, int64_t n,
                          int64_t k, void *y_out, int64_t ldy, int num_threads)
{
    return with_float32(matmul_float, x_in, x_bf16, wq, qtype, m, n, k, y_out, ldy, num_threads);
}

/* The same with x quantized to int8 per group of 32 (matmul_int8). */
int loraplex_quant_matmul_int8(const void *x_in, int x_bf16, const uint8_t *wq, int qtype, int64_t m, int64_t n,
                               int64_t k, void *y_out, int64_t ldy, int num_threads)
{
    return with_float32(matmul_int8, x_in, x_bf16, wq, qtype, m, n, k, y_out, ldy, num_threads);
}

/* The same on a weight laid out by interleave_x16 (matmul_int8_x16); 3 where this build or format has none. */
int loraplex_quant_matmul_int8_x16(const void *x_in, int x_bf16, const uint8_t *wq, int qtype, int64_t m,
                                   int64_t n, int64_t k, void *y_out, int64_t ldy, int num_threads)
{
    return with_float32(matmul_int8_x16, x_in, x_bf16, wq, qtype, m, n, k, y_out, ldy, num_threads);
}

/* 1 where loraplex_quant_matmul_int8_x16 serves qtype (an index of QUANT_TYPES) in this build */
int loraplex_quant_x16_available(int qtype)
{
    return I8_PATH == 3 && qtype >= 0 && qtype < NUM_TYPES && x16_supported(qtype);
}
