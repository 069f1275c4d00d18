/*
 * flash.cu - causal attention on bf16 tensor cores without the T x T
 * matrices (flash.h says what and why; tests/unit/flash_ref.c is the same
 * arithmetic on the CPU, one loop at a time).
 *
 * A block is 4 warps and owns one tile of 64 rows (queries in the forward
 * and for dQ, keys for dK and dV) of one (sequence, head); each warp owns
 * 16 of those rows. Products go through WMMA 16x16x16 fragments (bf16 in,
 * fp32 accumulated). A fragment's element layout is opaque, so the row-wise
 * work (the softmax, its backward) reads the product back from the warp's
 * own slice of shared memory, where lane l holds half of row l / 2.
 *
 * Shared memory per block, with LD = HSP + 8 (the pad spreads rows over the
 * banks) and every region on a 128-byte boundary:
 *   forward:  Q, K, V tiles (bf16, 64 x LD), scores (fp32, 4 x 16 x SLD),
 *             P (bf16, 4 x 16 x PLD)                 53 KiB at HSP 64
 *   dK, dV:   K, V, Q, dO tiles, scores, P and dS, lse and D of the tile's
 *             queries                                71.5 KiB at HSP 64
 *   dQ:       Q, dO, K, V tiles, scores, dS          62 KiB at HSP 64
 * (at HSP 128: 93, 119.5 and 110 KiB: more than the 99 KiB of sm_86 and
 * sm_89, whose runs then take heads up to 64 wide only: flash_max_hs).
 *
 * The row-wise work walks a lane's 32 columns starting at a rotation of its
 * own (col below): rows are SLD = 4 (mod 32) words apart, so 32 lanes
 * reading column j of their rows would fall on 8 banks, 4 to a bank.
 */
#include "flash.h"

#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>

using namespace nvcuda;

#ifndef FLASH_LAUNCH /* tests/unit/cuda_emu runs the kernels on CPU threads */
#define FLASH_LAUNCH(kernel, grid, threads, bytes, stream, ...)                                    \
    kernel<<<grid, threads, bytes, stream>>>(__VA_ARGS__)
#endif

