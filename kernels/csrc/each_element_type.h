/* Includes the kernel body named by ELEMENT_BODY (a quoted header name) once per element type: float32, then
 * bfloat16 (bf16.h), with ET, ELOAD8, ESTORE8 and E_SUFFIX defined as bf16.h describes. The body #undefs
 * those four; this header #undefs ELEMENT_BODY. Not guarded: a source includes it once per body. */
#define ET float
#define ELOAD8(p) load8(p)
#define ESTORE8(p, v) store8(p, v)
#define E_SUFFIX f32
#include ELEMENT_BODY

#define ET uint16_t
#define ELOAD8(p) load8_bf16(p)
#define ESTORE8(p, v) store8_bf16(p, v)
#define E_SUFFIX bf16
#include ELEMENT_BODY

#undef ELEMENT_BODY
