/*
 * fsdp.c - the FSDP engine's units: shard layout, gather/free, gradient
 * reduction and the sharded AdamW step. The forward and backward passes
 * over the model's blocks, and the activations they keep, are in
 * fsdp_pass.c; fsdp_units.h is what the two files share.
 */
#include "fsdp.h"
#include "fsdp_family.h"
#include "fsdp_units.h"

#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fsdp_shard_name(enum fsdp_shard s)
{
    return s == FSDP_SHARD_FULL ? "full" : s == FSDP_SHARD_GRAD_OP ? "grad-op" : "none";
}

int fsdp_shard_parse(const char *s, enum fsdp_shard *out)
{
    if (strcmp(s, "full") == 0)
        *out = FSDP_SHARD_FULL;
    else if (strcmp(s, "grad-op") == 0)
        *out = FSDP_SHARD_GRAD_OP;
    else if (strcmp(s, "none") == 0)
        *out = FSDP_SHARD_NONE;
    else
        return -1;
    return 0;
}

int fsdp_recompute_parse(const char *s, int *every)
{
    long long n;
    if (strcmp(s, "none") == 0)
        *every = 0;
    else if (strcmp(s, "blocks") == 0)
        *every = 1;
    else if (strncmp(s, "every-", 6) == 0 && fsdp_parse_i64(s + 6, 1, 256, &n) == 0)
        *every = (int)n;
    else
        return -1;
    return 0;
}

const char *fsdp_recompute_name(int every, char *buf, size_t len)
{
    if (every <= 1)
        snprintf(buf, len, "%s", every ? "blocks" : "none");
    else
        snprintf(buf, len, "every-%d", every);
    return buf;
}

static int gather_finish(struct fsdp_engine *e, char *err);
static int bucket_finish(struct fsdp_engine *e, char *err);

/* Finishes whatever collective is in flight; a pass that failed half-way
 * may leave one (its error was reported then). */
static void settle(struct fsdp_engine *e)
{
    char err[FSDP_ERR_LEN];
    if (e->units) {
        gather_finish(e, err);
        fsdp_rs_finish(e, err);
        bucket_finish(e, err);
    }
}

/* none: buckets of consecutive units of at least `bytes` of gradient,
 * from the last unit down (the backward's order), and the all-reduce's
 * scratch for the largest. */
static int plan_buckets(struct fsdp_engine *e, size_t bytes)
{
    const int nu = e->m->nunits;
    e->buckets = calloc((size_t)nu, sizeof *e->buckets);
    if (!e->buckets)
        return -1;
    size_t biggest = 0;
    for (int hi = nu - 1; hi >= 0;) {
        int lo = hi;
        size_t n = e->units[lo].shard_n;
        while (lo > 0 && (bytes == 0 || n * sizeof(float) < bytes))
            n = e->units[hi].shard_off + e->units[hi].shard_n - e->units[--lo].shard_off;
        e->buckets[e->nbuckets++] = (struct fsdp_bucket){lo, hi, 0};
        biggest = n > biggest ? n : biggest;
        hi = lo - 1;
    }
    e->bucket_running = -1;
    if (!e->comm->start || !e->comm->start_uses_tmp)
        return 0; /* the blocking all-reduce and NCCL's need no scratch */
    size_t tmp = biggest + (size_t)e->comm->world; /* world * ceil(n / world) */
    if (!(e->rs_parts = e->k->alloc(tmp * sizeof(float))))
        return -1;
    e->rs_parts_bytes = tmp * sizeof(float);
    e->mem.grad_full_bytes += tmp * sizeof(float);
    return 0;
}

static void build_segments(struct fsdp_engine *e)
{
    const struct model_layout *m = e->m;
    e->nsegs = 0;
    for (int u = 0; u < m->nunits; u++) {
        const struct fsdp_unit *U = &e->units[u];
        const struct model_unit *mu = &m->units[u];
        for (int i = 0; i < mu->ntensors; i++) {
            const struct model_tensor *t = &m->tensors[mu->first_tensor + i];
            size_t lo = t->offset > U->shard_lo ? t->offset : U->shard_lo;
            size_t hi = t->offset + t->numel;
            if (hi > U->shard_lo + U->shard_n)
                hi = U->shard_lo + U->shard_n;
            if (lo >= hi)
                continue;
            e->segs[e->nsegs++] =
                (struct fsdp_segment){U->shard_off + (lo - U->shard_lo), hi - lo, t->decay};
        }
    }
}

/* The engine's settings from the options: nothing allocated yet. K blocks
 * make a group (one gather and one reduce-scatter); none keeps one a unit. */