namespace
{

constexpr int TILE = 64; /* queries or keys per tile */
constexpr int WARPS = 4; /* each owns 16 of the tile's rows */
constexpr int THREADS = 32 * WARPS;
constexpr int PLD = TILE + 8; /* bf16 row stride of P and dS */
constexpr int HALF_TILE = TILE / 2;

template <int HSP> struct dims {
    static constexpr int LD = HSP + 8;                        /* bf16 tiles' row stride */
    static constexpr int SLD = (HSP > TILE ? HSP : TILE) + 4; /* fp32 scores' row stride */
    static constexpr int HALF = HSP / 2;                      /* a lane's share of a row */
    static constexpr size_t tile_bytes = (size_t)TILE * LD * 2;
    static constexpr size_t scores_bytes = (size_t)WARPS * 16 * SLD * 4;
    static constexpr size_t p_bytes = (size_t)WARPS * 16 * PLD * 2;
    static constexpr size_t fwd_bytes = 3 * tile_bytes + scores_bytes + p_bytes;
    static constexpr size_t kv_bytes = 4 * tile_bytes + scores_bytes + 2 * p_bytes + 2 * TILE * 4;
    static constexpr size_t q_bytes = 4 * tile_bytes + scores_bytes + p_bytes;
    static constexpr size_t max_bytes = kv_bytes > q_bytes ? kv_bytes : q_bytes;
};

/* Column j of n (a power of two) of this lane's half of row rr, rotated
 * so that the 32 lanes of a warp read 32 different banks at each step
 * (with rows 4 words apart mod 32): 4 (rr % 8) + rr / 8 + 2 half + j. */
__device__ __forceinline__ int col(int j, int n, int rr, int half)
{
    return half * n + ((j + 2 * half + (rr >> 3)) & (n - 1));
}

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

__device__ __forceinline__ __nv_bfloat16 bf(float x) { return __float2bfloat16_rn(x); }

/* Rows t0 .. t0+63 of one head's columns (rows `stride` values apart, hs
 * wide) into a bf16 tile, zeros past T and past hs: from fp32 (dO),
 * rounded, or from bf16 (Q, K, V), copied. */
template <int HSP>
__device__ void load_tile(__nv_bfloat16 *dst, const float *src, size_t stride, int t0, int T,
                          int hs)
{
    if (hs % 4 == 0 && stride % 4 == 0 && (uintptr_t)src % 16 == 0) { /* 4 floats a load */
        for (int i = threadIdx.x; i < TILE * HSP / 4; i += THREADS) {
            int r = i / (HSP / 4), d = i % (HSP / 4) * 4;
            float4 x = {0.0f, 0.0f, 0.0f, 0.0f};
            if (t0 + r < T && d < hs)
                x = *(const float4 *)(src + (size_t)(t0 + r) * stride + d);
            __nv_bfloat16 *o = dst + r * dims<HSP>::LD + d;
            o[0] = bf(x.x), o[1] = bf(x.y), o[2] = bf(x.z), o[3] = bf(x.w);
        }
        return;
    }
    for (int i = threadIdx.x; i < TILE * HSP; i += THREADS) {
        int r = i / HSP, d = i % HSP;
        float x = (t0 + r < T && d < hs) ? src[(size_t)(t0 + r) * stride + d] : 0.0f;
        dst[r * dims<HSP>::LD + d] = bf(x);
    }
}

template <int HSP>
__device__ void load_tile(__nv_bfloat16 *dst, const uint16_t *src, size_t stride, int t0, int T,
                          int hs)
{
    if (hs % 8 == 0 && stride % 8 == 0 && (uintptr_t)src % 16 == 0) { /* 8 values a load */
        for (int i = threadIdx.x; i < TILE * HSP / 8; i += THREADS) {
            int r = i / (HSP / 8), d = i % (HSP / 8) * 8;
            uint4 x = {0u, 0u, 0u, 0u};
            if (t0 + r < T && d < hs)
                x = *(const uint4 *)(src + (size_t)(t0 + r) * stride + d);
            *(uint4 *)(dst + r * dims<HSP>::LD + d) = x;
        }
        return;
    }
    const __nv_bfloat16 *s = (const __nv_bfloat16 *)src;
    for (int i = threadIdx.x; i < TILE * HSP; i += THREADS) {
        int r = i / HSP, d = i % HSP;
        dst[r * dims<HSP>::LD + d] =
            (t0 + r < T && d < hs) ? s[(size_t)(t0 + r) * stride + d] : bf(0.0f);
    }
}

/* acc[c] = A B^T for the 16 rows of A (K wide, at a, stride lda) and the
 * N rows of B (at b, stride ldb): acc[c] holds columns 16c .. 16c+15. */
template <int K, int N>
__device__ void mm_abt(frag_c *acc, const __nv_bfloat16 *a, int lda, const __nv_bfloat16 *b,
                       int ldb)
{
#pragma unroll
    for (int c = 0; c < N / 16; c++)
        wmma::fill_fragment(acc[c], 0.0f);
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        frag_a fa;
        wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
        for (int c = 0; c < N / 16; c++) {
            frag_b_col fb; /* element (k, n) is B[16c + n][16kk + k] */
            wmma::load_matrix_sync(fb, b + (size_t)c * 16 * ldb + kk * 16, ldb);
            wmma::mma_sync(acc[c], fa, fb, acc[c]);
        }
    }
}

/* acc[c] += A B for the 16 rows of A (K wide, at a, stride lda) and B (K x
 * N, row-major at b, stride ldb). */
