/*
 * test_forward.c - the engine's forward pass against a reference GPT-2
 * forward written here from the model's definition: naive loops in double
 * precision, attention computed head by head with an explicit causal mask.
 * Logits and the mean loss must agree within 1e-4 (relative to the logits'
 * scale). The gradient check proves backward matches forward; this proves
 * forward is the model it claims to be.
 */
#include "check.h"

#include "comm.h"
#include "cpu/gemm.h"
#include "fsdp.h"
#include "kernels.h"
#include "model.h"
#include "numeric.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 7 };
static const struct model_config cfg = {
    .layers = 2, .dim = 12, .heads = 3, .seq = T, .vocab = 20, .vocab_pad = 24};

struct ref {
    const struct model_layout *m;
    const float *params; /* unit shards back to back as the engine lays them out */
    const struct fsdp_engine *e;
};

static const float *P(const struct ref *r, const char *name)
{
    for (int i = 0; i < r->m->ntensors; i++) {
        const struct model_tensor *t = &r->m->tensors[i];
        if (strcmp(t->name, name) == 0)
            return r->params + r->e->units[t->unit].shard_off + t->offset;
    }
    return NULL;
}

static void ref_layernorm(double *out, const double *x, const float *w, const float *b, int C)
{
    double mean = 0, var = 0;
    for (int c = 0; c < C; c++)
        mean += x[c];
    mean /= C;
    for (int c = 0; c < C; c++)
        var += (x[c] - mean) * (x[c] - mean);
    var /= C;
    for (int c = 0; c < C; c++)
        out[c] = (x[c] - mean) / sqrt(var + 1e-5) * w[c] + b[c];
}

/* y[o] = sum_i x[i] W[o][i] + b[o] */
static void ref_linear(double *y, const double *x, const float *W, const float *b, int in, int out)
{
    for (int o = 0; o < out; o++) {
        double s = b ? b[o] : 0;
        for (int i = 0; i < in; i++)
            s += x[i] * W[(size_t)o * in + i];
        y[o] = s;
    }
}

