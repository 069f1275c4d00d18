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

static int phase1_to_phase2(struct fsdp_comm *c);

/* A blocking collective is one more in the ranks' common order: any
 * all-reduce in flight moves to its second phase first (phase1_to_phase2). */
static int in_order(struct fsdp_comm *c, char *err)
{
    int rc = phase1_to_phase2(c);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "an allreduce's second phase", err);
}

static int count_ok(size_t n, const char *what, char *err)
{
    if (n > INT_MAX)
        return fsdp_err(err, "mpi: %s of %zu elements exceeds MPI's int count", what, n);
    return 0;
}

static int mpi_allgather(struct fsdp_comm *c, const float *shard, float *full, size_t n, char *err)
{
    if (in_order(c, err) || count_ok(n, "allgather", err))
        return -1;
    const void *send = shard == full + (size_t)c->rank * n ? MPI_IN_PLACE : shard;
    int rc = MPI_Allgather(send, (int)n, MPI_FLOAT, full, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allgather", err);
}

static int mpi_allgather_bf16(struct fsdp_comm *c, const uint16_t *shard, uint16_t *full, size_t n,
                              char *err)
{
    if (in_order(c, err) || count_ok(n, "allgather", err))
        return -1;
    const void *send = shard == full + (size_t)c->rank * n ? MPI_IN_PLACE : shard;
    int rc = MPI_Allgather(send, (int)n, MPI_UINT16_T, full, (int)n, MPI_UINT16_T, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allgather (bf16)", err);
}

/* ---- non-blocking collectives ----------------------------------------------
 *
 * Sums are taken in rank order by this code, never by MPI: a reduce-scatter
 * is an all-to-all (rank r receives every rank's part r) followed by the sum
 * on the receiver, and an all-reduce is that reduce-scatter on ceil(n/W)
 * parts followed by an all-gather. The bits therefore depend on neither the
 * algorithm Open MPI picks, nor whether the call blocks, nor how a buffer is
 * split into buckets. bf16 sums round each partial sum to bf16, as NCCL's
 * bf16 sum does. The running collectives are listed so progress can test
 * them; an all-reduce's second phase is started by progress or wait. */

#define MAX_RUNNING 8

static struct fsdp_coll *running[MAX_RUNNING];
/* an all-reduce's counts and displacements (MPI reads them until it ends) */
static int *vec_args[MAX_RUNNING][4];

_Static_assert(sizeof(MPI_Request) <= sizeof(((struct fsdp_coll *)0)->req.bytes),
               "an MPI_Request must fit in fsdp_coll.req");

static MPI_Request *req_of(struct fsdp_coll *op) { return (MPI_Request *)(void *)op->req.bytes; }

static const char *const coll_what[] = {"allgather",      "allgather (bf16)",
                                        "reduce-scatter", "reduce-scatter (bf16)",
                                        "allreduce",      "allreduce (bf16)"};

static int is_bf16(const struct fsdp_coll *op)
{
    return op->kind == FSDP_COLL_ALLGATHER_BF16 || op->kind == FSDP_COLL_REDUCE_SCATTER_BF16 ||
           op->kind == FSDP_COLL_ALLREDUCE_BF16;
}

/* o[i] = the sum over ranks r of t[r * per_rank + i], in rank order */
static void sum_ranks(void *o, const void *t, size_t n, size_t per_rank, int world, int bf16)
{
    if (!bf16) {
        float *of = o;
        const float *tf = t;
        memcpy(of, tf, n * sizeof *of);
        for (int r = 1; r < world; r++)
            for (size_t i = 0; i < n; i++)
                of[i] += tf[(size_t)r * per_rank + i];
    } else {
        uint16_t *oh = o;
        const uint16_t *th = t;
        memcpy(oh, th, n * sizeof *oh);
        for (int r = 1; r < world; r++)
            for (size_t i = 0; i < n; i++)
                oh[i] = fsdp_bf16_round(fsdp_bf16_widen(oh[i]) +
                                        fsdp_bf16_widen(th[(size_t)r * per_rank + i]));
    }
}

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
    if (rc != MPI_SUCCESS)
        return -1;
    if (MPI_Type_commit(out) == MPI_SUCCESS)
        return 0;
    MPI_Type_free(out);
    return -1;
}

/* An all-reduce's parts: rank r owns [r * part, r * part + len_r). */
static size_t part_of(size_t n, int world) { return (n + (size_t)world - 1) / (size_t)world; }
static size_t part_len(size_t n, int world, int r)
{
    size_t part = part_of(n, world), lo = part * (size_t)r;
    return lo >= n ? 0 : (n - lo < part ? n - lo : part);
}

/* Phase 1: every rank sends part r of its buffer to rank r. */
static int allreduce_phase1(struct fsdp_comm *c, struct fsdp_coll *op, int slot)
{
    const MPI_Datatype type = is_bf16(op) ? MPI_UINT16_T : MPI_FLOAT;
    const size_t part = part_of(op->n, c->world);
    int *sc = vec_args[slot][0], *sd = vec_args[slot][1], *rc = vec_args[slot][2],
        *rd = vec_args[slot][3];
    for (int r = 0; r < c->world; r++) {
        sc[r] = (int)part_len(op->n, c->world, r);
        sd[r] = (int)(part * (size_t)r);
        rc[r] = (int)part_len(op->n, c->world, c->rank);
        rd[r] = (int)(part * (size_t)r);
    }
    op->phase = 1;
    return MPI_Ialltoallv(op->out, sc, sd, type, op->tmp, rc, rd, type, MPI_COMM_WORLD, req_of(op));
}

/* Phase 2: this rank's part summed in rank order, then gathered by all. */
static int allreduce_phase2(struct fsdp_comm *c, struct fsdp_coll *op, int slot)
{
    const int bf16 = is_bf16(op);
    const size_t part = part_of(op->n, c->world), es = bf16 ? 2 : 4;
    sum_ranks((char *)op->out + part * (size_t)c->rank * es, op->tmp,
              part_len(op->n, c->world, c->rank), part, c->world, bf16);
    int *counts = vec_args[slot][0], *displs = vec_args[slot][1]; /* phase 1's sends */
    op->phase = 2;
    return MPI_Iallgatherv(MPI_IN_PLACE, 0, bf16 ? MPI_UINT16_T : MPI_FLOAT, op->out, counts,
                           displs, bf16 ? MPI_UINT16_T : MPI_FLOAT, MPI_COMM_WORLD, req_of(op));
}

static int mpi_start(struct fsdp_comm *c, struct fsdp_coll *op, char *err)
{
    const char *what = coll_what[op->kind];
    const int bf16 = is_bf16(op);
    const int gather = op->kind == FSDP_COLL_ALLGATHER || op->kind == FSDP_COLL_ALLGATHER_BF16;
    const MPI_Datatype base = bf16 ? MPI_UINT16_T : MPI_FLOAT;
    const size_t esize = bf16 ? sizeof(uint16_t) : sizeof(float);
    const int pieces = op->pieces > 1 ? op->pieces : 1;
    int slot = 0;
    while (slot < MAX_RUNNING && running[slot])
        slot++;
    if (op->state != 0 || slot == MAX_RUNNING)
        return fsdp_err(err, "mpi: %s started while %s", what,
                        op->state ? "it runs already" : "too many collectives run");
    if (count_ok(op->n * (size_t)pieces, what, err) || count_ok(op->in_stride, what, err) ||
        count_ok(op->out_stride, what, err) || count_ok(op->rank_stride, what, err))
        return -1;
    if (op->rank_stride > op->n && (gather || pieces > 1 || op->kind == FSDP_COLL_ALLREDUCE ||
                                    op->kind == FSDP_COLL_ALLREDUCE_BF16))
        return fsdp_err(err, "mpi: a %s takes no rank stride", what);
    int rc = phase1_to_phase2(c);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "an allreduce's second phase", err);
    if (op->kind == FSDP_COLL_ALLREDUCE || op->kind == FSDP_COLL_ALLREDUCE_BF16) {
        if (!vec_args[slot][0])
            return fsdp_err(err, "mpi: %s: no room for its counts", what);
        rc = allreduce_phase1(c, op, slot);
    } else {
        const int n = (int)op->n;
        MPI_Datatype send = base, recv = base;
        int scount = n, rcount = n;
        if (pieces > 1) { /* one element per rank: every piece's part */
            scount = rcount = 1;
            int bad = pieces_type(base, esize, pieces, op->n, op->in_stride, op->n, &send);
            if (!bad && gather &&
                pieces_type(base, esize, pieces, op->n, op->out_stride, op->n, &recv)) {
                MPI_Type_free(&send);
                bad = 1;
            }
            if (bad)
                return fsdp_err(err, "mpi: cannot describe %d pieces of %zu elements for a %s",
                                pieces, op->n, what);
            if (!gather) /* what arrives from each rank: its parts, back to back */
                rcount = n * pieces;
        } else if (op->rank_stride > op->n) { /* a slice of each rank's part */
            scount = 1;
            if (pieces_type(base, esize, 1, op->n, op->n, op->rank_stride, &send))
                return fsdp_err(err, "mpi: cannot describe a slice of %zu elements for a %s", op->n,
                                what);
        }
        if (gather) {
            const char *mine = (const char *)op->out + (size_t)c->rank * op->n * esize;
            const void *in = pieces == 1 && op->in == (const void *)mine ? MPI_IN_PLACE : op->in;
            rc =
                MPI_Iallgather(in, scount, send, op->out, rcount, recv, MPI_COMM_WORLD, req_of(op));
        } else {
            rc = MPI_Ialltoall(op->in, scount, send, op->tmp, rcount, recv, MPI_COMM_WORLD,
                               req_of(op));
        }
        /* a pending collective keeps the types it uses alive (MPI_Type_free) */
        if (send != base)
            MPI_Type_free(&send);
        if (recv != base)
            MPI_Type_free(&recv);
    }
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, what, err);
    op->state = 1;
    running[slot] = op;
    return 0;
}

