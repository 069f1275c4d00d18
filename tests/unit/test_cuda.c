/*
 * test_cuda.c - the CUDA backend against the CPU backend, kernel by kernel
 * on random inputs, then the whole engine (loss and every gradient), a
 * finite-difference gradient check on the GPU, and repeatability.
 *
 * Needs a GPU: without one (or in a build without CUDA) it prints why and
 * exits 77, which meson reports as skipped. tools/device-check.sh runs it
 * on a GPU machine.
 *
 * Errors are measured relative to the reference's largest magnitude,
 *   max |gpu - cpu| / max |cpu|,
 * so values near zero do not blow the ratio up. Tolerances, per kernel:
 *   1e-5  pointwise and row kernels, fp32 matmuls (summation order only)
 *   1e-4  attention (two products and a softmax), the loss, bf16 matmuls
 *         (the same rounded operands; accumulation order differs)
 *   0     bf16 rounding and widening (the same bits by construction)
 *   5e-3  flash attention against its CPU reference (flash_ref.c: the same
 *         bf16 roundings; a last-bit difference can flip one), and 1e-2
 *         against the fp32 attention (the roundings themselves)
 * and for the engine, per gradient tensor, ||gpu - cpu|| / ||cpu|| < 1e-4
 * in fp32 and 1e-2 in bf16 (a last-bit fp32 difference can flip a bf16
 * operand's rounding: 0.4% on that element; 1.8e-3 seen in CPU trials),
 * where the CPU's bf16 run takes flash_ref.c's attention as the GPU takes
 * flash.cu's.
 */
#include "check.h"

#include "comm.h"
#include "cuda/cuda.h"
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

static const struct fsdp_kernels *cpu, *gpu; /* set by find_the_gpu, read-only after */

/* ---- helpers ------------------------------------------------------------------------- */

static void *dev(const void *host, size_t bytes)
{
    void *d = gpu->alloc(bytes);
    if (host)
        gpu->upload(d, host, bytes);
    return d;
}

static float *back(const float *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    gpu->download(h, d, n * sizeof *h);
    return h;
}

/* compares device buffer d against host reference h */
#define EXPECT_CLOSE(d, h, n, tol, what)                                                           \
    do {                                                                                           \
        float *got_ = back(d, n);                                                                  \
        double e_ = rel_err(got_, h, n);                                                           \
        CHECK(e_ < (tol), "%s: relative error %.3g (tolerance %g)", what, e_, (double)(tol));      \
        free(got_);                                                                                \
    } while (0)

enum { B = 2, T = 64, C = 96, NH = 4, OC = 288, V = 100, Vp = 128 };
#define BT ((size_t)B * T)

/* ---- kernels ------------------------------------------------------------------------- */

static void encoder_matches_the_cpu(void)
{
    int32_t tok[BT];
    for (size_t i = 0; i < BT; i++)
        tok[i] = (int32_t)((i * 7919) % V);
    tok[3] = tok[9] = tok[40]; /* repeated tokens: the scatter must add them all */
    float *wte = randv((size_t)V * C, 1, 1), *wpe = randv((size_t)T * C, 2, 1);
    float *out = calloc(BT * C, 4), *dout = randv(BT * C, 3, 1);
    float *dwte = randv((size_t)V * C, 4, 1), *dwpe = randv((size_t)T * C, 5, 1);
    int32_t *dtok = dev(tok, sizeof tok);
    float *dwte_d = dev(wte, (size_t)V * C * 4), *dwpe_d = dev(wpe, (size_t)T * C * 4);
    float *dout_d = dev(NULL, BT * C * 4), *gdout = dev(dout, BT * C * 4);
    float *gdwte = dev(dwte, (size_t)V * C * 4), *gdwpe = dev(dwpe, (size_t)T * C * 4);
    cpu->encoder_forward(out, tok, wte, wpe, B, T, C);
    gpu->encoder_forward(dout_d, dtok, dwte_d, dwpe_d, B, T, C);
    EXPECT_CLOSE(dout_d, out, BT * C, 1e-6, "encoder_forward");
    cpu->encoder_backward(dwte, dwpe, dout, tok, B, T, C);
    gpu->encoder_backward(gdwte, gdwpe, gdout, dtok, B, T, C);
    EXPECT_CLOSE(gdwte, dwte, (size_t)V * C, 1e-6, "encoder_backward dwte");
    EXPECT_CLOSE(gdwpe, dwpe, (size_t)T * C, 1e-6, "encoder_backward dwpe");
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    void *d[] = {dtok, dwte_d, dwpe_d, dout_d, gdout, gdwte, gdwpe};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        gpu->free(d[i]);
}

static void layernorm_matches_the_cpu(void)
{
    float *x = randv(BT * C, 10, 2), *w = randv(C, 11, 1), *b = randv(C, 12, 1);
    float *out = calloc(BT * C, 4), *mean = calloc(BT, 4), *rstd = calloc(BT, 4);
    float *dout = randv(BT * C, 13, 1), *dinp = randv(BT * C, 14, 1);
    float *dw = randv(C, 15, 1), *db = randv(C, 16, 1);
    float *gx = dev(x, BT * C * 4), *gw = dev(w, C * 4), *gb = dev(b, C * 4);
    float *gout = dev(NULL, BT * C * 4), *gmean = dev(NULL, BT * 4), *grstd = dev(NULL, BT * 4);
    float *gdout = dev(dout, BT * C * 4), *gdinp = dev(dinp, BT * C * 4);
    float *gdw = dev(dw, C * 4), *gdb = dev(db, C * 4);
    cpu->layernorm_forward(out, mean, rstd, x, w, b, BT, C);
    gpu->layernorm_forward(gout, gmean, grstd, gx, gw, gb, BT, C);
    EXPECT_CLOSE(gout, out, BT * C, 1e-5, "layernorm_forward out");
    EXPECT_CLOSE(gmean, mean, BT, 1e-5, "layernorm_forward mean");
    EXPECT_CLOSE(grstd, rstd, BT, 1e-5, "layernorm_forward rstd");
    cpu->layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, BT, C);
    gpu->layernorm_backward(gdinp, gdw, gdb, gdout, gx, gw, gmean, grstd, BT, C);
    EXPECT_CLOSE(gdinp, dinp, BT * C, 1e-5, "layernorm_backward dinp (accumulated)");
    EXPECT_CLOSE(gdw, dw, C, 1e-5, "layernorm_backward dw");
    EXPECT_CLOSE(gdb, db, C, 1e-5, "layernorm_backward db");
    float *h[] = {x, w, b, out, mean, rstd, dout, dinp, dw, db};
    float *d[] = {gx, gw, gb, gout, gmean, grstd, gdout, gdinp, gdw, gdb};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
        free(h[i]), gpu->free(d[i]);
}