template <int K, int N>
__device__ void mm_ab(frag_c *acc, const __nv_bfloat16 *a, int lda, const __nv_bfloat16 *b, int ldb)
{
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        frag_a fa;
        wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
        for (int c = 0; c < N / 16; c++) {
            frag_b_row fb;
            wmma::load_matrix_sync(fb, b + (size_t)kk * 16 * ldb + c * 16, ldb);
            wmma::mma_sync(acc[c], fa, fb, acc[c]);
        }
    }
}

template <int N> __device__ void store(float *s, int sld, const frag_c *acc)
{
#pragma unroll
    for (int c = 0; c < N / 16; c++)
        wmma::store_matrix_sync(s + c * 16, acc[c], sld, wmma::mem_row_major);
    __syncwarp();
}

/* The block's shared memory: tile i (bf16, TILE x LD), the warps' scores
 * after n tiles, and the warps' P-shaped buffer j after those. */
template <int HSP> __device__ __forceinline__ __nv_bfloat16 *tile(unsigned char *m, int i)
{
    return (__nv_bfloat16 *)(m + i * dims<HSP>::tile_bytes);
}
template <int HSP> __device__ __forceinline__ float *scores(unsigned char *m, int n)
{
    return (float *)(m + n * dims<HSP>::tile_bytes);
}
template <int HSP> __device__ __forceinline__ __nv_bfloat16 *pbuf(unsigned char *m, int n, int j)
{
    return (__nv_bfloat16 *)(m + n * dims<HSP>::tile_bytes + dims<HSP>::scores_bytes +
                             j * dims<HSP>::p_bytes);
}

/* Where a thread works: its warp w, the row rr of the warp's 16 that half
 * of its lane's columns are in, the block's (sequence b, head h), and that
 * head's columns of qkv (q; k at + C, v at + 2 C), rows C3 values apart. */
struct place {
    int w, rr, half, nt, bh, b, h, hs, C3;
    const uint16_t *qkv;
};

__device__ __forceinline__ place place_of(const uint16_t *qkv, int T, int C, int NH)
{
    place p;
    p.w = threadIdx.x / 32;
    p.rr = threadIdx.x % 32 / 2;
    p.half = threadIdx.x % 2;
    p.nt = (T + TILE - 1) / TILE;
    p.bh = (int)blockIdx.x;
    p.b = p.bh / NH;
    p.h = p.bh % NH;
    p.hs = C / NH;
    p.C3 = 3 * C;
    p.qkv = qkv + (size_t)p.b * T * p.C3 + (size_t)p.h * p.hs;
    return p;
}

/* ---- forward ------------------------------------------------------------------------ */