static void set_options(struct fsdp_engine *e, const struct model_layout *m,
                        const struct fsdp_kernels *k, struct fsdp_comm *comm,
                        const struct fsdp_opts *o)
{
    memset(e, 0, sizeof *e);
    const enum fsdp_shard shard = o->shard;
    e->m = m;
    e->k = k;
    e->passes = fsdp_family_passes(m->cfg.arch);
    e->comm = comm;
    e->shard = shard;
    e->B = o->micro_batch;
    e->T = m->cfg.seq;
    e->recompute_every = o->recompute_every;
    e->bf16 = o->bf16;
    e->flash = e->bf16 && e->passes->flash && k->attention_forward_bf16 &&
               k->matmul_forward_to_bf16 && m->cfg.dim / m->cfg.heads <= k->attention_bf16_max_hs;
    e->reduce_bf16 = o->reduce_bf16;
    e->fp16 = o->fp16 && !o->bf16;
    e->half = e->bf16 || e->fp16;
    e->to16 = e->fp16 ? k->to_fp16 : k->to_bf16;
    e->from16 = e->fp16 ? k->from_fp16 : k->from_bf16;
    e->prefetch =
        o->prefetch && shard != FSDP_SHARD_NONE && comm->start; /* else nothing overlaps */
    e->holder[0] = e->holder[1] = -1;
    e->gather_unit = e->rs_unit = e->bucket_running = -1;
    const int L = m->cfg.layers;
    const int K = shard == FSDP_SHARD_NONE || o->unit_blocks < 1 ? 1
                  : o->unit_blocks > L                           ? L
                                                                 : o->unit_blocks;
    e->unit_blocks = K;
    e->nbuf = e->prefetch && K < L ? 2 : 1; /* one group of blocks has nothing to alternate with */
}

/* Each unit's flat size padded to a multiple of the world, this rank's
 * slice of it and where the slice lies in the rank's state, and the group
 * of blocks it belongs to; *max_shard: the largest slice. -1: out of memory. */
static int lay_out_units(struct fsdp_engine *e, size_t *max_shard)
{
    const struct model_layout *m = e->m;
    const int nu = m->nunits, L = m->cfg.layers, K = e->unit_blocks;
    const size_t W = e->shard == FSDP_SHARD_NONE ? 1 : (size_t)e->comm->world;
    const size_t rank = e->shard == FSDP_SHARD_NONE ? 0 : (size_t)e->comm->rank;
    e->units = calloc((size_t)nu, sizeof *e->units);
    e->segs = calloc((size_t)m->ntensors, sizeof *e->segs);
    if (!e->units || !e->segs)
        return -1;
    *max_shard = 0;
    for (int u = 0; u < nu; u++) {
        struct fsdp_unit *U = &e->units[u];
        U->numel = m->units[u].numel;
        U->padded = fsdp_round_up(U->numel, W);
        U->shard_n = U->padded / W;
        U->shard_lo = rank * U->shard_n;
        U->shard_off = e->shard_total;
        e->shard_total += fsdp_round_up(U->shard_n, ALIGN_FLOATS);
        if (U->shard_n > *max_shard)
            *max_shard = U->shard_n;
        U->group = u;
        U->group_n = 1;
        if (u >= model_unit_block(0) && u <= model_unit_block(L - 1)) {
            int l = u - model_unit_block(0), first = l / K * K;
            U->group = model_unit_block(first);
            U->group_n = first + K <= L ? K : L - first;
        }
    }
    return 0;
}

/* The rank's shard of each state kind: parameters, gradients, AdamW's two
 * moments. -1: out of memory. */
static int alloc_state(struct fsdp_engine *e)
{
    float **kinds[4] = {&e->params, &e->grads, &e->exp_avg, &e->exp_avg_sq};
    for (int i = 0; i < 4; i++) {
        *kinds[i] = e->k->alloc(e->shard_total * sizeof(float));
        if (!*kinds[i])
            return -1;
        e->mem.state_bytes[i] = e->shard_total * sizeof(float);
    }
    return 0;
}

/* none: the shard is the whole unit: parameters and gradients are used in
 * place, always "gathered". In bf16 the kernels read a rounded copy
 * instead, as the other strategies' gathers give them (fp16: the fp16
 * values, widened). -1: out of memory. */
static int alloc_unsharded(struct fsdp_engine *e)
{
    if (e->half) {
        e->gather_buf = e->k->alloc(e->shard_total * sizeof(float));
        if (!e->gather_buf)
            return -1;
        e->mem.gather_bytes = e->shard_total * sizeof(float);
    }
    for (int u = 0; u < e->m->nunits; u++) {
        float *params = e->half ? e->gather_buf : e->params;
        e->units[u].full = params + e->units[u].shard_off;
        e->units[u].full_grad = e->grads + e->units[u].shard_off;
        e->units[u].gathered = !e->half;
    }
    return 0;
}

/* The most elements of a shard one reduce-scatter through rs_parts takes. */
static size_t rs_slice(const struct fsdp_engine *e)
{
    const size_t es = e->reduce_bf16 ? sizeof(uint16_t) : sizeof(float);
    return e->rs_parts_bytes / es / (size_t)e->comm->world;
}

/* full and grad-op: full-size buffers. grad-op keeps every unit, full
 * shares nbuf group buffers of K blocks between all groups (group i of
 * blocks uses buffer i % nbuf). Full gradients always share nbuf group
 * buffers: one group is in its backward pass while (prefetch) the one
 * before is reduced. A group's blocks lie pb apart. -1: out of memory. */