static void matmuls_match_the_cpu(int bf16)
{
    const size_t nx = BT * C, nw = (size_t)OC * C, no = BT * OC;
    float *x = randv(nx, 20, 1), *w = randv(nw, 21, 0.1f), *bias = randv(OC, 22, 1);
    float *dout = randv(no, 23, 1), *out = calloc(no, 4), *dinp = calloc(nx, 4);
    float *dw = randv(nw, 24, 1), *dbias = randv(OC, 25, 1);
    uint16_t *w16 = malloc(nw * 2), *x16 = malloc(nx * 2);
    cpu->to_bf16(w16, w, nw);
    cpu->to_bf16(x16, x, nx); /* the engine rounds the products' inputs */
    float *gx = dev(x, nx * 4), *gw = dev(w, nw * 4), *gbias = dev(bias, OC * 4);
    float *gdout = dev(dout, no * 4), *gout = dev(NULL, no * 4), *gdinp = dev(NULL, nx * 4);
    float *gdw = dev(dw, nw * 4), *gdbias = dev(dbias, OC * 4);
    uint16_t *gw16 = dev(w16, nw * 2), *gx16 = dev(x16, nx * 2);
    const char *tag = bf16 ? "bf16" : "fp32";
    char what[64];
    if (bf16) {
        cpu->bf16_scratch(no);
        gpu->bf16_scratch(no);
        cpu->matmul_forward_bf16(out, x16, w16, bias, BT, C, OC);
        gpu->matmul_forward_bf16(gout, gx16, gw16, gbias, BT, C, OC);
    } else {
        cpu->matmul_forward(out, x, w, bias, BT, C, OC);
        gpu->matmul_forward(gout, gx, gw, gbias, BT, C, OC);
    }
    const double tol = bf16 ? 1e-4 : 1e-5;
    snprintf(what, sizeof what, "matmul_forward %s", tag);
    EXPECT_CLOSE(gout, out, no, tol, what);
    if (bf16) {
        cpu->matmul_backward_bf16(dinp, dw, dbias, dout, x16, w16, BT, C, OC);
        gpu->matmul_backward_bf16(gdinp, gdw, gdbias, gdout, gx16, gw16, BT, C, OC);
    } else {
        cpu->matmul_backward(dinp, dw, dbias, dout, x, w, BT, C, OC);
        gpu->matmul_backward(gdinp, gdw, gdbias, gdout, gx, gw, BT, C, OC);
    }
    snprintf(what, sizeof what, "matmul_backward %s dinp", tag);
    EXPECT_CLOSE(gdinp, dinp, nx, tol, what);
    snprintf(what, sizeof what, "matmul_backward %s dw (accumulated)", tag);
    EXPECT_CLOSE(gdw, dw, nw, tol, what);
    snprintf(what, sizeof what, "matmul_backward %s dbias (accumulated)", tag);
    EXPECT_CLOSE(gdbias, dbias, OC, 1e-5, what);
    float *h[] = {x, w, bias, dout, out, dinp, dw, dbias};
    float *d[] = {gx, gw, gbias, gdout, gout, gdinp, gdw, gdbias};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
        free(h[i]), gpu->free(d[i]);
    free(w16);
    free(x16);
    gpu->free(gw16);
    gpu->free(gx16);
}

static void fp32_matmuls_match_the_cpu(void) { matmuls_match_the_cpu(0); }
static void bf16_matmuls_match_the_cpu(void) { matmuls_match_the_cpu(1); }

