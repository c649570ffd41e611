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

/* max over the 16 lanes of a and b, by a shuffle tree */
static inline float hmax2x8(v8 a, v8 b)
{
    v8 m = max8(a, b);
    m = max8(m, __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3));
    m = max8(m, __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5));
    m = max8(m, __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6));
    return m[0];
}

/* The eight horizontal sums of a[0..7], as one vector: lane i = sum of a[i]'s lanes (7 adds for 8 sums
 * rather than a horizontal sum each). */
static inline v8 reduce8(const v8 *a)
{
    v8 b[4], c[2];
    for (int j = 0; j < 4; ++j)
        b[j] = __builtin_shufflevector(a[2 * j], a[2 * j + 1], 0, 8, 2, 10, 4, 12, 6, 14)
             + __builtin_shufflevector(a[2 * j], a[2 * j + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int j = 0; j < 2; ++j)
        c[j] = __builtin_shufflevector(b[2 * j], b[2 * j + 1], 0, 1, 8, 9, 4, 5, 12, 13)
             + __builtin_shufflevector(b[2 * j], b[2 * j + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(c[0], c[1], 0, 1, 2, 3, 8, 9, 10, 11)
         + __builtin_shufflevector(c[0], c[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

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
