/*
 * fsdp_pass.c - the engine's forward and backward passes: the order of a
 * step over the model's units (fsdp.c: gathering, freeing and reducing
 * them; fsdp_units.h: what the two files share), the output head and the
 * loss, and the activations' one allocation. What happens inside the
 * embedding, a block and the final norm is the model family's
 * (fsdp_family.h: the seam; model_gpt2_pass.c, model_llama_pass.c).
 *
 * The passes are straight-line calls in the order of the model (llm.c
 * style). Activations of every layer live in one allocation sized for the
 * micro-batch; the backward pass reuses one layer's worth of gradient
 * scratch.
 */
#include "fsdp.h"
#include "fsdp_family.h"
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

void fsdp_plan_add(struct fsdp_plan *p, float **ptr, size_t n)
{
    if (p->n < FSDP_PLAN_MAX) { /* more: fsdp_alloc_acts refuses the plan */
        p->f[p->n].p = ptr;
        p->f[p->n].n = n;
    }
    p->n++;
}

void fsdp_plan_add16(struct fsdp_plan *p, uint16_t **ptr, size_t n)
{
    if (p->n16 < FSDP_PLAN_MAX) {
        p->h[p->n16].p = ptr;
        p->h[p->n16].n = n;
    }
    p->n16++;
}

int fsdp_alloc_acts(struct fsdp_engine *e, char *err)
{
    const struct model_config *c = &e->m->cfg;
    if (assign_slots(e))
        return fsdp_err(err, "fsdp: out of memory for the activation plan");
    const size_t C = (size_t)c->dim, LB = (size_t)c->layers, BT = (size_t)e->B * e->T;
    const int head16 =
        e->bf16 && e->k->crossentropy_backward_bf16 && e->k->matmul_backward_from_bf16;
    struct fsdp_acts *a = &e->a;
    struct fsdp_plan plan = {0};
    fsdp_plan_add(&plan, &a->encoded, BT * C); /* first: the allocation's base (fsdp_free) */
    if (e->passes->plan(e, &plan))
        return fsdp_err(err, "fsdp: out of memory for the activation plan");
    fsdp_plan_add(&plan, &a->residual3, LB * BT * C);
    fsdp_plan_add(&plan, &a->lnf, e->bf16 ? 0 : BT * C);
    fsdp_plan_add(&plan, &a->lnf_mean, BT);
    fsdp_plan_add(&plan, &a->lnf_rstd, BT);
    fsdp_plan_add(&plan, &a->logits, BT * c->vocab_pad);
    fsdp_plan_add(&plan, &a->losses, BT);
    fsdp_plan_add(&plan, &a->loss_lse, BT);
    fsdp_plan_add(&plan, &a->scratch, BT * C);
    fsdp_plan_add(&plan, &a->dres, BT * C);
    fsdp_plan_add(&plan, &a->dbtc, BT * C);
    fsdp_plan_add16(&plan, &a->lnf16, e->bf16 ? BT * C : 0);
    fsdp_plan_add16(&plan, &a->dlogits16, head16 ? BT * c->vocab_pad : 0);
    if (plan.n > FSDP_PLAN_MAX || plan.n16 > FSDP_PLAN_MAX)
        return fsdp_err(err, "fsdp: the family's activation plan has too many entries");
    size_t total = 0, total16 = 0; /* floats; bf16 values after them */
    for (int i = 0; i < plan.n; i++)
        total += fsdp_round_up(plan.f[i].n, ALIGN_FLOATS);
    for (int i = 0; i < plan.n16; i++)
        total16 += fsdp_round_up(plan.h[i].n, 2 * ALIGN_FLOATS);
    const size_t bytes = total * sizeof(float) + total16 * sizeof(uint16_t);
    float *base = e->k->alloc(bytes);
    if (!base)
        return fsdp_err(err, "fsdp: out of memory for %zu MiB of activations", bytes >> 20);
    for (size_t i = 0, off = 0; i < (size_t)plan.n; i++) {
        *plan.f[i].p = plan.f[i].n ? base + off : NULL;
        off += fsdp_round_up(plan.f[i].n, ALIGN_FLOATS);
    }
    uint16_t *base16 = (uint16_t *)(base + total);
    for (size_t i = 0, off = 0; i < (size_t)plan.n16; i++) {
        *plan.h[i].p = plan.h[i].n ? base16 + off : NULL;
        off += fsdp_round_up(plan.h[i].n, 2 * ALIGN_FLOATS);
    }
    e->mem.act_bytes = bytes;
    if (e->passes->setup)
        e->passes->setup(e);
    return 0;
}

/* ---- what the families borrow (fsdp_family.h) ------------------------------------ */

const uint16_t *fsdp_twin16(const struct fsdp_engine *e, int u, const float *x)
{
    return e->units[u].full16 + (x - e->units[u].full);
}

void fsdp_mm_forward(struct fsdp_engine *e, int u, float *out, const float *inp,
                     const uint16_t *inp16, const float *w, const float *bias, size_t N, int C,
                     int OC)
{
    if (e->bf16) {
        e->k->matmul_forward_bf16(out, inp16, fsdp_twin16(e, u, w), bias, N, C, OC);
    } else {
        e->k->matmul_forward(out, inp, w, bias, N, C, OC);
    }
    fsdp_poke(e);
}

void fsdp_mm_backward(struct fsdp_engine *e, int u, float *dinp, float *dw, float *dbias,
                      const float *dout, const float *inp, const uint16_t *inp16, const float *w,
                      size_t N, int C, int OC)
{
    if (e->bf16)
        e->k->matmul_backward_bf16(dinp, dw, dbias, dout, inp16, fsdp_twin16(e, u, w), N, C, OC);
    else
        e->k->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
    fsdp_poke(e);
}

