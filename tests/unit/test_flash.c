/*
 * test_flash.c - the flash attention's arithmetic (flash_ref.c, the
 * reference src/cuda/flash.cu is checked against on a GPU) against the fp32
 * attention, kernel by kernel and through the whole engine, and the
 * engine's bf16 path that keeps lse instead of the softmax.
 *
 * Errors are max |ref - fp32| / max |fp32| (as in test_cuda.c). The flash
 * path rounds Q, K, V, dO, P, dS and its output to bf16 (8 bits of
 * mantissa, 2^-9 = 0.2% relative at worst per rounding); the tolerances allow a few such
 * roundings compounding, and are about 3x what these inputs give (the
 * figures in the comments, measured on this file's inputs).
 */
#include "check.h"

#include "comm.h"
#include "flash_ref.h"
#include "fsdp.h"
#include "kernels.h"
#include "model.h"
#include "numeric.h"
#include "tensor_errors.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* fp32 attention (the CPU kernels) against the reference, forward and
 * backward, on one shape; returns the two errors */
static void compare(int B, int T, int C, int NH, uint64_t seed, double *eo, double *eg)
{
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    const size_t na = (size_t)B * NH * T * T, nl = (size_t)B * NH * T;
    float *qkv = randv(nq, seed, 1), *dout = randv(no, seed + 1, 1);
    float *att = calloc(na, 4), *datt = calloc(na, 4), *out = calloc(no, 4), *dqkv = calloc(nq, 4);
    float *rout = calloc(no, 4), *lse = calloc(nl, 4), *d = calloc(nl, 4);
    float *rdqkv = calloc(nq, 4);
    uint16_t *out16 = calloc(no, 2), *qkv16 = calloc(nq, 2);
    k->attention_forward(out, att, qkv, B, T, NH, NH, C / NH);
    k->attention_backward(dqkv, datt, dout, qkv, att, B, T, NH, NH, C / NH);
    k->to_bf16(qkv16, qkv, nq); /* what the qkv product writes */
    flash_ref_forward(out16, lse, qkv16, B, T, C, NH);
    k->from_bf16(rout, out16, no);
    flash_ref_backward(rdqkv, d, dout, out16, qkv16, lse, B, T, C, NH);
    *eo = rel_err(rout, out, no);
    *eg = rel_err(rdqkv, dqkv, nq);
    free(qkv), free(dout), free(att), free(datt), free(out), free(dqkv);
    free(rout), free(lse), free(d), free(rdqkv), free(out16), free(qkv16);
}

/* One tile (T 64), several with a ragged last one (T 200), a single row,
 * heads of 8, 24 and 64 (the GPU pads 8 and 24 to 16 and 32). */
static void the_reference_matches_fp32_attention(void)
{
    static const struct {
        int B, T, C, NH;
    } shapes[] = {{2, 64, 96, 4}, {1, 200, 128, 2}, {2, 1, 16, 2}, {1, 130, 64, 8}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double eo, eg;
        compare(shapes[i].B, shapes[i].T, shapes[i].C, shapes[i].NH, 10 + 2 * i, &eo, &eg);
        printf("  B %d T %d C %d NH %d: out %.2g, dqkv %.2g\n", shapes[i].B, shapes[i].T,
               shapes[i].C, shapes[i].NH, eo, eg);
        CHECK(eo < 1e-2, "out: relative error %.3g (tolerance 1e-2)", eo);
        CHECK(eg < 1e-2, "dqkv: relative error %.3g (tolerance 1e-2)", eg);
    }
}

/* The rows' log-sum-exp: p = exp(s * scale - lse) must be the fp32
 * softmax on bf16-rounded Q and K (rounding them is all that differs). */