static int alloc_gathered(struct fsdp_engine *e, size_t max_shard)
{
    const struct fsdp_kernels *k = e->k;
    const int L = e->m->cfg.layers, K = e->unit_blocks;
    const int lnf = model_unit_lnf(e->m), blk = model_unit_block(0);
    const size_t nb = (size_t)e->nbuf, kb = (size_t)K;
    size_t pe = fsdp_round_up(e->units[0].padded, ALIGN_FLOATS);
    size_t pb = fsdp_round_up(e->units[blk].padded, ALIGN_FLOATS);
    size_t pl = fsdp_round_up(e->units[lnf].padded, ALIGN_FLOATS);
    size_t gather = e->shard == FSDP_SHARD_FULL ? pe + pb * kb * nb + pl : pe + pb * L + pl;
    /* the all-to-all's landing place fits the largest group but the first
     * unit (the embedding), which fsdp_unit_grad_end reduces in slices when it is
     * bigger: a vocabulary-wide embedding would otherwise add its whole size
     * to every rank (1 GB for Llama 3.2 1B's) */
    size_t land = pb * kb > pl ? pb * kb : pl;
    e->gather_buf = k->alloc(gather * sizeof(float));
    e->grad_full_buf = k->alloc((pe + pb * kb * nb + pl) * sizeof(float));
    e->rs_tmp = k->alloc(fsdp_round_up(max_shard, ALIGN_FLOATS) * kb * sizeof(float));
    if (!e->gather_buf || !e->grad_full_buf || !e->rs_tmp)
        return -1;
    e->mem.gather_bytes = gather * sizeof(float);
    e->mem.grad_full_bytes = (pe + pb * kb * nb + pl) * sizeof(float);
    if (e->comm->start && e->comm->start_uses_tmp) { /* the all-to-all's landing place */
        if (!(e->rs_parts = k->alloc(land * sizeof(float))))
            return -1;
        e->rs_parts_bytes = land * sizeof(float);
        e->mem.grad_full_bytes += land * sizeof(float);
        size_t step = rs_slice(e), n0 = e->units[0].shard_n;
        e->mem.rs_slices = step ? (int)((n0 + step - 1) / step) : 0;
    }
    e->units[0].full = e->gather_buf;
    e->units[0].full_grad = e->grad_full_buf;
    for (int l = 0; l < L; l++) {
        struct fsdp_unit *U = &e->units[model_unit_block(l)];
        size_t slot = (size_t)(l / K) % nb * kb + (size_t)(l % K);
        U->full = e->gather_buf + pe + pb * (e->shard == FSDP_SHARD_FULL ? slot : (size_t)l);
        U->full_grad = e->grad_full_buf + pe + pb * slot;
    }
    e->units[lnf].full = e->gather_buf + gather - pl;
    e->units[lnf].full_grad = e->grad_full_buf + pe + pb * kb * nb;
    return 0;
}

/* bf16 and fp16: a 16-bit twin of every gathered buffer, at the same
 * offsets, and of K shards. -1: out of memory. */
static int alloc_half_params(struct fsdp_engine *e, size_t max_shard)
{
    if (!e->half)
        return 0;
    size_t n16 = e->mem.gather_bytes / sizeof(float);
    float *base = e->gather_buf;
    e->gather16_buf = e->k->alloc(n16 * sizeof(uint16_t));
    e->shard16 =
        e->k->alloc(fsdp_round_up(max_shard, ALIGN_FLOATS) * e->unit_blocks * sizeof(uint16_t));
    if (!e->gather16_buf || !e->shard16)
        return -1;
    for (int u = 0; u < e->m->nunits; u++)
        e->units[u].full16 = e->gather16_buf + (e->units[u].full - base);
    e->mem.gather_bytes += n16 * sizeof(uint16_t);
    /* A bf16 gather widens only what the passes read in fp32 (widen): the
     * rest of the fp32 buffer is NaN, so a pass that read a twin_only
     * tensor's fp32 copy would turn every bf16 test's loss to NaN (fp16
     * widens every tensor). */
    enum { CHUNK = 1 << 16 };
    float *nan = malloc(CHUNK * sizeof *nan);
    if (!nan)
        return -1;
    for (size_t i = 0; i < CHUNK; i++)
        nan[i] = NAN;
    for (size_t off = 0; off < n16; off += CHUNK)
        e->k->upload(base + off, nan, (n16 - off < CHUNK ? n16 - off : CHUNK) * sizeof *nan);
    free(nan);
    return 0;
}

/* --reduce-bf16: bf16 copies of a group's gradient and of its reduced
 * shard; none: of all of it, all-reduced. -1: out of memory. */
