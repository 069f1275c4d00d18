/*
 * test_gradcheck.c - every parameter tensor's analytic gradient against
 * central finite differences of the loss, on a small model.
 *
 * Tolerance: for each tensor, over all of its elements,
 *   ||g_analytic - g_numeric|| / (||g_analytic|| + ||g_numeric||) < 5e-3
 * with eps = 5e-3 in float32. Parameters are drawn with a larger spread than
 * GPT-2's init so that gradients stand well above float32 rounding; the
 * padded vocabulary (V=30, Vp=32) and two heads are exercised. A wrong
 * backward kernel produces errors of order 1e-1 (the tests at the bottom
 * prove the check catches two such bugs).
 */
#include "check.h"

#include "comm.h"
#include "fsdp.h"
#include "kernels.h"
#include "model.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 8 };
static const struct model_config gpt2 = {
    .layers = 2, .dim = 16, .heads = 2, .seq = T, .vocab = 30, .vocab_pad = 32};
/* Llama: grouped-query attention (4 heads share 2 K/V heads), an untied
 * head; and a variant with Qwen2's q/k/v biases, a tied head, plain MHA and
 * llama3 RoPE scaling (with a short original context, so all three of its
 * frequency bands occur) */
static const struct model_config llama = {.arch = MODEL_LLAMA,
                                          .layers = 2,
                                          .dim = 16,
                                          .heads = 4,
                                          .seq = T,
                                          .vocab = 30,
                                          .vocab_pad = 32,
                                          .kv_heads = 2,
                                          .ffn_dim = 24,
                                          .rope_theta = 10000,
                                          .norm_eps = 1e-5};
static const struct model_config llama_tied_bias = {.arch = MODEL_LLAMA,
                                                    .layers = 2,
                                                    .dim = 16,
                                                    .heads = 2,
                                                    .seq = T,
                                                    .vocab = 30,
                                                    .vocab_pad = 32,
                                                    .kv_heads = 2,
                                                    .ffn_dim = 20,
                                                    .tie_embeddings = 1,
                                                    .attn_bias = 1,
                                                    .rope_theta = 500000,
                                                    .norm_eps = 1e-5,
                                                    .rope_factor = 8,
                                                    .rope_low_freq = 1,
                                                    .rope_high_freq = 4,
                                                    .rope_orig_ctx = 64};
/* the model every check below runs on (the tests at the bottom switch it) */
static const struct model_config *cfg = &gpt2;
#define TOL 5e-3
#define EPS 5e-3f

struct rig {
    struct model_layout m;
    struct fsdp_comm comm;
    struct fsdp_engine e;
    int32_t in[B * T], tgt[B * T];
};

/* What a rig asks of the engine besides its sharding (fsdp_opts). */
struct rig_opts {
    int recompute_every, bf16, reduce_bf16, unit_blocks, fp16, round_params;
};

static int rig_init_opts(struct rig *r, const struct fsdp_kernels *k, enum fsdp_shard shard,
                         const struct rig_opts *ro)
{
    char err[FSDP_ERR_LEN];
    if (model_layout_init(&r->m, cfg, err) != 0)
        return -1;
    fsdp_comm_local_init(&r->comm);
    const struct fsdp_opts o = {shard,
                                B,
                                ro->recompute_every,
                                ro->bf16,
                                ro->reduce_bf16,
                                1 /* prefetch */,
                                ro->unit_blocks,
                                0,
                                ro->fp16};
    if (fsdp_init(&r->e, &r->m, k, &r->comm, &o, err) != 0)
        return -1;
    struct fsdp_rng rng = {42};
    for (int i = 0; i < B * T; i++) {
        r->in[i] = (int32_t)fsdp_rng_below(&rng, (uint64_t)cfg->vocab);
        r->tgt[i] = (int32_t)fsdp_rng_below(&rng, (uint64_t)cfg->vocab);
    }
    /* parameters ~ N(init_value, 0.3^2): norms near 1, everything else near 0 */
    for (int ti = 0; ti < r->m.ntensors; ti++) {
        const struct model_tensor *t = &r->m.tensors[ti];
        float *p = r->e.params + r->e.units[t->unit].shard_off + t->offset;
        for (size_t i = 0; i < t->numel; i++)
            p[i] = t->init_value + 0.3f * fsdp_normal_at(1000 + (uint64_t)ti, i);
        if (ro->round_params) /* the values an fp16 gather gives */
            k->round_fp16(p, t->numel);
    }
    fsdp_set_batch(&r->e, r->in, r->tgt);
    return 0;
}