/* Waits for the running op in slot (block), or tests it. An all-reduce's
 * second phase is another collective, so it starts only where every rank
 * is at the same point of its program (here with block, or in
 * phase1_to_phase2): never from progress, whose timing differs by rank. */
static int advance(struct fsdp_comm *c, int slot, int block)
{
    struct fsdp_coll *op = running[slot];
    while (op->state == 1) {
        int done = 0, rc = block ? MPI_Wait(req_of(op), MPI_STATUS_IGNORE)
                                 : MPI_Test(req_of(op), &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return rc;
        if (!block && !done)
            return MPI_SUCCESS;
        if (op->phase != 1) {
            op->state = 2;
        } else if (!block) {
            return MPI_SUCCESS; /* its request is done (null); the next start moves it on */
        } else if ((rc = allreduce_phase2(c, op, slot)) != MPI_SUCCESS) {
            return rc;
        }
    }
    return MPI_SUCCESS;
}

/* Before another collective starts: every all-reduce still in its first
 * phase finishes it and starts its second, in slot order (the same on
 * every rank), so collectives start in one order everywhere. */
static int phase1_to_phase2(struct fsdp_comm *c)
{
    for (int i = 0; i < MAX_RUNNING; i++) {
        struct fsdp_coll *op = running[i];
        if (!op || op->state != 1 || op->phase != 1)
            continue;
        int rc = MPI_Wait(req_of(op), MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS)
            rc = allreduce_phase2(c, op, i);
        if (rc != MPI_SUCCESS) {
            op->phase = -1; /* its wait reports it */
            return rc;
        }
    }
    return MPI_SUCCESS;
}

static void mpi_progress(struct fsdp_comm *c)
{
    for (int i = 0; i < MAX_RUNNING; i++)
        if (running[i] && running[i]->phase != -1 && advance(c, i, 0) != MPI_SUCCESS)
            running[i]->phase = -1; /* its wait reports it */
}

static int mpi_wait(struct fsdp_comm *c, struct fsdp_coll *op, char *err)
{
    int slot = 0;
    while (slot < MAX_RUNNING && running[slot] != op)
        slot++;
    if (slot == MAX_RUNNING || op->state == 0)
        return 0;
    int rc = op->phase == -1 ? MPI_ERR_OTHER : advance(c, slot, 1);
    if (rc != MPI_SUCCESS) /* MPI may still read the slot's counts: end the request first */
        MPI_Wait(req_of(op), MPI_STATUS_IGNORE);
    running[slot] = NULL;
    op->state = 0;
    op->phase = 0;
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, coll_what[op->kind], err);
    if (op->kind == FSDP_COLL_REDUCE_SCATTER || op->kind == FSDP_COLL_REDUCE_SCATTER_BF16) {
        const size_t pieces = op->pieces > 1 ? (size_t)op->pieces : 1;
        const size_t stride = pieces > 1 ? op->out_stride : op->n, es = is_bf16(op) ? 2 : 4;
        for (size_t k = 0; k < pieces; k++) /* each rank's parts arrived back to back */
            sum_ranks((char *)op->out + k * stride * es, (const char *)op->tmp + k * op->n * es,
                      op->n, op->n * pieces, c->world, is_bf16(op));
    }
    return 0;
}