static double gelu(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* logits (B,T,V) of the reference model */
static void ref_forward(const struct ref *r, const int32_t *tok, double *logits)
{
    const int C = cfg.dim, NH = cfg.heads, hs = C / NH, L = cfg.layers, V = cfg.vocab;
    double *x = calloc((size_t)T * C, sizeof *x), *h = calloc((size_t)T * 4 * C, sizeof *h);
    double *qkv = calloc((size_t)T * 3 * C, sizeof *qkv), *y = calloc((size_t)T * C, sizeof *y);
    double *tmp = calloc((size_t)4 * C, sizeof *tmp), *ln = calloc((size_t)C, sizeof *ln);
    char name[64];
    const float *wte = P(r, "wte.weight"), *wpe = P(r, "wpe.weight");
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                x[t * C + c] = wte[(size_t)tok[b * T + t] * C + c] + wpe[t * C + c];
        for (int l = 0; l < L; l++) {
#define W(s) (snprintf(name, sizeof name, "h.%d.%s", l, s), P(r, name))
            for (int t = 0; t < T; t++) {
                ref_layernorm(ln, x + t * C, W("ln_1.weight"), W("ln_1.bias"), C);
                ref_linear(qkv + t * 3 * C, ln, W("attn.c_attn.weight"), W("attn.c_attn.bias"), C,
                           3 * C);
            }
            for (int hd = 0; hd < NH; hd++) {
                for (int t = 0; t < T; t++) {
                    double w[T], mx = -1e300, sum = 0;
                    for (int s = 0; s <= t; s++) { /* causal: keys up to t */
                        double d = 0;
                        for (int i = 0; i < hs; i++)
                            d += qkv[t * 3 * C + hd * hs + i] * qkv[s * 3 * C + C + hd * hs + i];
                        w[s] = d / sqrt((double)hs);
                        mx = w[s] > mx ? w[s] : mx;
                    }
                    for (int s = 0; s <= t; s++)
                        sum += (w[s] = exp(w[s] - mx));
                    for (int i = 0; i < hs; i++) {
                        double o = 0;
                        for (int s = 0; s <= t; s++)
                            o += w[s] / sum * qkv[s * 3 * C + 2 * C + hd * hs + i];
                        y[t * C + hd * hs + i] = o;
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                ref_linear(tmp, y + t * C, W("attn.c_proj.weight"), W("attn.c_proj.bias"), C, C);
                for (int c = 0; c < C; c++)
                    x[t * C + c] += tmp[c];
                ref_layernorm(ln, x + t * C, W("ln_2.weight"), W("ln_2.bias"), C);
                ref_linear(h, ln, W("mlp.c_fc.weight"), W("mlp.c_fc.bias"), C, 4 * C);
                for (int i = 0; i < 4 * C; i++)
                    h[i] = gelu(h[i]);
                ref_linear(tmp, h, W("mlp.c_proj.weight"), W("mlp.c_proj.bias"), 4 * C, C);
                for (int c = 0; c < C; c++)
                    x[t * C + c] += tmp[c];
            }
#undef W
        }
        for (int t = 0; t < T; t++) {
            ref_layernorm(ln, x + t * C, P(r, "ln_f.weight"), P(r, "ln_f.bias"), C);
            ref_linear(logits + ((size_t)b * T + t) * V, ln, wte, NULL, C, V); /* tied head */
        }
    }
    free(x), free(h), free(qkv), free(y), free(tmp), free(ln);
}

static void forward_matches_reference_gpt2(void)
{
    char err[FSDP_ERR_LEN];
    struct model_layout m;
    struct fsdp_comm comm;
    struct fsdp_engine e;
    REQUIRE(model_layout_init(&m, &cfg, err) == 0, "%s", err);
    fsdp_comm_local_init(&comm);
    const struct fsdp_opts fo = {FSDP_SHARD_FULL, B, 0, 0, 0, 0, 0, 0, 0};
    REQUIRE(fsdp_init(&e, &m, fsdp_kernels_cpu(), &comm, &fo, err) == 0, "%s", err);
    for (int ti = 0; ti < m.ntensors; ti++) {
        const struct model_tensor *t = &m.tensors[ti];
        float *p = e.params + e.units[t->unit].shard_off + t->offset;
        for (size_t i = 0; i < t->numel; i++)
            p[i] = t->init_value + 0.4f * fsdp_normal_at(77 + (uint64_t)ti, i);
    }
    fsdp_params_changed(&e);
    int32_t tok[B * T], tgt[B * T];
    struct fsdp_rng rng = {5};
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)fsdp_rng_below(&rng, (uint64_t)cfg.vocab);
        tgt[i] = (int32_t)fsdp_rng_below(&rng, (uint64_t)cfg.vocab);
    }
    fsdp_set_batch(&e, tok, NULL);
    REQUIRE(fsdp_forward(&e, B, T, NULL, err) == 0, "%s", err);
    struct ref r = {&m, e.params, &e};
    double *want = calloc((size_t)B * T * cfg.vocab, sizeof *want);
    ref_forward(&r, tok, want);
    double worst = 0, scale = 0, want_loss = 0;
    for (int i = 0; i < B * T; i++) {
        const float *got = e.a.logits + (size_t)i * cfg.vocab_pad;
        const double *w = want + (size_t)i * cfg.vocab;
        double mx = -1e300, sum = 0;
        for (int v = 0; v < cfg.vocab; v++) {
            worst = fmax(worst, fabs(got[v] - w[v]));
            scale = fmax(scale, fabs(w[v]));
            mx = fmax(mx, w[v]);
        }
        for (int v = 0; v < cfg.vocab; v++)
            sum += exp(w[v] - mx);
        want_loss += -(w[tgt[i]] - mx - log(sum)) / (B * T);
    }
    CHECK(scale > 0.1, "reference logits are degenerate (max |logit| %g)", scale);
    CHECK(worst <= 1e-4 * scale, "max |logit difference| %.3g exceeds 1e-4 x %.3g", worst, scale);
    fsdp_set_batch(&e, tok, tgt);
    double got_loss;
    REQUIRE(fsdp_forward(&e, B, T, &got_loss, err) == 0, "%s", err);
    got_loss /= B * T;
    CHECK(fabs(got_loss - want_loss) <= 1e-5 * want_loss, "loss %.8f, reference %.8f", got_loss,
          want_loss);
    free(want);
    fsdp_free(&e);
    model_layout_free(&m);
}

/* ---- bf16 ------------------------------------------------------------------ */

