/*
 * kernels_cpu_isa.c - the CPU compute kernels, compiled once per instruction
 * set: OpenMP loops, and the matmuls through gemm.c (oneDNN or OpenBLAS).
 *
 * src/meson.build builds this file several times, each with its own -march
 * (x86-64, x86-64-v3, x86-64-v4 on x86-64; one build elsewhere or with
 * -Dnative=true), naming the result FSDP_ISA_FN and FSDP_ISA_NAME.
 * kernels_cpu.c picks one table when the program starts, from what the CPU
 * supports, so one binary runs on every host of a mixed fleet and still uses
 * the widest vectors of the host it lands on. Nothing outside this file is
 * compiled for more than the baseline.
 *
 * Matmuls go to fsdp_gemm (oneDNN or OpenBLAS, gemm.h), the attention's
 * per-head products to fsdp_gemm_small; everything else is a loop
 * that the compiler vectorises. Two rules keep results reproducible on one
 * kind of CPU: reductions never depend on the number of threads (each
 * output element is owned by one thread, or partial sums are taken over
 * fixed blocks and added in order), and the transcendental functions are our
 * own polynomial exp, so they vectorise and give the same bits on every run.
 * Different instruction sets round differently (FMA contraction, vector
 * width in the reductions): the same job on x86-64-v3 and x86-64-v4 kernels
 * agrees to rounding, not to the bit (--cpu-kernels forces one).
 */
#include "../kernels.h"
#include "gemm.h"
#include "util.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(FSDP_ISA_FN) || !defined(FSDP_ISA_NAME)
#error "compile with -DFSDP_ISA_FN=fsdp_kernels_cpu_NAME -DFSDP_ISA_NAME=\"name\" (src/meson.build)"
#endif

const struct fsdp_kernels *FSDP_ISA_FN(void);

/* ---- memory ---------------------------------------------------------------- */

static void *cpu_alloc(size_t bytes)
{
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p)
        memset(p, 0, n ? n : 64); /* first touch now, not in the first step */
    return p;
}

static void cpu_free(void *p) { free(p); }
/* Large fills and copies (a unit's gradient, the gradient shard) are split
 * over the threads: one thread cannot saturate memory here. */
#define PAR_MIN   (1 << 18)
#define PAR_CHUNK (1 << 16)

static void cpu_zero(float *p, size_t n)
{
    if (n < PAR_MIN) {
        memset(p, 0, n * sizeof *p);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += PAR_CHUNK)
        memset(p + i, 0, (n - i < PAR_CHUNK ? n - i : PAR_CHUNK) * sizeof *p);
}

static void cpu_copy(float *dst, const float *src, size_t n)
{
    if (n < PAR_MIN) {
        memcpy(dst, src, n * sizeof *dst);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += PAR_CHUNK)
        memcpy(dst + i, src + i, (n - i < PAR_CHUNK ? n - i : PAR_CHUNK) * sizeof *dst);
}
static void cpu_memcpy(void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

/* ---- math helpers ---------------------------------------------------------- */

/* exp(x) for float, about 1 ulp on [-87, 88]: x = n ln2 + r, |r| <= ln2/2,
 * a degree-6 polynomial for e^r, scaled by 2^n through the exponent bits.
 * Plain arithmetic, so loops calling it vectorise. */
/* min/max without libm's NaN rules, so they inline and vectorise */
static inline float clampf(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

static inline float fexp(float x)
{
    x = clampf(x, -87.0f, 88.0f);
    /* round to nearest through the 1.5 * 2^23 trick: no libm call */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        float f;
        int i;
    } s = {.i = ((int)n + 127) << 23};
    return p * s.f;
}

static inline float ftanh(float x)
{
    x = clampf(x, -9.0f, 9.0f);
    return 1.0f - 2.0f / (fexp(2.0f * x) + 1.0f);
}

/* to nearest even; a NaN stays a (quiet) NaN */
static inline uint16_t bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? (u >> 16) | 0x40u : rne);
}

/* ---- embeddings ------------------------------------------------------------ */