static void bf16_rounding_is_the_cpus_bit_for_bit(void)
{
    const size_t n = 4096;
    float *x = randv(n, 30, 100);
    uint32_t special[] = {0x7fc00001u, 0xffc00000u, 0x7f800000u, 0xff800000u, 0x00000001u,
                          0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x80000000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        memcpy(&x[i], &special[i], 4);
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    float *wa = malloc(n * 4), *wb = malloc(n * 4);
    float *gx = dev(x, n * 4), *gw = dev(NULL, n * 4);
    uint16_t *g16 = dev(NULL, n * 2);
    cpu->to_bf16(a, x, n);
    gpu->to_bf16(g16, gx, n);
    gpu->download(b, g16, n * 2);
    CHECK(memcmp(a, b, n * 2) == 0, "to_bf16 differs from the CPU's");
    cpu->from_bf16(wa, a, n);
    gpu->from_bf16(gw, g16, n);
    gpu->download(wb, gw, n * 4);
    CHECK(memcmp(wa, wb, n * 4) == 0, "from_bf16 differs from the CPU's");
    free(x), free(a), free(b), free(wa), free(wb);
    gpu->free(gx), gpu->free(gw), gpu->free(g16);
}

static void attention_matches_the_cpu(void)
{
    const size_t nq = BT * 3 * C, na = (size_t)B * NH * T * T, no = BT * C;
    float *qkv = randv(nq, 40, 1), *att = calloc(na, 4), *out = calloc(no, 4);
    float *dout = randv(no, 41, 1), *dqkv = calloc(nq, 4), *datt = calloc(na, 4);
    float *gqkv = dev(qkv, nq * 4), *gatt = dev(NULL, na * 4), *gout = dev(NULL, no * 4);
    float *gdout = dev(dout, no * 4), *gdqkv = dev(NULL, nq * 4), *gdatt = dev(NULL, na * 4);
    cpu->attention_forward(out, att, qkv, B, T, NH, NH, C / NH);
    gpu->attention_forward(gout, gatt, gqkv, B, T, NH, NH, C / NH);
    EXPECT_CLOSE(gatt, att, na, 1e-5, "attention_forward att (the stored softmax)");
    EXPECT_CLOSE(gout, out, no, 1e-4, "attention_forward out");
    cpu->attention_backward(dqkv, datt, dout, qkv, att, B, T, NH, NH, C / NH);
    gpu->attention_backward(gdqkv, gdatt, gdout, gqkv, gatt, B, T, NH, NH, C / NH);
    EXPECT_CLOSE(gdqkv, dqkv, nq, 1e-4, "attention_backward dqkv");
    float *h[] = {qkv, att, out, dout, dqkv, datt};
    float *d[] = {gqkv, gatt, gout, gdout, gdqkv, gdatt};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
        free(h[i]), gpu->free(d[i]);
}

/* flash.cu against its CPU reference (the same roundings: only fp32
 * summation order and expf differ, which can flip a bf16 rounding of P or
 * dS, 0.4% on that element) and against the fp32 attention (the bf16
 * roundings themselves: test_flash.c measures 3e-3 for the reference). The
 * shapes take every head width's kernels (8, 24, 64, 96 and 128 wide; the
 * narrower pad to 16, 32, 64, 128; and 18, whose bf16 rows load a value at
 * a time), one tile, ragged tiles, a single row, and gpt2-124m's 1024. Two
 * runs give the same bits. */
static void flash_attention_matches_the_reference(void)
{
    if (!gpu->attention_forward_bf16) {
        printf("  FSDP_CUDA_ATTENTION=gemm: no flash kernels to test\n");
        return;
    }
    static const struct {
        int B, T, C, NH;
    } shapes[] = {{2, 64, 96, 4},   {1, 200, 128, 2}, {2, 1, 16, 2},     {1, 130, 256, 2},
                  {1, 100, 192, 2}, {2, 77, 32, 4},   {1, 1024, 128, 2}, {1, 70, 36, 2}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int B = shapes[si].B, T = shapes[si].T, C = shapes[si].C, NH = shapes[si].NH;
        if (C / NH > gpu->attention_bf16_max_hs) { /* sm_86, sm_89: 64 */
            printf("  B %d T %d C %d NH %d: heads too wide for this GPU's shared memory\n", B, T, C,
                   NH);
            continue;
        }
        const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
        const size_t nl = (size_t)B * NH * T, na = nl * T;
        float *qkv = randv(nq, 60 + si, 1), *dout = randv(no, 70 + si, 1);
        float *out = calloc(no, 4), *lse = calloc(nl, 4), *d = calloc(nl, 4);
        float *dqkv = calloc(nq, 4), *out32 = calloc(no, 4), *dqkv32 = calloc(nq, 4);
        float *att = calloc(na, 4), *datt = calloc(na, 4);
        uint16_t *out16 = calloc(no, 2), *qkv16 = calloc(nq, 2), *o16 = calloc(no, 2);
        cpu->to_bf16(qkv16, qkv, nq); /* as the qkv product writes it */
        flash_ref_forward(out16, lse, qkv16, B, T, C, NH);
        cpu->from_bf16(out, out16, no);
        flash_ref_backward(dqkv, d, dout, out16, qkv16, lse, B, T, C, NH);
        cpu->attention_forward(out32, att, qkv, B, T, NH, NH, C / NH);
        cpu->attention_backward(dqkv32, datt, dout, qkv, att, B, T, NH, NH, C / NH);
        uint16_t *gqkv = dev(qkv16, nq * 2), *gout = dev(NULL, no * 2);
        float *gdout = dev(dout, no * 4);
        float *glse = dev(NULL, nl * 4), *gd = dev(NULL, nl * 4), *gdqkv = dev(NULL, nq * 4);
        uint16_t *gout16 = (uint16_t *)dev(out16, no * 2); /* the reference's: the same D */
        gpu->attention_forward_bf16(gout, glse, gqkv, B, T, C, NH);
        gpu->attention_backward_bf16(gdqkv, gd, gdout, gout16, gqkv, glse, B, T, C, NH);
        gpu->download(o16, gout, no * 2);
        float *o = malloc(no * 4), *l = back(glse, nl), *dq = back(gdqkv, nq);
        cpu->from_bf16(o, o16, no);
        /* out is bf16 on both sides: the same bits but where the two sums
         * (in different orders, with expf's last bits) straddle a rounding
         * tie, and then one bf16 step apart */
        size_t differ = 0, far = 0;
        for (size_t i = 0; i < no; i++) {
            float big = fabsf(o[i]) > fabsf(out[i]) ? fabsf(o[i]) : fabsf(out[i]);
            differ += o16[i] != out16[i];
            far += !(fabsf(o[i] - out[i]) <= big * 0x1p-7f);
        }
        double eo = rel_err(o, out, no), el = rel_err(l, lse, nl), eg = rel_err(dq, dqkv, nq);
        double fo = rel_err(o, out32, no), fg = rel_err(dq, dqkv32, nq);
        printf("  B %d T %d C %d NH %d: vs reference out %.2g (%zu of %zu one bf16 step off) lse "
               "%.2g dqkv %.2g; vs fp32 out %.2g dqkv %.2g\n",
               B, T, C, NH, eo, differ, no, el, eg, fo, fg);
        CHECK(far == 0 && differ <= no / 10,
              "out vs the reference: %zu of %zu differ, %zu by more than one bf16 step", differ, no,
              far);
        CHECK(el < 1e-4, "lse vs the reference: relative error %.3g (tolerance 1e-4)", el);
        CHECK(eg < 5e-3, "dqkv vs the reference: relative error %.3g (tolerance 5e-3)", eg);
        CHECK(fo < 1e-2, "out vs fp32: relative error %.3g (tolerance 1e-2)", fo);
        CHECK(fg < 1e-2, "dqkv vs fp32: relative error %.3g (tolerance 1e-2)", fg);
        /* again: the same bits */
        gpu->attention_forward_bf16(gout, glse, gqkv, B, T, C, NH);
        gpu->attention_backward_bf16(gdqkv, gd, gdout, gout16, gqkv, glse, B, T, C, NH);
        uint16_t *o2 = malloc(no * 2);
        gpu->download(o2, gout, no * 2);
        float *dq2 = back(gdqkv, nq);
        CHECK(memcmp(o16, o2, no * 2) == 0 && memcmp(dq, dq2, nq * 4) == 0,
              "two runs differ (B %d T %d C %d NH %d)", B, T, C, NH);
        free(o), free(l), free(dq), free(o2), free(dq2), free(o16), free(qkv16);
        float *h[] = {qkv, dout, out, lse, d, dqkv, out32, dqkv32, att, datt};
        for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
            free(h[i]);
        free(out16);
        void *g[] = {gqkv, gdout, gout, glse, gd, gdqkv};
        for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
            gpu->free(g[i]);
        gpu->free(gout16);
    }
}

/* The qkv product of a flash run, bf16 out and bf16 bias, against the
 * reference's sum in fp32 rounded once: the GPU adds in another order, so
 * a value near a rounding tie may land one bf16 step away, no further. */
static void matmul_to_bf16_matches_the_reference(void)
{
    if (!gpu->matmul_forward_to_bf16) {
        printf("  FSDP_CUDA_ATTENTION=gemm: not used\n");
        return;
    }
    const size_t nx = BT * C, nw = (size_t)OC * C, no = BT * OC;
    float *x = randv(nx, 80, 1), *w = randv(nw, 81, 0.1f), *b = randv(OC, 82, 1);
    uint16_t *x16 = malloc(nx * 2), *w16 = malloc(nw * 2), *b16 = malloc(OC * 2);
    uint16_t *want = malloc(no * 2), *got = malloc(no * 2);
    cpu->to_bf16(x16, x, nx), cpu->to_bf16(w16, w, nw), cpu->to_bf16(b16, b, OC);
    flash_ref_matmul_to_bf16(want, x16, w16, b16, BT, C, OC);
    uint16_t *gx = dev(x16, nx * 2), *gw = dev(w16, nw * 2), *gb = dev(b16, OC * 2);
    uint16_t *go = dev(NULL, no * 2);
    gpu->matmul_forward_to_bf16(go, gx, gw, gb, BT, C, OC);
    gpu->download(got, go, no * 2);
    size_t same = 0, far = 0;
    for (size_t i = 0; i < no; i++) {
        float g = fsdp_bf16_widen(got[i]), h = fsdp_bf16_widen(want[i]);
        float big = fabsf(g) > fabsf(h) ? fabsf(g) : fabsf(h);
        same += got[i] == want[i];
        far += fabsf(g - h) > big * 0x1p-7f + 1e-6f; /* one bf16 step is 2^-8 to 2^-7 of it */
    }
    printf("  %zu of %zu the same bits, %zu more than one step off\n", same, no, far);
    CHECK(far == 0 && same >= no * 99 / 100, "%zu of %zu equal, %zu more than one bf16 step off",
          same, no, far);
    free(x), free(w), free(b), free(x16), free(w16), free(b16), free(want), free(got);
    gpu->free(gx), gpu->free(gw), gpu->free(gb), gpu->free(go);
}

static void pointwise_kernels_match_the_cpu(void)
{
    const size_t n = BT * 4 * C;
    float *x = randv(n, 50, 3), *y = randv(n, 51, 1), *o = calloc(n, 4);
    float *gx = dev(x, n * 4), *gy = dev(y, n * 4), *go = dev(NULL, n * 4);
    cpu->gelu_forward(o, x, n);
    gpu->gelu_forward(go, gx, n);
    EXPECT_CLOSE(go, o, n, 1e-5, "gelu_forward");
    cpu->gelu_backward(o, x, y, n);
    gpu->gelu_backward(go, gx, gy, n);
    EXPECT_CLOSE(go, o, n, 1e-5, "gelu_backward");
    cpu->residual_forward(o, x, y, n);
    gpu->residual_forward(go, gx, gy, n);
    EXPECT_CLOSE(go, o, n, 1e-7, "residual_forward");
    cpu->add(o, x, n);
    gpu->add(go, gx, n);
    EXPECT_CLOSE(go, o, n, 1e-7, "add");
    double s1 = cpu->sumsq(x, n), s2 = gpu->sumsq(gx, n);
    CHECK(fabs(s1 - s2) <= 1e-12 * s1, "sumsq: cpu %.17g gpu %.17g", s1, s2);
    free(x), free(y), free(o);
    gpu->free(gx), gpu->free(gy), gpu->free(go);
}

/* The kernels that write a bf16 run's product inputs round as they go:
 * the bits to_bf16 makes of the fp32 kernels' outputs on the same GPU. */
static void fused_rounding_is_to_bf16_bit_for_bit(void)
{
    const size_t n = BT * 4 * C;
    float *x = randv(n, 52, 3), *w = randv(C, 53, 1), *b = randv(C, 54, 0.5f);
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
    float *gx = dev(x, n * 4), *gw = dev(w, C * 4), *gb = dev(b, C * 4), *go = dev(NULL, n * 4);
    float *gm = dev(NULL, BT * 4), *gr = dev(NULL, BT * 4);
    uint16_t *g16 = dev(NULL, n * 2);
    gpu->layernorm_forward(go, gm, gr, gx, gw, gb, BT, C);
    gpu->to_bf16(g16, go, BT * C);
    gpu->download(want, g16, BT * C * 2);
    gpu->layernorm_forward_bf16(g16, gm, gr, gx, gw, gb, BT, C);
    gpu->download(got, g16, BT * C * 2);
    CHECK(memcmp(got, want, BT * C * 2) == 0, "layernorm_forward_bf16 is not to_bf16(out)");
    gpu->gelu_forward(go, gx, n);
    gpu->to_bf16(g16, go, n);
    gpu->download(want, g16, n * 2);
    gpu->gelu_forward_bf16(g16, gx, n);
    gpu->download(got, g16, n * 2);
    CHECK(memcmp(got, want, n * 2) == 0, "gelu_forward_bf16 is not to_bf16(out)");
    free(x), free(w), free(b), free(want), free(got);
    void *d[] = {gx, gw, gb, go, gm, gr, g16};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        gpu->free(d[i]);
}

/* The llama family's kernels: RMSNorm, RoPE and SwiGLU as the pointwise
 * and row kernels (1e-5), their bf16 forms the bits to_bf16 makes of the
 * fp32 ones, and grouped-query attention (2 and 1 K/V heads) as attention. */
static void llama_kernels_match_the_cpu(void)
{
    const size_t n = BT * C, hs = C / NH;
    float *x = randv(n, 60, 2), *w = randv(C, 61, 1), *o = calloc(n, 4), *rs = calloc(BT, 4);
    float *dout = randv(n, 62, 1), *dx = randv(n, 63, 1), *dw = randv(C, 64, 1);
    float *gx = dev(x, n * 4), *gw = dev(w, C * 4), *go = dev(NULL, n * 4),
          *grs = dev(NULL, BT * 4);
    float *gdout = dev(dout, n * 4), *gdx = dev(dx, n * 4), *gdw = dev(dw, C * 4);
    uint16_t *want = malloc(2 * n * 2), *got = malloc(2 * n * 2), *g16 = dev(NULL, 2 * n * 2);
    cpu->rmsnorm_forward(o, rs, x, w, BT, C, 1e-5f);
    gpu->rmsnorm_forward(go, grs, gx, gw, BT, C, 1e-5f);
    EXPECT_CLOSE(go, o, n, 1e-5, "rmsnorm_forward out");
    EXPECT_CLOSE(grs, rs, BT, 1e-5, "rmsnorm_forward rstd");
    gpu->to_bf16(g16, go, n);
    gpu->download(want, g16, n * 2);
    gpu->rmsnorm_forward_bf16(g16, grs, gx, gw, BT, C, 1e-5f);
    gpu->download(got, g16, n * 2);
    CHECK(memcmp(got, want, n * 2) == 0, "rmsnorm_forward_bf16 is not to_bf16(out)");
    cpu->rmsnorm_backward(dx, dw, dout, x, w, rs, BT, C);
    gpu->rmsnorm_backward(gdx, gdw, gdout, gx, gw, grs, BT, C);
    EXPECT_CLOSE(gdx, dx, n, 1e-5, "rmsnorm_backward dinp (accumulated)");
    EXPECT_CLOSE(gdw, dw, C, 1e-5, "rmsnorm_backward dw");
    /* RoPE on 3 of 4 heads of each row, then back */
    float *cs = randv(T * hs / 2, 65, 1), *sn = randv(T * hs / 2, 66, 1);
    float *gcs = dev(cs, T * hs / 2 * 4), *gsn = dev(sn, T * hs / 2 * 4);
    memcpy(o, x, n * 4);
    gpu->upload(go, x, n * 4);
    cpu->rope(o, cs, sn, B, T, NH - 1, (int)hs, C, 0);
    gpu->rope(go, gcs, gsn, B, T, NH - 1, (int)hs, C, 0);
    EXPECT_CLOSE(go, o, n, 1e-5, "rope");
    cpu->rope(o, cs, sn, B, T, NH - 1, (int)hs, C, 1);
    gpu->rope(go, gcs, gsn, B, T, NH - 1, (int)hs, C, 1);
    EXPECT_CLOSE(go, o, n, 1e-5, "rope inverse");
    /* SwiGLU: rows [gate | up] of 2 * (C / 2) */
    const int F = C / 2;
    float *gu = randv(BT * 2 * F, 67, 2), *ggu = dev(gu, BT * 2 * F * 4);
    cpu->swiglu_forward(o, gu, BT, F);
    gpu->swiglu_forward(go, ggu, BT, F);
    EXPECT_CLOSE(go, o, BT * F, 1e-5, "swiglu_forward");
    gpu->to_bf16(g16, go, BT * F);
    gpu->download(want, g16, BT * F * 2);
    gpu->swiglu_forward_bf16(g16, ggu, BT, F);
    gpu->download(got, g16, BT * F * 2);
    CHECK(memcmp(got, want, BT * F * 2) == 0, "swiglu_forward_bf16 is not to_bf16(out)");
    float *dgu = calloc(BT * 2 * F, 4), *gdgu = dev(NULL, BT * 2 * F * 4);
    cpu->swiglu_backward(dgu, gu, dout, BT, F);
    gpu->swiglu_backward(gdgu, ggu, gdout, BT, F);
    EXPECT_CLOSE(gdgu, dgu, BT * 2 * F, 1e-5, "swiglu_backward");
    for (int kvh = 2; kvh >= 1; kvh--) { /* grouped, multi-query */
        const size_t nq = BT * (NH + 2 * kvh) * hs, na = (size_t)B * NH * T * T, no = BT * C;
        float *qkv = randv(nq, 70 + (uint64_t)kvh, 1), *att = calloc(na, 4), *out = calloc(no, 4);
        float *dq = calloc(nq, 4), *datt = calloc(na, 4);
        float *gq = dev(qkv, nq * 4), *gatt = dev(NULL, na * 4), *gout = dev(NULL, no * 4);
        float *gdq = dev(NULL, nq * 4), *gdatt = dev(NULL, na * 4);
        cpu->attention_forward(out, att, qkv, B, T, NH, kvh, (int)hs);
        gpu->attention_forward(gout, gatt, gq, B, T, NH, kvh, (int)hs);
        EXPECT_CLOSE(gatt, att, na, 1e-5, kvh == 2 ? "GQA forward att" : "MQA forward att");
        EXPECT_CLOSE(gout, out, no, 1e-4, kvh == 2 ? "GQA forward out" : "MQA forward out");
        cpu->attention_backward(dq, datt, dout, qkv, att, B, T, NH, kvh, (int)hs);
        gpu->attention_backward(gdq, gdatt, gdout, gq, gatt, B, T, NH, kvh, (int)hs);
        EXPECT_CLOSE(gdq, dq, nq, 1e-4, kvh == 2 ? "GQA backward dqkv" : "MQA backward dqkv");
        free(qkv), free(att), free(out), free(dq), free(datt);
        gpu->free(gq), gpu->free(gatt), gpu->free(gout), gpu->free(gdq), gpu->free(gdatt);
    }
    free(x), free(w), free(o), free(rs), free(dout), free(dx), free(dw), free(want), free(got);
    free(cs), free(sn), free(gu), free(dgu);
    void *d[] = {gx, gw, go, grs, gdout, gdx, gdw, g16, gcs, gsn, ggu, gdgu};
    for (size_t k = 0; k < sizeof d / sizeof d[0]; k++)
        gpu->free(d[k]);
}

/* The loss, lse and the gradient, in place and (bf16 runs) rounded as it
 * is written: the bits to_bf16 makes of the in-place one. */
static void loss_matches_the_cpu(void)
{
    const size_t n = BT * Vp;
    float *logits = randv(n, 60, 3), *losses = calloc(BT, 4), *lse = calloc(BT, 4);
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
    int32_t tgt[BT];
    for (size_t i = 0; i < BT; i++)
        tgt[i] = (int32_t)((i * 31) % V);
    float *gl = dev(logits, n * 4), *gloss = dev(NULL, BT * 4), *glse = dev(NULL, BT * 4);
    uint16_t *g16 = dev(NULL, n * 2);
    int32_t *gt = dev(tgt, sizeof tgt);
    cpu->crossentropy_forward(losses, lse, logits, tgt, BT, V, Vp);
    gpu->crossentropy_forward(gloss, glse, gl, gt, BT, V, Vp);
    EXPECT_CLOSE(gloss, losses, BT, 1e-5, "crossentropy_forward losses");
    EXPECT_CLOSE(glse, lse, BT, 1e-6, "crossentropy_forward lse");
    float *kept = back(gl, n);
    CHECK(memcmp(kept, logits, n * 4) == 0, "crossentropy_forward changed the logits");
    free(kept);
    if (gpu->crossentropy_backward_bf16)
        gpu->crossentropy_backward_bf16(g16, gl, glse, gt, 1.0f / BT, BT, V, Vp);
    cpu->crossentropy_backward(logits, logits, lse, tgt, 1.0f / BT, BT, V, Vp);
    gpu->crossentropy_backward(gl, gl, glse, gt, 1.0f / BT, BT, V, Vp);
    EXPECT_CLOSE(gl, logits, n, 1e-5, "crossentropy_backward");
    if (gpu->crossentropy_backward_bf16) {
        gpu->download(got, g16, n * 2);
        gpu->to_bf16(g16, gl, n);
        gpu->download(want, g16, n * 2);
        CHECK(memcmp(got, want, n * 2) == 0, "crossentropy_backward_bf16 is not to_bf16(dlogits)");
    }
    free(logits), free(losses), free(lse), free(want), free(got);
    gpu->free(gl), gpu->free(gloss), gpu->free(glse), gpu->free(g16), gpu->free(gt);
}

static void adamw_matches_the_cpu(void)
{
    const size_t n = 10000;
    float *p = randv(n, 70, 1), *g = randv(n, 71, 1), *m = randv(n, 72, 0.1f);
    float *v = randv(n, 73, 0.1f);
    for (size_t i = 0; i < n; i++)
        v[i] = v[i] * v[i];
    float *gp = dev(p, n * 4), *gg = dev(g, n * 4), *gm = dev(m, n * 4), *gv = dev(v, n * 4);
    cpu->adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f, 0.5f);
    gpu->adamw(gp, gg, gm, gv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f, 0.5f);
    EXPECT_CLOSE(gp, p, n, 1e-6, "adamw params");
    EXPECT_CLOSE(gm, m, n, 1e-6, "adamw exp_avg");
    EXPECT_CLOSE(gv, v, n, 1e-6, "adamw exp_avg_sq");
    free(p), free(g), free(m), free(v);
    gpu->free(gp), gpu->free(gg), gpu->free(gm), gpu->free(gv);
}