static void lse_gives_back_the_softmax(void)
{
    enum { B = 1, T = 150, C = 64, NH = 2 };
    const int hs = C / NH;
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    float *qkv = randv((size_t)B * T * 3 * C, 7, 2), *out = calloc((size_t)B * T * C, 4);
    float *att = calloc((size_t)B * NH * T * T, 4), *lse = calloc((size_t)B * NH * T, 4);
    float *q16 = malloc((size_t)B * T * 3 * C * 4);
    uint16_t *tmp = malloc((size_t)B * T * 3 * C * 2);
    uint16_t *out16 = malloc((size_t)B * T * C * 2);
    k->to_bf16(tmp, qkv, (size_t)B * T * 3 * C);
    k->from_bf16(q16, tmp, (size_t)B * T * 3 * C);
    k->attention_forward(out, att, q16, B, T, NH, NH, C / NH);
    flash_ref_forward(out16, lse, tmp, B, T, C, NH);
    double worst = 0;
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j <= t; j++) {
                const float *q = q16 + (size_t)t * 3 * C + h * hs;
                const float *kk = q16 + (size_t)j * 3 * C + C + h * hs;
                float s = 0;
                for (int d = 0; d < hs; d++)
                    s += q[d] * kk[d];
                double p = exp(s / sqrt((double)hs) - lse[(size_t)h * T + t]);
                double e = fabs(p - att[((size_t)h * T + t) * T + j]);
                worst = e > worst ? e : worst;
            }
    printf("  worst |exp(s - lse) - softmax| %.2g\n", worst);
    CHECK(worst < 1e-5, "exp(s - lse) is off the softmax by %.3g", worst);
    free(qkv), free(out), free(att), free(lse), free(q16), free(tmp), free(out16);
}

/* ---- the engine ---------------------------------------------------------------------- */

enum { EB = 2, ET = 70 }; /* two tiles, the second ragged */
static const struct model_config ecfg = {
    .layers = 2, .dim = 32, .heads = 2, .seq = ET, .vocab = 30, .vocab_pad = 32};

/* loss and gradient shard (caller frees; *n floats) of one step with kernels k */
static float *step_grads(const struct fsdp_kernels *k, int recompute, double *loss,
                         size_t *act_bytes, size_t *n)
{
    char err[FSDP_ERR_LEN];
    struct model_layout m;
    struct fsdp_comm comm;
    struct fsdp_engine e;
    if (model_layout_init(&m, &ecfg, err) != 0)
        return NULL;
    fsdp_comm_local_init(&comm);
    const struct fsdp_opts o = {FSDP_SHARD_FULL, EB, recompute, 1, 0, 0, 0, 0, 0};
    float *g = NULL;
    if (fsdp_init(&e, &m, k, &comm, &o, err) != 0) {
        fprintf(stderr, "  %s\n", err);
        goto out;
    }
    fsdp_init_params(&e, 5);
    int32_t in[EB * ET], tgt[EB * ET];
    struct fsdp_rng rng = {42};
    for (int i = 0; i < EB * ET; i++) {
        in[i] = (int32_t)fsdp_rng_below(&rng, (uint64_t)ecfg.vocab);
        tgt[i] = (int32_t)fsdp_rng_below(&rng, (uint64_t)ecfg.vocab);
    }
    fsdp_set_batch(&e, in, tgt);
    fsdp_zero_grad(&e);
    *act_bytes = e.mem.act_bytes;
    if (fsdp_forward(&e, EB, ET, loss, err) == 0 && fsdp_backward(&e, 1.0f / (EB * ET), err) == 0) {
        *n = e.shard_total;
        g = malloc(e.shard_total * sizeof *g);
        memcpy(g, e.grads, e.shard_total * sizeof *g);
    } else {
        fprintf(stderr, "  %s\n", err);
    }
    fsdp_free(&e);
out:
    comm.finalize(&comm);
    model_layout_free(&m);
    return g;
}

/* A GPU's crossentropy_backward_bf16 and matmul_backward_from_bf16 on the
 * CPU: the CPU's fp32 gradient rounded, and the CPU's bf16 product on it
 * (whose own rounding of the widened values changes nothing). */
static void head_backward_bf16(uint16_t *d16, const float *logits, const float *lse,
                               const int32_t *targets, float dloss, size_t N, int V, int Vp)
{
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    float *d = malloc(N * Vp * sizeof *d);
    k->crossentropy_backward(d, logits, lse, targets, dloss, N, V, Vp);
    k->to_bf16(d16, d, N * Vp);
    free(d);
}

static void head_product_from_bf16(float *dinp, float *dw, const uint16_t *d16, const uint16_t *inp,
                                   const uint16_t *w, size_t N, int C, int OC)
{
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    float *d = malloc(N * OC * sizeof *d);
    k->from_bf16(d, d16, N * OC);
    k->matmul_backward_bf16(dinp, dw, NULL, d, inp, w, N, C, OC);
    free(d);
}

