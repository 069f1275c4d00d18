/*
 * model_llama_pass.c - the Llama family's passes (fsdp_family.h): the token
 * embedding, one block forward and backward (RMSNorm, q/k/v in one product,
 * RoPE, grouped-query attention, the output projection, RMSNorm, gate/up in
 * one product, SwiGLU, down), the final RMSNorm, RoPE's tables and the
 * activations a block keeps (model_llama.h: its tensors).
 *
 * Precision as in GPT-2's passes: in bf16 the products run on bf16 operands
 * (their inputs written in bf16 by their producers: RMSNorm, SwiGLU, the
 * attention's output rounded once), everything else is fp32, RoPE and the
 * attention included.
 */
#include "fsdp_family.h"
#include "model_llama.h"

#include <math.h>
#include <stdlib.h>

struct llama_acts {
    float *ln1, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_rstd, *fch, *fch_act;
    float *dbig, *dmid, *datt;  /* one layer's worth, reused */
    uint16_t *dbig16;           /* bf16 with the kernels for it: d(gate | up), rounded as written */
    float *rope_cos, *rope_sin; /* (T, HS/2) each */
    uint16_t *ln1_16, *atty16, *ln2_16, *fch_act16;
    size_t off[BL_COUNT]; /* the block's tensors in its unit */
};

static struct llama_acts *acts(const struct fsdp_engine *e) { return e->a.family; }

/* The model's widths: HS a head, Q the queries (NH HS), KV a K or V (KVH
 * HS), W a row of qkv (Q + 2 KV). */
struct dims {
    int C, NH, KVH, HS, Q, KV, W, F;
};

static struct dims dims_of(const struct model_config *c)
{
    struct dims d = {.C = c->dim, .NH = c->heads, .KVH = c->kv_heads, .F = c->ffn_dim};
    d.HS = d.C / d.NH;
    d.Q = d.NH * d.HS;
    d.KV = d.KVH * d.HS;
    d.W = d.Q + 2 * d.KV;
    return d;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

static int llama_plan(struct fsdp_engine *e, struct fsdp_plan *p)
{
    struct llama_acts *a = calloc(1, sizeof *a);
    if (!(e->a.family = a))
        return -1;
    llama_block_offsets(e->m, a->off);
    const struct dims d = dims_of(&e->m->cfg);
    const size_t L = (size_t)e->a.nslots, BT = (size_t)e->B * e->T, T = (size_t)e->T;
    const size_t C = (size_t)d.C, Q = (size_t)d.Q, W = (size_t)d.W, F = (size_t)d.F;
    const size_t TT = (size_t)e->B * (size_t)d.NH * T * T;
    /* bf16: the products' inputs in bf16 only, the attention's fp32 output
     * in one shared slot it is rounded from */
    const size_t Lx = e->bf16 ? 0 : L, L16 = e->bf16 ? L : 0, Latt = e->bf16 ? 1 : L;
    /* bf16: SwiGLU's backward writes gate/up's gradient in bf16 for its
     * products (the bits matmul_backward_bf16 would round it to) */
    const int d16 = e->bf16 && e->k->swiglu_backward_bf16 && e->k->matmul_backward_from_bf16;
    fsdp_plan_add(p, &a->ln1, Lx * BT * C);
    fsdp_plan_add(p, &a->ln1_rstd, L * BT);
    fsdp_plan_add(p, &a->qkv, L * BT * W);
    fsdp_plan_add(p, &a->att, L * TT);
    fsdp_plan_add(p, &a->atty, Latt * BT * Q);
    fsdp_plan_add(p, &a->res2, L * BT * C);
    fsdp_plan_add(p, &a->ln2, Lx * BT * C);
    fsdp_plan_add(p, &a->ln2_rstd, L * BT);
    fsdp_plan_add(p, &a->fch, L * BT * 2 * F);
    fsdp_plan_add(p, &a->fch_act, Lx * BT * F);
    fsdp_plan_add(p, &a->dbig, BT * (d16 ? W : max2(W, 2 * F)));
    fsdp_plan_add(p, &a->dmid, BT * max2(F, Q));
    fsdp_plan_add(p, &a->datt, TT);
    fsdp_plan_add(p, &a->rope_cos, T * (size_t)(d.HS / 2));
    fsdp_plan_add(p, &a->rope_sin, T * (size_t)(d.HS / 2));
    fsdp_plan_add16(p, &a->ln1_16, L16 * BT * C);
    fsdp_plan_add16(p, &a->atty16, L16 * BT * Q);
    fsdp_plan_add16(p, &a->ln2_16, L16 * BT * C);
    fsdp_plan_add16(p, &a->fch_act16, L16 * BT * F);
    fsdp_plan_add16(p, &a->dbig16, d16 ? BT * 2 * F : 0);
    return 0;
}

/* RoPE's inverse frequencies as Hugging Face computes them (the "default"
 * and "llama3" rope types), then the tables cos(t f_i), sin(t f_i) of the
 * angles rounded to float as torch's float32 products are. */
static void llama_setup(struct fsdp_engine *e)
{
    const struct model_config *c = &e->m->cfg;
    const int half = c->dim / c->heads / 2, T = e->T;
    float *host = malloc((size_t)T * half * 2 * sizeof *host);
    if (!host)
        abort(); /* a few KiB at start-up */
    for (int i = 0; i < half; i++) {
        double inv = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)(2 * half));
        if (c->rope_factor > 0) {
            const double lo_wave = c->rope_orig_ctx / c->rope_low_freq;
            const double hi_wave = c->rope_orig_ctx / c->rope_high_freq;
            const double wave = 2 * M_PI / inv;
            if (wave > lo_wave) {
                inv /= c->rope_factor;
            } else if (wave >= hi_wave) {
                double smooth = (c->rope_orig_ctx / wave - c->rope_low_freq) /
                                (c->rope_high_freq - c->rope_low_freq);
                inv = (1 - smooth) * inv / c->rope_factor + smooth * inv;
            }
        }
        const float f = (float)inv;
        for (int t = 0; t < T; t++) {
            const float angle = (float)t * f;
            host[(size_t)t * half + i] = (float)cos((double)angle);
            host[(size_t)T * half + (size_t)t * half + i] = (float)sin((double)angle);
        }
    }
    struct llama_acts *a = acts(e);
    e->k->upload(a->rope_cos, host, (size_t)T * half * sizeof *host);
    e->k->upload(a->rope_sin, host + (size_t)T * half, (size_t)T * half * sizeof *host);
    free(host);
}

