/*
 * comm_nccl.c - collectives on device memory with NCCL, beside the host
 * communicator (MPI, or local for one rank) that started the job.
 *
 * The engine's collectives (all-gather, reduce-scatter, all-reduce of
 * gradients) take device buffers: they go to NCCL on a stream of their own,
 * the comm stream, in the order the engine issues them (one stream: NCCL
 * kernels of one communicator never run side by side, and every rank
 * issues them in the same order). Events hand the buffers over: the comm
 * stream waits for the kernels queued before the call, and the compute
 * stream waits for the collective where its result is needed: at once for
 * the blocking calls, at wait() for start() (--prefetch on: the next
 * unit's all-gather, or a unit's reduce-scatter, runs while the compute
 * stream goes on, as FSDP's unshard and reduce-scatter streams do). The
 * host never waits for either stream here. The host collectives (doubles,
 * bytes, abort) stay on the wrapped communicator. Rank 0 makes the NCCL unique id and broadcasts
 * it over the host communicator, as torch.distributed does over its store.
 */
#include "module.h"

#include <cuda_runtime_api.h>
/* NCCL before 2.19 declares ncclBfloat16 only where cuda_bf16.h (C++) has
 * said the type exists; this file never uses the type itself, only the
 * enum value, so it says so for plain C. */
#ifndef __CUDA_BF16_TYPES_EXIST__
#define __CUDA_BF16_TYPES_EXIST__
#endif
#include <nccl.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Events for started collectives, used in turn: the engine has at most
 * two in flight (the next unit's all-gather and a reduce-scatter, or a
 * bucket's all-reduce). An event recorded again before its wait would only
 * make that wait later (the comm stream runs in order), never too early. */
#define NCCL_EVENTS 8

struct nccl_impl {
    struct fsdp_comm host; /* the communicator this one wraps */
    ncclComm_t nc;
    cudaStream_t stream; /* compute */
    cudaStream_t comm;   /* every NCCL call, in order */
    cudaEvent_t go;      /* the compute stream's work so far */
    cudaEvent_t done[NCCL_EVENTS];
    int next_done;
    /* The watch runs on the compute thread and on the checkpoint writer's,
     * and abort may come from either: one of them aborts, once, and no
     * thread asks an aborted (freed) communicator for its error. */
    pthread_mutex_t abort_lock;
    int aborted;
};

/* Aborts the communicator unless that was done; call with abort_lock held. */
static void abort_once(struct nccl_impl *m)
{
    if (!m->aborted)
        ncclCommAbort(m->nc);
    m->aborted = 1;
}

static struct nccl_impl *impl(struct fsdp_comm *c) { return c->impl; }

static int cuda_check(cudaError_t e, const char *what, char *err)
{
    if (e == cudaSuccess)
        return 0;
    snprintf(err, 256, "CUDA %s: %s", what, cudaGetErrorString(e));
    return -1;
}

/* The comm stream waits for what the compute stream has queued. */
static int enter(struct nccl_impl *m, char *err)
{
    return cuda_check(cudaEventRecord(m->go, m->stream), "event record", err) ||
           cuda_check(cudaStreamWaitEvent(m->comm, m->go, 0), "stream wait", err);
}

/* The compute stream waits for what the comm stream has queued: ev marks
 * it (recorded now; waited for now or at the collective's wait). */
static int mark(struct nccl_impl *m, cudaEvent_t ev, char *err)
{
    return cuda_check(cudaEventRecord(ev, m->comm), "event record", err);
}

static int leave(struct nccl_impl *m, cudaEvent_t ev, char *err)
{
    return cuda_check(cudaStreamWaitEvent(m->stream, ev, 0), "stream wait", err);
}

/* A blocking call: on the comm stream between enter and leave. */
#define BLOCKING(m, call, what, err)                                                               \
    (enter(m, err) || nccl_check(call, what, err) || mark(m, m->done[0], err) ||                   \
     leave(m, m->done[0], err))

static int nccl_check(ncclResult_t r, const char *what, char *err)
{
    if (r == ncclSuccess)
        return 0;
    snprintf(err, 256, "NCCL %s: %s", what, ncclGetErrorString(r));
    return -1;
}

static int nccl_allgather(struct fsdp_comm *c, const float *shard, float *full, size_t n, char *err)
{
    struct nccl_impl *m = impl(c);
    return BLOCKING(m, ncclAllGather(shard, full, n, ncclFloat32, m->nc, m->comm), "all-gather",
                    err);
}

static int nccl_allgather_bf16(struct fsdp_comm *c, const uint16_t *shard, uint16_t *full, size_t n,
                               char *err)
{
    struct nccl_impl *m = impl(c); /* moved, never added: any 2-byte type will do */
    return BLOCKING(m, ncclAllGather(shard, full, n * 2, ncclUint8, m->nc, m->comm),
                    "all-gather (bf16)", err);
}

static int nccl_reduce_scatter(struct fsdp_comm *c, const float *full, float *shard, size_t n,
                               char *err)
{
    struct nccl_impl *m = impl(c);
    return BLOCKING(m, ncclReduceScatter(full, shard, n, ncclFloat32, ncclSum, m->nc, m->comm),
                    "reduce-scatter", err);
}

static int nccl_reduce_scatter_bf16(struct fsdp_comm *c, const uint16_t *full, uint16_t *shard,
                                    size_t n, char *err)
{
    struct nccl_impl *m = impl(c);
    return BLOCKING(m, ncclReduceScatter(full, shard, n, ncclBfloat16, ncclSum, m->nc, m->comm),
                    "reduce-scatter (bf16)", err);
}

static int nccl_allreduce_bf16(struct fsdp_comm *c, uint16_t *buf, size_t n, char *err)
{
    struct nccl_impl *m = impl(c);
    return BLOCKING(m, ncclAllReduce(buf, buf, n, ncclBfloat16, ncclSum, m->nc, m->comm),
                    "all-reduce (bf16)", err);
}

static int nccl_allreduce(struct fsdp_comm *c, float *buf, size_t n, char *err)
{
    struct nccl_impl *m = impl(c);
    return BLOCKING(m, ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, m->nc, m->comm),
                    "all-reduce", err);
}

