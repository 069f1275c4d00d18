/*
 * fsdp.c - the FSDP engine: shard layout, gather/free, the forward and
 * backward passes over units, gradient reduction and the sharded AdamW step.
 *
 * The passes are straight-line calls of the backend's kernels in the order
 * of the model (llm.c style). Activations of every layer live in one
 * allocation sized for the micro-batch; the backward pass reuses one layer's
 * worth of gradient scratch.
 */
#include "fsdp.h"

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

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

static int gather_finish(struct fsdp_engine *e, char *err);
static int rs_finish(struct fsdp_engine *e, char *err);
static int bucket_finish(struct fsdp_engine *e, char *err);

/* Finishes whatever collective is in flight; a pass that failed half-way
 * may leave one (its error was reported then). */
static void settle(struct fsdp_engine *e)
{
    char err[FSDP_ERR_LEN];
    if (e->units) {
        gather_finish(e, err);
        rs_finish(e, err);
        bucket_finish(e, err);
    }
}

static int recomputed(const struct fsdp_engine *e, int l)
{
    return e->recompute_every > 0 && l % e->recompute_every == 0;
}

/* Kept blocks get slots 0, 1, ... in order; recomputed blocks share the
 * last slot. */
static int assign_slots(struct fsdp_engine *e)
{
    const int L = e->m->cfg.layers;
    int kept = 0, any = 0;
    e->a.slot = calloc((size_t)L, sizeof *e->a.slot);
    if (!e->a.slot)
        return -1;
    for (int l = 0; l < L; l++)
        if (!recomputed(e, l))
            e->a.slot[l] = kept++;
        else
            any = 1;
    for (int l = 0; l < L; l++)
        if (recomputed(e, l))
            e->a.slot[l] = kept;
    e->a.nslots = kept + any;
    e->a.slot_holder = -1;
    return 0;
}

/* Shards start on 64-byte boundaries inside each state kind's allocation. */
#define ALIGN_FLOATS 16