static float f32_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void bf16_rounds_to_nearest_even(void)
{
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1 */
        {0x3f808000u, 0x3f80}, /* 1 + 2^-8: a tie, to the even 1 */
        {0x3f818000u, 0x3f82}, /* 1 + 3 * 2^-8: a tie, to the even above */
        {0x3f808001u, 0x3f81}, /* just above the tie: up */
        {0x3f807fffu, 0x3f80}, /* just below: down */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7f800000u, 0x7f80}, /* inf */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to inf, as RNE must */
        {0x00000001u, 0x0000}, /* the smallest subnormal to zero */
        {0xbf80c000u, 0xbf81}, /* -(1 + 3 * 2^-9): past the tie, away from zero */
        {0x3fffffffu, 0x4000}, /* the carry runs into the exponent: 2 */
        {0xff7fffffu, 0xff80}, /* -FLT_MAX to -inf */
    };
    enum { N = sizeof cases / sizeof cases[0] };
    float in[N + 2];
    uint16_t out[N + 2];
    float back[N + 2];
    for (int i = 0; i < N; i++)
        in[i] = f32_bits(cases[i].in);
    in[N] = f32_bits(0x7fc00001u);     /* quiet NaN with payload */
    in[N + 1] = f32_bits(0x7f800001u); /* signalling NaN: must not become inf */
    k->to_bf16(out, in, N + 2);
    for (int i = 0; i < N; i++)
        CHECK(out[i] == cases[i].out, "%08x -> %04x, want %04x", cases[i].in, out[i], cases[i].out);
    /* the scalar helper (the MPI bf16 sum's rounding) is the kernel's, bit for bit */
    for (int i = 0; i < N + 2; i++) {
        uint32_t u;
        memcpy(&u, &in[i], sizeof u);
        CHECK(fsdp_bf16_round(in[i]) == out[i], "fsdp_bf16_round(%08x) = %04x, the kernel %04x", u,
              fsdp_bf16_round(in[i]), out[i]);
        uint32_t w = (uint32_t)out[i] << 16;
        CHECK(memcmp(&w, &(float){fsdp_bf16_widen(out[i])}, 4) == 0, "widening %04x", out[i]);
    }
    k->from_bf16(back, out, N + 2);
    CHECK(isnan(back[N]) && isnan(back[N + 1]), "NaN did not stay NaN: %04x %04x", out[N],
          out[N + 1]);
    CHECK(back[0] == 1.0f && back[6] == INFINITY, "widening is not exact");
}

/* fp16 (--precision fp16): every kernel table's to_fp16, from_fp16 and
 * round_fp16 give util.h's integer bits (what a compiler without
 * _Float16 runs): every half widened, and floats around every half's
 * rounding boundary (ties to even, 65504 / 65520, the subnormals, zero,
 * NaN, the infinities) plus a stride through all 2^32 bit patterns. */
static void fp16_kernels_are_the_integer_rounding_bit_for_bit(void)
{
    enum { N = 1 << 20 };
    float *in = malloc(N * sizeof *in), *back = malloc(N * sizeof *back);
    uint16_t *out = malloc(N * sizeof *out);
    size_t n = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) { /* each half's value and its neighbours */
        float x = fsdp_fp16_widen((uint16_t)h);
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        for (int d = -1; d <= 1; d++)
            in[n++] = f32_bits(u + (uint32_t)d);
        in[n++] = f32_bits(u + 0x1000u); /* the tie above (a normal half: 13 bits dropped) */
    }
    for (uint32_t u = 0; n < N; u += 5279u) /* a stride through every exponent */
        in[n++] = f32_bits(u * 977u);
    static const struct {
        float x;
        uint16_t want;
    } fixed[] = {{65504.0f, 0x7bff}, {65519.0f, 0x7bff}, {65520.0f, 0x7c00}, {-65520.0f, 0xfc00},
                 {1.0f, 0x3c00},     {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000}, {0x1.8p-25f, 0x0001},
                 {0x1p-14f, 0x0400}, {-0.0f, 0x8000},    {1e30f, 0x7c00}};
    int tables = 0;
    static const char *isa[] = {"x86-64", "x86-64-v3", "x86-64-v4", "native"};
    for (size_t t = 0; t < sizeof isa / sizeof isa[0]; t++) {
        char err[256];
        if (fsdp_kernels_cpu_select(isa[t], err, sizeof err))
            continue;
        const struct fsdp_kernels *k = fsdp_kernels_cpu();
        tables++;
        k->to_fp16(out, in, N);
        size_t bad = 0;
        for (size_t i = 0; i < N; i++)
            bad += out[i] != fsdp_fp16_round(in[i]) &&
                   !(isnan(in[i]) && (out[i] & 0x7fffu) > 0x7c00u); /* any NaN is a NaN */
        CHECK(bad == 0, "%s: to_fp16 differs from fsdp_fp16_round on %zu of %d values", isa[t], bad,
              N);
        for (uint32_t h = 0; h < 0x10000u; h++)
            out[h] = (uint16_t)h;
        k->from_fp16(back, out, 0x10000u);
        bad = 0;
        for (uint32_t h = 0; h < 0x10000u; h++) {
            float want = fsdp_fp16_widen((uint16_t)h);
            bad += isnan(want) ? !isnan(back[h]) : memcmp(&want, &back[h], sizeof want) != 0;
        }
        CHECK(bad == 0, "%s: from_fp16 differs from fsdp_fp16_widen on %zu halves", isa[t], bad);
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
            float x = fixed[i].x;
            k->round_fp16(&x, 1);
            CHECK(fsdp_fp16_round(fixed[i].x) == fixed[i].want &&
                      memcmp(&x, &(float){fsdp_fp16_widen(fixed[i].want)}, sizeof x) == 0,
                  "%s: %a rounds to %04x (round_fp16: %a), want %04x", isa[t], fixed[i].x,
                  fsdp_fp16_round(fixed[i].x), x, fixed[i].want);
        }
    }
    CHECK(tables > 0, "no kernel table ran");
    fsdp_kernels_cpu_select("auto", (char[256]){0}, 256);
    free(in), free(out), free(back);
}

