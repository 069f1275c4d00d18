/*
 * test_llama_kernels.c - the Llama family's CPU kernels (RMSNorm, RoPE,
 * SwiGLU, grouped-query attention) against naive double-precision
 * references written from their definitions, on every instruction set this
 * CPU runs: the forward to float32 rounding, the bf16 forms bit for bit what
 * rounding the fp32 output gives, and every backward against central finite
 * differences of a scalar loss L = sum(out * r) through the kernel's own
 * forward (r random, so no gradient is special).
 *
 * Tolerances: forwards 1e-5 of the largest value (float32 accumulation over
 * at most 64 terms); backwards 2e-3 in norm against differences of step
 * 1e-2 in float32 (the truncation and rounding error of the difference is
 * about 1e-4 here; a wrong term of a derivative is of order 1e-1).
 */
#include "check.h"
#include "numeric.h"

#include "kernels.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FWD_TOL 1e-5
#define BWD_TOL 2e-3
#define STEP    1e-2f

/* sum(out * r) */
static double dot(const float *out, const float *r, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * r[i];
    return s;
}

/* The numeric gradient of f (a loss of x's n values) into g. */
static void numeric_grad(float *g, float *x, size_t n, double (*f)(void *), void *ctx)
{
    for (size_t i = 0; i < n; i++) {
        const float saved = x[i];
        x[i] = saved + STEP;
        const double lp = f(ctx);
        x[i] = saved - STEP;
        const double lm = f(ctx);
        x[i] = saved;
        g[i] = (float)((lp - lm) / (2.0 * (double)STEP));
    }
}

static int bits_equal_rounded(const uint16_t *got16, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got16[i] != fsdp_bf16_round(want[i]))
            return 0;
    return 1;
}

static const struct fsdp_kernels *K;
static const char *isa;

/* ---- RMSNorm ---------------------------------------------------------------- */

enum { RN = 6, RC = 40 };
struct rms {
    float *x, *w, *r, *out, *rstd;
};

static double rms_loss(void *p)
{
    struct rms *s = p;
    K->rmsnorm_forward(s->out, s->rstd, s->x, s->w, RN, RC, 1e-5f);
    return dot(s->out, s->r, (size_t)RN * RC);
}

static void rmsnorm(void)
{
    struct rms s = {randv(RN * RC, 1, 1.5f), randv(RC, 2, 0.5f), randv(RN * RC, 3, 1.0f),
                    calloc(RN * RC, sizeof(float)), calloc(RN, sizeof(float))};
    float *want = calloc(RN * RC, sizeof(float)), *rstd = calloc(RN, sizeof(float));
    uint16_t *out16 = calloc(RN * RC, sizeof *out16);
    for (int c = 0; c < RC; c++)
        s.w[c] += 1.0f;
    for (int i = 0; i < RN; i++) {
        double ss = 0;
        for (int c = 0; c < RC; c++)
            ss += (double)s.x[i * RC + c] * s.x[i * RC + c];
        const double rs = 1.0 / sqrt(ss / RC + 1e-5);
        rstd[i] = (float)rs;
        for (int c = 0; c < RC; c++)
            want[i * RC + c] = (float)(s.x[i * RC + c] * rs * s.w[c]);
    }
    rms_loss(&s);
    CHECK(rel_err(s.out, want, RN * RC) < FWD_TOL && rel_err(s.rstd, rstd, RN) < FWD_TOL,
          "%s: RMSNorm forward off the reference by %.3g", isa, rel_err(s.out, want, RN * RC));
    float *rstd16 = calloc(RN, sizeof(float));
    K->rmsnorm_forward_bf16(out16, rstd16, s.x, s.w, RN, RC, 1e-5f);
    CHECK(bits_equal_rounded(out16, s.out, RN * RC) && !memcmp(rstd16, s.rstd, RN * sizeof(float)),
          "%s: the bf16 RMSNorm is not the fp32 one rounded", isa);
    /* backward: dinp accumulates (start it at a known value), dw too */
    float *dx = calloc(RN * RC, sizeof(float)), *dw = calloc(RC, sizeof(float));
    float *ndx = calloc(RN * RC, sizeof(float)), *ndw = calloc(RC, sizeof(float));
    for (int i = 0; i < RN * RC; i++)
        dx[i] = 0.25f;
    rms_loss(&s);
    K->rmsnorm_backward(dx, dw, s.r, s.x, s.w, s.rstd, RN, RC);
    for (int i = 0; i < RN * RC; i++)
        dx[i] -= 0.25f;
    numeric_grad(ndx, s.x, RN * RC, rms_loss, &s);
    numeric_grad(ndw, s.w, RC, rms_loss, &s);
    CHECK(norm_rel_err(dx, ndx, RN * RC) < BWD_TOL, "%s: RMSNorm dinp off by %.3g", isa,
          norm_rel_err(dx, ndx, RN * RC));
    CHECK(norm_rel_err(dw, ndw, RC) < BWD_TOL, "%s: RMSNorm dw off by %.3g", isa,
          norm_rel_err(dw, ndw, RC));
    free(s.x), free(s.w), free(s.r), free(s.out), free(s.rstd), free(want), free(rstd);
    free(out16), free(rstd16), free(dx), free(dw), free(ndx), free(ndw);
}

