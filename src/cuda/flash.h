/*
 * flash.h - causal attention on bf16 tensor cores, flash-style (flash.cu):
 * the T x T scores never reach memory. Private to src/cuda; kernels_cuda.cu
 * wraps these as the kernel table's attention_forward_bf16 and
 * attention_backward_bf16 (kernels.h says what they compute).
 *
 * The algorithm is FlashAttention-2's (Dao, 2023), deterministic: tiles of
 * 64 queries by 64 keys; the forward keeps a running maximum and sum per
 * row and stores lse = max + log(sum); the backward recomputes each tile's
 * probabilities from lse, with D = rowsum(dO * O) computed first. dK and
 * dV are summed over query tiles by the block that owns the key tile, dQ
 * over key tiles by the block that owns the query tile (a second kernel
 * that recomputes the scores), so there are no atomics and two runs give
 * the same bits.
 *
 * Rounding, the same as tests/unit/flash_ref.c's reference: Q, K and V
 * arrive in bf16 (the qkv product's output, rounded once), dO is rounded
 * to bf16 as it is loaded; the scores S = Q K^T and every product
 * accumulate in fp32; the softmax runs in fp32 on S * scale; P (and dS =
 * P * (dP - D)) are rounded to bf16 for the products they feed; the
 * output is rounded to bf16 as it is written (it is the next product's
 * input, and all the backward needs of it).
 * Heads up to FLASH_MAX_HS wide (or flash_max_hs's, below); a head of
 * width hs is padded with zeros to the next of 16, 32, 64 or 128.
 */
#ifndef FSDP_CUDA_FLASH_H
#define FSDP_CUDA_FLASH_H
#include <cuda_runtime.h>
#include <stdint.h>

#define FLASH_MAX_HS 128

/* The widest head the kernels take on a GPU that gives a block at most
 * smem_optin bytes of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin:
 * 163 KiB on sm_80, 227 KiB on sm_90, 99 KiB on sm_86 and sm_89); 0: none. */
int flash_max_hs(size_t smem_optin);
/* out16 (B,T,C) bf16 and lse (B,NH,T) from qkv (B,T,3C) bf16. 0, or -1
 * when the head is too wide or the launch failed (cudaGetLastError says
 * why). */
int flash_forward(cudaStream_t s, uint16_t *out16, float *lse, const uint16_t *qkv, int B, int T,
                  int C, int NH);
/* dqkv (B,T,3C) fp32, overwritten; d is scratch of B*NH*T floats. */
int flash_backward(cudaStream_t s, float *dqkv, float *d, const float *dout, const uint16_t *out16,
                   const uint16_t *qkv, const float *lse, int B, int T, int C, int NH);

#endif