/* ---- the engine ---------------------------------------------------------------------- */

enum { EB = 2, ET = 8 };
static const struct model_config gpt2_cfg = {
    .layers = 2, .dim = 16, .heads = 2, .seq = ET, .vocab = 30, .vocab_pad = 32};
/* grouped-query attention, q/k/v biases, an untied head */
static const struct model_config llama_cfg = {.arch = MODEL_LLAMA,
                                              .layers = 2,
                                              .dim = 16,
                                              .heads = 4,
                                              .seq = ET,
                                              .vocab = 30,
                                              .vocab_pad = 32,
                                              .kv_heads = 2,
                                              .ffn_dim = 24,
                                              .attn_bias = 1,
                                              .rope_theta = 10000,
                                              .norm_eps = 1e-5};
static const struct model_config *ecfg_p = &gpt2_cfg; /* the engine tests' model */
#define ecfg (*ecfg_p)

struct rig {
    struct model_layout m;
    struct fsdp_comm comm;
    struct fsdp_engine e;
    float *host; /* the parameter shard, host copy */
};

/* bf16 and prefetch as fsdp_opts has them; prefetch needs the GPU's comm
 * stream (comm_nccl.c) */
static int rig_init(struct rig *r, const struct fsdp_kernels *k, int bf16, int prefetch)
{
    char err[FSDP_ERR_LEN];
    if (model_layout_init(&r->m, &ecfg, err) != 0)
        return -1;
    fsdp_comm_local_init(&r->comm);
    if (k->on_device) { /* the one-rank copies are memmove: device buffers need NCCL */
        if (fsdp_comm_nccl_init(&r->comm, err) != 0) {
            fprintf(stderr, "  %s\n", err);
            return -1;
        }
    }
    const struct fsdp_opts o = {FSDP_SHARD_FULL, EB, 0, bf16, 0, prefetch, 0, 0, 0};
    if (fsdp_init(&r->e, &r->m, k, &r->comm, &o, err) != 0) {
        fprintf(stderr, "  %s\n", err);
        return -1;
    }
    r->host = calloc(r->e.shard_total, sizeof *r->host);
    for (int ti = 0; ti < r->m.ntensors; ti++) {
        const struct model_tensor *t = &r->m.tensors[ti];
        float *p = r->host + r->e.units[t->unit].shard_off + t->offset;
        for (size_t i = 0; i < t->numel; i++)
            p[i] = t->init_value + 0.3f * fsdp_normal_at(1000 + (uint64_t)ti, i);
    }
    k->upload(r->e.params, r->host, r->e.shard_total * sizeof(float));
    fsdp_params_changed(&r->e);
    int32_t in[EB * ET], tgt[EB * ET];
    struct fsdp_rng rng = {42};
    for (int i = 0; i < EB * ET; i++) {
        in[i] = (int32_t)fsdp_rng_below(&rng, (uint64_t)ecfg.vocab);
        tgt[i] = (int32_t)fsdp_rng_below(&rng, (uint64_t)ecfg.vocab);
    }
    fsdp_set_batch(&r->e, in, tgt);
    return 0;
}

