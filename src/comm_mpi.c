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
#include <string.h>

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

/* bf16 sums: MPI has no bf16 type, so a user operation on 16-bit words
 * adds in fp32 and rounds each partial sum back to bf16 (the all-reduce of
 * --shard none) */
static MPI_Op bf16_sum_op = MPI_OP_NULL;

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = fsdp_bf16_round(fsdp_bf16_widen(a[i]) + fsdp_bf16_widen(b[i]));
}

/* ---- non-blocking collectives ----------------------------------------------
 *
 * A reduce-scatter is an all-to-all (rank r receives every rank's part r)
 * followed by the sum in rank order on the receiver: the same bits for any
 * world size whatever algorithm Open MPI picks, and whether the call blocks
 * or not. The running collectives are listed so progress can test them. */

#define MAX_RUNNING 8

static struct fsdp_coll *running[MAX_RUNNING];

_Static_assert(sizeof(MPI_Request) <= sizeof(((struct fsdp_coll *)0)->req.bytes),
               "an MPI_Request must fit in fsdp_coll.req");

static MPI_Request *req_of(struct fsdp_coll *op) { return (MPI_Request *)(void *)op->req.bytes; }

/* count pieces of n elements, stride apart, seen as one element of extent
 * `extent` elements (MPI_Type_vector, resized) */
static int pieces_type(MPI_Datatype base, size_t esize, int count, size_t n, size_t stride,
                       size_t extent, MPI_Datatype *out)
{
    MPI_Datatype v;
    if (MPI_Type_vector(count, (int)n, (int)stride, base, &v) != MPI_SUCCESS)
        return -1;
    int rc = MPI_Type_create_resized(v, 0, (MPI_Aint)(extent * esize), out);
    MPI_Type_free(&v);
    if (rc == MPI_SUCCESS && MPI_Type_commit(out) == MPI_SUCCESS)
        return 0;
    return -1;
}

static int mpi_start(struct fsdp_comm *c, struct fsdp_coll *op, char *err)
{
    static const char *const what[] = {"allgather", "allgather (bf16)", "reduce-scatter",
                                       "reduce-scatter (bf16)"};
    const int bf16 = op->kind == FSDP_COLL_ALLGATHER_BF16 ||
                     op->kind == FSDP_COLL_REDUCE_SCATTER_BF16;
    const int gather = op->kind == FSDP_COLL_ALLGATHER || op->kind == FSDP_COLL_ALLGATHER_BF16;
    const MPI_Datatype base = bf16 ? MPI_UINT16_T : MPI_FLOAT;
    const size_t esize = bf16 ? sizeof(uint16_t) : sizeof(float);
    const int pieces = op->pieces > 1 ? op->pieces : 1;
    int slot = 0;
    while (slot < MAX_RUNNING && running[slot])
        slot++;
    if (op->state != 0 || slot == MAX_RUNNING)
        return fsdp_err(err, "mpi: %s started while %s", what[op->kind],
                        op->state ? "it runs already" : "too many collectives run");
    if (count_ok(op->n * (size_t)pieces, what[op->kind], err) ||
        count_ok(op->in_stride, what[op->kind], err) ||
        count_ok(op->out_stride * (size_t)c->world, what[op->kind], err))
        return -1;
    const int n = (int)op->n;
    MPI_Datatype send = base, recv = base;
    int scount = n, rcount = n, rc = MPI_SUCCESS;
    if (pieces > 1) { /* one element per rank: every piece's part */
        scount = rcount = 1;
        int bad = gather ? pieces_type(base, esize, pieces, op->n, op->in_stride, op->n, &send) ||
                               pieces_type(base, esize, pieces, op->n, op->out_stride, op->n,
                                           &recv)
                         : pieces_type(base, esize, pieces, op->n, op->in_stride, op->n, &send);
        if (!gather && !bad) { /* what arrives from each rank: its parts, back to back */
            recv = base;
            rcount = n * pieces;
        }
        if (bad)
            return fsdp_err(err, "mpi: cannot describe %d pieces of %zu elements for a %s",
                            pieces, op->n, what[op->kind]);
    }
    if (gather) {
        const char *mine = (const char *)op->out + (size_t)c->rank * op->n * esize;
        const void *in = pieces == 1 && op->in == (const void *)mine ? MPI_IN_PLACE : op->in;
        rc = MPI_Iallgather(in, scount, send, op->out, rcount, recv, MPI_COMM_WORLD, req_of(op));
    } else {
        rc = MPI_Ialltoall(op->in, scount, send, op->tmp, rcount, recv, MPI_COMM_WORLD,
                           req_of(op));
    }
    /* a pending collective keeps the types it uses alive (MPI_Type_free) */
    if (send != base)
        MPI_Type_free(&send);
    if (recv != base)
        MPI_Type_free(&recv);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, what[op->kind], err);
    op->state = 1;
    running[slot] = op;
    return 0;
}

