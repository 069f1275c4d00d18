/*
 * flash_ref.h - the arithmetic of src/cuda/flash.cu on the CPU, one row at
 * a time: the reference the GPU kernels are checked against (test_cuda.c)
 * and the record of what rounding they do, itself checked against the fp32
 * attention (test_flash.c).
 *
 * The same signatures as kernels.h's attention_forward_bf16,
 * attention_backward_bf16 and matmul_forward_to_bf16, on host memory, so a
 * copy of the CPU kernel table with these three plugged in runs the whole
 * engine the way a GPU's bf16 run does.
 */
#ifndef FSDP_TEST_FLASH_REF_H
#define FSDP_TEST_FLASH_REF_H
#include <stddef.h>
#include <stdint.h>

void flash_ref_forward(uint16_t *out16, float *lse, const uint16_t *qkv16, int B, int T, int C,
                       int NH);
void flash_ref_backward(float *dqkv, float *d, const float *dout, const uint16_t *out16,
                        const uint16_t *qkv16, const float *lse, int B, int T, int C, int NH);
/* kernels.h's matmul_forward_to_bf16: each output a sum in fp32 over k in
 * order, the bias added, rounded once */
void flash_ref_matmul_to_bf16(uint16_t *out16, const uint16_t *inp, const uint16_t *w,
                              const uint16_t *bias16, size_t N, int C, int OC);

#endif