/* ---- RoPE --------------------------------------------------------------------- */

enum { PB = 2, PT = 5, PH = 3, PHS = 8, PSTRIDE = 32 }; /* 3 heads rotated of a 32-wide row */
struct rope {
    float *x, *r, *cs, *sn, *work;
};

static double rope_loss(void *p)
{
    struct rope *s = p;
    memcpy(s->work, s->x, (size_t)PB * PT * PSTRIDE * sizeof(float));
    K->rope(s->work, s->cs, s->sn, PB, PT, PH, PHS, PSTRIDE, 0);
    return dot(s->work, s->r, (size_t)PB * PT * PSTRIDE);
}

static void rope(void)
{
    const size_t n = (size_t)PB * PT * PSTRIDE;
    struct rope s = {randv(n, 4, 1.0f), randv(n, 5, 1.0f), calloc(PT * PHS / 2, sizeof(float)),
                     calloc(PT * PHS / 2, sizeof(float)), calloc(n, sizeof(float))};
    float *want = calloc(n, sizeof(float));
    for (int t = 0; t < PT; t++)
        for (int i = 0; i < PHS / 2; i++) {
            const double a = t * pow(10000.0, -2.0 * i / PHS);
            s.cs[t * PHS / 2 + i] = (float)cos(a);
            s.sn[t * PHS / 2 + i] = (float)sin(a);
        }
    /* Hugging Face's rotate_half: out = x cos + [-x2, x1] sin, per head */
    for (int b = 0; b < PB; b++)
        for (int t = 0; t < PT; t++)
            for (int c = 0; c < PSTRIDE; c++) {
                const size_t row = ((size_t)b * PT + t) * PSTRIDE;
                const int h = c / PHS, i = c % PHS, half = PHS / 2;
                if (h >= PH) {
                    want[row + c] = s.x[row + c];
                    continue;
                }
                const int j = i % half;
                const double cs = cos(t * pow(10000.0, -2.0 * j / PHS)),
                             sn = sin(t * pow(10000.0, -2.0 * j / PHS));
                const double x1 = s.x[row + h * PHS + j], x2 = s.x[row + h * PHS + j + half];
                want[row + c] = (float)(i < half ? x1 * cs - x2 * sn : x2 * cs + x1 * sn);
            }
    rope_loss(&s);
    CHECK(rel_err(s.work, want, n) < FWD_TOL, "%s: RoPE off the reference by %.3g", isa,
          rel_err(s.work, want, n));
    K->rope(s.work, s.cs, s.sn, PB, PT, PH, PHS, PSTRIDE, 1);
    CHECK(rel_err(s.work, s.x, n) < FWD_TOL, "%s: RoPE's inverse does not turn back (%.3g)", isa,
          rel_err(s.work, s.x, n));
    /* the backward is the inverse applied to the output's gradient */
    float *g = malloc(n * sizeof *g), *ng = calloc(n, sizeof(float));
    memcpy(g, s.r, n * sizeof *g);
    K->rope(g, s.cs, s.sn, PB, PT, PH, PHS, PSTRIDE, 1);
    numeric_grad(ng, s.x, n, rope_loss, &s);
    CHECK(norm_rel_err(g, ng, n) < BWD_TOL, "%s: RoPE's backward off by %.3g", isa,
          norm_rel_err(g, ng, n));
    free(s.x), free(s.r), free(s.cs), free(s.sn), free(s.work), free(want), free(g), free(ng);
}

/* ---- SwiGLU ------------------------------------------------------------------- */

enum { SN = 5, SF = 24 };
struct swiglu {
    float *x, *r, *out;
};

static double swiglu_loss(void *p)
{
    struct swiglu *s = p;
    K->swiglu_forward(s->out, s->x, SN, SF);
    return dot(s->out, s->r, (size_t)SN * SF);
}

