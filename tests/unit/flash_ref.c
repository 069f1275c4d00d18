/*
 * flash_ref.c - src/cuda/flash.cu's arithmetic on the CPU (flash_ref.h).
 *
 * What matches the GPU: where values are rounded to bf16 (Q, K and V come
 * in bf16, dO on loading; P before P V and P^T dO; dS before its two
 * products; the output as it is written), the
 * tiles of 64 keys the online softmax steps through, and the formulas (P
 * from lse, D = rowsum(dO * O)). What does not: the order fp32 sums are
 * added in and expf's last bits, so the GPU is compared with a tolerance.
 */
#include "flash_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TILE 64

/* round to nearest even, as __float2bfloat16_rn (no NaN in these inputs) */
static float bf(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static float widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static uint16_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* one head's rows of dO as bf16 values, hs wide and packed */
static float *rows_bf16(const float *src, size_t stride, int T, int hs)
{
    float *r = malloc((size_t)T * hs * sizeof *r);
    for (int t = 0; t < T; t++)
        for (int d = 0; d < hs; d++)
            r[(size_t)t * hs + d] = bf(src[(size_t)t * stride + d]);
    return r;
}

/* one head's rows of Q, K or V, widened, hs wide and packed */
static float *rows_of(const uint16_t *src, size_t stride, int T, int hs)
{
    float *r = malloc((size_t)T * hs * sizeof *r);
    for (int t = 0; t < T; t++)
        for (int d = 0; d < hs; d++)
            r[(size_t)t * hs + d] = widen(src[(size_t)t * stride + d]);
    return r;
}

static float dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void forward_head(uint16_t *out16, float *lse, const float *q, const float *k,
                         const float *v, int T, int C, int hs, float scale)
{
    float x[TILE], p[TILE], *o = malloc((size_t)hs * sizeof *o);
    for (int qi = 0; qi < T; qi++) {
        float m = -INFINITY, l = 0.0f;
        memset(o, 0, (size_t)hs * sizeof *o);
        for (int k0 = 0; k0 <= qi; k0 += TILE) {
            float mx = -INFINITY;
            for (int c = 0; c < TILE; c++) {
                int kj = k0 + c;
                x[c] = kj <= qi ? dot(q + (size_t)qi * hs, k + (size_t)kj * hs, hs) * scale
                                : -INFINITY;
                mx = fmaxf(mx, x[c]);
            }
            float mnew = fmaxf(m, mx), alpha = expf(m - mnew), sum = 0.0f;
            for (int c = 0; c < TILE; c++) {
                float e = expf(x[c] - mnew);
                sum += e;
                p[c] = bf(e);
            }
            l = l * alpha + sum;
            m = mnew;
            for (int d = 0; d < hs; d++) {
                float pv = 0.0f;
                for (int c = 0; c < TILE && k0 + c <= qi; c++)
                    pv += p[c] * v[(size_t)(k0 + c) * hs + d];
                o[d] = o[d] * alpha + pv;
            }
        }
        for (int d = 0; d < hs; d++)
            out16[(size_t)qi * C + d] = bits(o[d] / l);
        lse[qi] = m + logf(l);
    }
    free(o);
}

void flash_ref_forward(uint16_t *out16, float *lse, const uint16_t *qkv16, int B, int T, int C,
                       int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const uint16_t *base = qkv16 + (size_t)b * T * C3 + (size_t)h * hs;
            float *q = rows_of(base, C3, T, hs), *k = rows_of(base + C, C3, T, hs);
            float *v = rows_of(base + 2 * C, C3, T, hs);
            forward_head(out16 + (size_t)b * T * C + (size_t)h * hs, lse + ((size_t)b * NH + h) * T,
                         q, k, v, T, C, hs, scale);
            free(q), free(k), free(v);
        }
}

/* one head: P from lse, dS = bf16(P (dP - D)); dV = P^T dO, dK = scale
 * dS^T Q, dQ = scale dS K, each summed in fp32 */
static void backward_head(float *dq, float *dk, float *dv, const float *q, const float *k,
                          const float *v, const float *dO, const float *lse, const float *D, int T,
                          int C3, int hs, float scale)
{
    float *ak = calloc((size_t)T * hs, sizeof *ak), *av = calloc((size_t)T * hs, sizeof *av);
    float *aq = calloc((size_t)T * hs, sizeof *aq);
    for (int qi = 0; qi < T; qi++)
        for (int kj = 0; kj <= qi; kj++) {
            float p = expf(dot(q + (size_t)qi * hs, k + (size_t)kj * hs, hs) * scale - lse[qi]);
            float dp = dot(dO + (size_t)qi * hs, v + (size_t)kj * hs, hs);
            float pb = bf(p), ds = bf(p * (dp - D[qi]));
            for (int d = 0; d < hs; d++) {
                av[(size_t)kj * hs + d] += pb * dO[(size_t)qi * hs + d];
                ak[(size_t)kj * hs + d] += ds * q[(size_t)qi * hs + d];
                aq[(size_t)qi * hs + d] += ds * k[(size_t)kj * hs + d];
            }
        }
    for (int t = 0; t < T; t++)
        for (int d = 0; d < hs; d++) {
            dq[(size_t)t * C3 + d] = scale * aq[(size_t)t * hs + d];
            dk[(size_t)t * C3 + d] = scale * ak[(size_t)t * hs + d];
            dv[(size_t)t * C3 + d] = av[(size_t)t * hs + d];
        }
    free(ak), free(av), free(aq);
}

void flash_ref_backward(float *dqkv, float *d, const float *dout, const uint16_t *out16,
                        const uint16_t *qkv16, const float *lse, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t bh = (size_t)b * NH + h, off = (size_t)b * T * C + (size_t)h * hs;
            for (int t = 0; t < T; t++) { /* D = dO . O, dO rounded */
                float s = 0.0f;
                for (int i = 0; i < hs; i++)
                    s += bf(dout[off + (size_t)t * C + i]) * widen(out16[off + (size_t)t * C + i]);
                d[bh * T + t] = s;
            }
            const uint16_t *base = qkv16 + (size_t)b * T * C3 + (size_t)h * hs;
            float *q = rows_of(base, C3, T, hs), *k = rows_of(base + C, C3, T, hs);
            float *v = rows_of(base + 2 * C, C3, T, hs), *dO = rows_bf16(dout + off, C, T, hs);
            float *dqh = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
            backward_head(dqh, dqh + C, dqh + 2 * C, q, k, v, dO, lse + bh * T, d + bh * T, T, C3,
                          hs, scale);
            free(q), free(k), free(v), free(dO);
        }
}

void flash_ref_matmul_to_bf16(uint16_t *out16, const uint16_t *inp, const uint16_t *w,
                              const uint16_t *bias16, size_t N, int C, int OC)
{
    for (size_t n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float s = 0.0f;
            for (int c = 0; c < C; c++)
                s += widen(inp[n * C + c]) * widen(w[(size_t)o * C + c]);
            out16[n * OC + o] = bits(s + widen(bias16[o]));
        }
}
