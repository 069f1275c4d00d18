/*
 * cuda.h - the CUDA compute backend and the NCCL collectives (-Dcuda).
 *
 * kernels_cuda.cu fills struct fsdp_kernels (kernels.h) with CUDA kernels
 * and cuBLAS matmuls on one stream per process; comm_nccl.c fills struct
 * fsdp_comm (comm.h) with NCCL collectives on that stream, keeping the host
 * collectives (loss, norms, bytes) on the MPI or local communicator it
 * wraps. One rank per GPU: rank r of a host uses device local_rank.
 *
 * Both live in a module, libfsdp-cuda.so, that fsdp_cuda_init loads
 * (cuda_load.c): a CPU run never loads CUDA, cuBLAS or NCCL, and a build or
 * host without them runs everything else. Without the module (a build
 * without nvcc, or a host without CUDA's libraries) fsdp_cuda_init fails
 * with one line saying why, and so does --device cuda.
 */
#ifndef FSDP_CUDA_H
#define FSDP_CUDA_H

#include "../comm.h"
#include "../kernels.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Loads the module and selects device local_rank % (devices visible), with
 * its stream and cuBLAS. -1 with err when there is no module or no usable
 * GPU. The module is FSDP_CUDA_MODULE (a path) when set, else
 * libfsdp-cuda.so beside the program, else in the installed library
 * directory. */
int fsdp_cuda_init(int local_rank, char *err, size_t len);
/* The kernel table (after fsdp_cuda_init; its name describes the GPU). */
const struct fsdp_kernels *fsdp_kernels_cuda(void);
/* 1 when bf16 matmuls run on this GPU (sm_80 and newer); else 0 and why. */
int fsdp_cuda_bf16(char *why, size_t len);
/* bf16 runs: lets the attention products (fp32 operands) use TF32 tensor
 * cores, as PyTorch's autocast does; fp32 runs keep full fp32. */
void fsdp_cuda_allow_tf32(int on);
/* Peak device memory allocated by the backend so far, bytes. */
size_t fsdp_cuda_peak_bytes(void);

/* Replaces *c with NCCL collectives over the same ranks; the host
 * collectives stay on the original (MPI or local) communicator. The unique
 * id travels by c->bcast_bytes. */
int fsdp_comm_nccl_init(struct fsdp_comm *c, char *err);

#ifdef __cplusplus
}
#endif

#endif