template <int HSP>
__global__ void __launch_bounds__(THREADS)
    flash_fwd(uint16_t *out16, float *lse, const uint16_t *qkv, int T, int C, int NH, float scale)
{
    typedef dims<HSP> D;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *sQ = tile<HSP>(smem, 0), *sK = tile<HSP>(smem, 1), *sV = tile<HSP>(smem, 2);
    float *sS = scores<HSP>(smem, 3);
    __nv_bfloat16 *sP = pbuf<HSP>(smem, 3, 0);

    const place at = place_of(qkv, T, C, NH);
    const int w = at.w, rr = at.rr, half = at.half, bh = at.bh, b = at.b, h = at.h, hs = at.hs;
    const int C3 = at.C3, qt = at.nt - 1 - (int)blockIdx.y; /* longest first */
    const uint16_t *base = at.qkv;
    const int q0 = qt * TILE, qi = q0 + w * 16 + rr; /* this lane's query */
    float *s = sS + w * 16 * D::SLD;
    __nv_bfloat16 *p = sP + w * 16 * PLD;

    load_tile<HSP>(sQ, base, C3, q0, T, hs);
    float m = -INFINITY, l = 0.0f, o[D::HALF];
#pragma unroll
    for (int i = 0; i < D::HALF; i++)
        o[i] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * TILE;
        __syncthreads(); /* every warp is done with the last K and V */
        load_tile<HSP>(sK, base + C, C3, k0, T, hs);
        load_tile<HSP>(sV, base + 2 * C, C3, k0, T, hs);
        __syncthreads();
        frag_c acc[TILE / 16];
        mm_abt<HSP, TILE>(acc, sQ + w * 16 * D::LD, D::LD, sK, D::LD);
        store<TILE>(s, D::SLD, acc);
        /* the online softmax on this lane's half of row rr */
        float x[HALF_TILE], mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < HALF_TILE; j++) {
            int c = col(j, HALF_TILE, rr, half);
            x[j] = k0 + c <= qi ? s[rr * D::SLD + c] * scale : -INFINITY;
            mx = fmaxf(mx, x[j]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float mnew = fmaxf(m, mx); /* finite: key k0 <= every query of the tile */
        const float alpha = expf(m - mnew);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < HALF_TILE; j++) {
            float e = expf(x[j] - mnew);
            sum += e;
            p[rr * PLD + col(j, HALF_TILE, rr, half)] = bf(e);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = mnew;
        __syncwarp();
        frag_c pv[HSP / 16];
#pragma unroll
        for (int c = 0; c < HSP / 16; c++)
            wmma::fill_fragment(pv[c], 0.0f);
        mm_ab<TILE, HSP>(pv, p, PLD, sV, D::LD);
        store<HSP>(s, D::SLD, pv);
#pragma unroll
        for (int i = 0; i < D::HALF; i++)
            o[i] = o[i] * alpha + s[rr * D::SLD + col(i, D::HALF, rr, half)];
        __syncwarp(); /* the next tile's scores overwrite s */
    }
    if (qi >= T)
        return;
    const float inv = 1.0f / l;
    __nv_bfloat16 *dst = (__nv_bfloat16 *)out16 + ((size_t)b * T + qi) * C + (size_t)h * hs;
#pragma unroll
    for (int i = 0; i < D::HALF; i++) {
        int d = col(i, D::HALF, rr, half);
        if (d < hs)
            dst[d] = bf(o[i] * inv);
    }
    if (half == 0)
        lse[(size_t)bh * T + qi] = m + logf(l);
}

/* ---- backward ----------------------------------------------------------------------- */

/* dd[(b*NH + h)*T + t] = dO . O over the head's columns, dO rounded to bf16
 * as the products see it: one warp per row. */
__global__ void flash_dot(float *dd, const float *dout, const uint16_t *out16, int B, int T, int C,
                          int NH)
{
    size_t row = (size_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)B * NH * T)
        return;
    int t = (int)(row % T), h = (int)(row / T % NH), hs = C / NH;
    size_t b = row / T / NH, off = (b * T + t) * C + (size_t)h * hs;
    float acc = 0.0f;
    for (int d = lane; d < hs; d += 32)
        acc +=
            __bfloat162float(bf(dout[off + d])) * __uint_as_float((uint32_t)out16[off + d] << 16);
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0)
        dd[row] = acc;
}

/* Writes a warp's 16 rows (t0 + row, this lane's half of the columns) of
 * a result held in fragments to dst (rows `stride` floats apart), times k. */
template <int HSP>
__device__ void write_rows(float *dst, size_t stride, float *s, const frag_c *acc, int t, int T,
                           int hs, float k)
{
    store<HSP>(s, dims<HSP>::SLD, acc);
    const int lane = threadIdx.x % 32, rr = lane / 2, half = lane % 2;
    if (t < T)
#pragma unroll
        for (int i = 0; i < dims<HSP>::HALF; i++) {
            int d = col(i, dims<HSP>::HALF, rr, half);
            if (d < hs)
                dst[(size_t)t * stride + d] = k * s[rr * dims<HSP>::SLD + d];
        }
    __syncwarp();
}