static void rig_free(struct rig *r)
{
    fsdp_free(&r->e);
    r->comm.finalize(&r->comm);
    model_layout_free(&r->m);
    free(r->host);
}

/* loss and the gradient shard (host copy, caller frees) of one step */
static float *step_grads_with(const struct fsdp_kernels *k, int bf16, int prefetch, double *loss)
{
    struct rig r;
    char err[FSDP_ERR_LEN];
    if (rig_init(&r, k, bf16, prefetch) != 0)
        return NULL;
    fsdp_zero_grad(&r.e);
    float *g = NULL;
    if (fsdp_forward(&r.e, EB, ET, loss, err) == 0 &&
        fsdp_backward(&r.e, 1.0f / (EB * ET), err) == 0) {
        g = malloc(r.e.shard_total * sizeof *g);
        k->download(g, r.e.grads, r.e.shard_total * sizeof *g);
    } else {
        fprintf(stderr, "  %s\n", err);
    }
    rig_free(&r);
    return g;
}

static float *step_grads(const struct fsdp_kernels *k, int bf16, double *loss)
{
    return step_grads_with(k, bf16, 0, loss);
}

/* The CPU kernels, with flash_ref.c as the bf16 attention where the GPU
 * runs flash.cu (unless FSDP_CUDA_ATTENTION=gemm): the engine then takes
 * the same path on both. */