/* The blocking reductions: the same collectives, started and waited for. */
static int blocking(struct fsdp_comm *c, enum fsdp_coll_kind kind, const void *in, void *out,
                    size_t n, char *err)
{
    const size_t es = kind == FSDP_COLL_REDUCE_SCATTER_BF16 || kind == FSDP_COLL_ALLREDUCE_BF16
                          ? sizeof(uint16_t)
                          : sizeof(float);
    const size_t parts =
        kind == FSDP_COLL_ALLREDUCE || kind == FSDP_COLL_ALLREDUCE_BF16 ? part_of(n, c->world) : n;
    void *tmp = malloc(parts * (size_t)c->world * es + 1);
    if (!tmp)
        return fsdp_err(err, "mpi: out of memory for a %s of %zu elements", coll_what[kind], n);
    struct fsdp_coll op = {.kind = kind, .in = in, .out = out, .tmp = tmp, .n = n};
    int rc = mpi_start(c, &op, err);
    if (rc == 0)
        rc = mpi_wait(c, &op, err);
    free(tmp);
    return rc;
}

static int mpi_reduce_scatter(struct fsdp_comm *c, const float *full, float *shard, size_t n,
                              char *err)
{
    return blocking(c, FSDP_COLL_REDUCE_SCATTER, full, shard, n, err);
}

