/*
 * module.h - what the CUDA module (libfsdp-cuda.so) exports to the loader
 * (cuda_load.c): one function returning one table. Private to src/cuda.
 *
 * The module is separate so that fsdp-train loads CUDA, cuBLAS and NCCL
 * only when a run asks for --device cuda: linked in, they cost every CPU
 * rank 0.35 s and 220 MiB at start, and a host without them could not run
 * fsdp-train at all.
 */
#ifndef FSDP_CUDA_MODULE_H
#define FSDP_CUDA_MODULE_H

#include "../comm.h"
#include "../kernels.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* raised whenever this struct, struct fsdp_kernels (kernels.h) or struct
 * fsdp_comm (comm.h) changes: 3 added the bf16 attention and start_uses_tmp,
 * 4 layernorm_forward_bf16 and gelu_forward_bf16, 5 the bf16 attention on
 * bf16 qkv and out (matmul_forward_to_bf16), 6 the loss kept as lse
 * (crossentropy_*) and the head's gradient in bf16, 7 grouped-query
 * attention and the Llama family's kernels (rmsnorm_*, rope, swiglu_*), 8
 * swiglu_backward_bf16, 9 add_bf16_rounded, 10 struct fsdp_coll's
 * rank_stride */
#define FSDP_CUDA_MODULE_ABI 10

struct fsdp_cuda_module {
    int abi; /* FSDP_CUDA_MODULE_ABI: a module of another build is refused */
    int (*init)(int local_rank, char *err, size_t len);
    const struct fsdp_kernels *(*kernels)(void);
    int (*bf16)(char *why, size_t len);
    void (*allow_tf32)(int on);
    size_t (*peak_bytes)(void);
    int (*comm_nccl_init)(struct fsdp_comm *c, char *err);
};

/* Exported by the module (the only symbol it exports). */
const struct fsdp_cuda_module *fsdp_cuda_module(void);

/* Inside the module: the compute stream (kernels_cuda.cu) for NCCL, and
 * NCCL's communicator set-up (comm_nccl.c). */
void *fsdp_cudamod_stream(void);
/* Hands the backend a check it calls while waiting for the GPU: nonzero
 * when the communicator failed (and was aborted); the rank then exits. */
void fsdp_cudamod_watch(int (*watch)(void *arg), void *arg);
int fsdp_cudamod_comm_nccl_init(struct fsdp_comm *c, char *err);

#ifdef __cplusplus
}
#endif

#endif
