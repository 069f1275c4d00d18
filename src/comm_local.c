/*
 * comm_local.c - the one-rank backend: every collective is a copy or nothing.
 * Used when fsdp-train runs without mpirun, and by unit tests.
 */
#include "comm.h"

#include <stdlib.h>
#include <string.h>

static int local_allgather(struct fsdp_comm *c, const float *shard, float *full, size_t n,
                           char *err)
{
    (void)c, (void)err;
    if (full != shard)
        memmove(full, shard, n * sizeof *full);
    return 0;
}

static int local_allgather_bf16(struct fsdp_comm *c, const uint16_t *shard, uint16_t *full,
                                size_t n, char *err)
{
    (void)c, (void)err;
    if (full != shard)
        memmove(full, shard, n * sizeof *full);
    return 0;
}

static int local_reduce_scatter(struct fsdp_comm *c, const float *full, float *shard, size_t n,
                                char *err)
{
    (void)c, (void)err;
    if (full != shard)
        memmove(shard, full, n * sizeof *shard);
    return 0;
}

static int local_reduce_scatter_bf16(struct fsdp_comm *c, const uint16_t *full, uint16_t *shard,
                                     size_t n, char *err)
{
    (void)c, (void)err;
    if (full != shard)
        memmove(shard, full, n * sizeof *shard);
    return 0;
}

static int local_allreduce_bf16(struct fsdp_comm *c, uint16_t *buf, size_t n, char *err)
{
    (void)c, (void)buf, (void)n, (void)err;
    return 0;
}

static int local_allreduce(struct fsdp_comm *c, float *buf, size_t n, char *err)
{
    (void)c, (void)buf, (void)n, (void)err;
    return 0;
}

static int local_allreduce_f64(struct fsdp_comm *c, double *buf, size_t n, char *err)
{
    (void)c, (void)buf, (void)n, (void)err;
    return 0;
}

static int local_bcast(struct fsdp_comm *c, void *buf, size_t bytes, int root, char *err)
{
    (void)c, (void)buf, (void)bytes, (void)root, (void)err;
    return 0;
}

static int local_gather_bytes(struct fsdp_comm *c, const void *buf, size_t n, int root, char **out,
                              size_t *lens, char *err)
{
    (void)c, (void)root, (void)err;
    *out = malloc(n ? n : 1);
    if (!*out)
        return -1;
    memcpy(*out, buf, n);
    lens[0] = n;
    return 0;
}

static void local_finalize(struct fsdp_comm *c) { (void)c; }

static void local_abort(struct fsdp_comm *c, int code)
{
    (void)c;
    exit(code);
}

void fsdp_comm_local_init(struct fsdp_comm *c)
{
    *c = (struct fsdp_comm){
        .name = "local",
        .rank = 0,
        .world = 1,
        .local_rank = 0,
        .local_size = 1,
        .host = 0,
        .hosts = 1,
        .allgather = local_allgather,
        .allgather_bf16 = local_allgather_bf16,
        .reduce_scatter = local_reduce_scatter,
        .reduce_scatter_bf16 = local_reduce_scatter_bf16,
        .allreduce_sum = local_allreduce,
        .allreduce_sum_bf16 = local_allreduce_bf16,
        .allreduce_sum_f64 = local_allreduce_f64,
        .bcast_bytes = local_bcast,
        .gather_bytes = local_gather_bytes,
        .abort = local_abort,
        .finalize = local_finalize,
    };
}