/* A bf16 run's LayerNorm and GELU write the products' inputs rounded as
 * they go: the bits to_bf16 makes of the fp32 kernels' outputs, on every
 * kernel table this CPU runs (one fewer pass, nothing else changed); the
 * same for the gradient rounding that adds as it goes. */
static void fused_rounding_is_to_bf16_bit_for_bit(void)
{
    enum { N = 37, C = 200 }; /* rows not a multiple of the threads, C not of the vectors */
    float *x = randv((size_t)N * C, 11, 3.0f), *w = randv(C, 12, 1.0f), *b = randv(C, 13, 0.5f);
    float out[N * C], mean[N], rstd[N], mean16[N], rstd16[N];
    uint16_t want[N * C], got[N * C];
    static const char *isa[] = {"x86-64", "x86-64-v3", "x86-64-v4", "native"};
    int tables = 0;
    for (size_t t = 0; t < sizeof isa / sizeof isa[0]; t++) {
        char err[256];
        if (fsdp_kernels_cpu_select(isa[t], err, sizeof err))
            continue; /* not this CPU's, or not this build's (native: -Dnative=true) */
        const struct fsdp_kernels *k = fsdp_kernels_cpu();
        tables++;
        k->layernorm_forward(out, mean, rstd, x, w, b, N, C);
        k->to_bf16(want, out, (size_t)N * C);
        k->layernorm_forward_bf16(got, mean16, rstd16, x, w, b, N, C);
        CHECK(memcmp(got, want, sizeof got) == 0, "%s: layernorm_forward_bf16 is not to_bf16(out)",
              isa[t]);
        CHECK(memcmp(mean, mean16, sizeof mean) == 0 && memcmp(rstd, rstd16, sizeof rstd) == 0,
              "%s: layernorm_forward_bf16's statistics differ", isa[t]);
        k->gelu_forward(out, x, (size_t)N * C);
        k->to_bf16(want, out, (size_t)N * C);
        k->gelu_forward_bf16(got, x, (size_t)N * C);
        CHECK(memcmp(got, want, sizeof got) == 0, "%s: gelu_forward_bf16 is not to_bf16(out)",
              isa[t]);
        /* a one-rank bf16 gradient: dst += round(src) in one pass; ties,
         * infinities and a NaN among the values */
        float acc[N * C], acc2[N * C], wide[N * C];
        for (size_t i = 0; i < (size_t)N * C; i++)
            acc[i] = acc2[i] = out[i], wide[i] = x[i];
        const uint32_t odd[] = {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7fc00001u};
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
            memcpy(&wide[i * 7], &odd[i], sizeof(float));
        k->to_bf16(want, wide, (size_t)N * C);
        k->from_bf16(out, want, (size_t)N * C);
        k->add(acc, out, (size_t)N * C);
        k->add_bf16_rounded(acc2, wide, (size_t)N * C);
        CHECK(memcmp(acc, acc2, sizeof acc) == 0,
              "%s: add_bf16_rounded is not add(from_bf16(to_bf16(src)))", isa[t]);
    }
    char err[256];
    REQUIRE(fsdp_kernels_cpu_select("auto", err, sizeof err) == 0, "%s", err);
    CHECK(tables > 0, "no kernel table ran");
    printf("  %d kernel tables\n", tables);
    free(x), free(w), free(b);
}