static int rig_init(struct rig *r, const struct fsdp_kernels *k, enum fsdp_shard shard)
{
    const struct rig_opts none = {0};
    return rig_init_opts(r, k, shard, &none);
}

static void rig_free(struct rig *r)
{
    fsdp_free(&r->e);
    model_layout_free(&r->m);
}

static double loss_of(struct rig *r)
{
    double s = 0;
    char err[FSDP_ERR_LEN];
    fsdp_params_changed(&r->e); /* a parameter was edited in place */
    if (fsdp_forward(&r->e, B, T, &s, err) != 0)
        return NAN;
    return s / (B * T);
}

/* Fills rel[ti] with each tensor's relative error; returns the worst. */
static double gradcheck(const struct fsdp_kernels *k, enum fsdp_shard shard, double *rel)
{
    struct rig r;
    char err[FSDP_ERR_LEN];
    if (rig_init(&r, k, shard) != 0)
        return INFINITY;
    fsdp_zero_grad(&r.e);
    double base;
    if (fsdp_forward(&r.e, B, T, &base, err) || fsdp_backward(&r.e, 1.0f / (B * T), err)) {
        rig_free(&r);
        return INFINITY;
    }
    double worst = 0;
    for (int ti = 0; ti < r.m.ntensors; ti++) {
        const struct model_tensor *t = &r.m.tensors[ti];
        size_t off = r.e.units[t->unit].shard_off + t->offset;
        double diff2 = 0, a2 = 0, n2 = 0;
        for (size_t i = 0; i < t->numel; i++) {
            float *p = r.e.params + off + i, saved = *p;
            *p = saved + EPS;
            double lp = loss_of(&r);
            *p = saved - EPS;
            double lm = loss_of(&r);
            *p = saved;
            double num = (lp - lm) / (2.0 * EPS), ana = r.e.grads[off + i];
            diff2 += (ana - num) * (ana - num);
            a2 += ana * ana;
            n2 += num * num;
        }
        rel[ti] = sqrt(diff2) / (sqrt(a2) + sqrt(n2) + 1e-30);
        if (!(a2 > 0))
            rel[ti] = INFINITY; /* a gradient that is exactly zero is a bug here */
        if (!(rel[ti] <= worst))
            worst = rel[ti];
    }
    rig_free(&r);
    return worst;
}

static void check_all_tensors(enum fsdp_shard shard)
{
    struct model_layout m;
    char err[FSDP_ERR_LEN];
    REQUIRE(model_layout_init(&m, cfg, err) == 0, "%s", err);
    double *rel = calloc((size_t)m.ntensors, sizeof *rel);
    gradcheck(fsdp_kernels_cpu(), shard, rel);
    const char *verbose = getenv("GRADCHECK_VERBOSE");
    for (int ti = 0; ti < m.ntensors; ti++) {
        if (verbose)
            printf("  %-24s %.3g\n", m.tensors[ti].name, rel[ti]);
        CHECK(rel[ti] < TOL, "%s: relative error %.3g (tolerance %g)", m.tensors[ti].name, rel[ti],
              TOL);
    }
    free(rel);
    model_layout_free(&m);
}

static void every_tensor_gradient_matches_finite_differences_full_shard(void)
{
    check_all_tensors(FSDP_SHARD_FULL);
}

static void every_tensor_gradient_matches_finite_differences_no_shard(void)
{
    check_all_tensors(FSDP_SHARD_NONE);
}

/* ---- activation checkpointing ---------------------------------------------- */

/* The gradient shard after one forward and backward (a validation-sized
 * forward first, so that a recompute must not trust what it left behind). */
