/* Half-width floats widened to float32, exactly, for the package's C kernels (store/_statistics.c,
 * traces/_diverge_errors.c): included by them, built by runtime/native_build.py with this folder on
 * the include path (the header's text is part of each library's cache key). */
#ifndef NSP_FLOATS_H
#define NSP_FLOATS_H

#include <stdint.h>
#include <string.h>

static inline float from_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* float16 to float32, exact; no branch, so that the loop around it is vectorised */
static inline float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t normal = sign | ((exp + 112u) << 23) | (man << 13);
    uint32_t special = sign | 0x7f800000u | (man << 13);               /* infinity or NaN */
    uint32_t subnormal = bits_of((float)man * 0x1p-24f) | sign;        /* zero or subnormal: man * 2^-24 */
    uint32_t low = 0u - (uint32_t)(exp == 0), high = 0u - (uint32_t)(exp == 31);  /* all ones where true */
    uint32_t b = (subnormal & low) | (special & high) | (normal & ~(low | high));
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

#endif