static void swiglu(void)
{
    struct swiglu s = {randv(SN * 2 * SF, 6, 2.0f), randv(SN * SF, 7, 1.0f),
                       calloc(SN * SF, sizeof(float))};
    float *want = calloc(SN * SF, sizeof(float));
    uint16_t *out16 = calloc(SN * SF, sizeof *out16);
    for (int i = 0; i < SN; i++)
        for (int j = 0; j < SF; j++) {
            const double g = s.x[i * 2 * SF + j], u = s.x[i * 2 * SF + SF + j];
            want[i * SF + j] = (float)(g / (1.0 + exp(-g)) * u);
        }
    swiglu_loss(&s);
    CHECK(rel_err(s.out, want, SN * SF) < FWD_TOL, "%s: SwiGLU off the reference by %.3g", isa,
          rel_err(s.out, want, SN * SF));
    K->swiglu_forward_bf16(out16, s.x, SN, SF);
    CHECK(bits_equal_rounded(out16, s.out, SN * SF),
          "%s: the bf16 SwiGLU is not the fp32 one rounded", isa);
    float *g = calloc(SN * 2 * SF, sizeof(float)), *ng = calloc(SN * 2 * SF, sizeof(float));
    K->swiglu_backward(g, s.x, s.r, SN, SF);
    numeric_grad(ng, s.x, SN * 2 * SF, swiglu_loss, &s);
    CHECK(norm_rel_err(g, ng, SN * 2 * SF) < BWD_TOL, "%s: SwiGLU's backward off by %.3g", isa,
          norm_rel_err(g, ng, SN * 2 * SF));
    uint16_t *g16 = calloc(SN * 2 * SF, sizeof *g16);
    K->swiglu_backward_bf16(g16, s.x, s.r, SN, SF);
    CHECK(bits_equal_rounded(g16, g, SN * 2 * SF),
          "%s: the bf16 SwiGLU backward is not the fp32 one rounded", isa);
    free(s.x), free(s.r), free(s.out), free(want), free(out16), free(g), free(ng), free(g16);
}

/* ---- grouped-query attention ---------------------------------------------------- */

enum { AB = 2, AT = 6, AHS = 4 };
struct attn {
    int NH, KVH;
    float *qkv, *r, *out, *att;
};

static size_t attn_row(const struct attn *s) { return (size_t)(s->NH + 2 * s->KVH) * AHS; }

static double attn_loss(void *p)
{
    struct attn *s = p;
    K->attention_forward(s->out, s->att, s->qkv, AB, AT, s->NH, s->KVH, AHS);
    return dot(s->out, s->r, (size_t)AB * AT * s->NH * AHS);
}

/* Query head h reads K/V head h / (NH / KVH), causal, scaled by 1/sqrt(HS). */
static void attn_reference(const struct attn *s, float *want)
{
    const size_t S = attn_row(s);
    const int grp = s->NH / s->KVH;
    for (int b = 0; b < AB; b++)
        for (int h = 0; h < s->NH; h++)
            for (int t = 0; t < AT; t++) {
                const float *q = s->qkv + ((size_t)b * AT + t) * S + (size_t)h * AHS;
                double w[AT], m = -INFINITY, z = 0;
                for (int u = 0; u <= t; u++) {
                    const float *k =
                        s->qkv + ((size_t)b * AT + u) * S + (size_t)(s->NH + h / grp) * AHS;
                    double d = 0;
                    for (int c = 0; c < AHS; c++)
                        d += (double)q[c] * k[c];
                    w[u] = d / sqrt((double)AHS);
                    m = w[u] > m ? w[u] : m;
                }
                for (int u = 0; u <= t; u++)
                    z += (w[u] = exp(w[u] - m));
                for (int c = 0; c < AHS; c++) {
                    double o = 0;
                    for (int u = 0; u <= t; u++)
                        o += w[u] / z *
                             s->qkv[((size_t)b * AT + u) * S +
                                    (size_t)(s->NH + s->KVH + h / grp) * AHS + (size_t)c];
                    want[((size_t)b * AT + t) * s->NH * AHS + (size_t)h * AHS + (size_t)c] =
                        (float)o;
                }
            }
}