static struct fsdp_kernels with_head16(struct fsdp_kernels k)
{
    k.crossentropy_backward_bf16 = head_backward_bf16;
    k.matmul_backward_from_bf16 = head_product_from_bf16;
    return k;
}

/* The head's gradient written in bf16 straight away (a GPU's bf16 run) is
 * the rounding the product did before: the same loss and gradients, bit
 * for bit, through the engine's other branch. */
static void the_heads_bf16_gradient_gives_the_same_bits(void)
{
    const struct fsdp_kernels *plain = fsdp_kernels_cpu();
    const struct fsdp_kernels head16 = with_head16(*plain);
    double l0 = 0, l1 = 0;
    size_t b0 = 0, b1 = 0, n = 0, n1 = 0;
    float *g0 = step_grads(plain, 0, &l0, &b0, &n), *g1 = step_grads(&head16, 0, &l1, &b1, &n1);
    REQUIRE(g0 && g1 && n == n1, "a step failed");
    CHECK(l0 == l1, "loss: %.9g with the fp32 head gradient, %.9g with the bf16 one", l0, l1);
    CHECK(memcmp(g0, g1, n * sizeof *g0) == 0, "the gradients differ");
    CHECK(b1 > b0, "no buffer for the bf16 head gradient (%zu -> %zu bytes)", b0, b1);
    printf("  activations %zu -> %zu bytes (the head's bf16 gradient)\n", b0, b1);
    free(g0), free(g1);
}

/* The CPU kernels with the reference plugged in as the bf16 attention: a
 * bf16 run then takes the engine's flash path, as on a GPU. */
static struct fsdp_kernels with_flash(void)
{
    struct fsdp_kernels k = *fsdp_kernels_cpu();
    k.attention_forward_bf16 = flash_ref_forward;
    k.attention_backward_bf16 = flash_ref_backward;
    k.matmul_forward_to_bf16 = flash_ref_matmul_to_bf16;
    k.attention_bf16_max_hs = 128;
    return with_head16(k);
}

/* The engine's flash path (lse kept per row, the backward fed the bf16
 * copy of the attention's output) against its softmax path in the same
 * bf16 run: the loss and every gradient tensor, with and without the
 * activations recomputed; and the activations shrink by the T x T
 * matrices. */
static void the_engines_flash_path_matches_its_softmax_path(void)
{
    const struct fsdp_kernels *plain = fsdp_kernels_cpu();
    const struct fsdp_kernels flash = with_flash();
    for (int recompute = 0; recompute <= 1; recompute++) {
        double lp = 0, lf = 0;
        size_t bp = 0, bf = 0, np = 0, nf = 0;
        float *gp = step_grads(plain, recompute, &lp, &bp, &np);
        float *gf = step_grads(&flash, recompute, &lf, &bf, &nf);
        REQUIRE(gp && gf, "a step failed");
        printf("  recompute %d: loss %.7g (softmax) %.7g (flash); activations %zu -> %zu bytes\n",
               recompute, lp, lf, bp, bf);
        CHECK(fabs(lp - lf) <= 1e-3 * fabs(lp), "loss: softmax %.9g flash %.9g", lp, lf);
        CHECK(bf < bp, "flash keeps %zu bytes of activations, the softmax %zu", bf, bp);
        struct model_layout m;
        char err[FSDP_ERR_LEN];
        REQUIRE(model_layout_init(&m, &ecfg, err) == 0, "%s", err);
        double *rel = malloc((size_t)m.ntensors * sizeof *rel), worst = 0;
        REQUIRE(tensor_errors(&m, EB, plain, gf, gp, rel) == 0, "no engine for the offsets");
        for (int ti = 0; ti < m.ntensors; ti++) {
            worst = rel[ti] > worst ? rel[ti] : worst;
            CHECK(rel[ti] < 1.5e-2, "%s gradient: relative error %.3g (tolerance 1.5e-2)",
                  m.tensors[ti].name, rel[ti]);
        }
        printf("  recompute %d: worst gradient tensor %.2g\n", recompute, worst);
        free(rel);
        model_layout_free(&m);
        free(gp), free(gf);
    }
}