/* A norm or SwiGLU whose output is a product's input: fp32, or in bf16
 * rounded as it is written (out16), all the product needs. */
static void norm_forward(const struct fsdp_engine *e, float *out, uint16_t *out16, float *rstd,
                         const float *inp, const float *w, size_t N)
{
    const int C = e->m->cfg.dim;
    const float eps = (float)e->m->cfg.norm_eps;
    if (e->bf16)
        e->k->rmsnorm_forward_bf16(out16, rstd, inp, w, N, C, eps);
    else
        e->k->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
}

/* Pointers to a block's tensors in a gathered buffer (parameters or their
 * gradient); NULL for biases the model has not. */
struct block_params {
    float *t[BL_COUNT];
};

static void block_params(const struct llama_acts *a, float *base, struct block_params *p)
{
    for (int i = 0; i < BL_COUNT; i++)
        p->t[i] = a->off[i] == (size_t)-1 ? NULL : base + a->off[i];
}

/* Where block l's activations live. */
struct layer_acts {
    const float *res; /* the block's input */
    float *ln1, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_rstd, *fch, *fch_act;
    uint16_t *ln1_16, *atty16, *ln2_16, *fch_act16;
    float *res3; /* the block's output */
};

static void layer_acts(const struct fsdp_engine *e, int l, struct layer_acts *la)
{
    const struct llama_acts *a = acts(e);
    const struct dims d = dims_of(&e->m->cfg);
    const size_t S = (size_t)e->B * e->T, s = (size_t)fsdp_slot(e, l);
    const size_t C = (size_t)d.C, Q = (size_t)d.Q, W = (size_t)d.W, F = (size_t)d.F;
    const size_t TT = (size_t)e->B * (size_t)d.NH * (size_t)e->T * (size_t)e->T;
    const int x = !e->bf16, h = e->bf16;
    la->res = fsdp_block_input(e, l);
    la->ln1 = x ? a->ln1 + s * S * C : NULL;
    la->ln1_rstd = a->ln1_rstd + s * S;
    la->qkv = a->qkv + s * S * W;
    la->att = a->att + s * TT;
    la->atty = x ? a->atty + s * S * Q : a->atty; /* bf16: the one slot */
    la->res2 = a->res2 + s * S * C;
    la->ln2 = x ? a->ln2 + s * S * C : NULL;
    la->ln2_rstd = a->ln2_rstd + s * S;
    la->fch = a->fch + s * S * 2 * F;
    la->fch_act = x ? a->fch_act + s * S * F : NULL;
    la->ln1_16 = h ? a->ln1_16 + s * S * C : NULL;
    la->atty16 = h ? a->atty16 + s * S * Q : NULL;
    la->ln2_16 = h ? a->ln2_16 + s * S * C : NULL;
    la->fch_act16 = h ? a->fch_act16 + s * S * F : NULL;
    la->res3 = fsdp_block_output(e, l);
}