static int alloc_bf16_grads(struct fsdp_engine *e, size_t max_shard)
{
    const int nu = e->m->nunits;
    if (e->reduce_bf16 && e->shard != FSDP_SHARD_NONE) {
        size_t n16 = 0, r16 = fsdp_round_up(max_shard, ALIGN_FLOATS) * (size_t)e->unit_blocks;
        for (int u = 0; u < nu; u++) /* a group's blocks lie a padded block apart */
            if (fsdp_round_up(e->units[u].padded, ALIGN_FLOATS) * (size_t)e->units[u].group_n > n16)
                n16 = fsdp_round_up(e->units[u].padded, ALIGN_FLOATS) * (size_t)e->units[u].group_n;
        e->grad16 = e->k->alloc(n16 * sizeof(uint16_t));
        e->rs16 = e->k->alloc(r16 * sizeof(uint16_t));
        if (!e->grad16 || !e->rs16)
            return -1;
        e->mem.grad_full_bytes += (n16 + r16) * sizeof(uint16_t);
    } else if (e->reduce_bf16 && e->comm->world > 1) {
        e->grad16 = e->k->alloc(e->shard_total * sizeof(uint16_t));
        if (!e->grad16)
            return -1;
        e->mem.grad_full_bytes += e->shard_total * sizeof(uint16_t);
    }
    return 0;
}

static int out_of_memory(char *err)
{
    return fsdp_err(err, "fsdp: out of memory while allocating the rank's state");
}

/* The batch's token arrays and, in bf16, the backward's rounded dout: a
 * block's widest (the head's goes in chunks). */
static int alloc_batch(struct fsdp_engine *e, char *err)
{
    const size_t BT = (size_t)e->B * e->T, W = e->m->widest_row;
    if (e->bf16) {
        size_t held = e->k->bf16_scratch(BT * W);
        if (!held)
            return fsdp_err(err, "fsdp: out of memory for %zu MiB of bf16 scratch",
                            (BT * W * 2) >> 20);
        e->mem.act_bytes += held;
    }
    e->inputs = e->k->alloc(BT * sizeof(int32_t));
    e->targets = e->k->alloc(BT * sizeof(int32_t));
    if (!e->inputs || !e->targets)
        return out_of_memory(err);
    return 0;
}

int fsdp_init(struct fsdp_engine *e, const struct model_layout *m, const struct fsdp_kernels *k,
              struct fsdp_comm *comm, const struct fsdp_opts *o, char *err)
{
    if (o->fp16 && (o->bf16 || !k->to_fp16 || !k->from_fp16 || !k->round_fp16)) {
        memset(e, 0, sizeof *e); /* as a failure below leaves it */
        return fsdp_err(err, o->bf16 ? "fsdp: fp16 and bf16 at once"
                                     : "fsdp: this backend has no fp16 conversions");
    }
    set_options(e, m, k, comm, o);
    const int none = e->shard == FSDP_SHARD_NONE;
    size_t max_shard;
    if (lay_out_units(e, &max_shard) || alloc_state(e) ||
        (none ? alloc_unsharded(e) : alloc_gathered(e, max_shard)) ||
        alloc_half_params(e, max_shard) || alloc_bf16_grads(e, max_shard)) {
        out_of_memory(err);
        goto fail;
    }
    build_segments(e);
    if (none && comm->world > 1 && plan_buckets(e, o->bucket_bytes)) {
        out_of_memory(err);
        goto fail;
    }
    if (fsdp_alloc_acts(e, err) || alloc_batch(e, err))
        goto fail;
    return 0;
fail:
    fsdp_free(e);
    return -1;
}

void fsdp_free(struct fsdp_engine *e)
{
    if (!e->k)
        return;
    settle(e);
    float *bufs[] = {e->params,        e->grads,  e->exp_avg,  e->exp_avg_sq, e->gather_buf,
                     e->grad_full_buf, e->rs_tmp, e->rs_parts, e->a.encoded};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            e->k->free(bufs[i]);
    if (e->gather16_buf)
        e->k->free(e->gather16_buf);
    if (e->shard16)
        e->k->free(e->shard16);
    if (e->grad16)
        e->k->free(e->grad16);
    if (e->rs16)
        e->k->free(e->rs16);
    if (e->inputs)
        e->k->free(e->inputs);
    if (e->targets)
        e->k->free(e->targets);
    free(e->units);
    free(e->segs);
    free(e->buckets);
    free(e->a.slot);
    free(e->a.family);
    memset(e, 0, sizeof *e);
}

/* Forgets unit u's gathered copies (fp32 NONE uses its parameters in
 * place: nothing to forget). */
static void unit_drop(struct fsdp_engine *e, int u)
{
    if (e->shard != FSDP_SHARD_NONE || e->half)
        e->units[u].gathered = 0;
}

void fsdp_params_changed(struct fsdp_engine *e)
{
    settle(e);
    for (int u = 0; u < e->m->nunits; u++)
        unit_drop(e, u);
    e->holder[0] = e->holder[1] = -1;
}