/* One piece of a started collective, queued on the comm stream. */
static ncclResult_t queue_piece(struct nccl_impl *m, const struct fsdp_coll *op, int p)
{
    const int bf16 = op->kind == FSDP_COLL_ALLGATHER_BF16 ||
                     op->kind == FSDP_COLL_REDUCE_SCATTER_BF16 ||
                     op->kind == FSDP_COLL_ALLREDUCE_BF16;
    const size_t es = bf16 ? 2 : 4, n = op->n;
    const void *in = (const char *)op->in + (size_t)p * op->in_stride * es;
    void *out = (char *)op->out + (size_t)p * op->out_stride * es;
    switch (op->kind) {
    case FSDP_COLL_ALLGATHER:
        return ncclAllGather(in, out, n, ncclFloat32, m->nc, m->comm);
    case FSDP_COLL_ALLGATHER_BF16:
        return ncclAllGather(in, out, n * 2, ncclUint8, m->nc, m->comm);
    case FSDP_COLL_REDUCE_SCATTER:
        return ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, m->nc, m->comm);
    case FSDP_COLL_REDUCE_SCATTER_BF16:
        return ncclReduceScatter(in, out, n, ncclBfloat16, ncclSum, m->nc, m->comm);
    case FSDP_COLL_ALLREDUCE: /* in place on out */
        return ncclAllReduce(out, out, n, ncclFloat32, ncclSum, m->nc, m->comm);
    case FSDP_COLL_ALLREDUCE_BF16:
        return ncclAllReduce(out, out, n, ncclBfloat16, ncclSum, m->nc, m->comm);
    }
    return ncclInvalidArgument;
}

/* --prefetch on: the collective queued on the comm stream after the
 * compute stream's work so far, one call per piece as the blocking path
 * makes them (not one NCCL group: grouping may change NCCL's algorithm and
 * so the bits); the compute stream goes on, and waits for it at
 * nccl_wait. */
static int nccl_start(struct fsdp_comm *c, struct fsdp_coll *op, char *err)
{
    struct nccl_impl *m = impl(c);
    const int pieces = op->pieces > 1 ? op->pieces : 1;
    if (op->rank_stride > op->n) /* the engine slices only where start_uses_tmp */
        return snprintf(err, 256, "NCCL: a collective takes no rank stride"), -1;
    if (enter(m, err))
        return -1;
    for (int p = 0; p < pieces; p++)
        if (nccl_check(queue_piece(m, op, p), "collective", err))
            return -1;
    int k = 1 + m->next_done; /* done[0] is the blocking calls' */
    m->next_done = (m->next_done + 1) % (NCCL_EVENTS - 1);
    if (mark(m, m->done[k], err))
        return -1;
    op->req.bytes[0] = (unsigned char)k;
    op->state = 1;
    return 0;
}

static int nccl_wait(struct fsdp_comm *c, struct fsdp_coll *op, char *err)
{
    struct nccl_impl *m = impl(c);
    op->state = 0;
    return leave(m, m->done[op->req.bytes[0]], err);
}

static int host_allreduce_f64(struct fsdp_comm *c, double *buf, size_t n, char *err)
{
    struct fsdp_comm *h = &impl(c)->host;
    return h->allreduce_sum_f64(h, buf, n, err);
}

static int host_bcast(struct fsdp_comm *c, void *buf, size_t bytes, int root, char *err)
{
    struct fsdp_comm *h = &impl(c)->host;
    return h->bcast_bytes(h, buf, bytes, root, err);
}