static struct fsdp_kernels cpu_like_the_gpu(void)
{
    struct fsdp_kernels k = *cpu;
    if (gpu->attention_forward_bf16) {
        k.attention_forward_bf16 = flash_ref_forward;
        k.attention_backward_bf16 = flash_ref_backward;
        k.matmul_forward_to_bf16 = flash_ref_matmul_to_bf16;
        k.attention_bf16_max_hs = gpu->attention_bf16_max_hs;
    }
    return k;
}

static void engine_gradients_match_the_cpu(int bf16)
{
    double lc = 0, lg = 0;
    const struct fsdp_kernels ref = cpu_like_the_gpu();
    float *gc = step_grads(&ref, bf16, &lc), *gg = step_grads(gpu, bf16, &lg);
    REQUIRE(gc && gg, "a step failed");
    CHECK(fabs(lc - lg) <= 1e-5 * fabs(lc), "loss: cpu %.9g gpu %.9g", lc, lg);
    struct model_layout m;
    char err[FSDP_ERR_LEN];
    REQUIRE(model_layout_init(&m, &ecfg, err) == 0, "%s", err);
    double *rel = malloc((size_t)m.ntensors * sizeof *rel);
    REQUIRE(tensor_errors(&m, EB, cpu, gg, gc, rel) == 0, "no engine for the offsets");
    for (int ti = 0; ti < m.ntensors; ti++) {
        /* bf16: an fp32 difference in the last bit can flip an operand's
         * rounding (0.4% on that element); fp32: summation order only */
        const double tol = bf16 ? 1e-2 : 1e-4;
        CHECK(rel[ti] < tol, "%s gradient (%s): relative error %.3g (tolerance %g)",
              m.tensors[ti].name, bf16 ? "bf16" : "fp32", rel[ti], tol);
    }
    free(rel);
    model_layout_free(&m);
    free(gc), free(gg);
}

