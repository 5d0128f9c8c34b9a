/* Half-precision conversions (f16 in runtime/half.c, bf16 inline). Not installed. */
#ifndef DTENSOR_RUNTIME_HALF_H
#define DTENSOR_RUNTIME_HALF_H

#include <stdint.h>
#include <string.h>

/* Half-precision conversions: round to nearest even, infinities kept, NaN made quiet with
 * its top payload. f16 in runtime/half.c; bf16 here, inline and branch-free so that loops
 * over them vectorise (ops/cast.c). */
float dt__f16_to_f32(uint16_t h);
uint16_t dt__f32_to_f16(float f);

static inline float dt__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    u |= (u & 0x7fffffffu) > 0x7f800000u ? 0x400000u : 0u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t dt__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

#endif
