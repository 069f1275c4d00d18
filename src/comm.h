/*
 * comm.h - collectives behind one struct of function pointers.
 *
 * Two backends: "mpi" (Open MPI, chosen when the process was started by
 * mpirun) and "local" (one rank, no MPI at all). A NCCL backend fills the
 * same struct. Buffers are compute-backend memory; counts are elements.
 */
#ifndef FSDP_COMM_H
#define FSDP_COMM_H

#include <stddef.h>
#include <stdint.h>

struct fsdp_comm {
    const char *name;
    int rank, world;
    int local_rank, local_size; /* ranks on this host */
    void *impl;

    /* full[r * n .. (r+1) * n) = shard of rank r */
    int (*allgather)(struct fsdp_comm *c, const float *shard, float *full, size_t n, char *err);
    /* the same on bf16 elements (half the bytes: mixed precision) */
    int (*allgather_bf16)(struct fsdp_comm *c, const uint16_t *shard, uint16_t *full, size_t n,
                          char *err);
    /* shard = sum over ranks of full[rank * n .. (rank+1) * n) */
    int (*reduce_scatter)(struct fsdp_comm *c, const float *full, float *shard, size_t n,
                          char *err);
    /* the same on bf16 elements (--reduce-dtype bf16): each partial sum is
     * rounded to bf16 (to nearest even), as NCCL's bf16 sum does */
    int (*reduce_scatter_bf16)(struct fsdp_comm *c, const uint16_t *full, uint16_t *shard,
                               size_t n, char *err);
    int (*allreduce_sum)(struct fsdp_comm *c, float *buf, size_t n, char *err);
    int (*allreduce_sum_bf16)(struct fsdp_comm *c, uint16_t *buf, size_t n, char *err);
    /* host memory, doubles: small reductions (loss, norms) */
    int (*allreduce_sum_f64)(struct fsdp_comm *c, double *buf, size_t n, char *err);
    int (*bcast_bytes)(struct fsdp_comm *c, void *buf, size_t bytes, int root, char *err);
    int (*barrier)(struct fsdp_comm *c, char *err);
    /* root receives every rank's bytes: *out is one allocation of all of
     * them back to back, lens[r] their lengths (root only; others get NULL) */
    int (*gather_bytes)(struct fsdp_comm *c, const void *buf, size_t n, int root, char **out,
                        size_t *lens, char *err);
    /* ends every rank of the job at once (a failed rank must not leave the
     * others waiting in a collective) */
    void (*abort)(struct fsdp_comm *c, int code);
    void (*finalize)(struct fsdp_comm *c);
};

/* True when this process was started by mpirun (or another PMIx launcher). */
int fsdp_comm_launched_by_mpi(void);

int fsdp_comm_mpi_init(struct fsdp_comm *c, int *argc, char ***argv, char *err);
void fsdp_comm_local_init(struct fsdp_comm *c);

#endif