static void engine_gradients_match_the_cpu_fp32(void) { engine_gradients_match_the_cpu(0); }
static void engine_gradients_match_the_cpu_bf16(void) { engine_gradients_match_the_cpu(1); }

/* The llama family's passes on the GPU: the same loss and gradients as on
 * the CPU, fp32 and bf16. */
static void llama_engine_gradients_match_the_cpu(void)
{
    ecfg_p = &llama_cfg;
    engine_gradients_match_the_cpu(0);
    engine_gradients_match_the_cpu(1);
    ecfg_p = &gpt2_cfg;
}

/* Central differences of the loss on the GPU itself, every element, the
 * same tolerance as the CPU's gradient check (test_gradcheck.c). */
static void every_gradient_matches_finite_differences_on_the_gpu(void)
{
    struct rig r;
    char err[FSDP_ERR_LEN];
    REQUIRE(rig_init(&r, gpu, 0, 0) == 0, "rig");
    double base;
    fsdp_zero_grad(&r.e);
    REQUIRE(fsdp_forward(&r.e, EB, ET, &base, err) == 0 &&
                fsdp_backward(&r.e, 1.0f / (EB * ET), err) == 0,
            "%s", err);
    float *grads = back(r.e.grads, r.e.shard_total);
    const float eps = 5e-3f;
    for (int ti = 0; ti < r.m.ntensors; ti++) {
        const struct model_tensor *t = &r.m.tensors[ti];
        size_t off = r.e.units[t->unit].shard_off + t->offset;
        double diff2 = 0, a2 = 0, n2 = 0;
        for (size_t i = 0; i < t->numel; i++) {
            float saved = r.host[off + i], v;
            double l[2];
            for (int s = 0; s < 2; s++) {
                v = saved + (s ? -eps : eps);
                gpu->upload(r.e.params + off + i, &v, sizeof v);
                fsdp_params_changed(&r.e);
                fsdp_forward(&r.e, EB, ET, &l[s], err);
            }
            gpu->upload(r.e.params + off + i, &saved, sizeof saved);
            double num = (l[0] - l[1]) / (EB * ET) / (2.0 * eps), ana = grads[off + i];
            diff2 += (ana - num) * (ana - num);
            a2 += ana * ana;
            n2 += num * num;
        }
        double rel = sqrt(diff2) / (sqrt(a2) + sqrt(n2) + 1e-30);
        CHECK(a2 > 0 && rel < 5e-3, "%s: relative error %.3g", t->name, rel);
    }
    free(grads);
    rig_free(&r);
}