/* The bf16 matmuls against fp32 ones on the bf16-rounded operands (the
 * same products, so only the accumulation order differs). */
static void bf16_matmuls_match_fp32_on_rounded_operands(void)
{
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    enum { N = 37, C = 48, OC = 40 };
    static float x[N * C], w[OC * C], b[OC], dy[N * OC], xr[N * C], wr[OC * C], dyr[N * OC];
    static float y16[N * OC], y32[N * OC], dx16[N * C], dx32[N * C], dw16[OC * C], dw32[OC * C],
        db16[OC], db32[OC];
    static uint16_t w16[OC * C], x16[N * C], tmp[N * OC];
    /* the backward adds into these: from zero on every run, not only the first */
    memset(dw16, 0, sizeof dw16), memset(dw32, 0, sizeof dw32);
    memset(db16, 0, sizeof db16), memset(db32, 0, sizeof db32);
    for (int i = 0; i < N * C; i++)
        x[i] = fsdp_normal_at(11, (uint64_t)i);
    for (int i = 0; i < OC * C; i++)
        w[i] = 0.1f * fsdp_normal_at(12, (uint64_t)i);
    for (int i = 0; i < OC; i++)
        b[i] = fsdp_normal_at(13, (uint64_t)i);
    for (int i = 0; i < N * OC; i++)
        dy[i] = fsdp_normal_at(14, (uint64_t)i);
    k->to_bf16(w16, w, OC * C);
    k->from_bf16(wr, w16, OC * C);
    k->to_bf16(x16, x, N * C); /* the engine rounds the products' inputs */
    k->from_bf16(xr, x16, N * C);
    k->to_bf16(tmp, dy, N * OC);
    k->from_bf16(dyr, tmp, N * OC);
    k->bf16_scratch(N * OC);
    k->matmul_forward_bf16(y16, x16, w16, b, N, C, OC);
    k->matmul_forward(y32, xr, wr, b, N, C, OC);
    k->matmul_backward_bf16(dx16, dw16, db16, dy, x16, w16, N, C, OC);
    k->matmul_backward(dx32, dw32, db32, dyr, xr, wr, N, C, OC);
    double worst = 0;
    struct {
        const float *a, *b;
        int n;
    } pairs[] = {{y16, y32, N * OC}, {dx16, dx32, N * C}, {dw16, dw32, OC * C}};
    for (size_t p = 0; p < 3; p++)
        for (int i = 0; i < pairs[p].n; i++) {
            double d = fabs(pairs[p].a[i] - pairs[p].b[i]) / (fabs(pairs[p].b[i]) + 1e-3);
            worst = d > worst ? d : worst;
        }
    CHECK(worst < 1e-4, "bf16 matmuls differ from fp32 ones on the same operands by %.2e", worst);
    /* the bias gradient comes from the fp32 dout (never rounded), each
     * column's rows added in order, as the fp32 kernel does: the same bits */
    for (int o = 0; o < OC; o++) {
        float want = 0;
        for (int i = 0; i < N; i++)
            want += dy[i * OC + o];
        CHECK(db16[o] == want, "dbias[%d] %.9g, want %.9g", o, db16[o], want);
    }
}

/* The attention's backward against naive double-precision products, at a
 * length that spans several of the kernel's 64-row blocks and ends in a
 * partial one (the blocked products skip the masked triangle). */