static void cpu_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe,
                                int B, int T, int C)
{
    if (!wpe) { /* the token embedding alone */
#pragma omp parallel for schedule(static)
        for (int bt = 0; bt < B * T; bt++)
            memcpy(out + (size_t)bt * C, wte + (size_t)tok[bt] * C, (size_t)C * sizeof *out);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float *we = wte + (size_t)tok[bt] * C, *pe = wpe + (size_t)(bt % T) * C;
        float *o = out + (size_t)bt * C;
#pragma omp simd
        for (int c = 0; c < C; c++)
            o[c] = we[c] + pe[c];
    }
}

static void cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                                 int B, int T, int C)
{
    /* Threads own channel slices, so the scatter into dwte has no races and
     * the order of additions is fixed. */
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int bt = 0; bt < B * T; bt++) {
            float *dw = dwte + (size_t)tok[bt] * C;
            const float *d = dout + (size_t)bt * C;
            for (int c = c0; c < c1; c++)
                dw[c] += d[c];
        }
        for (int t = 0; dwpe && t < T; t++) {
            float *dp = dwpe + (size_t)t * C;
            for (int b = 0; b < B; b++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                for (int c = c0; c < c1; c++)
                    dp[c] += d[c];
            }
        }
    }
}

/* ---- layernorm ------------------------------------------------------------- */

/* The forward's rows into out, or (out NULL) rounded into out16: the same
 * arithmetic either way, the store chosen once per call. */
static inline void ln_rows(float *out, uint16_t *out16, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, size_t N, int C)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        float m = 0.0f;
#pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= (float)C;
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++)
            v += (x[c] - m) * (x[c] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        if (out) {
            float *o = out + i * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] = (x[c] - m) * s * w[c] + b[c];
        } else {
            uint16_t *o = out16 + i * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] = bf16_rne((x[c] - m) * s * w[c] + b[c]);
        }
        mean[i] = m;
        rstd[i] = s;
    }
}

static void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                  const float *w, const float *b, size_t N, int C)
{
    ln_rows(out, NULL, mean, rstd, inp, w, b, N, C);
}

static void cpu_layernorm_forward_bf16(uint16_t *out16, float *mean, float *rstd, const float *inp,
                                       const float *w, const float *b, size_t N, int C)
{
    ln_rows(NULL, out16, mean, rstd, inp, w, b, N, C);
}

static void cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                   const float *inp, const float *w, const float *mean,
                                   const float *rstd, size_t N, int C)
{
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (size_t i = 0; i < N; i++) {
            const float *x = inp + i * C, *d = dout + i * C;
            float m = mean[i], s = rstd[i];
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
            for (int c = 0; c < C; c++) {
                float dn = w[c] * d[c];
                dnorm_mean += dn;
                dnorm_norm_mean += dn * (x[c] - m) * s;
            }
            dnorm_mean /= (float)C;
            dnorm_norm_mean /= (float)C;
            float *di = dinp + i * C;
#pragma omp simd
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                di[c] += (w[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
        /* parameter gradients: each thread owns a slice of channels */
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (size_t i = 0; i < N; i++) {
            const float *x = inp + i * C, *d = dout + i * C;
            float m = mean[i], s = rstd[i];
            for (int c = c0; c < c1; c++) {
                dw[c] += (x[c] - m) * s * d[c];
                db[c] += d[c];
            }
        }
    }
}

/* ---- matmul ---------------------------------------------------------------- */

static void bias_rows(float *out, const float *bias, size_t N, int OC)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++)
        memcpy(out + i * OC, bias, (size_t)OC * sizeof *out);
}

static void dbias_rows(float *dbias, const float *dout, size_t N, int OC)
{
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int o0 = (int)((long)OC * id / nt), o1 = (int)((long)OC * (id + 1) / nt);
        for (size_t i = 0; i < N; i++) {
            const float *d = dout + i * OC;
            for (int o = o0; o < o1; o++)
                dbias[o] += d[o];
        }
    }
}

static void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                               size_t N, int C, int OC)
{
    if (bias)
        bias_rows(out, bias, N, OC);
    fsdp_gemm('N', 'T', (int)N, OC, C, inp, C, w, C, bias ? 1.0f : 0.0f, out, OC);
}