static int mpi_reduce_scatter_bf16(struct fsdp_comm *c, const uint16_t *full, uint16_t *shard,
                                   size_t n, char *err)
{
    return blocking(c, FSDP_COLL_REDUCE_SCATTER_BF16, full, shard, n, err);
}

static int mpi_allreduce_bf16(struct fsdp_comm *c, uint16_t *buf, size_t n, char *err)
{
    return blocking(c, FSDP_COLL_ALLREDUCE_BF16, NULL, buf, n, err);
}

static int mpi_allreduce(struct fsdp_comm *c, float *buf, size_t n, char *err)
{
    return blocking(c, FSDP_COLL_ALLREDUCE, NULL, buf, n, err);
}

static int mpi_allreduce_f64(struct fsdp_comm *c, double *buf, size_t n, char *err)
{
    if (in_order(c, err) || count_ok(n, "allreduce", err))
        return -1;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allreduce", err);
}

static int mpi_bcast(struct fsdp_comm *c, void *buf, size_t bytes, int root, char *err)
{
    if (in_order(c, err) || count_ok(bytes, "broadcast", err))
        return -1;
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "broadcast", err);
}

static int mpi_gather_bytes(struct fsdp_comm *c, const void *buf, size_t n, int root, char **out,
                            size_t *lens, char *err)
{
    *out = NULL;
    if (in_order(c, err) || count_ok(n, "gather", err))
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

static MPI_Comm side_comm = MPI_COMM_NULL; /* side_sendrecv's: tags never meet the collectives' */

static int mpi_side_sendrecv(struct fsdp_comm *c, const void *send, size_t n, int to, void *recv,
                             size_t m, int from, char *err)
{
    (void)c;
    if (count_ok(n, "side send", err) || count_ok(m, "side receive", err))
        return -1;
    int rc =
        MPI_Sendrecv(send, (int)n, MPI_BYTE, to < 0 ? MPI_PROC_NULL : to, 0, recv, (int)m, MPI_BYTE,
                     from < 0 ? MPI_PROC_NULL : from, 0, side_comm, MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "a copy to a buddy rank", err);
}

/* c->host and c->hosts: each host is named by its lowest rank. */
static void number_hosts(struct fsdp_comm *c, MPI_Comm local)
{
    int lowest = c->rank, *all = calloc((size_t)c->world, sizeof *all);
    MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, local);
    c->host = 0;
    c->hosts = 1;
    if (!all ||
        MPI_Allgather(&lowest, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD) != MPI_SUCCESS) {
        free(all);
        return;
    }
    c->hosts = 0;
    for (int r = 0; r < c->world; r++)
        if (all[r] == r) { /* r is a host's lowest rank */
            if (r == lowest)
                c->host = c->hosts;
            c->hosts++;
        }
    free(all);
}