static float *grads_of(enum fsdp_shard shard, const struct rig_opts *ro, int micro, size_t *n,
                       size_t *act)
{
    struct rig r;
    char err[FSDP_ERR_LEN];
    double loss;
    if (rig_init_opts(&r, fsdp_kernels_cpu(), shard, ro) != 0)
        return NULL;
    fsdp_zero_grad(&r.e);
    int rc = fsdp_forward(&r.e, 1, T / 2, &loss, err);
    for (int i = 0; i < micro && rc == 0; i++) /* 2: the accumulation path too */
        rc = fsdp_forward(&r.e, B, T, &loss, err) || fsdp_backward(&r.e, 1.0f / (B * T), err);
    if (rc == 0) /* as the trainer does (none, fp16: where one rank's gradient is rounded) */
        rc = fsdp_reduce_grads(&r.e, err);
    if (rc) {
        rig_free(&r);
        return NULL;
    }
    *n = r.e.shard_total;
    *act = r.e.mem.act_bytes;
    float *g = malloc(*n * sizeof *g);
    memcpy(g, r.e.grads, *n * sizeof *g);
    rig_free(&r);
    return g;
}

static float *grads_with(int recompute_every, enum fsdp_shard shard, int bf16, int micro, size_t *n,
                         size_t *act)
{
    const struct rig_opts ro = {.recompute_every = recompute_every, .bf16 = bf16};
    return grads_of(shard, &ro, micro, n, act);
}

static void recomputing_blocks_gives_the_same_gradient_bits(void)
{
    for (int s = 0; s < 4; s++) { /* fp32 and bf16 (its fallback where no hardware) */
        enum fsdp_shard shard = s % 2 ? FSDP_SHARD_NONE : FSDP_SHARD_FULL;
        const int bf16 = s >= 2;
        size_t n0, n, act0, act;
        float *ref = grads_with(0, shard, bf16, 2, &n0, &act0);
        REQUIRE(ref, "the reference run failed");
        for (int every = 1; every <= 3; every++) {
            float *g = grads_with(every, shard, bf16, 2, &n, &act);
            REQUIRE(g, "recompute every %d failed", every);
            CHECK(n == n0 && memcmp(g, ref, n * sizeof *g) == 0,
                  "%s shard, %s, recompute every %d: the gradients differ from keeping "
                  "everything",
                  fsdp_shard_name(shard), bf16 ? "bf16" : "fp32", every);
            /* two blocks: only "blocks" shares a slot between them */
            CHECK(every == 1 ? act < act0 : act == act0,
                  "recompute every %d keeps %zu activation bytes against %zu", every, act, act0);
            free(g);
        }
        free(ref);
    }
}

static void the_recompute_option_parses_and_names_itself(void)
{
    static const struct {
        const char *in;
        int every;
        const char *name;
    } ok[] = {{"none", 0, "none"},
              {"blocks", 1, "blocks"},
              {"every-1", 1, "blocks"},
              {"every-2", 2, "every-2"},
              {"every-256", 256, "every-256"}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int every = -1;
        char buf[32];
        CHECK(fsdp_recompute_parse(ok[i].in, &every) == 0 && every == ok[i].every, "%s", ok[i].in);
        CHECK(strcmp(fsdp_recompute_name(every, buf, sizeof buf), ok[i].name) == 0, "%s -> %s",
              ok[i].in, buf);
    }
    static const char *bad[] = {"",          "block",    "every-",   "every-0",
                                "every-257", "every-2x", "every--1", "Blocks"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int every = -1;
        CHECK(fsdp_recompute_parse(bad[i], &every) != 0, "'%s' was accepted", bad[i]);
    }
}

/* bf16 on one rank: every strategy reads the same rounded parameters, so
 * one micro-batch's gradients agree to the bit (with two, NONE adds the
 * second into the shard in another order, in fp32 too); and they are not
 * fp32's, only near them (the rounding really happens). Runs the engine's bf16 path on any CPU:
 * without bf16 hardware the products are widened to fp32 for OpenBLAS, same values. */