static int host_gather(struct fsdp_comm *c, const void *buf, size_t n, int root, char **out,
                       size_t *lens, char *err)
{
    struct fsdp_comm *h = &impl(c)->host;
    return h->gather_bytes(h, buf, n, root, out, lens, err);
}

/* Called while the host waits for the GPU (kernels_cuda.cu): NCCL reports
 * a dead or failed peer as an asynchronous error; the communicator is then
 * aborted, which ends this rank's collective kernels, and the rank exits. */
static int nccl_watch(void *arg)
{
    struct nccl_impl *m = arg;
    pthread_mutex_lock(&m->abort_lock);
    int failed = m->aborted;
    if (!failed) {
        ncclResult_t r = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(m->nc, &r);
        failed = !(q == ncclSuccess && (r == ncclSuccess || r == ncclInProgress));
        if (failed) {
            fprintf(stderr, "fsdp-train: NCCL: %s; aborting the communicator\n",
                    ncclGetErrorString(q != ncclSuccess ? q : r));
            abort_once(m);
        }
    }
    pthread_mutex_unlock(&m->abort_lock);
    return failed;
}

/* A dead peer must not leave this rank in a collective: abort NCCL's
 * communicator first (it ends the kernels waiting on the peer), then the
 * job. */
static void nccl_abort(struct fsdp_comm *c, int code)
{
    struct nccl_impl *m = impl(c);
    pthread_mutex_lock(&m->abort_lock);
    abort_once(m);
    pthread_mutex_unlock(&m->abort_lock);
    m->host.abort(&m->host, code);
}

static void nccl_finalize(struct fsdp_comm *c)
{
    struct nccl_impl *m = impl(c);
    fsdp_cudamod_watch(NULL, NULL);
    cudaStreamSynchronize(m->stream);
    cudaStreamSynchronize(m->comm);
    if (!m->aborted) /* an aborted communicator is freed already */
        ncclCommDestroy(m->nc);
    pthread_mutex_destroy(&m->abort_lock);
    for (int i = 0; i < NCCL_EVENTS; i++)
        cudaEventDestroy(m->done[i]);
    cudaEventDestroy(m->go);
    cudaStreamDestroy(m->comm);
    struct fsdp_comm host = m->host;
    free(m);
    host.finalize(&host);
}

int fsdp_cudamod_comm_nccl_init(struct fsdp_comm *c, char *err)
{
    struct nccl_impl *m = calloc(1, sizeof *m);
    if (!m)
        return snprintf(err, 256, "out of memory"), -1;
    m->host = *c;
    m->stream = (cudaStream_t)fsdp_cudamod_stream();
    pthread_mutex_init(&m->abort_lock, NULL);
    int ok = cudaStreamCreateWithFlags(&m->comm, cudaStreamNonBlocking) == cudaSuccess &&
             cudaEventCreateWithFlags(&m->go, cudaEventDisableTiming) == cudaSuccess;
    for (int i = 0; ok && i < NCCL_EVENTS; i++)
        ok = cudaEventCreateWithFlags(&m->done[i], cudaEventDisableTiming) == cudaSuccess;
    if (!ok) { /* a process that cannot make a stream and 9 events ends soon anyway */
        free(m);
        return snprintf(err, 256, "CUDA: cannot create the comm stream: %s",
                        cudaGetErrorString(cudaGetLastError())),
               -1;
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int rc = c->rank == 0 ? nccl_check(ncclGetUniqueId(&id), "unique id", err) : 0;
    /* every rank learns whether rank 0 has an id (a zero id means no) */
    if (c->bcast_bytes(c, &id, sizeof id, 0, err) || rc) {
        free(m);
        return -1;
    }
    static const ncclUniqueId zero;
    if (memcmp(&id, &zero, sizeof id) == 0) {
        free(m);
        return snprintf(err, 256, "NCCL: rank 0 could not make a unique id"), -1;
    }
    if (nccl_check(ncclCommInitRank(&m->nc, c->world, id, c->rank), "init", err)) {
        free(m);
        return -1;
    }
    c->name = "nccl";
    c->impl = m;
    fsdp_cudamod_watch(nccl_watch, m);
    c->allgather = nccl_allgather;
    c->allgather_bf16 = nccl_allgather_bf16;
    c->reduce_scatter = nccl_reduce_scatter;
    c->reduce_scatter_bf16 = nccl_reduce_scatter_bf16;
    c->allreduce_sum = nccl_allreduce;
    c->allreduce_sum_bf16 = nccl_allreduce_bf16;
    c->start = nccl_start;
    c->progress = NULL; /* the GPU moves the data: nothing to advance */
    c->wait = nccl_wait;
    c->start_uses_tmp = 0; /* NCCL reduces straight into out */
    c->allreduce_sum_f64 = host_allreduce_f64;
    c->bcast_bytes = host_bcast;
    c->gather_bytes = host_gather;
    c->abort = nccl_abort;
    c->finalize = nccl_finalize;
    return 0;
}