void fsdp_init_params(struct fsdp_engine *e, uint64_t seed)
{
    const struct model_layout *m = e->m;
    size_t max_shard = 0;
    for (int u = 0; u < m->nunits; u++)
        if (e->units[u].shard_n > max_shard)
            max_shard = e->units[u].shard_n;
    float *host = calloc(max_shard ? max_shard : 1, sizeof *host);
    if (!host)
        abort(); /* a few MiB at start-up; nothing sensible to do without it */
    for (int u = 0; u < m->nunits; u++) {
        const struct fsdp_unit *U = &e->units[u];
        const struct model_unit *mu = &m->units[u];
        memset(host, 0, U->shard_n * sizeof *host);
        for (int i = 0; i < mu->ntensors; i++) {
            int ti = mu->first_tensor + i;
            const struct model_tensor *t = &m->tensors[ti];
            uint64_t key = fsdp_mix64(seed) ^ fsdp_mix64(0x7e2502 + (uint64_t)ti);
            size_t lo = t->offset > U->shard_lo ? t->offset : U->shard_lo;
            size_t hi = t->offset + t->numel;
            if (hi > U->shard_lo + U->shard_n)
                hi = U->shard_lo + U->shard_n;
            for (size_t x = lo; x < hi; x++) {
                float v = t->init_value;
                if (t->init_std > 0)
                    v += t->init_std * fsdp_normal_at(key, x - t->offset);
                host[x - U->shard_lo] = x - t->offset < t->init_numel ? v : 0.0f;
            }
        }
        e->k->upload(e->params + U->shard_off, host, U->shard_n * sizeof *host);
    }
    free(host);
    e->k->zero(e->exp_avg, e->shard_total);
    e->k->zero(e->exp_avg_sq, e->shard_total);
    fsdp_params_changed(e);
}

void fsdp_set_batch(struct fsdp_engine *e, const int32_t *inputs, const int32_t *targets)
{
    size_t bytes = (size_t)e->B * e->T * sizeof(int32_t);
    e->k->upload(e->inputs, inputs, bytes);
    e->have_targets = targets != NULL;
    if (targets)
        e->k->upload(e->targets, targets, bytes);
}

/* ---- gather / free / reduce ------------------------------------------------ */

/* Collectives go through start and wait; a backend without non-blocking
 * calls (comm.h) does the blocking call in start. Time spent here is time
 * the compute thread waited: comm_seconds. */
static int coll_start(struct fsdp_engine *e, struct fsdp_coll *op, char *err)
{
    struct fsdp_comm *c = e->comm;
    double t0 = fsdp_now();
    int rc;
    if (c->start) {
        rc = c->start(c, op, err);
    } else { /* one blocking call per piece */
        const int bf16 =
            op->kind == FSDP_COLL_ALLGATHER_BF16 || op->kind == FSDP_COLL_REDUCE_SCATTER_BF16;
        const size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
        rc = 0;
        for (int p = 0; !rc && p < (op->pieces > 1 ? op->pieces : 1); p++) {
            const void *in = (const char *)op->in + (size_t)p * op->in_stride * es;
            void *out = (char *)op->out + (size_t)p * op->out_stride * es;
            switch (op->kind) {
            case FSDP_COLL_ALLGATHER:
                rc = c->allgather(c, in, out, op->n, err);
                break;
            case FSDP_COLL_ALLGATHER_BF16:
                rc = c->allgather_bf16(c, in, out, op->n, err);
                break;
            case FSDP_COLL_REDUCE_SCATTER:
                rc = c->reduce_scatter(c, in, out, op->n, err);
                break;
            default:
                rc = c->reduce_scatter_bf16(c, in, out, op->n, err);
                break;
            }
        }
        op->state = rc ? 0 : 2;
    }
    e->comm_seconds += fsdp_now() - t0;
    return rc;
}

static int coll_wait(struct fsdp_engine *e, struct fsdp_coll *op, char *err)
{
    if (op->state == 0)
        return 0;
    if (!e->comm->wait) {
        op->state = 0;
        return 0;
    }
    double t0 = fsdp_now();
    int rc = e->comm->wait(e->comm, op, err);
    e->comm_seconds += fsdp_now() - t0;
    return rc;
}

/* Lets the collectives in flight advance; called between kernels. */
void fsdp_poke(struct fsdp_engine *e)
{
    if (e->comm->progress &&
        (e->gather_op.state == 1 || e->rs_op.state == 1 || e->bucket_op.state == 1)) {
        double t0 = fsdp_now();
        e->comm->progress(e->comm);
        e->comm_seconds += fsdp_now() - t0;
    }
}

/* Unit u's group (--unit-blocks): its first unit g and its n units, which
 * lie the same distance apart in every buffer (a padded block). */
static size_t group_stride(const struct fsdp_engine *e, int g)
{
    return e->units[g].group_n > 1 ? (size_t)(e->units[g + 1].full - e->units[g].full) : 0;
}

/* bf16: unit u's fp32 copy, widened from the bf16 one that was gathered,
 * so every kernel sees the same values; only the tensors the passes read
 * in fp32 (norms, biases, embeddings), runs of them at a time: a product's
 * weight is read through its bf16 twin alone (model.h: twin_only). fp16:
 * all of it (every kernel reads fp32). */