static void bf16_gives_the_same_gradients_for_every_strategy(void)
{
    size_t n0, n, act;
    float *full = grads_with(0, FSDP_SHARD_FULL, 1, 1, &n0, &act);
    float *fp32 = grads_with(0, FSDP_SHARD_FULL, 0, 1, &n, &act);
    REQUIRE(full && fp32, "a run failed");
    CHECK(memcmp(full, fp32, n * sizeof *full) != 0, "bf16 gave fp32's gradients exactly");
    double d2 = 0, f2 = 0;
    for (size_t i = 0; i < n; i++) {
        d2 += (full[i] - fp32[i]) * (double)(full[i] - fp32[i]);
        f2 += fp32[i] * (double)fp32[i];
    }
    CHECK(sqrt(d2 / f2) < 0.05, "bf16 gradients stray %.3g from fp32's (relative norm)",
          sqrt(d2 / f2));
    if (getenv("GRADCHECK_VERBOSE"))
        printf("  bf16 gradients against fp32: relative norm of the difference %.3g\n",
               sqrt(d2 / f2));
    const enum fsdp_shard others[] = {FSDP_SHARD_GRAD_OP, FSDP_SHARD_NONE};
    for (int i = 0; i < 2; i++) {
        float *g = grads_with(0, others[i], 1, 1, &n, &act);
        REQUIRE(g, "a run failed");
        size_t first = 0;
        while (first < n && g[first] == full[first])
            first++;
        CHECK(n == n0 && first == n, "bf16 %s gradients differ from full's at %zu of %zu (%g, %g)",
              fsdp_shard_name(others[i]), first, n, first < n ? g[first] : 0.0,
              first < n ? full[first] : 0.0);
        free(g);
    }
    free(full);
    free(fp32);
}

/* ---- the check must catch wrong kernels ---------------------------------- */

/* GELU's derivative without the x * sech^2 term. */
static void gelu_backward_wrong(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
        dinp[i] = 0.5f * (1.0f + th) * dout[i];
    }
}

/* LayerNorm backward that forgets the mean-of-dnorm correction. */
static void layernorm_backward_wrong(float *dinp, float *dw, float *db, const float *dout,
                                     const float *inp, const float *w, const float *mean,
                                     const float *rstd, size_t N, int C)
{
    for (size_t i = 0; i < N; i++) {
        for (int c = 0; c < C; c++) {
            float norm = (inp[i * C + c] - mean[i]) * rstd[i];
            dinp[i * C + c] += w[c] * dout[i * C + c] * rstd[i];
            dw[c] += norm * dout[i * C + c];
            db[c] += dout[i * C + c];
        }
    }
}

static double worst_with(struct fsdp_kernels *k)
{
    struct model_layout m;
    char err[FSDP_ERR_LEN];
    model_layout_init(&m, cfg, err);
    double *rel = calloc((size_t)m.ntensors, sizeof *rel);
    double worst = gradcheck(k, FSDP_SHARD_FULL, rel);
    free(rel);
    model_layout_free(&m);
    return worst;
}

static void gradcheck_catches_a_wrong_gelu_backward(void)
{
    const struct fsdp_kernels *real = fsdp_kernels_cpu();
    struct fsdp_kernels k = *real;
    k.gelu_backward = gelu_backward_wrong;
    double worst = worst_with(&k);
    if (getenv("GRADCHECK_VERBOSE"))
        printf("  worst relative error with the wrong kernel: %.3g\n", worst);
    CHECK(worst > 10 * TOL, "worst relative error %.3g should exceed %g", worst, 10 * TOL);
}

static void gradcheck_catches_a_wrong_layernorm_backward(void)
{
    const struct fsdp_kernels *real = fsdp_kernels_cpu();
    struct fsdp_kernels k = *real;
    k.layernorm_backward = layernorm_backward_wrong;
    double worst = worst_with(&k);
    if (getenv("GRADCHECK_VERBOSE"))
        printf("  worst relative error with the wrong kernel: %.3g\n", worst);
    CHECK(worst > 10 * TOL, "worst relative error %.3g should exceed %g", worst, 10 * TOL);
}

/* --reduce-dtype bf16 on one rank: the reduce-scatter is a copy, so the
 * gradient shard after one micro-batch is exactly the fp32 gradient rounded
 * to bf16 (to nearest even), for the strategies that reduce-scatter; none
 * has nothing to reduce on one rank and keeps fp32. */
