/*
 * gemm.h - the library behind the CPU kernels' dense matrix products.
 *
 * The model's matmuls (forward, input gradient, weight gradient) go through
 * fsdp_gemm, which runs oneDNN's matmul primitive when the build has oneDNN
 * (libdnnl-dev; measured 1.0-2.3x OpenBLAS's sgemm on this model's shapes,
 * README "Matmuls") and OpenBLAS's sgemm otherwise or when --matmul openblas
 * asks for it. The attention's many small per-head products, called from
 * inside OpenMP loops, go through fsdp_gemm_small (oneDNN's dnnl_sgemm,
 * one thread each, or OpenBLAS).
 *
 * fsdp_gemm is called by one thread at a time (the rank's compute thread);
 * the library parallelises each call over the OpenMP threads.
 */
#ifndef FSDP_CPU_GEMM_H
#define FSDP_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* "auto" (oneDNN when built in), "onednn" or "openblas"; -1 with err when
 * the name is unknown or this build lacks the library. */
int fsdp_gemm_select(const char *want, char *err, size_t errlen);
/* Caps oneDNN's instruction set to a --cpu-kernels level ("x86-64",
 * "x86-64-v3", "x86-64-v4") before its first use. */
void fsdp_gemm_max_isa(const char *level);
/* The chosen library, e.g. "onednn 2.6.3" or "openblas". */
const char *fsdp_gemm_name(void);

/* Row-major C (M x N, leading dimension ldc) = op(A) op(B) + beta C, where
 * op(X) is X or its transpose (ta, tb: 'N' or 'T') and beta is 0 or 1. */
void fsdp_gemm(char ta, char tb, int M, int N, int K, const float *A, int lda, const float *B,
               int ldb, float beta, float *C, int ldc);

/* As fsdp_gemm, for the small products inside OpenMP loops (the
 * attention's per-head ones): runs on the calling thread, and may be
 * called by many threads at once. */
void fsdp_gemm_small(char ta, char tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc);

/* As fsdp_gemm with A and B in bf16 (products accumulated in fp32, C
 * fp32). Without oneDNN it widens both to fp32 and calls OpenBLAS (correct,
 * slow). */
void fsdp_gemm_bf16(char ta, char tb, int M, int N, int K, const uint16_t *A, int lda,
                    const uint16_t *B, int ldb, float beta, float *C, int ldc);
/* As fsdp_gemm_bf16, C's rows split between the OpenMP threads, each
 * thread's share one single-threaded product: the weight gradients
 * (op(A) = dout^T, K the batch's rows), which oneDNN's own split of such a
 * product ran 1.3x slower on 2 cores. Bits depend on the thread count, as
 * a library's own split does. */
void fsdp_gemm_bf16_rows(char ta, char tb, int M, int N, int K, const uint16_t *A, int lda,
                         const uint16_t *B, int ldb, float beta, float *C, int ldc);
/* 1 when oneDNN is chosen and runs bf16 products in hardware here; else 0
 * with the reason. */
int fsdp_gemm_bf16_fast(char *why, size_t len);
/* Scratch of at least n bf16 values, slot 0 or 1, kept between calls (the
 * kernels round their fp32 operands into it). NULL when out of memory. */
uint16_t *fsdp_gemm_scratch(int slot, size_t n);
/* How many values slot holds now. */
size_t fsdp_gemm_scratch_held(int slot);

#endif