static void widen(struct fsdp_engine *e, int u)
{
    const struct fsdp_unit *U = &e->units[u];
    if (e->fp16) {
        e->from16(U->full, U->full16, U->numel);
        return;
    }
    size_t lo = 0, hi = 0; /* a run of fp32-read tensors, back to back */
    for (int i = 0; i < e->m->units[u].ntensors; i++) {
        const struct model_tensor *t = model_unit_tensor(e->m, u, i);
        if (t->twin_only)
            continue;
        if (t->offset != hi) {
            if (hi > lo)
                e->from16(U->full + lo, U->full16 + lo, hi - lo);
            lo = t->offset;
        }
        hi = t->offset + t->numel;
    }
    if (hi > lo)
        e->from16(U->full + lo, U->full16 + lo, hi - lo);
}

/* Finishes the gather in flight: its group becomes gathered. */
static int gather_finish(struct fsdp_engine *e, char *err)
{
    const int g = e->gather_unit;
    if (g < 0)
        return 0;
    e->gather_unit = -1;
    if (coll_wait(e, &e->gather_op, err))
        return -1;
    for (int u = g; u < g + e->units[g].group_n; u++) {
        struct fsdp_unit *U = &e->units[u];
        if (e->half)
            widen(e, u);
        U->gathered = 1; /* and in bf16 or fp16, full16 with it */
    }
    return 0;
}

/* Starts the gather of unit u's group unless it is gathered or on its way:
 * one collective for the group, each block's slices landing in its buffer.
 * One gather runs at a time (shard16 is its source): one in flight is
 * finished first. bf16 and fp16 gathers move half the bytes. */
static int gather_start(struct fsdp_engine *e, int u, char *err)
{
    const int g = e->units[u].group, n = e->units[g].group_n;
    struct fsdp_unit *G = &e->units[g];
    if (G->gathered || e->gather_unit == g)
        return 0;
    if (gather_finish(e, err))
        return -1;
    if (e->shard == FSDP_SHARD_FULL && g != 0 && g != model_unit_lnf(e->m)) {
        int *h = &e->holder[(g - model_unit_block(0)) / e->unit_blocks % e->nbuf];
        if (*h >= 0)
            for (int v = *h; v < *h + e->units[*h].group_n; v++)
                unit_drop(e, v);
        *h = g;
    }
    if (e->comm->world == 1 || e->shard == FSDP_SHARD_NONE) { /* the shard is the unit */
        for (int v = g; v < g + n; v++) {
            struct fsdp_unit *U = &e->units[v];
            if (e->half) {
                e->to16(U->full16, e->params + U->shard_off, U->shard_n);
                widen(e, v);
            } else {
                e->k->copy(U->full, e->params + U->shard_off, U->shard_n);
            }
            U->gathered = 1;
        }
        return 0;
    }
    /* a group's shards lie one aligned shard apart in params (and shard16) */
    const size_t sstride = n > 1 ? e->units[g + 1].shard_off - G->shard_off : 0;
    struct fsdp_coll *op = &e->gather_op;
    if (e->half) { /* the 16-bit gather moves bits: bf16 or fp16 alike */
        e->to16(e->shard16, e->params + G->shard_off, sstride * (size_t)(n - 1) + G->shard_n);
        *op = (struct fsdp_coll){
            .kind = FSDP_COLL_ALLGATHER_BF16, .in = e->shard16, .out = G->full16, .n = G->shard_n};
    } else {
        *op = (struct fsdp_coll){.kind = FSDP_COLL_ALLGATHER,
                                 .in = e->params + G->shard_off,
                                 .out = G->full,
                                 .n = G->shard_n};
    }
    op->pieces = n;
    op->in_stride = sstride;
    op->out_stride = group_stride(e, g);
    if (coll_start(e, op, err))
        return -1;
    e->gather_unit = g;
    return 0;
}

/* Makes unit u's full parameters valid (and in bf16 mode their bf16 copy,
 * which the matmuls read), with the rest of its group. */
int fsdp_unit_gather(struct fsdp_engine *e, int u, char *err)
{
    if (e->units[u].gathered)
        return 0;
    if (gather_start(e, u, err))
        return -1;
    return gather_finish(e, err);
}

/* --prefetch: starts the gather of the group computed next (u < 0: none). */
int fsdp_unit_prefetch(struct fsdp_engine *e, int u, char *err)
{
    return e->prefetch && u >= 0 ? gather_start(e, u, err) : 0;
}

/* FULL_SHARD drops a group's gathered parameters after its last use. */
void fsdp_unit_reshard(struct fsdp_engine *e, int u)
{
    if (e->shard != FSDP_SHARD_FULL)
        return;
    const int g = e->units[u].group;
    for (int v = g; v < g + e->units[g].group_n; v++)
        unit_drop(e, v);
    for (int b = 0; b < 2; b++)
        if (e->holder[b] == g)
            e->holder[b] = -1;
}