static void attention_backward_matches_naive_products(void)
{
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    enum { AB = 2, AT = 150, AC = 32, NH = 2, HS = AC / NH, C3 = 3 * AC };
    float *qkv = malloc(sizeof(float) * AB * AT * C3), *out = malloc(sizeof(float) * AB * AT * AC);
    float *att = malloc(sizeof(float) * AB * NH * AT * AT);
    float *datt = malloc(sizeof(float) * AB * NH * AT * AT);
    float *dout = malloc(sizeof(float) * AB * AT * AC);
    float *dqkv = calloc((size_t)AB * AT * C3, sizeof(float));
    double *want = calloc((size_t)AB * AT * C3, sizeof(double));
    double *dA = malloc(sizeof(double) * AT * AT);
    for (int i = 0; i < AB * AT * C3; i++)
        qkv[i] = fsdp_normal_at(21, (uint64_t)i);
    for (int i = 0; i < AB * AT * AC; i++)
        dout[i] = fsdp_normal_at(22, (uint64_t)i);
    k->attention_forward(out, att, qkv, AB, AT, NH, NH, AC / NH);
    k->attention_backward(dqkv, datt, dout, qkv, att, AB, AT, NH, NH, AC / NH);
    const double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < AB; b++)
        for (int h = 0; h < NH; h++) {
            const float *A = att + ((size_t)b * NH + h) * AT * AT;
            const float *q = qkv + (size_t)b * AT * C3 + h * HS, *kk = q + AC, *v = q + 2 * AC;
            const float *d = dout + (size_t)b * AT * AC + h * HS;
            double *dq = want + (size_t)b * AT * C3 + h * HS, *dk = dq + AC, *dv = dq + 2 * AC;
            for (int t = 0; t < AT; t++) {
                double dot = 0;
                for (int u = 0; u <= t; u++) {
                    double g = 0;
                    for (int i = 0; i < HS; i++)
                        g += (double)d[t * AC + i] * v[u * C3 + i];
                    dA[t * AT + u] = g;
                    dot += A[t * AT + u] * g;
                    for (int i = 0; i < HS; i++) /* dV = A^T dout */
                        dv[u * C3 + i] += (double)A[t * AT + u] * d[t * AC + i];
                }
                for (int u = 0; u <= t; u++) {
                    double pre = A[t * AT + u] * (dA[t * AT + u] - dot) * scale;
                    for (int i = 0; i < HS; i++) {
                        dq[t * C3 + i] += pre * kk[u * C3 + i];
                        dk[u * C3 + i] += pre * q[t * C3 + i];
                    }
                }
            }
        }
    double worst = 0, mag = 0;
    for (int i = 0; i < AB * AT * C3; i++)
        mag = fabs(want[i]) > mag ? fabs(want[i]) : mag;
    for (int i = 0; i < AB * AT * C3; i++) {
        double e = fabs(dqkv[i] - want[i]) / mag;
        worst = e > worst ? e : worst;
    }
    CHECK(worst < 1e-5, "attention backward differs from the naive products by %.2e", worst);
    free(qkv), free(out), free(att), free(datt), free(dout), free(dqkv), free(want), free(dA);
}

/* A dout wider than the reserved scratch (the head's: B*T x vocabulary)
 * goes through it in chunks of rows: the same products as fp32 ones on the
 * rounded operands, dbias the same bits as one pass. */