/* res2 = res + o(attention(rope(qkv(norm1(res))))),
 * res3 = res2 + down(swiglu(gate_up(norm2(res2)))). The recompute stops
 * after SwiGLU: down's output is the block's output, which was kept. */
static void llama_block_forward(struct fsdp_engine *e, int l, int B, int T, int recompute)
{
    const struct fsdp_kernels *k = e->k;
    const struct llama_acts *a = acts(e);
    const struct dims d = dims_of(&e->m->cfg);
    const int u = model_unit_block(l);
    const size_t BT = (size_t)B * T;
    struct block_params p;
    struct layer_acts la_, *la = &la_;
    block_params(a, e->units[u].full, &p);
    layer_acts(e, l, la);
    float *scratch = e->a.scratch;
    norm_forward(e, la->ln1, la->ln1_16, la->ln1_rstd, la->res, p.t[BL_IN_NORM], BT);
    fsdp_mm_forward(e, u, la->qkv, la->ln1, la->ln1_16, p.t[BL_Q], p.t[BL_Q_BIAS], BT, d.C, d.W);
    k->rope(la->qkv, a->rope_cos, a->rope_sin, B, T, d.NH + d.KVH, d.HS, d.W, 0);
    k->attention_forward(la->atty, la->att, la->qkv, B, T, d.NH, d.KVH, d.HS);
    if (e->bf16)
        k->to_bf16(la->atty16, la->atty, BT * (size_t)d.Q);
    fsdp_poke(e);
    fsdp_mm_forward(e, u, scratch, la->atty, la->atty16, p.t[BL_O], NULL, BT, d.Q, d.C);
    k->residual_forward(la->res2, la->res, scratch, BT * (size_t)d.C);
    norm_forward(e, la->ln2, la->ln2_16, la->ln2_rstd, la->res2, p.t[BL_POST_NORM], BT);
    fsdp_mm_forward(e, u, la->fch, la->ln2, la->ln2_16, p.t[BL_GATE], NULL, BT, d.C, 2 * d.F);
    if (e->bf16)
        k->swiglu_forward_bf16(la->fch_act16, la->fch, BT, d.F);
    else
        k->swiglu_forward(la->fch_act, la->fch, BT, d.F);
    if (recompute) /* the backward reads fch_act as down's input */
        return;
    fsdp_mm_forward(e, u, scratch, la->fch_act, la->fch_act16, p.t[BL_DOWN], NULL, BT, d.F, d.C);
    k->residual_forward(la->res3, la->res2, scratch, BT * (size_t)d.C);
}