static void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                                const float *inp, const float *w, size_t N, int C, int OC)
{
    if (dinp)
        fsdp_gemm('N', 'N', (int)N, C, OC, dout, OC, w, C, 0.0f, dinp, C);
    fsdp_gemm('T', 'N', OC, C, (int)N, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias)
        dbias_rows(dbias, dout, N, OC);
}

/* ---- bf16 ------------------------------------------------------------------ */

static void cpu_to_bf16(uint16_t *dst, const float *src, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_rne(src[i]);
}

static void cpu_from_bf16(float *dst, const uint16_t *src, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

/* ---- fp16 ------------------------------------------------------------------ */

/* The compiler's _Float16 where it has one (x86-64-v3 and up: one F16C
 * instruction per element; x86-64: libgcc's exact conversions), else
 * util.h's integer rounding: the same bits. */
#ifdef FSDP_HAVE_FLOAT16
static inline uint16_t fp16_round(float x)
{
    _Float16 h = (_Float16)x;
    uint16_t b;
    memcpy(&b, &h, sizeof b);
    return b;
}

static inline float fp16_widen(uint16_t b)
{
    _Float16 h;
    memcpy(&h, &b, sizeof h);
    return (float)h;
}
#else
#define fp16_round fsdp_fp16_round
#define fp16_widen fsdp_fp16_widen
#endif

static void cpu_to_fp16(uint16_t *dst, const float *src, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] = fp16_round(src[i]);
}

static void cpu_from_fp16(float *dst, const uint16_t *src, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] = fp16_widen(src[i]);
}

static void cpu_round_fp16(float *x, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] = fp16_widen(fp16_round(x[i]));
}

static uint16_t *scratch16(int slot, size_t n)
{
    uint16_t *p = fsdp_gemm_scratch(slot, n);
    if (!p) { /* reserved by fsdp_init (bf16_scratch): only a caller that did not */
        fprintf(stderr, "fsdp-train: out of memory for %zu MiB of bf16 scratch\n",
                (n * sizeof *p) >> 20);
        abort();
    }
    return p;
}

static size_t cpu_bf16_scratch(size_t n)
{
    return fsdp_gemm_scratch(0, n) ? n * sizeof(uint16_t) : 0;
}

static void cpu_matmul_forward_bf16(float *out, const uint16_t *inp, const uint16_t *w,
                                    const float *bias, size_t N, int C, int OC)
{
    if (bias)
        bias_rows(out, bias, N, OC);
    fsdp_gemm_bf16('N', 'T', (int)N, OC, C, inp, C, w, C, bias ? 1.0f : 0.0f, out, OC);
}

/* d = bf16(dout) and, when dbias is given, dbias += its column sums: one
 * pass over dout. Each thread owns a range of columns and adds the rows in
 * order, as dbias_rows does, so the sums are the same bits. */
static void round_dout(uint16_t *d, float *dbias, const float *dout, size_t N, int OC)
{
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int o0 = (int)((long)OC * id / nt), o1 = (int)((long)OC * (id + 1) / nt);
        for (size_t i = 0; i < N; i++) {
            const float *src = dout + i * OC;
            uint16_t *dst = d + i * OC;
#pragma omp simd
            for (int o = o0; o < o1; o++)
                dst[o] = bf16_rne(src[o]);
            if (dbias)
#pragma omp simd
                for (int o = o0; o < o1; o++)
                    dbias[o] += src[o];
        }
    }
}

/* The products of matmul_backward_bf16 on a dout already in bf16 */
static void cpu_matmul_backward_from_bf16(float *dinp, float *dw, const uint16_t *d,
                                          const uint16_t *inp, const uint16_t *w, size_t N, int C,
                                          int OC)
{
    if (dinp)
        fsdp_gemm_bf16('N', 'N', (int)N, C, OC, d, OC, w, C, 0.0f, dinp, C);
    fsdp_gemm_bf16_rows('T', 'N', OC, C, (int)N, d, OC, inp, C, 1.0f, dw, C);
}

/* The rounded dout goes through the scratch fsdp_init reserved (a block's
 * widest, B*T x 4C) in chunks of rows: the head's (B*T x vocabulary, 824
 * MiB for gpt2-124m at 8 x 1024) would need a scratch of its own size. A
 * chunked weight gradient adds its chunks in order, so it is as
 * reproducible as one product; dinp's rows and dbias are the same bits. */
