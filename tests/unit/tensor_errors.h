/*
 * tensor_errors.h - how far two gradient shards are apart, tensor by
 * tensor (test_flash.c, test_cuda.c): a one-rank full-shard engine says
 * where each of the layout's tensors lies in the shard.
 */
#ifndef FSDP_TEST_TENSOR_ERRORS_H
#define FSDP_TEST_TENSOR_ERRORS_H
#include "comm.h"
#include "fsdp.h"
#include "model.h"
#include "numeric.h"

#include <stdio.h>

/* rel[i] = norm_rel_err of tensor i of m between the shards got and want,
 * laid out by an engine of micro-batch B on kernels k. 0, or -1 with the
 * reason on stderr. */
static inline int tensor_errors(const struct model_layout *m, int B, const struct fsdp_kernels *k,
                                const float *got, const float *want, double *rel)
{
    char err[FSDP_ERR_LEN];
    struct fsdp_comm comm;
    struct fsdp_engine e;
    fsdp_comm_local_init(&comm);
    const struct fsdp_opts o = {FSDP_SHARD_FULL, B, 0, 0, 0, 0, 0, 0, 0};
    int rc = fsdp_init(&e, m, k, &comm, &o, err);
    if (rc == 0) {
        for (int i = 0; i < m->ntensors; i++) {
            const struct model_tensor *t = &m->tensors[i];
            const size_t off = e.units[t->unit].shard_off + t->offset;
            rel[i] = norm_rel_err(got + off, want + off, t->numel);
        }
        fsdp_free(&e);
    } else {
        fprintf(stderr, "  %s\n", err);
    }
    comm.finalize(&comm);
    return rc ? -1 : 0;
}

#endif