static void attention_one(int NH, int KVH)
{
    struct attn s = {NH, KVH, NULL, NULL, NULL, NULL};
    const size_t nq = (size_t)AB * AT * attn_row(&s), no = (size_t)AB * AT * NH * AHS;
    s.qkv = randv(nq, 8 + (uint64_t)KVH, 1.0f);
    s.r = randv(no, 9, 1.0f);
    s.out = calloc(no, sizeof(float));
    s.att = calloc((size_t)AB * NH * AT * AT, sizeof(float));
    float *want = calloc(no, sizeof(float));
    attn_reference(&s, want);
    attn_loss(&s);
    CHECK(rel_err(s.out, want, no) < FWD_TOL,
          "%s: attention NH %d KVH %d off the reference by %.3g", isa, NH, KVH,
          rel_err(s.out, want, no));
    float *g = calloc(nq, sizeof(float)), *ng = calloc(nq, sizeof(float));
    float *datt = calloc((size_t)AB * NH * AT * AT, sizeof(float));
    for (size_t i = 0; i < nq; i++)
        g[i] = 7.0f; /* overwritten, not accumulated */
    K->attention_backward(g, datt, s.r, s.qkv, s.att, AB, AT, NH, KVH, AHS);
    numeric_grad(ng, s.qkv, nq, attn_loss, &s);
    CHECK(norm_rel_err(g, ng, nq) < BWD_TOL, "%s: attention NH %d KVH %d backward off by %.3g", isa,
          NH, KVH, norm_rel_err(g, ng, nq));
    free(s.qkv), free(s.r), free(s.out), free(s.att), free(want), free(g), free(ng), free(datt);
}

/* Past one block of rows (64) the kernels skip the masked upper triangle
 * of the stored softmax and its gradient: entries there hold whatever the
 * buffer held (NaN here) and must change no output. */
static void attention_long(void)
{
    enum { LB = 2, LT = 150, LNH = 4, LKVH = 2, LHS = 8 };
    const size_t S = (size_t)(LNH + 2 * LKVH) * LHS, nq = (size_t)LB * LT * S;
    const size_t no = (size_t)LB * LT * LNH * LHS, na = (size_t)LB * LNH * LT * LT;
    float *qkv = randv(nq, 91, 1.0f), *dout = randv(no, 92, 1.0f);
    float *out[2], *dq[2];
    for (int run = 0; run < 2; run++) {
        float *att = malloc(na * sizeof *att), *datt = malloc(na * sizeof *datt);
        for (size_t i = 0; i < na; i++)
            att[i] = datt[i] = run ? NAN : 0.0f;
        out[run] = calloc(no, sizeof(float));
        dq[run] = calloc(nq, sizeof(float));
        K->attention_forward(out[run], att, qkv, LB, LT, LNH, LKVH, LHS);
        K->attention_backward(dq[run], datt, dout, qkv, att, LB, LT, LNH, LKVH, LHS);
        free(att), free(datt);
    }
    CHECK(!memcmp(out[0], out[1], no * sizeof(float)) && !memcmp(dq[0], dq[1], nq * sizeof(float)),
          "%s: the attention at T %d read a masked entry of its softmax buffers", isa, LT);
    int finite = 1;
    for (size_t i = 0; i < nq; i++)
        finite &= isfinite(dq[1][i]);
    CHECK(finite, "%s: the attention's backward at T %d is not finite", isa, LT);
    free(qkv), free(dout), free(out[0]), free(out[1]), free(dq[0]), free(dq[1]);
}

static void attention(void)
{
    attention_one(4, 4); /* multi-head */
    attention_one(4, 2); /* grouped */
    attention_one(6, 1); /* multi-query */
    attention_long();
}

static void on_every_isa(void (*body)(void))
{
    static const char *const isas[] = {"x86-64", "x86-64-v3", "x86-64-v4"};
    char err[256];
    int ran = 0;
    for (int i = 0; i < 3; i++) {
        if (fsdp_kernels_cpu_select(isas[i], err, sizeof err))
            continue; /* this CPU does not run it */
        K = fsdp_kernels_cpu();
        isa = isas[i];
        body();
        ran++;
    }
    CHECK(ran > 0, "no instruction set ran");
    fsdp_kernels_cpu_select("auto", err, sizeof err);
}

static void rmsnorm_matches_its_definition(void) { on_every_isa(rmsnorm); }
static void rope_matches_hugging_faces_rotate_half(void) { on_every_isa(rope); }
static void swiglu_matches_its_definition(void) { on_every_isa(swiglu); }
static void grouped_query_attention_matches_its_definition(void) { on_every_isa(attention); }

CHECK_MAIN(TEST(rmsnorm_matches_its_definition), TEST(rope_matches_hugging_faces_rotate_half),
           TEST(swiglu_matches_its_definition),
           TEST(grouped_query_attention_matches_its_definition))