static void cpu_matmul_backward_bf16(float *dinp, float *dw, float *dbias, const float *dout,
                                     const uint16_t *inp, const uint16_t *w, size_t N, int C,
                                     int OC)
{
    size_t rows = fsdp_gemm_scratch_held(0) / (size_t)OC;
    rows = rows >= N ? N : rows ? rows : 1;
    uint16_t *d = scratch16(0, rows * (size_t)OC);
    for (size_t r0 = 0; r0 < N; r0 += rows) {
        const size_t n = N - r0 < rows ? N - r0 : rows;
        /* dbias from the fp32 gradient, as in fp32 */
        round_dout(d, dbias, dout + r0 * (size_t)OC, n, OC);
        cpu_matmul_backward_from_bf16(dinp ? dinp + r0 * (size_t)C : NULL, dw, d,
                                      inp + r0 * (size_t)C, w, n, C, OC);
    }
}

/* ---- attention ------------------------------------------------------------- */

/* Rows (and in the backward, columns) are processed in blocks so the
 * products skip the masked upper triangle beyond each block's diagonal:
 * 10 of the 16 blocks at T = 256. */
#define ATT_BLOCK 64

/* Row t of a softmax (or its gradient) is read by the products up to the
 * end of t's block of rows: the columns past it, in the masked upper
 * triangle, are neither written nor read. */
static inline int att_row_end(int t, int T)
{
    int end = (t / ATT_BLOCK + 1) * ATT_BLOCK;
    return end < T ? end : T;
}

/* Query head h of a row of qkv, [q (NH heads) | k (KVH) | v (KVH)], reads
 * K/V head h / (NH / KVH); rows are S = (NH + 2 KVH) HS floats apart. With
 * KVH = NH (GPT-2) these are the products of plain multi-head attention. */
static void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                                  int KVH, int hs)
{
    const int Cq = NH * hs, Ckv = KVH * hs, S = Cq + 2 * Ckv, grp = NH / KVH;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *row = qkv + (size_t)b * T * S;
            const float *q = row + (size_t)h * hs;
            const float *k = row + Cq + (size_t)(h / grp) * hs, *v = k + Ckv;
            float *A = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * Cq + (size_t)h * hs;
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
                fsdp_gemm_small('N', 'T', r1 - r0, r1, hs, scale, q + (size_t)r0 * S, S, k, S, 0.0f,
                                A + (size_t)r0 * T, T);
            }
            for (int t = 0; t < T; t++) {
                float *a = A + (size_t)t * T;
                float mx = -INFINITY;
                /* max is exact in any order: lanes give the same bits (a
                 * scalar chain of compares was 65% of this kernel) */
#pragma omp simd reduction(max : mx)
                for (int t2 = 0; t2 <= t; t2++)
                    mx = a[t2] > mx ? a[t2] : mx;
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = fexp(a[t2] - mx);
                    sum += a[t2];
                }
                float inv = 1.0f / sum;
#pragma omp simd
                for (int t2 = 0; t2 <= t; t2++)
                    a[t2] *= inv;
                /* the products read a row up to its block's end only */
                for (int t2 = t + 1; t2 < att_row_end(t, T); t2++)
                    a[t2] = 0.0f;
            }
            for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
                fsdp_gemm_small('N', 'N', r1 - r0, hs, r1, 1.0f, A + (size_t)r0 * T, T, v, S, 0.0f,
                                o + (size_t)r0 * Cq, Cq);
            }
        }
    }
}

/* One thread per (sequence, K/V head): the query heads that share a K/V
 * head add their dK and dV in order (the first overwrites), so the sums do
 * not depend on the threads. */
