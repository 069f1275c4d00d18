/*
 * checkpoint_verify.c - --verify-load: after a resume, the state as loaded
 * (every rank's shard, gathered unit by unit) is hashed tensor by tensor
 * (ckpt_tensor_digest, as fsdp-ckpt digest does) and compared with the
 * digest of the checkpoint it came from, read from the store. A mismatch
 * names the tensor and the kind. Collective: every rank gathers each unit
 * in the same order; rank 0 compares and all ranks agree on the verdict.
 */
#include "checkpoint_internal.h"

#include "heartbeat.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The checkpoint's digest: a line "tensor kind hex" per tensor and kind,
 * in ckpt_digest's order (tensor-major). */
struct digest_list {
    int n;
    char (*v)[200];
};

/* ckpt_digest's callback: appends one line to the list. */
static int collect_digest(void *arg, const char *tensor, const char *kind, const char *hex)
{
    struct digest_list *d = arg;
    void *v = realloc(d->v, (size_t)(d->n + 1) * sizeof *d->v);
    if (!v)
        return -1;
    d->v = v;
    snprintf(d->v[d->n++], sizeof d->v[0], "%s %s %s", tensor, kind, hex);
    return 0;
}

/* Rank 0: the digest of checkpoint man, read from the store. */
static int checkpoint_digest(struct tckpt *c, const struct ckpt_manifest *man,
                             struct digest_list *want, char *err)
{
    struct ckpt_reader r;
    if (ckpt_reader_init(&r, c->st, man, err))
        return -1;
    int rc = ckpt_digest(&r, collect_digest, want, err);
    ckpt_reader_free(&r);
    return rc;
}

/* ckpt_tensor_digest's source of values when they are all in memory. */
static const float *in_memory(void *arg, uint64_t off, uint64_t n, char *err)
{
    (void)n;
    (void)err;
    return (const float *)arg + off;
}

/* Rank 0: the digest of each tensor of unit u's state of kind k (the whole
 * unit at `unit`, host memory), looked up in the checkpoint's digest. */
static int compare_unit(struct tckpt *c, int u, int k, const float *unit,
                        const struct digest_list *want, int *checked, int *mismatches, char *err)
{
    const struct model_unit *mu = &c->m->units[u];
    for (int t = 0; t < mu->ntensors; t++) {
        const struct model_tensor *mt = &c->m->tensors[mu->first_tensor + t];
        char hex[65], line[200];
        if (ckpt_tensor_digest(mt->numel, in_memory, (void *)(unit + mt->offset), hex, err))
            return -1;
        snprintf(line, sizeof line, "%s %s %s", mt->name, ckpt_kind_name(k), hex);
        int found = 0; /* the checkpoint's digest lists tensor-major order */
        for (int i = 0; i < want->n && !found; i++)
            found = strcmp(line, want->v[i]) == 0;
        *mismatches += !found;
        (*checked)++;
    }
    return 0;
}

/* Collective: every unit's state, kind by kind, gathered on rank 0 (a
 * device engine's into hostunit there), which compares it tensor by tensor.
 * The gathers run on every rank whatever rank 0's hashing meets; its
 * failure is reported after them. */
static int compare_state(struct tckpt *c, const struct digest_list *want, float *hostunit,
                         int *checked, int *mismatches, char *err)
{
    struct fsdp_engine *e = c->e;
    int rc = 0, hash_rc = 0;
    char hash_err[FSDP_ERR_LEN] = "";
    for (int u = 0; !rc && u < c->m->nunits; u++) {
        struct fsdp_unit *U = &e->units[u];
        float *full = e->shard == FSDP_SHARD_NONE ? NULL : U->full;
        for (int k = 0; !rc && k < CKPT_NKINDS; k++) {
            const float *src = tckpt_kind_base(e, k) + U->shard_off;
            if (full)
                rc = c->comm->allgather(c->comm, src, full, U->shard_n, err);
            const float *unit = full ? full : src;
            if (!rc && hostunit) {
                e->k->download(hostunit, unit, (full ? U->padded : U->shard_n) * sizeof(float));
                unit = hostunit;
            }
            if (!rc && !hash_rc && c->comm->rank == 0)
                hash_rc = compare_unit(c, u, k, unit, want, checked, mismatches, hash_err);
        }
    }
    if (!rc && hash_rc)
        rc = fsdp_err(err, "%s", hash_err);
    return rc;
}

/* Rank 0 of a device engine: room for the largest gathered unit on the
 * host. NULL (nothing to allocate) elsewhere. */
static int alloc_host_unit(struct tckpt *c, float **hostunit)
{
    struct fsdp_engine *e = c->e;
    *hostunit = NULL;
    if (!e->k->on_device || c->comm->rank != 0)
        return 0;
    size_t max_unit = 0;
    for (int u = 0; u < c->m->nunits; u++)
        if (e->units[u].padded > max_unit)
            max_unit = e->units[u].padded;
    *hostunit = e->k->host_alloc(max_unit * sizeof(float));
    return *hostunit ? 0 : -1;
}

/* Collective. The digest of the state as loaded (gathered unit by unit on
 * rank 0) against the digest of the checkpoint it came from: proves a
 * reshard placed every byte where it belongs. Reported on stderr and to
 * the supervisor. */
int tckpt_verify_loaded(struct tckpt *c, const struct ckpt_manifest *man, char *err)
{
    struct digest_list want = {0};
    int rc = c->comm->rank == 0 ? checkpoint_digest(c, man, &want, err) : 0;
    if (tckpt_agree(c->comm, rc, err)) {
        free(want.v);
        return -1;
    }
    float *hostunit; /* agreed on: compare_state is collective */
    int oom = alloc_host_unit(c, &hostunit);
    if (tckpt_agree(c->comm, oom ? fsdp_err(err, "verify-load: out of memory") : 0, err)) {
        if (hostunit)
            c->e->k->host_free(hostunit);
        free(want.v);
        return -1;
    }
    int checked = 0, mismatches = 0;
    rc = compare_state(c, &want, hostunit, &checked, &mismatches, err);
    if (hostunit)
        c->e->k->host_free(hostunit);
    free(want.v);
    want.v = NULL;
    fsdp_params_changed(c->e); /* the gather buffers held other kinds */
    if (tckpt_agree(c->comm, rc, err))
        return -1;
    double bad = mismatches;
    if (c->comm->allreduce_sum_f64(c->comm, &bad, 1, err))
        return -1;
    if (c->comm->rank == 0) {
        fprintf(stderr,
                "fsdp-train: loaded state of step %llu (written by %d ranks, loaded on "
                "%d): %s\n",
                (unsigned long long)man->step, man->world, c->comm->world,
                bad ? "DIGEST DIFFERS" : "digest equal to the checkpoint's");
        hb_event("load_verified step=%llu from=%d to=%d digest=%s", (unsigned long long)man->step,
                 man->world, c->comm->world, bad ? "different" : "equal");
    }
    if (bad || (c->comm->rank == 0 && checked != want.n))
        return fsdp_err(err, "the loaded state's digest differs from checkpoint step %llu",
                        (unsigned long long)man->step);
    return 0;
}
