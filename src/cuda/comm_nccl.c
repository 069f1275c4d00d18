/*
 * comm_nccl.c - collectives on device memory with NCCL, beside the host
 * communicator (MPI, or local for one rank) that started the job.
 *
 * The engine's collectives (all-gather, reduce-scatter, all-reduce of
 * gradients) take device buffers: they go to NCCL, queued on the compute
 * stream, so they run in order with the kernels and the host never waits
 * for them. The host collectives (doubles, bytes, abort) stay on
 * the wrapped communicator. Rank 0 makes the NCCL unique id and broadcasts
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct nccl_impl {
    struct fsdp_comm host; /* the communicator this one wraps */
    ncclComm_t nc;
    cudaStream_t stream;
};

static struct nccl_impl *impl(struct fsdp_comm *c) { return c->impl; }

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
    return nccl_check(ncclAllGather(shard, full, n, ncclFloat32, m->nc, m->stream), "all-gather",
                      err);
}

static int nccl_allgather_bf16(struct fsdp_comm *c, const uint16_t *shard, uint16_t *full, size_t n,
                               char *err)
{
    struct nccl_impl *m = impl(c); /* moved, never added: any 2-byte type will do */
    return nccl_check(ncclAllGather(shard, full, n * 2, ncclUint8, m->nc, m->stream),
                      "all-gather (bf16)", err);
}

static int nccl_reduce_scatter(struct fsdp_comm *c, const float *full, float *shard, size_t n,
                               char *err)
{
    struct nccl_impl *m = impl(c);
    return nccl_check(ncclReduceScatter(full, shard, n, ncclFloat32, ncclSum, m->nc, m->stream),
                      "reduce-scatter", err);
}

static int nccl_reduce_scatter_bf16(struct fsdp_comm *c, const uint16_t *full, uint16_t *shard,
                                    size_t n, char *err)
{
    struct nccl_impl *m = impl(c);
    return nccl_check(ncclReduceScatter(full, shard, n, ncclBfloat16, ncclSum, m->nc, m->stream),
                      "reduce-scatter (bf16)", err);
}

static int nccl_allreduce_bf16(struct fsdp_comm *c, uint16_t *buf, size_t n, char *err)
{
    struct nccl_impl *m = impl(c);
    return nccl_check(ncclAllReduce(buf, buf, n, ncclBfloat16, ncclSum, m->nc, m->stream),
                      "all-reduce (bf16)", err);
}

static int nccl_allreduce(struct fsdp_comm *c, float *buf, size_t n, char *err)
{
    struct nccl_impl *m = impl(c);
    return nccl_check(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, m->nc, m->stream),
                      "all-reduce", err);
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
    ncclResult_t r = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(m->nc, &r);
    if (q == ncclSuccess && (r == ncclSuccess || r == ncclInProgress))
        return 0;
    fprintf(stderr, "fsdp-train: NCCL: %s; aborting the communicator\n",
            ncclGetErrorString(q != ncclSuccess ? q : r));
    ncclCommAbort(m->nc);
    return 1;
}

/* A dead peer must not leave this rank in a collective: abort NCCL's
 * communicator first (it ends the kernels waiting on the peer), then the
 * job. */
static void nccl_abort(struct fsdp_comm *c, int code)
{
    struct nccl_impl *m = impl(c);
    ncclCommAbort(m->nc);
    m->host.abort(&m->host, code);
}

static void nccl_finalize(struct fsdp_comm *c)
{
    struct nccl_impl *m = impl(c);
    fsdp_cudamod_watch(NULL, NULL);
    cudaStreamSynchronize(m->stream);
    ncclCommDestroy(m->nc);
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
    c->start = NULL; /* the host's would run on device memory; NCCL calls are asynchronous on
                      * the stream already */
    c->progress = NULL;
    c->wait = NULL;
    c->allreduce_sum_f64 = host_allreduce_f64;
    c->bcast_bytes = host_bcast;
    c->gather_bytes = host_gather;
    c->abort = nccl_abort;
    c->finalize = nccl_finalize;
    return 0;
}