static int alloc_acts(struct fsdp_engine *e, char *err)
{
    const struct model_config *c = &e->m->cfg;
    if (assign_slots(e))
        return fsdp_err(err, "fsdp: out of memory for the activation plan");
    /* L counts slots here; only the block outputs need one row per block */
    const size_t L = (size_t)e->a.nslots, C = (size_t)c->dim, NH = (size_t)c->heads;
    const size_t LB = (size_t)c->layers;
    const size_t BT = (size_t)e->B * e->T;
    /* attention's state per (sequence, head): the softmax, or flash's lse */
    const size_t TT = e->flash ? (size_t)e->T : (size_t)e->T * e->T;
    /* bf16: the products' inputs are written in bf16 only (struct fsdp_acts),
     * but for the fp32 attention's output, rounded from one shared slot;
     * flash: qkv and the attention's output in bf16 only */
    const size_t Lx = e->bf16 ? 0 : L, L16 = e->bf16 ? L : 0;
    const size_t Latt = e->flash ? 0 : e->bf16 ? 1 : L, Lq = e->flash ? 0 : L, Lq16 = L - Lq;
    const size_t lnf = e->bf16 ? 0 : BT * C, lnf16 = e->bf16 ? BT * C : 0;
    const int head16 =
        e->bf16 && e->k->crossentropy_backward_bf16 && e->k->matmul_backward_from_bf16;
    struct fsdp_acts *a = &e->a;
    struct {
        float **p;
        size_t n;
    } plan[] = {
        {&a->encoded, BT * C},
        {&a->ln1, Lx * BT * C},
        {&a->ln1_mean, L * BT},
        {&a->ln1_rstd, L * BT},
        {&a->qkv, Lq * BT * 3 * C},
        {&a->atty, Latt * BT * C},
        {&a->att, L * e->B * NH * TT},
        {&a->residual2, L * BT * C},
        {&a->ln2, Lx * BT * C},
        {&a->ln2_mean, L * BT},
        {&a->ln2_rstd, L * BT},
        {&a->fch, L * BT * 4 * C},
        {&a->fch_gelu, Lx * BT * 4 * C},
        {&a->residual3, LB * BT * C},
        {&a->lnf, lnf},
        {&a->lnf_mean, BT},
        {&a->lnf_rstd, BT},
        {&a->logits, BT * c->vocab_pad},
        {&a->losses, BT},
        {&a->loss_lse, BT},
        {&a->scratch, BT * C},
        {&a->dres, BT * C},
        {&a->dbtc, BT * C},
        {&a->d4c, BT * 4 * C},
        {&a->datt, e->B * NH * TT},
    };
    struct {
        uint16_t **p;
        size_t n;
    } plan16[] = {
        {&a->ln1_16, L16 * BT * C},
        {&a->atty16, L16 * BT * C},
        {&a->ln2_16, L16 * BT * C},
        {&a->fch_gelu16, L16 * BT * 4 * C},
        {&a->lnf16, lnf16},
        {&a->qkv16, Lq16 * BT * 3 * C},
        {&a->dlogits16, head16 ? BT * c->vocab_pad : 0},
    };
    size_t total = 0, total16 = 0; /* floats; bf16 values after them */
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        total += round_up(plan[i].n, ALIGN_FLOATS);
    for (size_t i = 0; i < sizeof plan16 / sizeof plan16[0]; i++)
        total16 += round_up(plan16[i].n, 2 * ALIGN_FLOATS);
    const size_t bytes = total * sizeof(float) + total16 * sizeof(uint16_t);
    float *base = e->k->alloc(bytes);
    if (!base)
        return fsdp_err(err, "fsdp: out of memory for %zu MiB of activations", bytes >> 20);
    for (size_t i = 0, off = 0; i < sizeof plan / sizeof plan[0]; i++) {
        *plan[i].p = plan[i].n ? base + off : NULL;
        off += round_up(plan[i].n, ALIGN_FLOATS);
    }
    uint16_t *base16 = (uint16_t *)(base + total);
    for (size_t i = 0, off = 0; i < sizeof plan16 / sizeof plan16[0]; i++) {
        *plan16[i].p = plan16[i].n ? base16 + off : NULL;
        off += round_up(plan16[i].n, 2 * ALIGN_FLOATS);
    }
    e->mem.act_bytes = bytes;
    return 0;
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
    e->comm = comm;
    e->shard = shard;
    e->B = o->micro_batch;
    e->T = m->cfg.seq;
    e->recompute_every = o->recompute_every;
    e->bf16 = o->bf16;
    e->flash = e->bf16 && k->attention_forward_bf16 && k->matmul_forward_to_bf16 &&
               m->cfg.dim / m->cfg.heads <= k->attention_bf16_max_hs;
    e->reduce_bf16 = o->reduce_bf16;
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
        U->padded = round_up(U->numel, W);
        U->shard_n = U->padded / W;
        U->shard_lo = rank * U->shard_n;
        U->shard_off = e->shard_total;
        e->shard_total += round_up(U->shard_n, ALIGN_FLOATS);
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
 * instead, as the other strategies' gathers give them. -1: out of memory. */
static int alloc_unsharded(struct fsdp_engine *e)
{
    if (e->bf16) {
        e->gather_buf = e->k->alloc(e->shard_total * sizeof(float));
        if (!e->gather_buf)
            return -1;
        e->mem.gather_bytes = e->shard_total * sizeof(float);
    }
    for (int u = 0; u < e->m->nunits; u++) {
        float *params = e->bf16 ? e->gather_buf : e->params;
        e->units[u].full = params + e->units[u].shard_off;
        e->units[u].full_grad = e->grads + e->units[u].shard_off;
        e->units[u].gathered = !e->bf16;
    }
    return 0;
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
    size_t pe = round_up(e->units[0].padded, ALIGN_FLOATS);
    size_t pb = round_up(e->units[blk].padded, ALIGN_FLOATS);
    size_t pl = round_up(e->units[lnf].padded, ALIGN_FLOATS);
    size_t gather = e->shard == FSDP_SHARD_FULL ? pe + pb * kb * nb + pl : pe + pb * L + pl;
    size_t max_padded = pe > pb * kb ? (pe > pl ? pe : pl) : (pb * kb > pl ? pb * kb : pl);
    e->gather_buf = k->alloc(gather * sizeof(float));
    e->grad_full_buf = k->alloc((pe + pb * kb * nb + pl) * sizeof(float));
    e->rs_tmp = k->alloc(round_up(max_shard, ALIGN_FLOATS) * kb * sizeof(float));
    if (!e->gather_buf || !e->grad_full_buf || !e->rs_tmp)
        return -1;
    e->mem.gather_bytes = gather * sizeof(float);
    e->mem.grad_full_bytes = (pe + pb * kb * nb + pl) * sizeof(float);
    if (e->comm->start && e->comm->start_uses_tmp) { /* the all-to-all's landing place */
        if (!(e->rs_parts = k->alloc(max_padded * sizeof(float))))
            return -1;
        e->mem.grad_full_bytes += max_padded * sizeof(float);
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

/* --bf16: a bf16 twin of every gathered buffer, at the same offsets, and
 * of K shards. -1: out of memory. */
static int alloc_bf16_params(struct fsdp_engine *e, size_t max_shard)
{
    if (!e->bf16)
        return 0;
    size_t n16 = e->mem.gather_bytes / sizeof(float);
    float *base = e->gather_buf;
    e->gather16_buf = e->k->alloc(n16 * sizeof(uint16_t));
    e->shard16 = e->k->alloc(round_up(max_shard, ALIGN_FLOATS) * e->unit_blocks * sizeof(uint16_t));
    if (!e->gather16_buf || !e->shard16)
        return -1;
    for (int u = 0; u < e->m->nunits; u++)
        e->units[u].full16 = e->gather16_buf + (e->units[u].full - base);
    e->mem.gather_bytes += n16 * sizeof(uint16_t);
    return 0;
}

/* --reduce-bf16: bf16 copies of a group's gradient and of its reduced
 * shard; none: of all of it, all-reduced. -1: out of memory. */
static int alloc_bf16_grads(struct fsdp_engine *e, size_t max_shard)
{
    const int nu = e->m->nunits;
    if (e->reduce_bf16 && e->shard != FSDP_SHARD_NONE) {
        size_t n16 = 0, r16 = round_up(max_shard, ALIGN_FLOATS) * (size_t)e->unit_blocks;
        for (int u = 0; u < nu; u++) /* a group's blocks lie a padded block apart */
            if (round_up(e->units[u].padded, ALIGN_FLOATS) * (size_t)e->units[u].group_n > n16)
                n16 = round_up(e->units[u].padded, ALIGN_FLOATS) * (size_t)e->units[u].group_n;
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
    const size_t BT = (size_t)e->B * e->T, C = (size_t)e->m->cfg.dim;
    if (e->bf16) {
        size_t held = e->k->bf16_scratch(BT * 4 * C);
        if (!held)
            return fsdp_err(err, "fsdp: out of memory for %zu MiB of bf16 scratch",
                            (BT * 4 * C * 2) >> 20);
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
    set_options(e, m, k, comm, o);
    const int none = e->shard == FSDP_SHARD_NONE;
    size_t max_shard;
    if (lay_out_units(e, &max_shard) || alloc_state(e) ||
        (none ? alloc_unsharded(e) : alloc_gathered(e, max_shard)) ||
        alloc_bf16_params(e, max_shard) || alloc_bf16_grads(e, max_shard)) {
        out_of_memory(err);
        goto fail;
    }
    build_segments(e);
    if (none && comm->world > 1 && plan_buckets(e, o->bucket_bytes)) {
        out_of_memory(err);
        goto fail;
    }
    if (alloc_acts(e, err) || alloc_batch(e, err))
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
    memset(e, 0, sizeof *e);
}

/* Forgets unit u's gathered copies (fp32 NONE uses its parameters in
 * place: nothing to forget). */
static void unit_drop(struct fsdp_engine *e, int u)
{
    if (e->shard != FSDP_SHARD_NONE || e->bf16)
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
static void poke(struct fsdp_engine *e)
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
        if (e->bf16) /* the fp32 copy is widened from the bf16 one: every kernel sees the same */
            e->k->from_bf16(U->full, U->full16, U->padded);
        U->gathered = 1; /* and in bf16, full16 with it */
    }
    return 0;
}

/* Starts the gather of unit u's group unless it is gathered or on its way:
 * one collective for the group, each block's slices landing in its buffer.
 * One gather runs at a time (shard16 is its source): one in flight is
 * finished first. bf16 gathers move half the bytes. */
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
            if (e->bf16) {
                e->k->to_bf16(U->full16, e->params + U->shard_off, U->shard_n);
                e->k->from_bf16(U->full, U->full16, U->padded);
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
    if (e->bf16) {
        e->k->to_bf16(e->shard16, e->params + G->shard_off, sstride * (size_t)(n - 1) + G->shard_n);
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
static int unit_gather(struct fsdp_engine *e, int u, char *err)
{
    if (e->units[u].gathered)
        return 0;
    if (gather_start(e, u, err))
        return -1;
    return gather_finish(e, err);
}

/* --prefetch: starts the gather of the group computed next (u < 0: none). */
static int unit_prefetch(struct fsdp_engine *e, int u, char *err)
{
    return e->prefetch && u >= 0 ? gather_start(e, u, err) : 0;
}

/* FULL_SHARD drops a group's gathered parameters after its last use. */
static void unit_reshard(struct fsdp_engine *e, int u)
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

static void unit_grad_begin(struct fsdp_engine *e, int u)
{
    if (e->shard != FSDP_SHARD_NONE)
        e->k->zero(e->units[u].full_grad, e->units[u].padded);
}

/* Finishes the reduce-scatter in flight and adds this rank's part of each
 * unit to the gradient shard (gradients accumulate over micro-batches). */
static int rs_finish(struct fsdp_engine *e, char *err)
{
    const int g = e->rs_unit;
    if (g < 0)
        return 0;
    e->rs_unit = -1;
    if (coll_wait(e, &e->rs_op, err))
        return -1;
    const size_t stride = round_up(e->units[g].shard_n, ALIGN_FLOATS);
    for (int u = g; u < g + e->units[g].group_n; u++) {
        const struct fsdp_unit *U = &e->units[u];
        float *part = e->rs_tmp + stride * (size_t)(u - g);
        if (e->reduce_bf16)
            e->k->from_bf16(part, e->rs16 + stride * (size_t)(u - g), U->shard_n);
        e->k->add(e->grads + U->shard_off, part, U->shard_n);
    }
    return 0;
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

static int unit_grad_end(struct fsdp_engine *e, int u, char *err)
{
    if (e->shard == FSDP_SHARD_NONE) { /* a bucket whose last unit this is goes now */
        for (int b = 0; e->final_micro && b < e->nbuckets; b++)
            if (e->buckets[b].lo == u && !e->buckets[b].done)
                return bucket_start(e, b, err);
        return 0;
    }
    if (rs_finish(e, err))
        return -1;
    const int g = e->units[u].group, n = e->units[g].group_n;
    const struct fsdp_unit *G = &e->units[g];
    const size_t gstride = group_stride(e, g), span = gstride * (size_t)(n - 1) + G->padded;
    if (e->comm->world == 1) { /* nothing to reduce; bf16 still rounds (fsdp_opts) */
        for (int v = g; v < g + n; v++) {
            const struct fsdp_unit *U = &e->units[v];
            const float *grad = U->full_grad;
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
    op->out_stride = round_up(G->shard_n, ALIGN_FLOATS);
    if (coll_start(e, op, err))
        return -1;
    e->rs_unit = g;
    return e->prefetch ? 0 : rs_finish(e, err);
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

/* ---- forward / backward ---------------------------------------------------- */

static const struct model_tensor *tensor(const struct fsdp_engine *e, int unit, int i)
{
    return &e->m->tensors[e->m->units[unit].first_tensor + i];
}

/* The bf16 twin of x, a tensor in unit u's fp32 buffer: at the same offset
 * in the unit's bf16 buffer. */
static const uint16_t *twin16(const struct fsdp_engine *e, int u, const float *x)
{
    return e->units[u].full16 + (x - e->units[u].full);
}

/* The matmuls of unit u, on its fp32 or (bf16 mode) bf16 weights (the twin
 * of w). In bf16 the input's producer has written it in bf16 (inp16;
 * ln_forward, gelu_forward), and the backward reads the same copy. */
static void mm_forward(struct fsdp_engine *e, int u, float *out, const float *inp,
                       const uint16_t *inp16, const float *w, const float *bias, size_t N, int C,
                       int OC)
{
    if (e->bf16) {
        e->k->matmul_forward_bf16(out, inp16, twin16(e, u, w), bias, N, C, OC);
    } else {
        e->k->matmul_forward(out, inp, w, bias, N, C, OC);
    }
    poke(e);
}

static void mm_backward(struct fsdp_engine *e, int u, float *dinp, float *dw, float *dbias,
                        const float *dout, const float *inp, const uint16_t *inp16, const float *w,
                        size_t N, int C, int OC)
{
    if (e->bf16)
        e->k->matmul_backward_bf16(dinp, dw, dbias, dout, inp16, twin16(e, u, w), N, C, OC);
    else
        e->k->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
    poke(e);
}

/* A LayerNorm or GELU whose output is a product's input: fp32, or in bf16
 * rounded as it is written (out16), which is all the product needs. */
static void ln_forward(const struct fsdp_engine *e, float *out, uint16_t *out16, float *mean,
                       float *rstd, const float *inp, const float *w, const float *b, size_t N,
                       int C)
{
    if (e->bf16)
        e->k->layernorm_forward_bf16(out16, mean, rstd, inp, w, b, N, C);
    else
        e->k->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}

static void gelu_forward(const struct fsdp_engine *e, float *out, uint16_t *out16, const float *inp,
                         size_t n)
{
    if (e->bf16)
        e->k->gelu_forward_bf16(out16, inp, n);
    else
        e->k->gelu_forward(out, inp, n);
}

/* Where block l's activations live. */
struct layer_acts {
    const float *res; /* the block's input: the residual stream */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu;
    uint16_t *ln1_16, *atty16, *ln2_16, *fch_gelu16; /* bf16: the products' inputs */
    uint16_t *qkv16;                                 /* flash: qkv in bf16 */
    float *res3;                                     /* the block's output */
};

static void layer_acts(const struct fsdp_engine *e, int l, struct layer_acts *la)
{
    const struct fsdp_acts *a = &e->a;
    const size_t C = (size_t)e->m->cfg.dim, NH = (size_t)e->m->cfg.heads;
    const size_t S = (size_t)e->B * e->T;                            /* S: per-layer stride */
    const size_t TT = e->flash ? (size_t)e->T : (size_t)e->T * e->T; /* as in alloc_acts */
    const size_t s = (size_t)a->slot[l];
    const int x = !e->bf16; /* bf16 keeps the products' inputs in bf16 only */
    la->res = l == 0 ? a->encoded : a->residual3 + (size_t)(l - 1) * S * C;
    la->ln1 = x ? a->ln1 + s * S * C : NULL;
    la->ln1_mean = a->ln1_mean + s * S;
    la->ln1_rstd = a->ln1_rstd + s * S;
    la->qkv = e->flash ? NULL : a->qkv + s * S * 3 * C;
    la->qkv16 = e->flash ? a->qkv16 + s * S * 3 * C : NULL;
    la->atty = x ? a->atty + s * S * C : a->atty; /* bf16: the one slot (flash: NULL) */
    la->att = a->att + s * (size_t)e->B * NH * TT;
    la->res2 = a->residual2 + s * S * C;
    la->ln2 = x ? a->ln2 + s * S * C : NULL;
    la->ln2_mean = a->ln2_mean + s * S;
    la->ln2_rstd = a->ln2_rstd + s * S;
    la->fch = a->fch + s * S * 4 * C;
    la->fch_gelu = x ? a->fch_gelu + s * S * 4 * C : NULL;
    la->ln1_16 = e->bf16 ? a->ln1_16 + s * S * C : NULL;
    la->atty16 = e->bf16 ? a->atty16 + s * S * C : NULL;
    la->ln2_16 = e->bf16 ? a->ln2_16 + s * S * C : NULL;
    la->fch_gelu16 = e->bf16 ? a->fch_gelu16 + s * S * 4 * C : NULL;
    la->res3 = a->residual3 + (size_t)l * S * C;
}

/* One block's forward on B x T rows. The recompute during the backward
 * stops after the GELU: the last projection's output is the block's output,
 * which was kept. */
static void block_forward(struct fsdp_engine *e, int u, const struct block_params *p,
                          const struct layer_acts *la, int B, int T, int recompute)
{
    const struct fsdp_kernels *k = e->k;
    const int C = e->m->cfg.dim, NH = e->m->cfg.heads;
    const size_t BT = (size_t)B * T;
    float *scratch = e->a.scratch;
    ln_forward(e, la->ln1, la->ln1_16, la->ln1_mean, la->ln1_rstd, la->res, p->t[BT_LN1_W],
               p->t[BT_LN1_B], BT, C);
    if (e->flash) { /* qkv and the attention's output in bf16 only */
        k->matmul_forward_to_bf16(la->qkv16, la->ln1_16, twin16(e, u, p->t[BT_QKV_W]),
                                  twin16(e, u, p->t[BT_QKV_B]), BT, C, 3 * C);
        poke(e);
        k->attention_forward_bf16(la->atty16, la->att, la->qkv16, B, T, C, NH);
    } else {
        mm_forward(e, u, la->qkv, la->ln1, la->ln1_16, p->t[BT_QKV_W], p->t[BT_QKV_B], BT, C,
                   3 * C);
        k->attention_forward(la->atty, la->att, la->qkv, B, T, C, NH);
        if (e->bf16)
            k->to_bf16(la->atty16, la->atty, BT * C);
    }
    poke(e);
    mm_forward(e, u, scratch, la->atty, la->atty16, p->t[BT_ATTPROJ_W], p->t[BT_ATTPROJ_B], BT, C,
               C);
    k->residual_forward(la->res2, la->res, scratch, BT * C);
    ln_forward(e, la->ln2, la->ln2_16, la->ln2_mean, la->ln2_rstd, la->res2, p->t[BT_LN2_W],
               p->t[BT_LN2_B], BT, C);
    mm_forward(e, u, la->fch, la->ln2, la->ln2_16, p->t[BT_FC_W], p->t[BT_FC_B], BT, C, 4 * C);
    gelu_forward(e, la->fch_gelu, la->fch_gelu16, la->fch, BT * 4 * C);
    if (recompute) /* the backward reads fch_gelu as the last product's input */
        return;
    mm_forward(e, u, scratch, la->fch_gelu, la->fch_gelu16, p->t[BT_FCPROJ_W], p->t[BT_FCPROJ_B],
               BT, 4 * C, C);
    k->residual_forward(la->res3, la->res2, scratch, BT * C);
}

/* One block's backward over the full micro-batch: a->dres holds d(loss)/d(the
 * block's output) on entry and d(loss)/d(its input) on return. */
static void block_backward(struct fsdp_engine *e, int u, const struct block_params *p,
                           const struct block_params *g, const struct layer_acts *la)
{
    const struct fsdp_kernels *k = e->k;
    const int C = e->m->cfg.dim, NH = e->m->cfg.heads, B = e->B, T = e->T;
    const size_t BT = (size_t)B * T;
    struct fsdp_acts *a = &e->a;
    /* residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))) */
    mm_backward(e, u, a->d4c, g->t[BT_FCPROJ_W], g->t[BT_FCPROJ_B], a->dres, la->fch_gelu,
                la->fch_gelu16, p->t[BT_FCPROJ_W], BT, 4 * C, C);
    k->gelu_backward(a->d4c, la->fch, a->d4c, BT * 4 * C);
    mm_backward(e, u, a->dbtc, g->t[BT_FC_W], g->t[BT_FC_B], a->d4c, la->ln2, la->ln2_16,
                p->t[BT_FC_W], BT, C, 4 * C);
    k->layernorm_backward(a->dres, g->t[BT_LN2_W], g->t[BT_LN2_B], a->dbtc, la->res2,
                          p->t[BT_LN2_W], la->ln2_mean, la->ln2_rstd, BT, C);
    /* residual2 = residual + attproj(attention(qkv(ln1(residual)))) */
    mm_backward(e, u, a->dbtc, g->t[BT_ATTPROJ_W], g->t[BT_ATTPROJ_B], a->dres, la->atty,
                la->atty16, p->t[BT_ATTPROJ_W], BT, C, C);
    if (e->flash)
        k->attention_backward_bf16(a->d4c, a->datt, a->dbtc, la->atty16, la->qkv16, la->att, B, T,
                                   C, NH);
    else
        k->attention_backward(a->d4c, a->datt, a->dbtc, la->qkv, la->att, B, T, C, NH);
    poke(e);
    mm_backward(e, u, a->dbtc, g->t[BT_QKV_W], g->t[BT_QKV_B], a->d4c, la->ln1, la->ln1_16,
                p->t[BT_QKV_W], BT, C, 3 * C);
    k->layernorm_backward(a->dres, g->t[BT_LN1_W], g->t[BT_LN1_B], a->dbtc, la->res, p->t[BT_LN1_W],
                          la->ln1_mean, la->ln1_rstd, BT, C);
}

int fsdp_forward(struct fsdp_engine *e, int B, int T, double *loss_sum, char *err)
{
    const struct fsdp_kernels *k = e->k;
    const struct model_config *c = &e->m->cfg;
    const int L = c->layers, C = c->dim, V = c->vocab, Vp = c->vocab_pad;
    const size_t BT = (size_t)B * T, S = (size_t)e->B * e->T; /* S: per-layer stride */
    struct fsdp_acts *a = &e->a;

    const int lnf = model_unit_lnf(e->m);
    if (unit_gather(e, 0, err) || unit_prefetch(e, model_unit_block(0), err))
        return -1;
    const float *wte = e->units[0].full + tensor(e, 0, 0)->offset;
    const float *wpe = e->units[0].full + tensor(e, 0, 1)->offset;
    k->encoder_forward(a->encoded, e->inputs, wte, wpe, B, T, C);

    a->slot_holder = -1;
    for (int l = 0; l < L; l++) {
        const int u = model_unit_block(l), g = e->units[u].group, n = e->units[g].group_n;
        const int first = u == g, last = u == g + n - 1; /* of its group, in this pass */
        /* the next group, or after the last one the final LayerNorm */
        if (unit_gather(e, u, err) || (first && unit_prefetch(e, g + n, err)))
            return -1;
        struct block_params p;
        struct layer_acts la;
        model_block_params(e->m, e->units[u].full, &p);
        layer_acts(e, l, &la);
        block_forward(e, u, &p, &la, B, T, 0);
        if (recomputed(e, l)) /* only a full-size forward has a backward */
            a->slot_holder = B == e->B && T == e->T ? l : -1;
        if (last)
            unit_reshard(e, u);
        if (e->on_progress)
            e->on_progress();
    }

    if (unit_gather(e, lnf, err))
        return -1;
    const float *lnfw = e->units[lnf].full + tensor(e, lnf, 0)->offset;
    const float *lnfb = e->units[lnf].full + tensor(e, lnf, 1)->offset;
    ln_forward(e, a->lnf, a->lnf16, a->lnf_mean, a->lnf_rstd, a->residual3 + (L - 1) * S * C, lnfw,
               lnfb, BT, C);
    mm_forward(e, 0, a->logits, a->lnf, a->lnf16, wte, NULL, BT, C, Vp);
    if (!loss_sum)
        return 0;
    if (!e->have_targets)
        return fsdp_err(err, "fsdp: forward asked for a loss without targets");
    k->crossentropy_forward(a->losses, a->loss_lse, a->logits, e->targets, BT, V, Vp);
    float losses[4096];
    double sum = 0.0;
    for (size_t i = 0; i < BT; i += 4096) {
        size_t n = BT - i < 4096 ? BT - i : 4096;
        k->download(losses, a->losses + i, n * sizeof(float));
        for (size_t j = 0; j < n; j++)
            sum += losses[j];
    }
    *loss_sum = sum;
    return 0;
}

int fsdp_backward(struct fsdp_engine *e, float dloss, char *err)
{
    const struct fsdp_kernels *k = e->k;
    const struct model_config *c = &e->m->cfg;
    const int L = c->layers, C = c->dim, V = c->vocab, Vp = c->vocab_pad;
    const int B = e->B, T = e->T;
    const size_t BT = (size_t)B * T, S = BT;
    const int lnf = model_unit_lnf(e->m);
    struct fsdp_acts *a = &e->a;

    /* Head (tied to wte) and final LayerNorm. The embedding unit is still
     * gathered from the forward pass. */
    if (unit_gather(e, 0, err) || unit_gather(e, lnf, err) ||
        unit_prefetch(e, model_unit_block(L - 1), err))
        return -1;
    unit_grad_begin(e, 0);
    unit_grad_begin(e, lnf);
    const float *wte = e->units[0].full + tensor(e, 0, 0)->offset;
    float *dwte = e->units[0].full_grad + tensor(e, 0, 0)->offset;
    float *dwpe = e->units[0].full_grad + tensor(e, 0, 1)->offset;
    if (a->dlogits16) { /* the gradient straight to bf16: the head has no bias to sum */
        k->crossentropy_backward_bf16(a->dlogits16, a->logits, a->loss_lse, e->targets, dloss, BT,
                                      V, Vp);
        k->matmul_backward_from_bf16(a->dbtc, dwte, a->dlogits16, a->lnf16, twin16(e, 0, wte), BT,
                                     C, Vp);
        poke(e);
    } else {
        k->crossentropy_backward(a->logits, a->logits, a->loss_lse, e->targets, dloss, BT, V, Vp);
        mm_backward(e, 0, a->dbtc, dwte, NULL, a->logits, a->lnf, a->lnf16, wte, BT, C, Vp);
    }
    k->zero(a->dres, BT * C);
    k->layernorm_backward(a->dres, e->units[lnf].full_grad + tensor(e, lnf, 0)->offset,
                          e->units[lnf].full_grad + tensor(e, lnf, 1)->offset, a->dbtc,
                          a->residual3 + (L - 1) * S * C,
                          e->units[lnf].full + tensor(e, lnf, 0)->offset, a->lnf_mean, a->lnf_rstd,
                          BT, C);
    if (unit_grad_end(e, lnf, err))
        return -1;
    unit_reshard(e, lnf);

    /* Blocks, last to first. a->dres holds d(loss)/d(residual stream). A
     * recomputed block runs its forward again first, on parameters that are
     * gathered for the backward anyway, unless the shared slot still holds
     * its activations (the last recomputed block of the forward). */
    for (int l = L - 1; l >= 0; l--) {
        const int u = model_unit_block(l), g = e->units[u].group, n = e->units[g].group_n;
        const int first = u == g + n - 1, last = u == g;         /* of its group, in this pass */
        const int before = g > model_unit_block(0) ? g - 1 : -1; /* the group computed next */
        if (unit_gather(e, u, err) || (first && unit_prefetch(e, before, err)))
            return -1;
        unit_grad_begin(e, u);
        struct block_params p, gr;
        struct layer_acts la;
        model_block_params(e->m, e->units[u].full, &p);
        model_block_params(e->m, e->units[u].full_grad, &gr);
        layer_acts(e, l, &la);
        if (recomputed(e, l) && a->slot_holder != l) {
            block_forward(e, u, &p, &la, B, T, 1);
            a->slot_holder = l;
        }
        block_backward(e, u, &p, &gr, &la);
        if (last && unit_grad_end(e, u, err))
            return -1;
        if (last)
            unit_reshard(e, u);
        if (e->on_progress)
            e->on_progress();
    }

    k->encoder_backward(dwte, dwpe, a->dres, e->inputs, B, T, C);
    if (unit_grad_end(e, 0, err) || rs_finish(e, err))
        return -1;
    unit_reshard(e, 0);
    return 0;
}

/* ---- optimizer ------------------------------------------------------------- */

void fsdp_zero_grad(struct fsdp_engine *e) { e->k->zero(e->grads, e->shard_total); }

int fsdp_reduce_grads(struct fsdp_engine *e, char *err)
{
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

void fsdp_logits_row(struct fsdp_engine *e, int t, float *out)
{
    const int Vp = e->m->cfg.vocab_pad;
    e->k->download(out, e->a.logits + (size_t)t * Vp, (size_t)Vp * sizeof(float));
}