void fsdp_unit_grad_begin(struct fsdp_engine *e, int u)
{
    if (e->shard != FSDP_SHARD_NONE)
        e->k->zero(e->units[u].full_grad, e->units[u].padded);
}

/* Finishes the reduce-scatter in flight and adds this rank's part of each
 * unit to the gradient shard (gradients accumulate over micro-batches). */
int fsdp_rs_finish(struct fsdp_engine *e, char *err)
{
    const int g = e->rs_unit;
    if (g < 0)
        return 0;
    e->rs_unit = -1;
    if (coll_wait(e, &e->rs_op, err))
        return -1;
    const size_t stride = fsdp_round_up(e->units[g].shard_n, ALIGN_FLOATS);
    for (int u = g; u < g + e->units[g].group_n; u++) {
        const struct fsdp_unit *U = &e->units[u];
        float *part = e->rs_tmp + stride * (size_t)(u - g);
        if (e->reduce_bf16)
            e->k->from_bf16(part, e->rs16 + stride * (size_t)(u - g), U->shard_n);
        e->k->add(e->grads + U->shard_off, part, U->shard_n);
    }
    return 0;
}

/* A reduce-scatter whose parts outgrow the landing place (the first unit:
 * a vocabulary-wide embedding) goes a slice of the shard at a time, each
 * waited for: the same sums in the same order, so the same bits. It is
 * the backward's last, so there is nothing to overlap it with but the
 * next micro-batch's forward. */
static int rs_in_slices(struct fsdp_engine *e, int g, char *err)
{
    struct fsdp_coll *op = &e->rs_op;
    const struct fsdp_coll whole = *op;
    const size_t es = e->reduce_bf16 ? sizeof(uint16_t) : sizeof(float), step = rs_slice(e);
    if (whole.pieces > 1 || step == 0)
        return fsdp_err(err, "fsdp: a group of %d units outgrows the reduce-scatter's %zu bytes",
                        whole.pieces, e->rs_parts_bytes);
    for (size_t lo = 0; lo < whole.n; lo += step) {
        *op = whole;
        op->in = (const char *)whole.in + lo * es;
        op->out = (char *)whole.out + lo * es;
        op->n = whole.n - lo < step ? whole.n - lo : step;
        op->rank_stride = whole.n;
        if (coll_start(e, op, err) || coll_wait(e, op, err))
            return -1;
    }
    e->rs_unit = g;
    return fsdp_rs_finish(e, err);
}

/* Reduce-scatters the full gradients of unit u's group (one collective);
 * with prefetch it runs while the next group's backward computes, and is
 * finished before the one after starts (its buffers are reused) or at the
 * end of the backward. */
/* none: starts the all-reduce of bucket b (its gradients are final);
 * one runs at a time */
static int bucket_start(struct fsdp_engine *e, int b, char *err)
{
    if (bucket_finish(e, err))
        return -1;
    const struct fsdp_bucket *B = &e->buckets[b];
    const size_t off = e->units[B->lo].shard_off;
    const size_t n = e->units[B->hi].shard_off + e->units[B->hi].shard_n - off;
    struct fsdp_coll *op = &e->bucket_op;
    if (e->fp16) /* the step's gradient, as an fp16 backward leaves it */
        e->k->round_fp16(e->grads + off, n);
    if (e->reduce_bf16) {
        e->k->to_bf16(e->grad16 + off, e->grads + off, n);
        *op = (struct fsdp_coll){
            .kind = FSDP_COLL_ALLREDUCE_BF16, .out = e->grad16 + off, .tmp = e->rs_parts, .n = n};
    } else {
        *op = (struct fsdp_coll){
            .kind = FSDP_COLL_ALLREDUCE, .out = e->grads + off, .tmp = e->rs_parts, .n = n};
    }
    if (!e->comm->start) { /* the blocking call */
        double t0 = fsdp_now();
        int rc = e->reduce_bf16 ? e->comm->allreduce_sum_bf16(e->comm, op->out, n, err)
                                : e->comm->allreduce_sum(e->comm, op->out, n, err);
        e->comm_seconds += fsdp_now() - t0;
        if (rc)
            return -1;
        op->state = 2;
    } else if (coll_start(e, op, err)) {
        return -1;
    }
    e->bucket_running = b;
    return 0;
}

static int bucket_finish(struct fsdp_engine *e, char *err)
{
    const int b = e->bucket_running;
    if (b < 0)
        return 0;
    e->bucket_running = -1;
    if (coll_wait(e, &e->bucket_op, err))
        return -1;
    e->buckets[b].done = 1;
    if (e->reduce_bf16)
        e->k->from_bf16((float *)e->grads + ((uint16_t *)e->bucket_op.out - e->grad16),
                        e->bucket_op.out, e->bucket_op.n);
    return 0;
}