static void mpi_progress(struct fsdp_comm *c)
{
    (void)c;
    for (int i = 0; i < MAX_RUNNING; i++) {
        int done = 0;
        if (running[i] && running[i]->state == 1 &&
            MPI_Test(req_of(running[i]), &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)
            running[i]->state = 2; /* an error is reported by wait */
    }
}

/* out = the sum of the world's parts in tmp, in rank order: tmp holds, for
 * each rank, its part of every piece back to back */
static void sum_parts(const struct fsdp_coll *op, int world)
{
    const size_t n = op->n, pieces = op->pieces > 1 ? (size_t)op->pieces : 1;
    const size_t stride = pieces > 1 ? op->out_stride : n, per_rank = n * pieces;
    for (size_t k = 0; k < pieces; k++) {
        if (op->kind == FSDP_COLL_REDUCE_SCATTER) {
            const float *t = (const float *)op->tmp + k * n;
            float *o = (float *)op->out + k * stride;
            memcpy(o, t, n * sizeof *o);
            for (int r = 1; r < world; r++)
                for (size_t i = 0; i < n; i++)
                    o[i] += t[(size_t)r * per_rank + i];
        } else {
            const uint16_t *t = (const uint16_t *)op->tmp + k * n;
            uint16_t *o = (uint16_t *)op->out + k * stride;
            memcpy(o, t, n * sizeof *o);
            for (int r = 1; r < world; r++)
                for (size_t i = 0; i < n; i++)
                    o[i] = fsdp_bf16_round(fsdp_bf16_widen(o[i]) +
                                           fsdp_bf16_widen(t[(size_t)r * per_rank + i]));
        }
    }
}

static int mpi_wait(struct fsdp_comm *c, struct fsdp_coll *op, char *err)
{
    for (int i = 0; i < MAX_RUNNING; i++)
        if (running[i] == op)
            running[i] = NULL;
    if (op->state == 0)
        return 0;
    int rc = op->state == 1 ? MPI_Wait(req_of(op), MPI_STATUS_IGNORE) : MPI_SUCCESS;
    op->state = 0;
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "waiting for a collective", err);
    if (op->kind == FSDP_COLL_REDUCE_SCATTER || op->kind == FSDP_COLL_REDUCE_SCATTER_BF16)
        sum_parts(op, c->world);
    return 0;
}

/* The blocking reduce-scatters: the same all-to-all and sum. */
static int blocking_reduce_scatter(struct fsdp_comm *c, enum fsdp_coll_kind kind,
                                   const void *full, void *shard, size_t n, size_t esize,
                                   char *err)
{
    void *tmp = malloc(n * (size_t)c->world * esize + 1);
    if (!tmp)
        return fsdp_err(err, "mpi: out of memory for a reduce-scatter of %zu elements", n);
    struct fsdp_coll op = {.kind = kind, .in = full, .out = shard, .tmp = tmp, .n = n};
    int rc = mpi_start(c, &op, err);
    if (rc == 0)
        rc = mpi_wait(c, &op, err);
    free(tmp);
    return rc;
}

static int mpi_reduce_scatter(struct fsdp_comm *c, const float *full, float *shard, size_t n,
                              char *err)
{
    return blocking_reduce_scatter(c, FSDP_COLL_REDUCE_SCATTER, full, shard, n, sizeof(float),
                                   err);
}

static int mpi_reduce_scatter_bf16(struct fsdp_comm *c, const uint16_t *full, uint16_t *shard,
                                   size_t n, char *err)
{
    return blocking_reduce_scatter(c, FSDP_COLL_REDUCE_SCATTER_BF16, full, shard, n,
                                   sizeof(uint16_t), err);
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
        .start = mpi_start,
        .progress = mpi_progress,
        .wait = mpi_wait,
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
