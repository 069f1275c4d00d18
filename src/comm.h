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

enum fsdp_coll_kind {
    FSDP_COLL_ALLGATHER,
    FSDP_COLL_ALLGATHER_BF16,
    FSDP_COLL_REDUCE_SCATTER,
    FSDP_COLL_REDUCE_SCATTER_BF16,
    FSDP_COLL_ALLREDUCE, /* in place on out (in unused), any n; tmp: world * ceil(n / world) */
    FSDP_COLL_ALLREDUCE_BF16,
};

/* A collective that runs while the caller computes (--prefetch on). The
 * caller fills kind, in, out, n (elements per rank, as in the blocking
 * calls) and, for a reduce-scatter, tmp: world * n * pieces elements of
 * scratch. From start until wait returns, the buffers belong to the
 * collective. Every rank starts the same collectives in the same order.
 *
 * pieces > 1 moves that many units in one collective (--unit-blocks):
 * piece k is the blocking call on in + k * in_stride and out + k *
 * out_stride (strides in elements).
 *
 * rank_stride > n (a reduce-scatter of one piece): rank r's part of in
 * starts at in + r * rank_stride, not r * n, so a shard too big for tmp
 * is reduced a slice at a time. */
struct fsdp_coll {
    enum fsdp_coll_kind kind;
    const void *in;
    void *out, *tmp;
    size_t n;
    int pieces;                   /* 0 means 1 */
    size_t in_stride, out_stride; /* pieces > 1 */
    size_t rank_stride;           /* 0 means n */
    int state;                    /* 0 idle, 1 running, 2 arrived (wait finishes it) */
    int phase;                    /* the backend's: an all-reduce runs in two */
    union {
        unsigned char bytes[16];
        void *align_p;
        unsigned long long align_u;
    } req; /* the backend's request */
};

struct fsdp_comm {
    const char *name;
    int rank, world;
    int local_rank, local_size; /* ranks on this host */
    int host, hosts;            /* this host's number (hosts in order of their lowest
                                   rank) and how many there are */
    void *impl;

    /* full[r * n .. (r+1) * n) = shard of rank r */
    int (*allgather)(struct fsdp_comm *c, const float *shard, float *full, size_t n, char *err);
    /* the same on bf16 elements (half the bytes: mixed precision) */
    int (*allgather_bf16)(struct fsdp_comm *c, const uint16_t *shard, uint16_t *full, size_t n,
                          char *err);
    /* shard = sum over ranks of full[rank * n .. (rank+1) * n); the MPI
     * backend adds in rank order (an all-to-all, then the sum), so the bits
     * do not depend on MPI's choice of algorithm nor on --prefetch */
    int (*reduce_scatter)(struct fsdp_comm *c, const float *full, float *shard, size_t n,
                          char *err);
    /* the same on bf16 elements (--reduce-dtype bf16): each partial sum is
     * rounded to bf16 (to nearest even), as NCCL's bf16 sum does */
    int (*reduce_scatter_bf16)(struct fsdp_comm *c, const uint16_t *full, uint16_t *shard, size_t n,
                               char *err);
    /* buf = the sum over ranks; the MPI backend adds in rank order (a
     * reduce-scatter as above, then an all-gather), so bucketing a buffer
     * into several all-reduces gives the same bits */
    int (*allreduce_sum)(struct fsdp_comm *c, float *buf, size_t n, char *err);
    int (*allreduce_sum_bf16)(struct fsdp_comm *c, uint16_t *buf, size_t n, char *err);
    /* Non-blocking versions of the four above; NULL where a backend has
     * none (local: nothing to wait for), and the caller then runs the
     * blocking call. NCCL's run on a comm stream of their own and wait
     * makes the compute stream (not the host) wait for them. progress
     * lets the running collectives advance (Open MPI moves data only inside
     * its calls), never blocks, and is called between kernels. The result
     * is the same bits as the blocking call. */
    int (*start)(struct fsdp_comm *c, struct fsdp_coll *op, char *err);
    void (*progress)(struct fsdp_comm *c);
    int (*wait)(struct fsdp_comm *c, struct fsdp_coll *op, char *err);
    /* 1 when start's reduce-scatters and all-reduces use op->tmp (MPI's
     * all-to-all lands there); NCCL's do not, and the engine then keeps no
     * such scratch */
    int start_uses_tmp;
    /* host memory, doubles: small reductions (loss, norms) */
    int (*allreduce_sum_f64)(struct fsdp_comm *c, double *buf, size_t n, char *err);
    int (*bcast_bytes)(struct fsdp_comm *c, void *buf, size_t bytes, int root, char *err);
    /* root receives every rank's bytes: *out is one allocation of all of
     * them back to back, lens[r] their lengths (root only; others get NULL) */
    int (*gather_bytes)(struct fsdp_comm *c, const void *buf, size_t n, int root, char **out,
                        size_t *lens, char *err);
    /* Point to point, for one thread besides the collectives' (the
     * snapshot writer's copies to a buddy host): sends n bytes to rank to
     * while receiving m from rank from, on a communicator of its own (a
     * negative rank: that direction is left out, MPI_PROC_NULL). NULL
     * unless asked for at start-up and the library runs threads alongside
     * (MPI_THREAD_MULTIPLE). */
    int (*side_sendrecv)(struct fsdp_comm *c, const void *send, size_t n, int to, void *recv,
                         size_t m, int from, char *err);
    /* ends every rank of the job at once (a failed rank must not leave the
     * others waiting in a collective) */
    void (*abort)(struct fsdp_comm *c, int code);
    void (*finalize)(struct fsdp_comm *c);
};

/* True when this process was started by mpirun (or another PMIx launcher). */
int fsdp_comm_launched_by_mpi(void);

/* side: set up side_sendrecv (MPI_THREAD_MULTIPLE), else FUNNELED. */
int fsdp_comm_mpi_init(struct fsdp_comm *c, int *argc, char ***argv, int side, char *err);
void fsdp_comm_local_init(struct fsdp_comm *c);

#endif
