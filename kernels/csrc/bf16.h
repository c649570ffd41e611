/* bfloat16 <-> float32 for the C kernels: bfloat16 is the top half of a float32, so widening is a 16-bit
 * shift (exact) and narrowing rounds to nearest-even in integer arithmetic, bit for bit as torch's
 * .to(torch.bfloat16) does (NaN stays NaN, subnormals round as normals do). AVX512-BF16's vcvtneps2bf16 is not
 * used: it flushes subnormal inputs to zero, where torch keeps them. The kernels keep every sum in float32
 * and round once, when they store.
 *
 * Each kernel source that takes both element types includes its body once per type with ET (the stored
 * element), ELOAD8(p) (eight elements as a float v8), ESTORE8(p, v) and E_SUFFIX (f32 or bf16) defined;
 * E(name) below appends the suffix. The body #undefs its parameters, ready for the next type;
 * each_element_type.h does the two includes for a body that needs nothing more. */
#ifndef LORAPLEX_BF16_H
#define LORAPLEX_BF16_H

#include <stdint.h>
#include <string.h>

#include "vec8.h"
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

/* On x86 the zero-extension is spelled with intrinsics: GCC 12 turns the generic conversion into two
 * half-width extensions and an insert, which costs a bfloat16 stream (half the bytes) its advantage
 * (bench/README.md). */
static inline v8 load8_bf16(const uint16_t *p)
{
#if defined(__AVX2__)
    return (v8)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
#else
    v8u16 h;
    memcpy(&h, p, sizeof h);
    return (v8)(__builtin_convertvector(h, v8u32) << 16);
#endif
}

static inline void store8_bf16(uint16_t *p, v8 v)
{
    const v8u32 bits = (v8u32)v;
    v8u32 r = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const v8u32 nan = (v8u32)(v != v);  /* all ones on NaN lanes: those keep a quiet NaN of their sign */
    r = (r & ~nan) | (((bits >> 16) | 0x40u) & nan);
    const v8u16 h = __builtin_convertvector(r, v8u16);
    memcpy(p, &h, sizeof h);
}

static inline float bf16_to_float(const uint16_t *p)
{
    const uint32_t bits = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline void float_to_bf16(uint16_t *p, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    *p = f != f ? (uint16_t)((bits >> 16) | 0x40u) : (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* whole rows: dst[0:n] = src[0:n] widened / rounded */
static inline void widen_bf16(float *dst, const uint16_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store8(dst + i, load8_bf16(src + i));
    for (; i < n; ++i) dst[i] = bf16_to_float(src + i);
}
static inline void narrow_bf16(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store8_bf16(dst + i, load8(src + i));
    for (; i < n; ++i) float_to_bf16(dst + i, src[i]);
}

/* E(name): name with the element type's suffix, for the functions of a body included once per type */
#define E_CAT2(name, suffix) name##_##suffix
#define E_CAT(name, suffix) E_CAT2(name, suffix)
#define E(name) E_CAT(name, E_SUFFIX)

#endif