static void cpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                                   const float *att, int B, int T, int NH, int KVH, int hs)
{
    const int Cq = NH * hs, Ckv = KVH * hs, S = Cq + 2 * Ckv, grp = NH / KVH;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int kh = 0; kh < KVH; kh++) {
            for (int j = 0; j < grp; j++) {
                const int h = kh * grp + j;
                const float acc = j ? 1.0f : 0.0f; /* dK, dV: the group's sum */
                const size_t ro = (size_t)b * T * S;
                const float *q = qkv + ro + (size_t)h * hs;
                const float *k = qkv + ro + Cq + (size_t)kh * hs, *v = k + Ckv;
                float *dq = dqkv + ro + (size_t)h * hs;
                float *dk = dqkv + ro + Cq + (size_t)kh * hs, *dv = dk + Ckv;
                const float *A = att + ((size_t)b * NH + h) * T * T;
                float *dA = datt + ((size_t)b * NH + h) * T * T;
                const float *d = dout + (size_t)b * T * Cq + (size_t)h * hs;
                /* dA = dout V^T (lower blocks only) */
                for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                    int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
                    fsdp_gemm_small('N', 'T', r1 - r0, r1, hs, 1.0f, d + (size_t)r0 * Cq, Cq, v, S,
                                    0.0f, dA + (size_t)r0 * T, T);
                }
                /* dV = A^T dout: key block [c0, c1) gets queries c0 .. T-1 only */
                for (int c0 = 0; c0 < T; c0 += ATT_BLOCK) {
                    int c1 = c0 + ATT_BLOCK < T ? c0 + ATT_BLOCK : T;
                    fsdp_gemm_small('T', 'N', c1 - c0, hs, T - c0, 1.0f, A + (size_t)c0 * T + c0, T,
                                    d + (size_t)c0 * Cq, Cq, acc, dv + (size_t)c0 * S, S);
                }
                /* softmax backward, in place: dpre = A * (dA - sum(A * dA)) * scale */
                for (int t = 0; t < T; t++) {
                    const float *a = A + (size_t)t * T;
                    float *g = dA + (size_t)t * T;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int t2 = 0; t2 <= t; t2++)
                        dot += a[t2] * g[t2];
#pragma omp simd
                    for (int t2 = 0; t2 <= t; t2++)
                        g[t2] = a[t2] * (g[t2] - dot) * scale;
                    for (int t2 = t + 1; t2 < att_row_end(t, T); t2++)
                        g[t2] = 0.0f;
                }
                /* dQ = dpre K, dK = dpre^T Q, over the lower triangle's blocks */
                for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
                    int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
                    fsdp_gemm_small('N', 'N', r1 - r0, hs, r1, 1.0f, dA + (size_t)r0 * T, T, k, S,
                                    0.0f, dq + (size_t)r0 * S, S);
                    fsdp_gemm_small('T', 'N', r1 - r0, hs, T - r0, 1.0f, dA + (size_t)r0 * T + r0,
                                    T, q + (size_t)r0 * S, S, acc, dk + (size_t)r0 * S, S);
                }
            }
        }
    }
}

/* ---- pointwise ------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

static inline float gelu(float x)
{
    return 0.5f * x * (1.0f + ftanh(GELU_K * (x + 0.044715f * x * x * x)));
}

static void cpu_gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = gelu(inp[i]);
}

static void cpu_gelu_forward_bf16(uint16_t *out16, const float *inp, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        out16[i] = bf16_rne(gelu(inp[i]));
}

static void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = ftanh(u);
        float sech2 = 1.0f - th * th;
        float g =
            0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

static void cpu_residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* ---- the Llama family's ------------------------------------------------------ */

/* RMSNorm's rows into out, or (out NULL) rounded into out16, as ln_rows */
static inline void rms_rows(float *out, uint16_t *out16, float *rstd, const float *inp,
                            const float *w, size_t N, int C, float eps)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++)
            ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / (float)C + eps);
        if (out) {
            float *o = out + i * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] = x[c] * s * w[c];
        } else {
            uint16_t *o = out16 + i * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] = bf16_rne(x[c] * s * w[c]);
        }
        rstd[i] = s;
    }
}

static void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, size_t N,
                                int C, float eps)
{
    rms_rows(out, NULL, rstd, inp, w, N, C, eps);
}

static void cpu_rmsnorm_forward_bf16(uint16_t *out16, float *rstd, const float *inp, const float *w,
                                     size_t N, int C, float eps)
{
    rms_rows(NULL, out16, rstd, inp, w, N, C, eps);
}