/* dK and dV of one key tile, summed over the query tiles at and after it. */
template <int HSP>
__global__ void __launch_bounds__(THREADS)
    flash_bwd_kv(float *dqkv, const float *dout, const uint16_t *qkv, const float *lse,
                 const float *dd, int T, int C, int NH, float scale)
{
    typedef dims<HSP> D;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *sK = tile<HSP>(smem, 0), *sV = tile<HSP>(smem, 1), *sQ = tile<HSP>(smem, 2);
    __nv_bfloat16 *sdO = tile<HSP>(smem, 3);
    float *sS = scores<HSP>(smem, 4);
    __nv_bfloat16 *sP = pbuf<HSP>(smem, 4, 0), *sdS = pbuf<HSP>(smem, 4, 1);
    float *sL = (float *)pbuf<HSP>(smem, 4, 2);
    float *sD = sL + TILE;

    const place at = place_of(qkv, T, C, NH);
    const int w = at.w, rr = at.rr, half = at.half, bh = at.bh, b = at.b, h = at.h, hs = at.hs;
    const int C3 = at.C3, nt = at.nt, kt = (int)blockIdx.y; /* the first has the most */
    const uint16_t *base = at.qkv;
    const float *dob = dout + (size_t)b * T * C + (size_t)h * hs;
    const int k0 = kt * TILE, kj = k0 + w * 16 + rr; /* this lane's key */
    float *s = sS + w * 16 * D::SLD;
    __nv_bfloat16 *p = sP + w * 16 * PLD, *ds = sdS + w * 16 * PLD;

    load_tile<HSP>(sK, base + C, C3, k0, T, hs);
    load_tile<HSP>(sV, base + 2 * C, C3, k0, T, hs);
    frag_c dk[HSP / 16], dv[HSP / 16];
#pragma unroll
    for (int c = 0; c < HSP / 16; c++) {
        wmma::fill_fragment(dk[c], 0.0f);
        wmma::fill_fragment(dv[c], 0.0f);
    }
    for (int qt = kt; qt < nt; qt++) {
        const int q0 = qt * TILE;
        __syncthreads(); /* every warp is done with the last Q, dO, lse, D */
        load_tile<HSP>(sQ, base, C3, q0, T, hs);
        load_tile<HSP>(sdO, dob, C, q0, T, hs);
        for (int i = threadIdx.x; i < TILE; i += THREADS) {
            int q = q0 + i;
            sL[i] = q < T ? lse[(size_t)bh * T + q] : 0.0f;
            sD[i] = q < T ? dd[(size_t)bh * T + q] : 0.0f;
        }
        __syncthreads();
        frag_c acc[TILE / 16];
        mm_abt<HSP, TILE>(acc, sK + w * 16 * D::LD, D::LD, sQ, D::LD); /* S^T */
        store<TILE>(s, D::SLD, acc);
        float pr[HALF_TILE];
#pragma unroll
        for (int j = 0; j < HALF_TILE; j++) {
            int c = col(j, HALF_TILE, rr, half), q = q0 + c;
            pr[j] = (q >= kj && q < T) ? expf(s[rr * D::SLD + c] * scale - sL[c]) : 0.0f;
            p[rr * PLD + c] = bf(pr[j]);
        }
        __syncwarp();
        /* dS before the two products, so that pr is dead while they run */
        mm_abt<HSP, TILE>(acc, sV + w * 16 * D::LD, D::LD, sdO, D::LD); /* dP^T = V dO^T */
        store<TILE>(s, D::SLD, acc);
#pragma unroll
        for (int j = 0; j < HALF_TILE; j++) {
            int c = col(j, HALF_TILE, rr, half);
            ds[rr * PLD + c] = bf(pr[j] * (s[rr * D::SLD + c] - sD[c]));
        }
        __syncwarp();
        mm_ab<TILE, HSP>(dv, p, PLD, sdO, D::LD); /* dV += P^T dO */
        mm_ab<TILE, HSP>(dk, ds, PLD, sQ, D::LD); /* dK += dS^T Q (times scale at the end) */
    }
    float *dkv = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
    write_rows<HSP>(dkv + 2 * C, C3, s, dv, kj, T, hs, 1.0f);
    write_rows<HSP>(dkv + C, C3, s, dk, kj, T, hs, scale);
}