static void bf16_backward_in_chunks_matches_fp32(void)
{
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    enum { N = 301, C = 24, OC = 260 }; /* more than the 1480 values reserved before */
    float *x = malloc(sizeof(float) * N * C), *xr = malloc(sizeof(float) * N * C);
    float *w = malloc(sizeof(float) * OC * C), *wr = malloc(sizeof(float) * OC * C);
    float *dy = malloc(sizeof(float) * N * OC), *dyr = malloc(sizeof(float) * N * OC);
    float *dx16 = malloc(sizeof(float) * N * C), *dx32 = malloc(sizeof(float) * N * C);
    float *dw16 = calloc(OC * C, sizeof(float)), *dw32 = calloc(OC * C, sizeof(float));
    float *db16 = calloc(OC, sizeof(float)), *db32 = calloc(OC, sizeof(float));
    uint16_t *x16 = malloc(2 * N * C), *w16 = malloc(2 * OC * C), *t16 = malloc(2 * N * OC);
    for (int i = 0; i < N * C; i++)
        x[i] = fsdp_normal_at(31, (uint64_t)i);
    for (int i = 0; i < OC * C; i++)
        w[i] = 0.1f * fsdp_normal_at(32, (uint64_t)i);
    for (int i = 0; i < N * OC; i++)
        dy[i] = fsdp_normal_at(33, (uint64_t)i);
    k->to_bf16(x16, x, N * C);
    k->from_bf16(xr, x16, N * C);
    k->to_bf16(w16, w, OC * C);
    k->from_bf16(wr, w16, OC * C);
    k->to_bf16(t16, dy, N * OC);
    k->from_bf16(dyr, t16, N * OC);
    REQUIRE(fsdp_gemm_scratch_held(0) < (size_t)N * OC, "the scratch is already %zu values",
            fsdp_gemm_scratch_held(0));
    k->matmul_backward_bf16(dx16, dw16, db16, dy, x16, w16, N, C, OC);
    k->matmul_backward(dx32, dw32, db32, dyr, xr, wr, N, C, OC);
    /* relative to each product's largest value: the two sum in different
     * orders (oneDNN's blocking depends on the CPU), which moves a value
     * near zero by far more than its own size; a misplaced chunk moves
     * whole rows by their size */
    double worst = 0, mx = 0, mw = 0;
    for (int i = 0; i < N * C; i++)
        mx = fmax(mx, fabs(dx32[i]));
    for (int i = 0; i < OC * C; i++)
        mw = fmax(mw, fabs(dw32[i]));
    for (int i = 0; i < N * C; i++)
        worst = fmax(worst, fabs(dx16[i] - dx32[i]) / mx);
    for (int i = 0; i < OC * C; i++)
        worst = fmax(worst, fabs(dw16[i] - dw32[i]) / mw);
    CHECK(worst < 1e-5, "chunked bf16 backward differs from fp32 by %.2e", worst);
    for (int o = 0; o < OC; o++) {
        float want = 0;
        for (int i = 0; i < N; i++)
            want += dy[i * OC + o];
        CHECK(db16[o] == want, "dbias[%d] %.9g, want %.9g", o, db16[o], want);
    }
    free(x), free(xr), free(w), free(wr), free(dy), free(dyr), free(dx16), free(dx32);
    free(dw16), free(dw32), free(db16), free(db32), free(x16), free(w16), free(t16);
}

/* The weight gradients' product split by rows between two threads (each
 * share one single-threaded product, fsdp_gemm_bf16_rows) against one
 * product of all the threads: the same sums, perhaps in another order.
 * M is not a multiple of a share's 32 rows; op(A) transposed (the weight
 * gradient's dout^T) and not; C accumulates (beta 1). */
static void bf16_products_split_by_rows_match_one_product(void)
{
    enum { M = 200, N = 48, K = 96 };
    float *af = randv((size_t)M * K, 21, 1.0f), *bf = randv((size_t)K * N, 22, 1.0f);
    float *c0 = randv((size_t)M * N, 23, 1.0f);
    uint16_t *a = calloc((size_t)M * K, sizeof *a), *b = calloc((size_t)K * N, sizeof *b);
    float *one = calloc((size_t)M * N, sizeof *one), *split = calloc((size_t)M * N, sizeof *split);
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    k->to_bf16(a, af, (size_t)M * K);
    k->to_bf16(b, bf, (size_t)K * N);
    fsdp_kernels_cpu_threads(2);
    for (int t = 0; t < 2; t++) {
        const char ta = t ? 'T' : 'N';
        const int lda = t ? M : K;
        memcpy(one, c0, (size_t)M * N * sizeof *one);
        memcpy(split, c0, (size_t)M * N * sizeof *split);
        fsdp_gemm_bf16(ta, 'N', M, N, K, a, lda, b, N, 1.0f, one, N);
        fsdp_gemm_bf16_rows(ta, 'N', M, N, K, a, lda, b, N, 1.0f, split, N);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < (size_t)M * N; i++) {
            worst = fmax(worst, fabs((double)one[i] - split[i]));
            scale = fmax(scale, fabs((double)one[i]));
        }
        CHECK(worst <= 1e-5 * scale, "op(A) %c: the split product is off by %.3g (of %.3g)", ta,
              worst, scale);
    }
    free(af), free(bf), free(c0), free(a), free(b), free(one), free(split);
}

CHECK_MAIN(TEST(forward_matches_reference_gpt2), TEST(bf16_rounds_to_nearest_even),
           TEST(fp16_kernels_are_the_integer_rounding_bit_for_bit),
           TEST(fused_rounding_is_to_bf16_bit_for_bit),
           TEST(bf16_matmuls_match_fp32_on_rounded_operands),
           TEST(bf16_backward_in_chunks_matches_fp32),
           TEST(attention_backward_matches_naive_products),
           TEST(bf16_products_split_by_rows_match_one_product))