static void bf16_reduction_rounds_the_gradient_and_nothing_else(void)
{
    for (int s = 0; s < 3; s++) {
        enum fsdp_shard shard = s == 0   ? FSDP_SHARD_FULL
                                : s == 1 ? FSDP_SHARD_GRAD_OP
                                         : FSDP_SHARD_NONE;
        size_t n, n2, act;
        struct rig_opts ro = {.reduce_bf16 = 0};
        float *g32 = grads_of(shard, &ro, 1, &n, &act);
        ro.reduce_bf16 = 1;
        float *g16 = grads_of(shard, &ro, 1, &n2, &act);
        REQUIRE(g32 && g16 && n == n2, "a step failed");
        size_t differ = 0, changed = 0;
        for (size_t i = 0; i < n; i++) {
            float want =
                shard == FSDP_SHARD_NONE ? g32[i] : fsdp_bf16_widen(fsdp_bf16_round(g32[i]));
            differ += memcmp(&want, &g16[i], sizeof want) != 0;
            changed += g32[i] != g16[i];
        }
        CHECK(differ == 0, "%s: %zu of %zu gradient elements are not the rounded fp32 ones",
              fsdp_shard_name(shard), differ, n);
        CHECK(shard == FSDP_SHARD_NONE || changed > n / 2,
              "%s: only %zu of %zu elements changed: was anything rounded?", fsdp_shard_name(shard),
              changed, n);
        free(g32);
        free(g16);
    }
}

/* fp16 (fsdp_opts): the kernels see the parameters rounded to fp16 and
 * the gradient leaves as fp16 values, nothing else changes: against an
 * fp32 engine whose parameters are those rounded values, the same loss
 * bits and the fp32 gradient rounded to fp16, on every strategy (none with
 * two micro-batches: its accumulated gradient is rounded once). */
static void fp16_rounds_the_parameters_and_the_gradient_and_nothing_else(void)
{
    for (int s = 0; s < 3; s++) {
        enum fsdp_shard shard = s == 0   ? FSDP_SHARD_FULL
                                : s == 1 ? FSDP_SHARD_GRAD_OP
                                         : FSDP_SHARD_NONE;
        const int micro = shard == FSDP_SHARD_NONE ? 2 : 1;
        size_t n, n2, act;
        struct rig_opts ro = {.round_params = 1};
        float *g32 = grads_of(shard, &ro, micro, &n, &act);
        ro = (struct rig_opts){.fp16 = 1};
        float *g16 = grads_of(shard, &ro, micro, &n2, &act);
        REQUIRE(g32 && g16 && n == n2, "a step failed");
        size_t differ = 0, changed = 0;
        float *want = malloc(n * sizeof *want);
        memcpy(want, g32, n * sizeof *want);
        fsdp_kernels_cpu()->round_fp16(want, n);
        for (size_t i = 0; i < n; i++) {
            differ += memcmp(&want[i], &g16[i], sizeof *want) != 0;
            changed += g32[i] != g16[i];
        }
        CHECK(differ == 0, "%s: %zu of %zu gradient elements are not the rounded fp32 ones",
              fsdp_shard_name(shard), differ, n);
        CHECK(changed > n / 2, "%s: only %zu of %zu elements changed: was anything rounded?",
              fsdp_shard_name(shard), changed, n);
        free(want);
        free(g32);
        free(g16);
    }
}

/* --unit-blocks changes which buffers a block is gathered into and how many
 * collectives move it, never the gradient: the same bits, with and without
 * bf16 reduction and recompute. */
static void unit_groups_give_the_same_gradient_bits(void)
{
    for (int s = 0; s < 2; s++)
        for (int variant = 0; variant < 2; variant++) {
            enum fsdp_shard shard = s == 0 ? FSDP_SHARD_FULL : FSDP_SHARD_GRAD_OP;
            size_t n, n2, act;
            struct rig_opts ro = {.recompute_every = variant,
                                  .bf16 = variant,
                                  .reduce_bf16 = variant,
                                  .unit_blocks = 1};
            float *one = grads_of(shard, &ro, 1, &n, &act);
            ro.unit_blocks = 2;
            float *two = grads_of(shard, &ro, 1, &n2, &act);
            REQUIRE(one && two && n == n2, "a step failed");
            CHECK(memcmp(one, two, n * sizeof *one) == 0,
                  "%s%s: 2 blocks per unit changed the gradients", fsdp_shard_name(shard),
                  variant ? ", bf16 gathers and reduction, recompute" : "");
            free(one);
            free(two);
        }
}

/* ---- the llama family -------------------------------------------------------- */

/* SwiGLU's backward that forgets the gate's own derivative (d silu = s, not
 * s (1 + g (1 - s))). */