/* y = x s w with s = (mean(x^2) + eps)^-1/2: dx = s (w d) - x s^3 mean(w d x) */
static void cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                 const float *w, const float *rstd, size_t N, int C)
{
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (size_t i = 0; i < N; i++) {
            const float *x = inp + i * C, *d = dout + i * C;
            const float s = rstd[i];
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int c = 0; c < C; c++)
                dot += w[c] * d[c] * x[c];
            const float k = s * s * s * dot / (float)C;
            float *di = dinp + i * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                di[c] += s * w[c] * d[c] - x[c] * k;
        }
        /* the weight's gradient: each thread owns a slice of channels */
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (size_t i = 0; i < N; i++) {
            const float *x = inp + i * C, *d = dout + i * C;
            const float s = rstd[i];
            for (int c = c0; c < c1; c++)
                dw[c] += x[c] * s * d[c];
        }
    }
}

static void cpu_rope(float *x, const float *cs, const float *sn, int B, int T, int NROT, int HS,
                     int stride, int inverse)
{
    const int half = HS / 2;
    const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < (size_t)B * T; r++) {
        const size_t t = r % (size_t)T;
        const float *c = cs + t * half, *s = sn + t * half;
        float *row = x + r * (size_t)stride;
        for (int h = 0; h < NROT; h++) {
            float *a = row + (size_t)h * HS, *b = a + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float x1 = a[i], x2 = b[i], si = sign * s[i];
                a[i] = x1 * c[i] - x2 * si;
                b[i] = x2 * c[i] + x1 * si;
            }
        }
    }
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + fexp(-x)); }

static inline void swiglu_rows(float *out, uint16_t *out16, const float *inp, size_t N, int F)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *g = inp + i * 2 * F, *u = g + F;
        if (out) {
            float *o = out + i * F;
#pragma omp simd
            for (int j = 0; j < F; j++)
                o[j] = g[j] * sigmoid(g[j]) * u[j];
        } else {
            uint16_t *o = out16 + i * F;
#pragma omp simd
            for (int j = 0; j < F; j++)
                o[j] = bf16_rne(g[j] * sigmoid(g[j]) * u[j]);
        }
    }
}

static void cpu_swiglu_forward(float *out, const float *inp, size_t N, int F)
{
    swiglu_rows(out, NULL, inp, N, F);
}

static void cpu_swiglu_forward_bf16(uint16_t *out16, const float *inp, size_t N, int F)
{
    swiglu_rows(NULL, out16, inp, N, F);
}

/* SwiGLU's backward over n columns of one row, d silu(g)/dg = s (1 + g (1 -
 * s)), s = sigmoid(g). Both kernels below call this
 * one compiled copy: the compiler contracts a*b+c into FMAs as each loop's
 * context suggests, so an inlined copy in each could round differently
 * (one value in a million was a bf16 step off) */
__attribute__((noinline)) static void swiglu_bwd_span(float *dg, float *du, const float *g,
                                                      const float *u, const float *d, int n)
{
#pragma omp simd
    for (int j = 0; j < n; j++) {
        const float s = sigmoid(g[j]);
        du[j] = d[j] * g[j] * s;
        dg[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    }
}

static void cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, size_t N, int F)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *g = inp + i * 2 * F;
        float *dg = dinp + i * 2 * F;
        swiglu_bwd_span(dg, dg + F, g, g + F, dout + i * F, F);
    }
}

/* cpu_swiglu_backward's values rounded to bf16 as they are written: the
 * same bits as to_bf16 after it */
static void cpu_swiglu_backward_bf16(uint16_t *dinp16, const float *inp, const float *dout,
                                     size_t N, int F)
{
    enum { SPAN = 512 };
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float dg[SPAN], du[SPAN];
        const float *g = inp + i * 2 * F, *d = dout + i * F;
        uint16_t *out = dinp16 + i * 2 * F;
        for (int j0 = 0; j0 < F; j0 += SPAN) {
            const int n = F - j0 < SPAN ? F - j0 : SPAN;
            swiglu_bwd_span(dg, du, g + j0, g + F + j0, d + j0, n);
#pragma omp simd
            for (int j = 0; j < n; j++) {
                out[j0 + j] = bf16_rne(dg[j]);
                out[F + j0 + j] = bf16_rne(du[j]);
            }
        }
    }
}