int fsdp_unit_grad_end(struct fsdp_engine *e, int u, char *err)
{
    if (e->shard == FSDP_SHARD_NONE) { /* a bucket whose last unit this is goes now */
        for (int b = 0; e->final_micro && b < e->nbuckets; b++)
            if (e->buckets[b].lo == u && !e->buckets[b].done)
                return bucket_start(e, b, err);
        return 0;
    }
    if (fsdp_rs_finish(e, err))
        return -1;
    const int g = e->units[u].group, n = e->units[g].group_n;
    const struct fsdp_unit *G = &e->units[g];
    const size_t gstride = group_stride(e, g), span = gstride * (size_t)(n - 1) + G->padded;
    if (e->fp16) /* the gradient an fp16 backward made (fsdp_opts) */
        for (int v = g; v < g + n; v++)
            e->k->round_fp16(e->units[v].full_grad, e->units[v].padded);
    if (e->comm->world == 1) { /* nothing to reduce; bf16 still rounds (fsdp_opts) */
        for (int v = g; v < g + n; v++) {
            const struct fsdp_unit *U = &e->units[v];
            const float *grad = U->full_grad;
            if (e->reduce_bf16 && e->k->add_bf16_rounded) {
                e->k->add_bf16_rounded(e->grads + U->shard_off, grad, U->shard_n);
                continue;
            }
            if (e->reduce_bf16) {
                e->k->to_bf16(e->grad16, U->full_grad, U->padded);
                e->k->from_bf16(e->rs_tmp, e->grad16, U->padded);
                grad = e->rs_tmp;
            }
            e->k->add(e->grads + U->shard_off, grad, U->shard_n);
        }
        return 0;
    }
    struct fsdp_coll *op = &e->rs_op;
    if (e->reduce_bf16) {
        e->k->to_bf16(e->grad16, G->full_grad, span);
        *op = (struct fsdp_coll){.kind = FSDP_COLL_REDUCE_SCATTER_BF16,
                                 .in = e->grad16,
                                 .out = e->rs16,
                                 .tmp = e->rs_parts,
                                 .n = G->shard_n};
    } else {
        *op = (struct fsdp_coll){.kind = FSDP_COLL_REDUCE_SCATTER,
                                 .in = G->full_grad,
                                 .out = e->rs_tmp,
                                 .tmp = e->rs_parts,
                                 .n = G->shard_n};
    }
    op->pieces = n;
    op->in_stride = gstride;
    op->out_stride = fsdp_round_up(G->shard_n, ALIGN_FLOATS);
    if (e->rs_parts && G->shard_n * (size_t)n > rs_slice(e))
        return rs_in_slices(e, g, err);
    if (coll_start(e, op, err))
        return -1;
    e->rs_unit = g;
    return e->prefetch ? 0 : fsdp_rs_finish(e, err);
}

void fsdp_release(struct fsdp_engine *e)
{
    if (e->shard != FSDP_SHARD_FULL)
        return;
    settle(e);
    for (int u = 0; u < e->m->nunits; u++)
        unit_drop(e, u);
    e->holder[0] = e->holder[1] = -1;
}

/* ---- optimizer ------------------------------------------------------------- */

void fsdp_zero_grad(struct fsdp_engine *e) { e->k->zero(e->grads, e->shard_total); }

int fsdp_reduce_grads(struct fsdp_engine *e, char *err)
{
    if (e->shard == FSDP_SHARD_NONE && e->comm->world == 1 && e->fp16)
        e->k->round_fp16(e->grads, e->shard_total); /* what bucket_start does */
    if (e->shard != FSDP_SHARD_NONE || e->comm->world == 1)
        return 0;
    for (int b = 0; b < e->nbuckets; b++)
        if (!e->buckets[b].done && e->bucket_running != b && bucket_start(e, b, err))
            return -1;
    if (bucket_finish(e, err))
        return -1;
    for (int b = 0; b < e->nbuckets; b++)
        e->buckets[b].done = 0; /* the next step's */
    return 0;
}

int fsdp_grad_norm(struct fsdp_engine *e, double *norm, char *err)
{
    double s = e->k->sumsq(e->grads, e->shard_total);
    if (e->shard != FSDP_SHARD_NONE && e->comm->allreduce_sum_f64(e->comm, &s, 1, err))
        return -1;
    *norm = sqrt(s);
    return 0;
}

void fsdp_adamw_step(struct fsdp_engine *e, const struct fsdp_adamw *o, int t, float gscale)
{
    settle(e); /* nothing may still read the parameters it changes */
    float bc1 = (float)(1.0 - pow(o->beta1, t)), bc2 = (float)(1.0 - pow(o->beta2, t));
    for (int i = 0; i < e->nsegs; i++) {
        const struct fsdp_segment *s = &e->segs[i];
        e->k->adamw(e->params + s->off, e->grads + s->off, e->exp_avg + s->off,
                    e->exp_avg_sq + s->off, s->n, o->lr, o->beta1, o->beta2, o->eps,
                    s->decay ? o->weight_decay : 0.0f, bc1, bc2, gscale);
    }
    fsdp_params_changed(e);
}