/* 20 AdamW steps of tiny (L4 C128 H4 T128, 4 sequences) on a learnable
 * token stream: bf16 with the flash reference stays within 1e-2 of bf16
 * with the softmax attention at every step (8.8e-4 measured), and both
 * within 2e-2 of fp32 (4.3e-3 and 3.5e-3). The learning rate, 2e-3, keeps
 * the descent smooth: at 3e-3 the loss spikes at steps 6 and 9 and a spike
 * turns any difference of rounding into several percent, which would make
 * this a test of chaos, not of the attention. */
enum { DB = 4, DT = 128, DSTEPS = 20 };

static int drift_run(const struct fsdp_kernels *k, int bf16, double *losses)
{
    char err[FSDP_ERR_LEN];
    struct model_config cfg = {
        .layers = 4, .dim = 128, .heads = 4, .seq = DT, .vocab = 256, .vocab_pad = 256};
    struct model_layout m;
    struct fsdp_comm comm;
    struct fsdp_engine e;
    if (model_layout_init(&m, &cfg, err))
        return -1;
    fsdp_comm_local_init(&comm);
    const struct fsdp_opts o = {FSDP_SHARD_FULL, DB, 0, bf16, 0, 0, 0, 0, 0};
    int rc = fsdp_init(&e, &m, k, &comm, &o, err);
    if (rc == 0) {
        fsdp_init_params(&e, 1);
        struct fsdp_rng rng = {7};
        int32_t in[DB * DT], tgt[DB * DT];
        const struct fsdp_adamw ad = {2e-3f, 0.9f, 0.95f, 1e-8f, 0.0f};
        for (int s = 0; rc == 0 && s < DSTEPS; s++) {
            for (int i = 0; i < DB * DT; i++) { /* the next token is a function of this one */
                in[i] = (int32_t)fsdp_rng_below(&rng, 256);
                tgt[i] = (in[i] * 5 + 3) % 256;
            }
            fsdp_set_batch(&e, in, tgt);
            fsdp_zero_grad(&e);
            double l = 0;
            rc = fsdp_forward(&e, DB, DT, &l, err) || fsdp_backward(&e, 1.0f / (DB * DT), err) ||
                 fsdp_reduce_grads(&e, err);
            losses[s] = l / (DB * DT);
            fsdp_adamw_step(&e, &ad, s + 1, 1.0f);
        }
        fsdp_free(&e);
    }
    if (rc)
        fprintf(stderr, "  %s\n", err);
    comm.finalize(&comm);
    model_layout_free(&m);
    return rc ? -1 : 0;
}

static void bf16_with_flash_follows_the_softmax_for_20_steps(void)
{
    const struct fsdp_kernels flash = with_flash();
    double f32[DSTEPS], soft[DSTEPS], fl[DSTEPS], ws = 0, wf = 0, wfs = 0;
    REQUIRE(drift_run(fsdp_kernels_cpu(), 0, f32) == 0 &&
                drift_run(fsdp_kernels_cpu(), 1, soft) == 0 && drift_run(&flash, 1, fl) == 0,
            "a run failed");
    for (int s = 0; s < DSTEPS; s++) {
        ws = fmax(ws, fabs(soft[s] - f32[s]) / f32[s]);
        wf = fmax(wf, fabs(fl[s] - f32[s]) / f32[s]);
        wfs = fmax(wfs, fabs(fl[s] - soft[s]) / soft[s]);
    }
    printf("  losses %.4f -> %.4f (fp32); worst step vs fp32: bf16 %.2g, bf16 with flash %.2g; "
           "flash vs the softmax, both bf16: %.2g\n",
           f32[0], f32[DSTEPS - 1], ws, wf, wfs);
    CHECK(f32[DSTEPS - 1] < 0.8 * f32[0], "fp32 did not learn: %.4f -> %.4f", f32[0],
          f32[DSTEPS - 1]);
    CHECK(wfs < 1e-2, "bf16 with flash: %.3g off bf16 with the softmax (tolerance 1e-2)", wfs);
    CHECK(ws < 2e-2 && wf < 2e-2, "bf16 %.3g, bf16 with flash %.3g off fp32 (tolerance 2e-2)", ws,
          wf);
}

CHECK_MAIN(TEST(the_reference_matches_fp32_attention), TEST(lse_gives_back_the_softmax),
           TEST(the_engines_flash_path_matches_its_softmax_path),
           TEST(the_heads_bf16_gradient_gives_the_same_bits),
           TEST(bf16_with_flash_follows_the_softmax_for_20_steps))