static void mpi_finalize(struct fsdp_comm *c)
{
    (void)c;
    if (side_comm != MPI_COMM_NULL)
        MPI_Comm_free(&side_comm);
    for (int i = 0; i < MAX_RUNNING; i++)
        free(vec_args[i][0]);
    MPI_Finalize();
}

int fsdp_comm_launched_by_mpi(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

int fsdp_comm_mpi_init(struct fsdp_comm *c, int *argc, char ***argv, int side, char *err)
{
    int provided = 0;
    int rc =
        MPI_Init_thread(argc, argv, side ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS)
        return fsdp_err(err, "mpi: MPI_Init failed (code %d)", rc);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
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
        .start_uses_tmp = 1,
        .allreduce_sum_f64 = mpi_allreduce_f64,
        .bcast_bytes = mpi_bcast,
        .gather_bytes = mpi_gather_bytes,
        .abort = mpi_abort,
        .finalize = mpi_finalize,
    };
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    for (int i = 0; i < MAX_RUNNING; i++) { /* one allocation per slot, four arrays */
        int *v = calloc((size_t)c->world * 4, sizeof *v);
        if (!v) {
            for (int j = 0; j < i; j++)
                free(vec_args[j][0]);
            MPI_Finalize(); /* the caller has no communicator to finalize */
            return fsdp_err(err, "mpi: out of memory for %d ranks' counts", c->world);
        }
        for (int k = 0; k < 4; k++)
            vec_args[i][k] = v + (size_t)k * c->world;
    }
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &c->local_rank);
    MPI_Comm_size(local, &c->local_size);
    number_hosts(c, local);
    MPI_Comm_free(&local);
    if (side && provided >= MPI_THREAD_MULTIPLE &&
        MPI_Comm_dup(MPI_COMM_WORLD, &side_comm) == MPI_SUCCESS) {
        MPI_Comm_set_errhandler(side_comm, MPI_ERRORS_RETURN);
        c->side_sendrecv = mpi_side_sendrecv;
    }
    return 0;
}
