/*
 * comm_mpi.c - collectives over Open MPI.
 *
 * MPI counts are int; the FSDP units here are far below 2^31 elements per
 * shard, and a larger count is refused with an error rather than truncated.
 * MPI errors are returned, not fatal (MPI_ERRORS_RETURN), so the trainer can
 * report which collective failed.
 */
#include "comm.h"

#include "util.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

static int mpi_fail(int rc, const char *what, char *err)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return fsdp_err(err, "mpi: %s failed: %s", what, msg);
}

static int count_ok(size_t n, const char *what, char *err)
{
    if (n > INT_MAX)
        return fsdp_err(err, "mpi: %s of %zu elements exceeds MPI's int count", what, n);
    return 0;
}

static int mpi_allgather(struct fsdp_comm *c, const float *shard, float *full, size_t n,
                         char *err)
{
    (void)c;
    if (count_ok(n, "allgather", err))
        return -1;
    const void *send = shard == full + (size_t)c->rank * n ? MPI_IN_PLACE : shard;
    int rc = MPI_Allgather(send, (int)n, MPI_FLOAT, full, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allgather", err);
}

static int mpi_allgather_bf16(struct fsdp_comm *c, const uint16_t *shard, uint16_t *full,
                              size_t n, char *err)
{
    if (count_ok(n, "allgather", err))
        return -1;
    const void *send = shard == full + (size_t)c->rank * n ? MPI_IN_PLACE : shard;
    int rc = MPI_Allgather(send, (int)n, MPI_UINT16_T, full, (int)n, MPI_UINT16_T,
                           MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allgather (bf16)", err);
}

static int mpi_reduce_scatter(struct fsdp_comm *c, const float *full, float *shard, size_t n,
                              char *err)
{
    (void)c;
    if (count_ok(n, "reduce-scatter", err))
        return -1;
    int rc = MPI_Reduce_scatter_block(full, shard, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "reduce-scatter", err);
}

/* bf16 sums: MPI has no bf16 type, so a user operation on 16-bit words
 * adds in fp32 and rounds each partial sum back to bf16 */
static MPI_Op bf16_sum_op = MPI_OP_NULL;

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = fsdp_bf16_round(fsdp_bf16_widen(a[i]) + fsdp_bf16_widen(b[i]));
}

static int mpi_reduce_scatter_bf16(struct fsdp_comm *c, const uint16_t *full, uint16_t *shard,
                                   size_t n, char *err)
{
    (void)c;
    if (count_ok(n, "reduce-scatter", err))
        return -1;
    int rc = MPI_Reduce_scatter_block(full, shard, (int)n, MPI_UINT16_T, bf16_sum_op,
                                      MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "reduce-scatter (bf16)", err);
}

static int mpi_allreduce_bf16(struct fsdp_comm *c, uint16_t *buf, size_t n, char *err)
{
    (void)c;
    if (count_ok(n, "allreduce", err))
        return -1;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_UINT16_T, bf16_sum_op, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allreduce (bf16)", err);
}

static int mpi_allreduce(struct fsdp_comm *c, float *buf, size_t n, char *err)
{
    (void)c;
    if (count_ok(n, "allreduce", err))
        return -1;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allreduce", err);
}

static int mpi_allreduce_f64(struct fsdp_comm *c, double *buf, size_t n, char *err)
{
    (void)c;
    if (count_ok(n, "allreduce", err))
        return -1;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allreduce", err);
}

static int mpi_bcast(struct fsdp_comm *c, void *buf, size_t bytes, int root, char *err)
{
    (void)c;
    if (count_ok(bytes, "broadcast", err))
        return -1;
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "broadcast", err);
}

static int mpi_barrier(struct fsdp_comm *c, char *err)
{
    (void)c;
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "barrier", err);
}

static int mpi_gather_bytes(struct fsdp_comm *c, const void *buf, size_t n, int root, char **out,
                            size_t *lens, char *err)
{
    *out = NULL;
    if (count_ok(n, "gather", err))
        return -1;
    int len = (int)n, *all = NULL, *displs = NULL, rc;
    if (c->rank == root) {
        all = calloc((size_t)c->world, sizeof *all);
        displs = calloc((size_t)c->world, sizeof *displs);
        if (!all || !displs) {
            free(all);
            free(displs);
            return fsdp_err(err, "mpi: out of memory for a gather");
        }
    }
    rc = MPI_Gather(&len, 1, MPI_INT, all, 1, MPI_INT, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(all);
        free(displs);
        return mpi_fail(rc, "gather", err);
    }
    size_t total = 0;
    if (c->rank == root) {
        for (int r = 0; r < c->world; r++) {
            displs[r] = (int)total;
            lens[r] = (size_t)all[r];
            total += (size_t)all[r];
        }
        if (total > INT_MAX || !(*out = malloc(total ? total : 1))) {
            /* still take part, so the other ranks are not left waiting */
            MPI_Gatherv(buf, len, MPI_BYTE, NULL, all, displs, MPI_BYTE, root, MPI_COMM_WORLD);
            free(all);
            free(displs);
            return fsdp_err(err, "mpi: cannot receive %zu gathered bytes", total);
        }
    }
    rc = MPI_Gatherv(buf, len, MPI_BYTE, *out, all, displs, MPI_BYTE, root, MPI_COMM_WORLD);
    free(all);
    free(displs);
    if (rc != MPI_SUCCESS) {
        free(*out);
        *out = NULL;
        return mpi_fail(rc, "gather", err);
    }
    return 0;
}

static void mpi_abort(struct fsdp_comm *c, int code)
{
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code);
}

static void mpi_finalize(struct fsdp_comm *c)
{
    (void)c;
    if (bf16_sum_op != MPI_OP_NULL)
        MPI_Op_free(&bf16_sum_op);
    MPI_Finalize();
}

int fsdp_comm_launched_by_mpi(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

int fsdp_comm_mpi_init(struct fsdp_comm *c, int *argc, char ***argv, char *err)
{
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS)
        return fsdp_err(err, "mpi: MPI_Init failed (code %d)", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if ((rc = MPI_Op_create(bf16_sum, 1, &bf16_sum_op)) != MPI_SUCCESS) {
        mpi_fail(rc, "creating the bf16 sum", err);
        MPI_Finalize(); /* the caller has no communicator to finalize */
        return -1;
    }
    *c = (struct fsdp_comm){
        .name = "mpi",
        .allgather = mpi_allgather,
        .allgather_bf16 = mpi_allgather_bf16,
        .reduce_scatter = mpi_reduce_scatter,
        .reduce_scatter_bf16 = mpi_reduce_scatter_bf16,
        .allreduce_sum = mpi_allreduce,
        .allreduce_sum_bf16 = mpi_allreduce_bf16,
        .allreduce_sum_f64 = mpi_allreduce_f64,
        .bcast_bytes = mpi_bcast,
        .barrier = mpi_barrier,
        .gather_bytes = mpi_gather_bytes,
        .abort = mpi_abort,
        .finalize = mpi_finalize,
    };
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &c->local_rank);
    MPI_Comm_size(local, &c->local_size);
    MPI_Comm_free(&local);
    return 0;
}