static void two_gpu_steps_give_the_same_bits(int bf16)
{
    double l1, l2;
    float *a = step_grads(gpu, bf16, &l1), *b = step_grads(gpu, bf16, &l2);
    REQUIRE(a && b, "a step failed");
    struct model_layout m;
    char err[FSDP_ERR_LEN];
    model_layout_init(&m, &ecfg, err);
    size_t n = 0;
    struct fsdp_comm comm;
    fsdp_comm_local_init(&comm);
    struct fsdp_engine e;
    const struct fsdp_opts o = {FSDP_SHARD_FULL, EB, 0, 0, 0, 0, 0, 0, 0};
    fsdp_init(&e, &m, cpu, &comm, &o, err);
    n = e.shard_total;
    fsdp_free(&e);
    model_layout_free(&m);
    CHECK(l1 == l2, "losses differ: %.17g %.17g", l1, l2);
    CHECK(memcmp(a, b, n * sizeof *a) == 0, "gradients differ between two identical steps");
    free(a), free(b);
}

/* The engine takes --prefetch on with NCCL (a one-rank engine copies
 * instead of calling NCCL, so this checks the plan, not the streams: the
 * next test does) and gives the same bits as off. */
static void prefetch_on_gives_the_same_bits(void)
{
    struct rig r;
    REQUIRE(rig_init(&r, gpu, 1, 1) == 0, "rig");
    const int on = r.e.prefetch;
    size_t n = r.e.shard_total;
    rig_free(&r);
    CHECK(on, "the engine did not take --prefetch on with NCCL");
    double l0, l1;
    float *a = step_grads_with(gpu, 1, 0, &l0), *b = step_grads_with(gpu, 1, 1, &l1);
    REQUIRE(a && b, "a step failed");
    CHECK(l0 == l1, "loss: prefetch off %.17g, on %.17g", l0, l1);
    CHECK(memcmp(a, b, n * sizeof *a) == 0, "gradients differ with --prefetch on");
    free(a), free(b);
}

/* NCCL's start and wait on the comm stream (comm_nccl.c), through a
 * one-rank communicator: each round the compute stream writes the input
 * (a 256 MiB copy, long enough for a collective that did not wait for it
 * to read the last round's values), the collective runs between start and
 * wait, and the compute stream copies the output (which it must not read
 * before the collective wrote it). Every round must see its own values:
 * an all-gather in two pieces, then the same through the blocking call. */
static void the_comm_stream_waits_and_is_waited_for(void)
{
    char err[FSDP_ERR_LEN];
    struct fsdp_comm c;
    fsdp_comm_local_init(&c);
    REQUIRE(fsdp_comm_nccl_init(&c, err) == 0, "%s", err);
    REQUIRE(c.start && c.wait, "no start/wait in the NCCL backend");
    const size_t n = (size_t)32 << 20, total = 2 * n; /* floats: two pieces of 128 MiB */
    float *src[2] = {randv(total, 80, 1), randv(total, 81, 1)}, *got = malloc(total * 4);
    float *gsrc[2] = {dev(src[0], total * 4), dev(src[1], total * 4)};
    float *in = dev(NULL, total * 4), *out = dev(NULL, total * 4), *chk = dev(NULL, total * 4);
    for (int round = 0; round < 6; round++) {
        const int w = round % 2;
        gpu->copy(in, gsrc[w], total);
        if (round < 4) {
            struct fsdp_coll op = {.kind = FSDP_COLL_ALLGATHER,
                                   .in = in,
                                   .out = out,
                                   .n = n,
                                   .pieces = 2,
                                   .in_stride = n,
                                   .out_stride = n};
            REQUIRE(c.start(&c, &op, err) == 0 && c.wait(&c, &op, err) == 0, "%s", err);
        } else {
            REQUIRE(c.allgather(&c, in, out, total, err) == 0, "%s", err);
        }
        gpu->copy(chk, out, total);
        gpu->download(got, chk, total * 4);
        CHECK(memcmp(got, src[w], total * 4) == 0, "round %d: the output is not its input", round);
    }
    free(src[0]), free(src[1]), free(got);
    gpu->free(gsrc[0]), gpu->free(gsrc[1]), gpu->free(in), gpu->free(out), gpu->free(chk);
    c.finalize(&c);
}

static void two_gpu_steps_give_the_same_bits_fp32(void) { two_gpu_steps_give_the_same_bits(0); }
static void two_gpu_steps_give_the_same_bits_bf16(void) { two_gpu_steps_give_the_same_bits(1); }

/* The backends, once before the first test (the GPU's start-up is the
 * process's); without a GPU the program is skipped (77). */
static int find_the_gpu(void)
{
    char err[256];
    if (fsdp_cuda_init(0, err, sizeof err) != 0) {
        printf("skip: %s\n", err);
        return 77;
    }
    cpu = fsdp_kernels_cpu();
    gpu = fsdp_kernels_cuda();
    printf("%s against %s\n", gpu->name, cpu->name);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct check_test tests[] = {
        TEST(encoder_matches_the_cpu),
        TEST(layernorm_matches_the_cpu),
        TEST(fp32_matmuls_match_the_cpu),
        TEST(bf16_matmuls_match_the_cpu),
        TEST(bf16_rounding_is_the_cpus_bit_for_bit),
        TEST(attention_matches_the_cpu),
        TEST(flash_attention_matches_the_reference),
        TEST(matmul_to_bf16_matches_the_reference),
        TEST(pointwise_kernels_match_the_cpu),
        TEST(fused_rounding_is_to_bf16_bit_for_bit),
        TEST(loss_matches_the_cpu),
        TEST(adamw_matches_the_cpu),
        TEST(engine_gradients_match_the_cpu_fp32),
        TEST(engine_gradients_match_the_cpu_bf16),
        TEST(llama_kernels_match_the_cpu),
        TEST(llama_engine_gradients_match_the_cpu),
        TEST(every_gradient_matches_finite_differences_on_the_gpu),
        TEST(two_gpu_steps_give_the_same_bits_fp32),
        TEST(two_gpu_steps_give_the_same_bits_bf16),
        TEST(prefetch_on_gives_the_same_bits),
        TEST(the_comm_stream_waits_and_is_waited_for),
    };
    return check_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv, find_the_gpu);
}