int fsdp_slot(const struct fsdp_engine *e, int l) { return e->a.slot[l]; }

const float *fsdp_block_input(const struct fsdp_engine *e, int l)
{
    const size_t S = (size_t)e->B * e->T * (size_t)e->m->cfg.dim; /* per-layer stride */
    return l == 0 ? e->a.encoded : e->a.residual3 + (size_t)(l - 1) * S;
}

float *fsdp_block_output(const struct fsdp_engine *e, int l)
{
    const size_t S = (size_t)e->B * e->T * (size_t)e->m->cfg.dim;
    return e->a.residual3 + (size_t)l * S;
}

/* ---- forward / backward ---------------------------------------------------- */

/* The output head's weight (the first Vp rows of the layout's head tensor)
 * and its unit. */
static float *head_weight(const struct fsdp_engine *e, int *unit)
{
    const struct model_tensor *t = &e->m->tensors[e->m->head_tensor];
    *unit = t->unit;
    return e->units[t->unit].full + t->offset;
}

int fsdp_forward(struct fsdp_engine *e, int B, int T, double *loss_sum, char *err)
{
    const struct fsdp_kernels *k = e->k;
    const struct model_config *c = &e->m->cfg;
    const int L = c->layers, C = c->dim, V = c->vocab, Vp = c->vocab_pad;
    const size_t BT = (size_t)B * T;
    struct fsdp_acts *a = &e->a;

    const int lnf = model_unit_lnf(e->m);
    if (fsdp_unit_gather(e, 0, err) || fsdp_unit_prefetch(e, model_unit_block(0), err))
        return -1;
    e->passes->embed_forward(e, B, T);

    a->slot_holder = -1;
    for (int l = 0; l < L; l++) {
        const int u = model_unit_block(l), g = e->units[u].group, n = e->units[g].group_n;
        const int first = u == g, last = u == g + n - 1; /* of its group, in this pass */
        /* the next group, or after the last one the final norm */
        if (fsdp_unit_gather(e, u, err) || (first && fsdp_unit_prefetch(e, g + n, err)))
            return -1;
        e->passes->block_forward(e, l, B, T, 0);
        if (recomputed(e, l)) /* only a full-size forward has a backward */
            a->slot_holder = B == e->B && T == e->T ? l : -1;
        if (last)
            fsdp_unit_reshard(e, u);
        if (e->on_progress)
            e->on_progress();
    }

    if (fsdp_unit_gather(e, lnf, err))
        return -1;
    e->passes->final_forward(e, BT);
    int hu;
    const float *head = head_weight(e, &hu);
    fsdp_mm_forward(e, hu, a->logits, a->lnf, a->lnf16, head, NULL, BT, C, Vp);
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

/* The head's backward: the loss's gradient, then d(loss)/d(head input)
 * into a->dbtc and the head's weight gradient. */
static void head_backward(struct fsdp_engine *e, float dloss)
{
    const struct fsdp_kernels *k = e->k;
    const struct model_config *c = &e->m->cfg;
    const int C = c->dim, V = c->vocab, Vp = c->vocab_pad;
    const size_t BT = (size_t)e->B * e->T;
    struct fsdp_acts *a = &e->a;
    int hu;
    const float *head = head_weight(e, &hu);
    float *dhead = e->units[hu].full_grad + e->m->tensors[e->m->head_tensor].offset;
    if (a->dlogits16) { /* the gradient straight to bf16: the head has no bias to sum */
        k->crossentropy_backward_bf16(a->dlogits16, a->logits, a->loss_lse, e->targets, dloss, BT,
                                      V, Vp);
        k->matmul_backward_from_bf16(a->dbtc, dhead, a->dlogits16, a->lnf16,
                                     fsdp_twin16(e, hu, head), BT, C, Vp);
        fsdp_poke(e);
    } else {
        k->crossentropy_backward(a->logits, a->logits, a->loss_lse, e->targets, dloss, BT, V, Vp);
        fsdp_mm_backward(e, hu, a->dbtc, dhead, NULL, a->logits, a->lnf, a->lnf16, head, BT, C, Vp);
    }
}

int fsdp_backward(struct fsdp_engine *e, float dloss, char *err)
{
    const struct model_config *c = &e->m->cfg;
    const int L = c->layers, C = c->dim;
    const size_t BT = (size_t)e->B * e->T;
    const int lnf = model_unit_lnf(e->m);
    struct fsdp_acts *a = &e->a;

    /* Head and final norm. The embedding unit is still gathered from the
     * forward pass. */
    if (fsdp_unit_gather(e, 0, err) || fsdp_unit_gather(e, lnf, err) ||
        fsdp_unit_prefetch(e, model_unit_block(L - 1), err))
        return -1;
    fsdp_unit_grad_begin(e, 0);
    fsdp_unit_grad_begin(e, lnf);
    head_backward(e, dloss);
    e->k->zero(a->dres, BT * (size_t)C);
    e->passes->final_backward(e);
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
        if (recomputed(e, l) && a->slot_holder != l) {
            e->passes->block_forward(e, l, e->B, e->T, 1);
            a->slot_holder = l;
        }
        e->passes->block_backward(e, l);
        if (last && fsdp_unit_grad_end(e, u, err))
            return -1;
        if (last)
            fsdp_unit_reshard(e, u);
        if (e->on_progress)
            e->on_progress();
    }

    e->passes->embed_backward(e);
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