static void llama_block_backward(struct fsdp_engine *e, int l)
{
    const struct fsdp_kernels *k = e->k;
    const struct llama_acts *a = acts(e);
    const struct dims d = dims_of(&e->m->cfg);
    const int u = model_unit_block(l), B = e->B, T = e->T;
    const size_t BT = (size_t)B * T;
    struct fsdp_acts *ea = &e->a;
    struct block_params p, g;
    struct layer_acts la_, *la = &la_;
    block_params(a, e->units[u].full, &p);
    block_params(a, e->units[u].full_grad, &g);
    layer_acts(e, l, la);
    /* the MLP: dmid = d(swiglu output), dbig = d(gate | up) */
    fsdp_mm_backward(e, u, a->dmid, g.t[BL_DOWN], NULL, ea->dres, la->fch_act, la->fch_act16,
                     p.t[BL_DOWN], BT, d.F, d.C);
    if (a->dbig16) {
        k->swiglu_backward_bf16(a->dbig16, la->fch, a->dmid, BT, d.F);
        k->matmul_backward_from_bf16(ea->dbtc, g.t[BL_GATE], a->dbig16, la->ln2_16,
                                     fsdp_twin16(e, u, p.t[BL_GATE]), BT, d.C, 2 * d.F);
        fsdp_poke(e);
    } else {
        k->swiglu_backward(a->dbig, la->fch, a->dmid, BT, d.F);
        fsdp_mm_backward(e, u, ea->dbtc, g.t[BL_GATE], NULL, a->dbig, la->ln2, la->ln2_16,
                         p.t[BL_GATE], BT, d.C, 2 * d.F);
    }
    k->rmsnorm_backward(ea->dres, g.t[BL_POST_NORM], ea->dbtc, la->res2, p.t[BL_POST_NORM],
                        la->ln2_rstd, BT, d.C);
    /* the attention: dmid = d(attention output), dbig = d(qkv), rotated back */
    fsdp_mm_backward(e, u, a->dmid, g.t[BL_O], NULL, ea->dres, la->atty, la->atty16, p.t[BL_O], BT,
                     d.Q, d.C);
    k->attention_backward(a->dbig, a->datt, a->dmid, la->qkv, la->att, B, T, d.NH, d.KVH, d.HS);
    k->rope(a->dbig, a->rope_cos, a->rope_sin, B, T, d.NH + d.KVH, d.HS, d.W, 1);
    fsdp_poke(e);
    fsdp_mm_backward(e, u, ea->dbtc, g.t[BL_Q], g.t[BL_Q_BIAS], a->dbig, la->ln1, la->ln1_16,
                     p.t[BL_Q], BT, d.C, d.W);
    k->rmsnorm_backward(ea->dres, g.t[BL_IN_NORM], ea->dbtc, la->res, p.t[BL_IN_NORM], la->ln1_rstd,
                        BT, d.C);
}

static void llama_embed_forward(struct fsdp_engine *e, int B, int T)
{
    e->k->encoder_forward(e->a.encoded, e->inputs, e->units[0].full, NULL, B, T, e->m->cfg.dim);
}

static void llama_embed_backward(struct fsdp_engine *e)
{
    e->k->encoder_backward(e->units[0].full_grad, NULL, e->a.dres, e->inputs, e->B, e->T,
                           e->m->cfg.dim);
}

static void llama_final_forward(struct fsdp_engine *e, size_t BT)
{
    const int fin = model_unit_lnf(e->m);
    const float *w = e->units[fin].full + model_unit_tensor(e->m, fin, 0)->offset;
    norm_forward(e, e->a.lnf, e->a.lnf16, e->a.lnf_rstd, fsdp_block_output(e, e->m->cfg.layers - 1),
                 w, BT);
}

static void llama_final_backward(struct fsdp_engine *e)
{
    const int fin = model_unit_lnf(e->m);
    const size_t wo = model_unit_tensor(e->m, fin, 0)->offset, BT = (size_t)e->B * e->T;
    struct fsdp_acts *a = &e->a;
    e->k->rmsnorm_backward(a->dres, e->units[fin].full_grad + wo, a->dbtc,
                           fsdp_block_output(e, e->m->cfg.layers - 1), e->units[fin].full + wo,
                           a->lnf_rstd, BT, e->m->cfg.dim);
}

const struct fsdp_family_passes llama_passes = {
    .flash = 0, /* flash.cu's kernels are multi-head only */
    .plan = llama_plan,
    .setup = llama_setup,
    .embed_forward = llama_embed_forward,
    .embed_backward = llama_embed_backward,
    .block_forward = llama_block_forward,
    .block_backward = llama_block_backward,
    .final_forward = llama_final_forward,
    .final_backward = llama_final_backward,
};
