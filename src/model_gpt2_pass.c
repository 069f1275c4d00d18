/*
 * model_gpt2_pass.c - the GPT-2 family's passes (fsdp_family.h): the
 * embeddings, one pre-LN block forward and backward, the final LayerNorm,
 * and the activations a block keeps (model_gpt2.h: its tensors).
 */
#include "fsdp_family.h"
#include "model_gpt2.h"

#include <stdlib.h>

/* The family's activations (fsdp_acts.family). A block's inner
 * activations (ln1 ... fch_gelu) live in a slot (fsdp_slot). In bf16 the
 * matmuls' inputs (ln1, atty, ln2, fch_gelu) are needed again only as the
 * bf16 operands of the backward's products: those bf16 copies (x16) are
 * what the slots keep, and the fp32 ones are NULL but for the attention's
 * output, one shared slot rounded from. With flash, qkv is bf16 too
 * (qkv16; qkv and atty NULL) and att holds each row's lse. */
struct gpt2_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu;
    float *d4c, *datt; /* one layer's worth, reused */
    uint16_t *ln1_16, *atty16, *ln2_16, *fch_gelu16, *qkv16;
};

static struct gpt2_acts *acts(const struct fsdp_engine *e) { return e->a.family; }

static int gpt2_plan(struct fsdp_engine *e, struct fsdp_plan *p)
{
    struct gpt2_acts *a = calloc(1, sizeof *a);
    if (!(e->a.family = a))
        return -1;
    const struct model_config *c = &e->m->cfg;
    /* L counts slots here */
    const size_t L = (size_t)e->a.nslots, C = (size_t)c->dim, NH = (size_t)c->heads;
    const size_t BT = (size_t)e->B * e->T;
    /* attention's state per (sequence, head): the softmax, or flash's lse */
    const size_t TT = e->flash ? (size_t)e->T : (size_t)e->T * e->T;
    /* bf16: the products' inputs are written in bf16 only (struct gpt2_acts),
     * but for the fp32 attention's output, rounded from one shared slot;
     * flash: qkv and the attention's output in bf16 only */
    const size_t Lx = e->bf16 ? 0 : L, L16 = e->bf16 ? L : 0;
    const size_t Latt = e->flash ? 0 : e->bf16 ? 1 : L, Lq = e->flash ? 0 : L, Lq16 = L - Lq;
    fsdp_plan_add(p, &a->ln1, Lx * BT * C);
    fsdp_plan_add(p, &a->ln1_mean, L * BT);
    fsdp_plan_add(p, &a->ln1_rstd, L * BT);
    fsdp_plan_add(p, &a->qkv, Lq * BT * 3 * C);
    fsdp_plan_add(p, &a->atty, Latt * BT * C);
    fsdp_plan_add(p, &a->att, L * e->B * NH * TT);
    fsdp_plan_add(p, &a->residual2, L * BT * C);
    fsdp_plan_add(p, &a->ln2, Lx * BT * C);
    fsdp_plan_add(p, &a->ln2_mean, L * BT);
    fsdp_plan_add(p, &a->ln2_rstd, L * BT);
    fsdp_plan_add(p, &a->fch, L * BT * 4 * C);
    fsdp_plan_add(p, &a->fch_gelu, Lx * BT * 4 * C);
    fsdp_plan_add(p, &a->d4c, BT * 4 * C);
    fsdp_plan_add(p, &a->datt, e->B * NH * TT);
    fsdp_plan_add16(p, &a->ln1_16, L16 * BT * C);
    fsdp_plan_add16(p, &a->atty16, L16 * BT * C);
    fsdp_plan_add16(p, &a->ln2_16, L16 * BT * C);
    fsdp_plan_add16(p, &a->fch_gelu16, L16 * BT * 4 * C);
    fsdp_plan_add16(p, &a->qkv16, Lq16 * BT * 3 * C);
    return 0;
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

/* Pointers to a block's tensors inside a gathered flat buffer (parameters
 * or their gradient). Every block has the same layout, so block 0's
 * offsets serve all. */
struct block_params {
    float *t[BT_COUNT];
};

static void block_params(const struct model_layout *m, float *unit_base, struct block_params *p)
{
    for (int i = 0; i < BT_COUNT; i++)
        p->t[i] = unit_base + model_unit_tensor(m, model_unit_block(0), i)->offset;
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
    const struct gpt2_acts *a = acts(e);
    const size_t C = (size_t)e->m->cfg.dim, NH = (size_t)e->m->cfg.heads;
    const size_t S = (size_t)e->B * e->T;                            /* S: per-layer stride */
    const size_t TT = e->flash ? (size_t)e->T : (size_t)e->T * e->T; /* as in gpt2_plan */
    const size_t s = (size_t)fsdp_slot(e, l);
    const int x = !e->bf16; /* bf16 keeps the products' inputs in bf16 only */
    la->res = fsdp_block_input(e, l);
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
    la->res3 = fsdp_block_output(e, l);
}

/* One block's forward on B x T rows. The recompute during the backward
 * stops after the GELU: the last projection's output is the block's output,
 * which was kept. */
static void gpt2_block_forward(struct fsdp_engine *e, int l, int B, int T, int recompute)
{
    const struct fsdp_kernels *k = e->k;
    const int u = model_unit_block(l), C = e->m->cfg.dim, NH = e->m->cfg.heads;
    const size_t BT = (size_t)B * T;
    struct block_params p;
    struct layer_acts la_, *la = &la_;
    block_params(e->m, e->units[u].full, &p);
    layer_acts(e, l, la);
    float *scratch = e->a.scratch;
    ln_forward(e, la->ln1, la->ln1_16, la->ln1_mean, la->ln1_rstd, la->res, p.t[BT_LN1_W],
               p.t[BT_LN1_B], BT, C);
    if (e->flash) { /* qkv and the attention's output in bf16 only */
        k->matmul_forward_to_bf16(la->qkv16, la->ln1_16, fsdp_twin16(e, u, p.t[BT_QKV_W]),
                                  fsdp_twin16(e, u, p.t[BT_QKV_B]), BT, C, 3 * C);
        fsdp_poke(e);
        k->attention_forward_bf16(la->atty16, la->att, la->qkv16, B, T, C, NH);
    } else {
        fsdp_mm_forward(e, u, la->qkv, la->ln1, la->ln1_16, p.t[BT_QKV_W], p.t[BT_QKV_B], BT, C,
                        3 * C);
        k->attention_forward(la->atty, la->att, la->qkv, B, T, NH, NH, C / NH);
        if (e->bf16)
            k->to_bf16(la->atty16, la->atty, BT * C);
    }
    fsdp_poke(e);
    fsdp_mm_forward(e, u, scratch, la->atty, la->atty16, p.t[BT_ATTPROJ_W], p.t[BT_ATTPROJ_B], BT,
                    C, C);
    k->residual_forward(la->res2, la->res, scratch, BT * C);
    ln_forward(e, la->ln2, la->ln2_16, la->ln2_mean, la->ln2_rstd, la->res2, p.t[BT_LN2_W],
               p.t[BT_LN2_B], BT, C);
    fsdp_mm_forward(e, u, la->fch, la->ln2, la->ln2_16, p.t[BT_FC_W], p.t[BT_FC_B], BT, C, 4 * C);
    gelu_forward(e, la->fch_gelu, la->fch_gelu16, la->fch, BT * 4 * C);
    if (recompute) /* the backward reads fch_gelu as the last product's input */
        return;
    fsdp_mm_forward(e, u, scratch, la->fch_gelu, la->fch_gelu16, p.t[BT_FCPROJ_W], p.t[BT_FCPROJ_B],
                    BT, 4 * C, C);
    k->residual_forward(la->res3, la->res2, scratch, BT * C);
}

/* One block's backward over the full micro-batch. */
static void gpt2_block_backward(struct fsdp_engine *e, int l)
{
    const struct fsdp_kernels *k = e->k;
    const int u = model_unit_block(l), C = e->m->cfg.dim, NH = e->m->cfg.heads, B = e->B, T = e->T;
    const size_t BT = (size_t)B * T;
    struct fsdp_acts *a = &e->a;
    struct gpt2_acts *ga = acts(e);
    struct block_params p, g;
    struct layer_acts la_, *la = &la_;
    block_params(e->m, e->units[u].full, &p);
    block_params(e->m, e->units[u].full_grad, &g);
    layer_acts(e, l, la);
    /* residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))) */
    fsdp_mm_backward(e, u, ga->d4c, g.t[BT_FCPROJ_W], g.t[BT_FCPROJ_B], a->dres, la->fch_gelu,
                     la->fch_gelu16, p.t[BT_FCPROJ_W], BT, 4 * C, C);
    k->gelu_backward(ga->d4c, la->fch, ga->d4c, BT * 4 * C);
    fsdp_mm_backward(e, u, a->dbtc, g.t[BT_FC_W], g.t[BT_FC_B], ga->d4c, la->ln2, la->ln2_16,
                     p.t[BT_FC_W], BT, C, 4 * C);
    k->layernorm_backward(a->dres, g.t[BT_LN2_W], g.t[BT_LN2_B], a->dbtc, la->res2, p.t[BT_LN2_W],
                          la->ln2_mean, la->ln2_rstd, BT, C);
    /* residual2 = residual + attproj(attention(qkv(ln1(residual)))) */
    fsdp_mm_backward(e, u, a->dbtc, g.t[BT_ATTPROJ_W], g.t[BT_ATTPROJ_B], a->dres, la->atty,
                     la->atty16, p.t[BT_ATTPROJ_W], BT, C, C);
    if (e->flash)
        k->attention_backward_bf16(ga->d4c, ga->datt, a->dbtc, la->atty16, la->qkv16, la->att, B, T,
                                   C, NH);
    else
        k->attention_backward(ga->d4c, ga->datt, a->dbtc, la->qkv, la->att, B, T, NH, NH, C / NH);
    fsdp_poke(e);
    fsdp_mm_backward(e, u, a->dbtc, g.t[BT_QKV_W], g.t[BT_QKV_B], ga->d4c, la->ln1, la->ln1_16,
                     p.t[BT_QKV_W], BT, C, 3 * C);
    k->layernorm_backward(a->dres, g.t[BT_LN1_W], g.t[BT_LN1_B], a->dbtc, la->res, p.t[BT_LN1_W],
                          la->ln1_mean, la->ln1_rstd, BT, C);
}

/* out[b,t,:] = wte[tok[b,t],:] + wpe[t,:] */
static void gpt2_embed_forward(struct fsdp_engine *e, int B, int T)
{
    const float *base = e->units[0].full;
    const float *wte = base + model_unit_tensor(e->m, 0, 0)->offset;
    const float *wpe = base + model_unit_tensor(e->m, 0, 1)->offset;
    e->k->encoder_forward(e->a.encoded, e->inputs, wte, wpe, B, T, e->m->cfg.dim);
}

static void gpt2_embed_backward(struct fsdp_engine *e)
{
    float *base = e->units[0].full_grad;
    float *dwte = base + model_unit_tensor(e->m, 0, 0)->offset;
    float *dwpe = base + model_unit_tensor(e->m, 0, 1)->offset;
    e->k->encoder_backward(dwte, dwpe, e->a.dres, e->inputs, e->B, e->T, e->m->cfg.dim);
}

static void gpt2_final_forward(struct fsdp_engine *e, size_t BT)
{
    const int fin = model_unit_lnf(e->m), L = e->m->cfg.layers;
    const float *w = e->units[fin].full + model_unit_tensor(e->m, fin, 0)->offset;
    const float *b = e->units[fin].full + model_unit_tensor(e->m, fin, 1)->offset;
    struct fsdp_acts *a = &e->a;
    ln_forward(e, a->lnf, a->lnf16, a->lnf_mean, a->lnf_rstd, fsdp_block_output(e, L - 1), w, b, BT,
               e->m->cfg.dim);
}

static void gpt2_final_backward(struct fsdp_engine *e)
{
    const int fin = model_unit_lnf(e->m), L = e->m->cfg.layers;
    const size_t BT = (size_t)e->B * e->T;
    const size_t wo = model_unit_tensor(e->m, fin, 0)->offset,
                 bo = model_unit_tensor(e->m, fin, 1)->offset;
    struct fsdp_acts *a = &e->a;
    e->k->layernorm_backward(a->dres, e->units[fin].full_grad + wo, e->units[fin].full_grad + bo,
                             a->dbtc, fsdp_block_output(e, L - 1), e->units[fin].full + wo,
                             a->lnf_mean, a->lnf_rstd, BT, e->m->cfg.dim);
}

const struct fsdp_family_passes gpt2_passes = {
    .flash = 1,
    .plan = gpt2_plan,
    .embed_forward = gpt2_embed_forward,
    .embed_backward = gpt2_embed_backward,
    .block_forward = gpt2_block_forward,
    .block_backward = gpt2_block_backward,
    .final_forward = gpt2_final_forward,
    .final_backward = gpt2_final_backward,
};
