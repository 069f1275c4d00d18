/*
 * fsdp_pass.c - the engine's forward and backward passes over the model's
 * blocks, and the activations they keep (fsdp.c: the units they gather,
 * free and reduce; fsdp_units.h: what the two files share).
 *
 * The passes are straight-line calls of the backend's kernels in the order
 * of the model (llm.c style). Activations of every layer live in one
 * allocation sized for the micro-batch; the backward pass reuses one layer's
 * worth of gradient scratch.
 */
#include "fsdp.h"
#include "fsdp_units.h"

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int fsdp_alloc_acts(struct fsdp_engine *e, char *err)
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
        total += fsdp_round_up(plan[i].n, ALIGN_FLOATS);
    for (size_t i = 0; i < sizeof plan16 / sizeof plan16[0]; i++)
        total16 += fsdp_round_up(plan16[i].n, 2 * ALIGN_FLOATS);
    const size_t bytes = total * sizeof(float) + total16 * sizeof(uint16_t);
    float *base = e->k->alloc(bytes);
    if (!base)
        return fsdp_err(err, "fsdp: out of memory for %zu MiB of activations", bytes >> 20);
    for (size_t i = 0, off = 0; i < sizeof plan / sizeof plan[0]; i++) {
        *plan[i].p = plan[i].n ? base + off : NULL;
        off += fsdp_round_up(plan[i].n, ALIGN_FLOATS);
    }
    uint16_t *base16 = (uint16_t *)(base + total);
    for (size_t i = 0, off = 0; i < sizeof plan16 / sizeof plan16[0]; i++) {
        *plan16[i].p = plan16[i].n ? base16 + off : NULL;
        off += fsdp_round_up(plan16[i].n, 2 * ALIGN_FLOATS);
    }
    e->mem.act_bytes = bytes;
    return 0;
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
    fsdp_poke(e);
}

static void mm_backward(struct fsdp_engine *e, int u, float *dinp, float *dw, float *dbias,
                        const float *dout, const float *inp, const uint16_t *inp16, const float *w,
                        size_t N, int C, int OC)
{
    if (e->bf16)
        e->k->matmul_backward_bf16(dinp, dw, dbias, dout, inp16, twin16(e, u, w), N, C, OC);
    else
        e->k->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
    fsdp_poke(e);
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
        fsdp_poke(e);
        k->attention_forward_bf16(la->atty16, la->att, la->qkv16, B, T, C, NH);
    } else {
        mm_forward(e, u, la->qkv, la->ln1, la->ln1_16, p->t[BT_QKV_W], p->t[BT_QKV_B], BT, C,
                   3 * C);
        k->attention_forward(la->atty, la->att, la->qkv, B, T, C, NH);
        if (e->bf16)
            k->to_bf16(la->atty16, la->atty, BT * C);
    }
    fsdp_poke(e);
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
    fsdp_poke(e);
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
    if (fsdp_unit_gather(e, 0, err) || fsdp_unit_prefetch(e, model_unit_block(0), err))
        return -1;
    const float *wte = e->units[0].full + tensor(e, 0, 0)->offset;
    const float *wpe = e->units[0].full + tensor(e, 0, 1)->offset;
    k->encoder_forward(a->encoded, e->inputs, wte, wpe, B, T, C);

    a->slot_holder = -1;
    for (int l = 0; l < L; l++) {
        const int u = model_unit_block(l), g = e->units[u].group, n = e->units[g].group_n;
        const int first = u == g, last = u == g + n - 1; /* of its group, in this pass */
        /* the next group, or after the last one the final LayerNorm */
        if (fsdp_unit_gather(e, u, err) || (first && fsdp_unit_prefetch(e, g + n, err)))
            return -1;
        struct block_params p;
        struct layer_acts la;
        model_block_params(e->m, e->units[u].full, &p);
        layer_acts(e, l, &la);
        block_forward(e, u, &p, &la, B, T, 0);
        if (recomputed(e, l)) /* only a full-size forward has a backward */
            a->slot_holder = B == e->B && T == e->T ? l : -1;
        if (last)
            fsdp_unit_reshard(e, u);
        if (e->on_progress)
            e->on_progress();
    }

    if (fsdp_unit_gather(e, lnf, err))
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
    if (fsdp_unit_gather(e, 0, err) || fsdp_unit_gather(e, lnf, err) ||
        fsdp_unit_prefetch(e, model_unit_block(L - 1), err))
        return -1;
    fsdp_unit_grad_begin(e, 0);
    fsdp_unit_grad_begin(e, lnf);
    const float *wte = e->units[0].full + tensor(e, 0, 0)->offset;
    float *dwte = e->units[0].full_grad + tensor(e, 0, 0)->offset;
    float *dwpe = e->units[0].full_grad + tensor(e, 0, 1)->offset;
    if (a->dlogits16) { /* the gradient straight to bf16: the head has no bias to sum */
        k->crossentropy_backward_bf16(a->dlogits16, a->logits, a->loss_lse, e->targets, dloss, BT,
                                      V, Vp);
        k->matmul_backward_from_bf16(a->dbtc, dwte, a->dlogits16, a->lnf16, twin16(e, 0, wte), BT,
                                     C, Vp);
        fsdp_poke(e);
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
    if (fsdp_unit_grad_end(e, lnf, err))
        return -1;
    fsdp_unit_reshard(e, lnf);

    /* Blocks, last to first. a->dres holds d(loss)/d(residual stream). A
     * recomputed block runs its forward again first, on parameters that are
     * gathered for the backward anyway, unless the shared slot still holds
     * its activations (the last recomputed block of the forward). */
    for (int l = L - 1; l >= 0; l--) {
        const int u = model_unit_block(l), g = e->units[u].group, n = e->units[g].group_n;
        const int first = u == g + n - 1, last = u == g;         /* of its group, in this pass */
        const int before = g > model_unit_block(0) ? g - 1 : -1; /* the group computed next */
        if (fsdp_unit_gather(e, u, err) || (first && fsdp_unit_prefetch(e, before, err)))
            return -1;
        fsdp_unit_grad_begin(e, u);
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
        if (last && fsdp_unit_grad_end(e, u, err))
            return -1;
        if (last)
            fsdp_unit_reshard(e, u);
        if (e->on_progress)
            e->on_progress();
    }

    k->encoder_backward(dwte, dwpe, a->dres, e->inputs, B, T, C);
    if (fsdp_unit_grad_end(e, 0, err) || fsdp_rs_finish(e, err))
        return -1;
    fsdp_unit_reshard(e, 0);
    return 0;
}

void fsdp_logits_row(struct fsdp_engine *e, int t, float *out)
{
    const int Vp = e->m->cfg.vocab_pad;
    e->k->download(out, e->a.logits + (size_t)t * Vp, (size_t)Vp * sizeof(float));
}