/* dQ of one query tile, summed over the key tiles up to it. */
template <int HSP>
__global__ void __launch_bounds__(THREADS)
    flash_bwd_q(float *dqkv, const float *dout, const uint16_t *qkv, const float *lse,
                const float *dd, int T, int C, int NH, float scale)
{
    typedef dims<HSP> D;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *sQ = tile<HSP>(smem, 0), *sdO = tile<HSP>(smem, 1), *sK = tile<HSP>(smem, 2);
    __nv_bfloat16 *sV = tile<HSP>(smem, 3);
    float *sS = scores<HSP>(smem, 4);
    __nv_bfloat16 *sdS = pbuf<HSP>(smem, 4, 0);

    const place at = place_of(qkv, T, C, NH);
    const int w = at.w, rr = at.rr, half = at.half, bh = at.bh, b = at.b, h = at.h, hs = at.hs;
    const int C3 = at.C3, qt = at.nt - 1 - (int)blockIdx.y; /* longest first */
    const uint16_t *base = at.qkv;
    const int q0 = qt * TILE, qi = q0 + w * 16 + rr; /* this lane's query */
    const float L = qi < T ? lse[(size_t)bh * T + qi] : 0.0f;
    const float Dq = qi < T ? dd[(size_t)bh * T + qi] : 0.0f;
    float *s = sS + w * 16 * D::SLD;
    __nv_bfloat16 *ds = sdS + w * 16 * PLD;

    load_tile<HSP>(sQ, base, C3, q0, T, hs);
    load_tile<HSP>(sdO, dout + (size_t)b * T * C + (size_t)h * hs, C, q0, T, hs);
    frag_c dq[HSP / 16];
#pragma unroll
    for (int c = 0; c < HSP / 16; c++)
        wmma::fill_fragment(dq[c], 0.0f);
    for (int kt = 0; kt <= qt; kt++) {
        const int k0 = kt * TILE;
        __syncthreads(); /* every warp is done with the last K and V */
        load_tile<HSP>(sK, base + C, C3, k0, T, hs);
        load_tile<HSP>(sV, base + 2 * C, C3, k0, T, hs);
        __syncthreads();
        frag_c acc[TILE / 16];
        mm_abt<HSP, TILE>(acc, sQ + w * 16 * D::LD, D::LD, sK, D::LD); /* S */
        store<TILE>(s, D::SLD, acc);
        float pr[HALF_TILE];
#pragma unroll
        for (int j = 0; j < HALF_TILE; j++) {
            int c = col(j, HALF_TILE, rr, half);
            pr[j] = k0 + c <= qi ? expf(s[rr * D::SLD + c] * scale - L) : 0.0f;
        }
        __syncwarp();
        mm_abt<HSP, TILE>(acc, sdO + w * 16 * D::LD, D::LD, sV, D::LD); /* dP = dO V^T */
        store<TILE>(s, D::SLD, acc);
#pragma unroll
        for (int j = 0; j < HALF_TILE; j++) {
            int c = col(j, HALF_TILE, rr, half);
            ds[rr * PLD + c] = bf(pr[j] * (s[rr * D::SLD + c] - Dq));
        }
        __syncwarp();
        mm_ab<TILE, HSP>(dq, ds, PLD, sK, D::LD); /* dQ += dS K (times scale at the end) */
    }
    write_rows<HSP>(dqkv + (size_t)b * T * C3 + (size_t)h * hs, C3, s, dq, qi, T, hs, scale);
}

/* ---- launches ----------------------------------------------------------------------- */

/* Raises a kernel's dynamic shared memory limit once (above 48 KiB needs
 * the opt-in); 0 when the launch may go ahead. */
template <typename K> int allow_smem(K kernel, size_t bytes, int *done)
{
    if (*done)
        return 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) !=
        cudaSuccess)
        return -1;
    *done = 1;
    return 0;
}