static void cpu_add(float *dst, const float *src, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* dst += src rounded to bf16: the bits of to_bf16, from_bf16 and add, in one
 * pass over memory instead of three */
static void cpu_add_bf16_rounded(float *dst, const float *src, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)bf16_rne(src[i]) << 16;
        float r;
        memcpy(&r, &u, sizeof r);
        dst[i] += r;
    }
}

/* ---- loss ------------------------------------------------------------------ */

/* Two passes over a row's logits (the maximum, then the sum of exponentials
 * under it); nothing is written but the row's lse and loss. */
static void cpu_crossentropy_forward(float *losses, float *lse, const float *logits,
                                     const int32_t *targets, size_t N, int V, int Vp)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *row = logits + i * Vp;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < V; j++)
            sum += fexp(row[j] - mx);
        lse[i] = mx + logf(sum);
        losses[i] = lse[i] - row[targets[i]];
    }
}

static void cpu_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                                      const int32_t *targets, float dloss, size_t N, int V, int Vp)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const float *x = logits + i * Vp;
        float *d = dlogits + i * Vp;
        const float l = lse[i];
        const int t = targets[i];
#pragma omp simd
        for (int j = 0; j < V; j++)
            d[j] = (fexp(x[j] - l) - (j == t ? 1.0f : 0.0f)) * dloss;
        for (int j = V; j < Vp; j++)
            d[j] = 0.0f;
    }
}

/* ---- optimizer ------------------------------------------------------------- */

static void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                      float beta2, float eps, float wd, float bc1, float bc2, float gscale)
{
    /* lr * mhat / (sqrt(vhat) + eps) with the bias corrections folded into
     * scalars (as torch.optim.AdamW does): one division and one square root
     * per element instead of three and one; the loop was bound by them */
    const float step = lr / bc1, rsqrt_bc2 = 1.0f / sqrtf(bc2), decay = lr * wd;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= step * mi / (sqrtf(vi) * rsqrt_bc2 + eps) + decay * p[i];
    }
}

/* Sixteen fixed blocks summed in order: the same bits for any thread count. */
static double cpu_sumsq(const float *x, size_t n)
{
    enum { NB = 16 };
    double part[NB];
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < NB; blk++) {
        size_t i0 = n * blk / NB, i1 = n * (blk + 1) / NB;
        double s = 0.0;
#pragma omp simd reduction(+ : s) /* lanes in a fixed order: the same bits every run */
        for (size_t i = i0; i < i1; i++)
            s += (double)x[i] * x[i];
        part[blk] = s;
    }
    double s = 0.0;
    for (int blk = 0; blk < NB; blk++)
        s += part[blk];
    return s;
}

static const struct fsdp_kernels cpu_kernels = {
    .name = "cpu " FSDP_ISA_NAME,
    .on_device = 0,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_forward_bf16 = cpu_layernorm_forward_bf16,
    .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .to_fp16 = cpu_to_fp16,
    .from_fp16 = cpu_from_fp16,
    .round_fp16 = cpu_round_fp16,
    .matmul_forward_bf16 = cpu_matmul_forward_bf16,
    .matmul_backward_bf16 = cpu_matmul_backward_bf16,
    .matmul_backward_from_bf16 = cpu_matmul_backward_from_bf16,
    .bf16_scratch = cpu_bf16_scratch,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_forward_bf16 = cpu_gelu_forward_bf16,
    .gelu_backward = cpu_gelu_backward,
    .residual_forward = cpu_residual_forward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_forward_bf16 = cpu_rmsnorm_forward_bf16,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope = cpu_rope,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_forward_bf16 = cpu_swiglu_forward_bf16,
    .swiglu_backward = cpu_swiglu_backward,
    .swiglu_backward_bf16 = cpu_swiglu_backward_bf16,
    .crossentropy_forward = cpu_crossentropy_forward,
    .crossentropy_backward = cpu_crossentropy_backward,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .add = cpu_add,
    .add_bf16_rounded = cpu_add_bf16_rounded,
};

const struct fsdp_kernels *FSDP_ISA_FN(void) { return &cpu_kernels; }
