/* cuda_bf16.h (emulated): see cuda_runtime.h here */
#ifndef FSDP_CUDA_EMU_BF16_H
#define FSDP_CUDA_EMU_BF16_H
#include "cuda_runtime.h"
struct __nv_bfloat16 {
    uint16_t x;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) /* to nearest even (no NaN here) */
{
    uint32_t u = __float_as_uint(f);
    return __nv_bfloat16{(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((uint32_t)b.x << 16); }
#endif