template <int HSP>
int forward(cudaStream_t st, uint16_t *out16, float *lse, const uint16_t *qkv, int B, int T, int C,
            int NH)
{
    typedef dims<HSP> D;
    static int done;
    const size_t bytes = D::fwd_bytes;
    if (allow_smem(flash_fwd<HSP>, bytes, &done))
        return -1;
    dim3 grid((unsigned)(B * NH), (unsigned)((T + TILE - 1) / TILE));
    FLASH_LAUNCH(flash_fwd<HSP>, grid, THREADS, bytes, st, out16, lse, qkv, T, C, NH,
                 1.0f / sqrtf((float)(C / NH)));
    return cudaPeekAtLastError() == cudaSuccess ? 0 : -1;
}

template <int HSP>
int backward(cudaStream_t st, float *dqkv, const float *dd, const float *dout, const uint16_t *qkv,
             const float *lse, int B, int T, int C, int NH)
{
    typedef dims<HSP> D;
    static int done_kv, done_q;
    const size_t kv_bytes = D::kv_bytes, q_bytes = D::q_bytes;
    if (allow_smem(flash_bwd_kv<HSP>, kv_bytes, &done_kv) ||
        allow_smem(flash_bwd_q<HSP>, q_bytes, &done_q))
        return -1;
    const float scale = 1.0f / sqrtf((float)(C / NH));
    dim3 grid((unsigned)(B * NH), (unsigned)((T + TILE - 1) / TILE));
    FLASH_LAUNCH(flash_bwd_kv<HSP>, grid, THREADS, kv_bytes, st, dqkv, dout, qkv, lse, dd, T, C, NH,
                 scale);
    FLASH_LAUNCH(flash_bwd_q<HSP>, grid, THREADS, q_bytes, st, dqkv, dout, qkv, lse, dd, T, C, NH,
                 scale);
    return cudaPeekAtLastError() == cudaSuccess ? 0 : -1;
}

} // namespace

int flash_max_hs(size_t smem_optin)
{
    if (dims<128>::max_bytes <= smem_optin && dims<128>::fwd_bytes <= smem_optin)
        return 128;
    if (dims<64>::max_bytes <= smem_optin && dims<64>::fwd_bytes <= smem_optin)
        return 64;
    if (dims<32>::max_bytes <= smem_optin && dims<32>::fwd_bytes <= smem_optin)
        return 32;
    if (dims<16>::max_bytes <= smem_optin && dims<16>::fwd_bytes <= smem_optin)
        return 16;
    return 0;
}

int flash_forward(cudaStream_t s, uint16_t *out16, float *lse, const uint16_t *qkv, int B, int T,
                  int C, int NH)
{
    const int hs = C / NH;
    if (hs <= 16)
        return forward<16>(s, out16, lse, qkv, B, T, C, NH);
    if (hs <= 32)
        return forward<32>(s, out16, lse, qkv, B, T, C, NH);
    if (hs <= 64)
        return forward<64>(s, out16, lse, qkv, B, T, C, NH);
    if (hs <= FLASH_MAX_HS)
        return forward<128>(s, out16, lse, qkv, B, T, C, NH);
    return -1;
}

int flash_backward(cudaStream_t s, float *dqkv, float *d, const float *dout, const uint16_t *out16,
                   const uint16_t *qkv, const float *lse, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    if (hs > FLASH_MAX_HS)
        return -1;
    size_t rows = (size_t)B * NH * T;
    FLASH_LAUNCH(flash_dot, dim3((unsigned)((rows + WARPS - 1) / WARPS)), THREADS, 0, s, d, dout,
                 out16, B, T, C, NH);
    if (hs <= 16)
        return backward<16>(s, dqkv, d, dout, qkv, lse, B, T, C, NH);
    if (hs <= 32)
        return backward<32>(s, dqkv, d, dout, qkv, lse, B, T, C, NH);
    if (hs <= 64)
        return backward<64>(s, dqkv, d, dout, qkv, lse, B, T, C, NH);
    return backward<128>(s, dqkv, d, dout, qkv, lse, B, T, C, NH);
}
