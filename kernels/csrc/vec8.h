/* 8-float vectors (GCC vector extensions: AVX2/AVX-512 on x86, NEON on Arm) and the helpers the C
 * kernels share. */
#ifndef LORAPLEX_VEC8_H
#define LORAPLEX_VEC8_H

#include <stdint.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
static inline v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }
static inline v8 max8(v8 a, v8 b)
{
    const v8i a_wins = a > b;
    return (v8)(((v8i)a & a_wins) | ((v8i)b & ~a_wins));
}
static inline float hsum8(v8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

/* e^x for x <= 0 (softmax arguments), 8 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-6
 * polynomial (relative error ~2e-7, like expf's), 2^n through the exponent bits; x < -87 gives 0. */
static inline v8 exp8_nonpositive(v8 x)
{
    const v8i tiny = x < -87.0f;  /* lanes of all ones where e^x underflows */
    const v8 floor87 = {-87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f, -87.0f};
    x = (v8)(((v8i)x & ~tiny) | ((v8i)floor87 & tiny));
    const v8 n = __builtin_convertvector(__builtin_convertvector(x * 1.44269504088896341f - 0.5f, v8i), v8);
    const v8 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  /* ln2 split in two for exactness */
    v8 p = (v8){1.9875691500e-4f, 1.9875691500e-4f, 1.9875691500e-4f, 1.9875691500e-4f, 1.9875691500e-4f,
                1.9875691500e-4f, 1.9875691500e-4f, 1.9875691500e-4f};
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    v8 scale;
    memcpy(&scale, &bits, sizeof scale);
    return (v8)((v8i)(p * scale) & ~tiny);
}

#endif