static void swiglu_backward_wrong(float *dinp, const float *inp, const float *dout, size_t N, int F)
{
    for (size_t i = 0; i < N; i++)
        for (int j = 0; j < F; j++) {
            const float g = inp[i * 2 * F + j], u = inp[i * 2 * F + F + j];
            const float s = 1.0f / (1.0f + expf(-g));
            dinp[i * 2 * F + F + j] = dout[i * F + j] * g * s;
            dinp[i * 2 * F + j] = dout[i * F + j] * u * s;
        }
}

/* RMSNorm's backward as if rstd did not depend on the input. */
static void rmsnorm_backward_wrong(float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, const float *rstd, size_t N, int C)
{
    for (size_t i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            dinp[i * C + c] += w[c] * dout[i * C + c] * rstd[i];
            dw[c] += inp[i * C + c] * rstd[i] * dout[i * C + c];
        }
}

/* RoPE whose backward turns the same way as the forward (not back). */
static void (*rope_real)(float *, const float *, const float *, int, int, int, int, int, int);
static void rope_backward_wrong(float *x, const float *cos, const float *sin, int B, int T,
                                int NROT, int HS, int stride, int inverse)
{
    (void)inverse;
    rope_real(x, cos, sin, B, T, NROT, HS, stride, 0);
}

static void llama_gradients_match_finite_differences(void)
{
    const struct model_config *configs[] = {&llama, &llama_tied_bias};
    for (int i = 0; i < 2; i++) {
        cfg = configs[i];
        check_all_tensors(FSDP_SHARD_FULL);
        check_all_tensors(FSDP_SHARD_NONE);
    }
    cfg = &gpt2;
}

/* Recompute, bf16 on every strategy, bf16 reduction and unit groups: the
 * engine's promises hold for llama's passes as for GPT-2's. */
static void llama_keeps_the_engines_equivalences(void)
{
    const struct model_config *configs[] = {&llama, &llama_tied_bias};
    for (int i = 0; i < 2; i++) {
        cfg = configs[i];
        recomputing_blocks_gives_the_same_gradient_bits();
        bf16_gives_the_same_gradients_for_every_strategy();
        bf16_reduction_rounds_the_gradient_and_nothing_else();
        fp16_rounds_the_parameters_and_the_gradient_and_nothing_else();
        unit_groups_give_the_same_gradient_bits();
    }
    cfg = &gpt2;
}

static void llama_gradcheck_catches_wrong_kernels(void)
{
    const struct fsdp_kernels *real = fsdp_kernels_cpu();
    cfg = &llama;
    for (int which = 0; which < 3; which++) {
        struct fsdp_kernels k = *real;
        const char *name = which == 0 ? "swiglu" : which == 1 ? "rmsnorm" : "rope";
        if (which == 0)
            k.swiglu_backward = swiglu_backward_wrong;
        else if (which == 1)
            k.rmsnorm_backward = rmsnorm_backward_wrong;
        rope_real = real->rope;
        if (which == 2)
            k.rope = rope_backward_wrong; /* the forward's calls pass inverse 0: unchanged */
        double worst = worst_with(&k);
        if (getenv("GRADCHECK_VERBOSE"))
            printf("  llama, wrong %s backward: worst relative error %.3g\n", name, worst);
        CHECK(worst > 10 * TOL, "a wrong %s backward: worst relative error %.3g should exceed %g",
              name, worst, 10 * TOL);
    }
    cfg = &gpt2;
}

CHECK_MAIN(TEST(every_tensor_gradient_matches_finite_differences_full_shard),
           TEST(unit_groups_give_the_same_gradient_bits),
           TEST(bf16_reduction_rounds_the_gradient_and_nothing_else),
           TEST(recomputing_blocks_gives_the_same_gradient_bits),
           TEST(bf16_gives_the_same_gradients_for_every_strategy),
           TEST(the_recompute_option_parses_and_names_itself),
           TEST(every_tensor_gradient_matches_finite_differences_no_shard),
           TEST(gradcheck_catches_a_wrong_gelu_backward),
           TEST(gradcheck_catches_a_wrong_layernorm_backward),
           TEST(llama_gradients_match_finite_differences),
           TEST(llama_keeps_the_engines_equivalences), TEST(llama_gradcheck_catches_wrong_kernels))
