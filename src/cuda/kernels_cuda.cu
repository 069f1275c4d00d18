/*
 * kernels_cuda.cu - the CUDA compute backend: struct fsdp_kernels on one GPU.
 *
 * Every kernel runs on one compute stream per process (g.stream), in the
 * order the engine calls it (NCCL's collectives on a comm stream of their
 * own: comm_nccl.c); the host waits only in download (the loss, the
 * gradient norm, a checkpoint's state) and upload. Matmuls are cuBLAS: fp32
 * with fp32 math (no TF32), or bf16 operands with fp32 accumulation and
 * fp32 outputs (the CPU backend's contract, kernels.h). Attention in fp32
 * keeps the CPU's contract too: the softmax is stored in att (B, NH, T, T)
 * for the backward pass, and the products are strided batched GEMMs
 * straight on qkv; bf16 runs take flash.cu's kernels, which keep one
 * log-sum-exp per row instead.
 *
 * Every reduction has a fixed order (fixed block counts, in-block trees,
 * partial sums added in order): the same inputs give the same bits on the
 * same GPU, so a resumed run repeats its losses exactly. No atomics.
 *
 * Errors inside a kernel sequence cannot be returned through the kernel
 * table (the CPU one has none); a failed CUDA or cuBLAS call is reported
 * with its place and the process exits, which the supervisor treats as a
 * crashed rank. Allocation failures return NULL as on the CPU.
 *
 * Built into libfsdp-cuda.so, which fsdp-train loads for --device cuda
 * (module.h, cuda_load.c).
 */
#include "flash.h"
#include "module.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct {
    int dev, major, minor, tf32;
    size_t smem_optin; /* shared memory a block may opt in to (flash.cu) */
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *lt_ws; /* cuBLASLt's workspace */
    pthread_t main_thread;
    char desc[160];
    size_t live, peak;
    void *scratch[4]; /* grown on demand: see scratch() */
    size_t scratch_bytes[4];
    double *partial;         /* sumsq */
    int (*watch)(void *arg); /* comm_nccl.c: 1 when NCCL failed (then it aborted) */
    void *watch_arg;
} g;

static void die(const char *what, const char *why, const char *file, int line)
{
    fprintf(stderr, "fsdp-train: CUDA: %s failed: %s (%s:%d)\n", what, why, file, line);
    exit(1);
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess)                                                                     \
            die(#x, cudaGetErrorString(e_), __FILE__, __LINE__);                                   \
    } while (0)
#define CB(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            die(#x, cublasGetStatusString(s_), __FILE__, __LINE__);                                \
    } while (0)
#define LAUNCHED() CK(cudaGetLastError())

static unsigned blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535u * 16u ? (b ? b : 1) : 65535u * 16u);
}

/* The async checkpoint writer copies from its own thread: it needs the
 * device selected there, and a stream of its own that waits for the work
 * queued on the compute stream so far. */
static cudaStream_t stream_here(void)
{
    static __thread cudaStream_t side;
    static __thread cudaEvent_t ev;
    if (pthread_equal(pthread_self(), g.main_thread))
        return g.stream;
    CK(cudaSetDevice(g.dev));
    if (!side) {
        CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    }
    CK(cudaEventRecord(ev, g.stream));
    CK(cudaStreamWaitEvent(side, ev, 0));
    return side;
}

/* FSDP_CUDA_PROFILE=1: GPU time per kernel-table entry (outermost calls
 * only), measured with events around each call, printed at exit. Each call
 * then waits for the GPU, so the step gets slower; the shares are what
 * matters. */
static struct {
    int on, depth;
    cudaEvent_t a, b;
    const char *name[32];
    double ms[32];
    long calls[32];
} prof;

static void prof_report(void)
{
    double total = 0;
    for (int i = 0; i < 32 && prof.name[i]; i++)
        total += prof.ms[i];
    fprintf(stderr, "fsdp-train: CUDA profile (GPU time per kernel entry):\n");
    for (;;) { /* largest first */
        int best = -1;
        for (int i = 0; i < 32 && prof.name[i]; i++)
            if (prof.calls[i] >= 0 && (best < 0 || prof.ms[i] > prof.ms[best]))
                best = i;
        if (best < 0)
            break;
        fprintf(stderr, "  %-30s %10.1f ms %5.1f%% %8ld calls\n", prof.name[best], prof.ms[best],
                total > 0 ? 100 * prof.ms[best] / total : 0.0, prof.calls[best]);
        prof.calls[best] = -1;
    }
}

/* not exported from the module */
namespace
{
struct prof_scope {
    const char *name;
    int outer;
    explicit prof_scope(const char *n) : name(n), outer(0)
    {
        if (!prof.on || !pthread_equal(pthread_self(), g.main_thread) || prof.depth++ > 0)
            return;
        outer = 1;
        CK(cudaEventRecord(prof.a, g.stream));
    }
    ~prof_scope()
    {
        if (!outer) {
            if (prof.on && pthread_equal(pthread_self(), g.main_thread))
                prof.depth--;
            return;
        }
        prof.depth--;
        CK(cudaEventRecord(prof.b, g.stream));
        CK(cudaEventSynchronize(prof.b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, prof.a, prof.b));
        int i = 0;
        while (i < 31 && prof.name[i] && prof.name[i] != name)
            i++;
        prof.name[i] = name;
        prof.ms[i] += ms;
        prof.calls[i]++;
    }
};
} // namespace
#define PROF(n) prof_scope prof_scope_(n)

/* ---- memory ------------------------------------------------------------------------ */

static void *cu_alloc(size_t bytes)
{
    void *p = NULL;
    size_t n = bytes ? (bytes + 255) & ~(size_t)255 : 256;
    if (cudaMalloc(&p, n + 256) != cudaSuccess) { /* room for the size */
        cudaGetLastError();
        return NULL;
    }
    CK(cudaMemsetAsync(p, 0, n + 256, g.stream)); /* the compute stream is non-blocking: */
    CK(cudaMemcpyAsync(p, &n, sizeof n, cudaMemcpyHostToDevice, g.stream));
    CK(cudaStreamSynchronize(g.stream)); /* order explicitly, then hand it out */
    g.live += n;
    if (g.live > g.peak)
        g.peak = g.live;
    return (char *)p + 256;
}

static void cu_free(void *p)
{
    if (!p)
        return;
    size_t n = 0;
    char *base = (char *)p - 256;
    CK(cudaStreamSynchronize(g.stream)); /* queued kernels may still read it */
    CK(cudaMemcpy(&n, base, sizeof n, cudaMemcpyDeviceToHost));
    g.live -= n;
    CK(cudaFree(base));
}

static void *cu_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    memset(p, 0, bytes ? bytes : 1);
    return p;
}

static void cu_host_free(void *p)
{
    if (p)
        CK(cudaFreeHost(p));
}

static void cu_zero(float *p, size_t n)
{
    PROF("zero");
    CK(cudaMemsetAsync(p, 0, n * sizeof *p, g.stream));
}

static void cu_copy(float *dst, const float *src, size_t n)
{
    PROF("copy");
    CK(cudaMemcpyAsync(dst, src, n * sizeof *dst, cudaMemcpyDeviceToDevice, g.stream));
}

/* Waits for a stream the way NCCL asks: a peer that died leaves this
 * rank's collective kernels spinning forever, so instead of blocking in
 * cudaStreamSynchronize the host polls the stream and NCCL's asynchronous
 * error; on an error comm_nccl.c aborts the communicator and the rank exits
 * (the supervisor restarts the job). A rank that hangs without an error
 * stops its progress counter here, which is what fsdp-super watches. */
static void wait_stream(cudaStream_t s)
{
    if (!g.watch) {
        CK(cudaStreamSynchronize(s));
        return;
    }
    for (unsigned spins = 0;; spins++) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            CK(e);
        if (g.watch(g.watch_arg)) { /* one thread exits; another that saw it too waits */
            static int exiting;
            if (__atomic_exchange_n(&exiting, 1, __ATOMIC_SEQ_CST) == 0)
                exit(1);
            for (;;)
                pause();
        }
        if (spins > 64)
            usleep(50);
    }
}

extern "C" __attribute__((visibility("hidden"))) void fsdp_cudamod_watch(int (*watch)(void *arg),
                                                                         void *arg)
{
    g.watch_arg = arg;
    g.watch = watch;
}

static void cu_upload(void *dst, const void *src, size_t bytes)
{
    cudaStream_t s = stream_here();
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    wait_stream(s);
}

static void cu_download(void *dst, const void *src, size_t bytes)
{
    cudaStream_t s = stream_here();
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    wait_stream(s);
}

/* Scratch of the backend's own (bf16 operands, partial sums), grown when
 * a call needs more; NULL when out of memory. */
static void *scratch_try(int slot, size_t bytes)
{
    if (g.scratch_bytes[slot] >= bytes)
        return g.scratch[slot];
    if (g.scratch[slot])
        cu_free(g.scratch[slot]);
    g.scratch_bytes[slot] = 0;
    g.scratch[slot] = cu_alloc(bytes);
    if (g.scratch[slot])
        g.scratch_bytes[slot] = bytes;
    return g.scratch[slot];
}

/* The same inside a kernel sequence, which has no way to fail: reserved
 * ahead (bf16_scratch) or small. */
static void *scratch(int slot, size_t bytes)
{
    if (!scratch_try(slot, bytes)) {
        fprintf(stderr, "fsdp-train: CUDA: out of device memory for %zu MiB of scratch\n",
                bytes >> 20);
        exit(1);
    }
    return g.scratch[slot];
}
enum { S_BF16_A, S_PARTIAL, S_PARTIAL2, S_WIDE };

/* ---- reductions -------------------------------------------------------------------- */

/* bf16 bits of x, to nearest even, NaN stays NaN: the CPU's rounding, bit
 * for bit (to_bf16 and the kernels that write a bf16 copy) */
__device__ static uint16_t rne_bf16(float x)
{
    uint32_t u = __float_as_uint(x);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? (u >> 16) | 0x40u : rne);
}

/* an output element: fp32, or its bf16 rounding */
__device__ static void put(float *o, float v) { *o = v; }
__device__ static void put(uint16_t *o, float v) { *o = rne_bf16(v); }

__device__ static float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum or max (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. */
__device__ static float block_reduce(float v, int is_max)
{
    __shared__ float part[32];
    __shared__ float result;
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0)
        part[w] = v;
    __syncthreads();
    if (w == 0) {
        float x = lane < nw ? part[lane] : (is_max ? -INFINITY : 0.0f);
        x = is_max ? warp_max(x) : warp_sum(x);
        if (lane == 0)
            result = x;
    }
    __syncthreads();
    float r = result;
    __syncthreads(); /* part and result may be reused by the next call */
    return r;
}

/* Column sums over row ranges, in two fixed stages: partial[s][c] over the
 * s-th range of rows, then dst[c] += sum over s in order. */
static int col_splits(size_t N)
{
    size_t s = N / 256;
    return (int)(s < 1 ? 1 : s > 128 ? 128 : s);
}

__global__ static void colsum_finish(float *dst, const float *partial, int S, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = 0.0f;
    for (int i = 0; i < S; i++)
        s += partial[(size_t)i * C + c];
    dst[c] += s;
}

/* dbias partials: 32 columns x 8 row lanes per block */
__global__ static void dbias_partial(float *partial, const float *dout, size_t N, int OC, int S)
{
    __shared__ float acc[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, s = blockIdx.y;
    size_t r0 = N * s / S, r1 = N * (s + 1) / S;
    float v = 0.0f;
    if (c < OC)
        for (size_t r = r0 + threadIdx.y; r < r1; r += 8)
            v += dout[r * OC + c];
    acc[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++)
            t += acc[y][threadIdx.x];
        partial[(size_t)s * OC + c] = t;
    }
}

static void dbias_rows(float *dbias, const float *dout, size_t N, int OC)
{
    int S = col_splits(N);
    float *partial = (float *)scratch(S_PARTIAL, (size_t)S * OC * sizeof(float));
    dbias_partial<<<dim3((OC + 31) / 32, S), dim3(32, 8), 0, g.stream>>>(partial, dout, N, OC, S);
    LAUNCHED();
    colsum_finish<<<(OC + 255) / 256, 256, 0, g.stream>>>(dbias, partial, S, OC);
    LAUNCHED();
}

/* ---- embeddings -------------------------------------------------------------------- */

__global__ static void encoder_forward_k(float *out, const int32_t *tok, const float *wte,
                                         const float *wpe, int BT, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)BT * C;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C, c = i % C;
        out[i] = wte[(size_t)tok[bt] * C + c] + (wpe ? wpe[(bt % T) * C + c] : 0.0f);
    }
}

static void cu_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe,
                               int B, int T, int C)
{
    PROF("encoder_forward");
    size_t n = (size_t)B * T * C;
    encoder_forward_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(out, tok, wte, wpe, B * T, T, C);
    LAUNCHED();
}

/* dwte: thread (c, bucket) adds, in token order, the rows whose token falls
 * in its bucket; no two threads touch one element, so no atomics and a
 * fixed order. Tokens pass through shared memory in tiles. */
#define ENC_BUCKETS 64
__global__ static void encoder_backward_wte(float *dwte, const float *dout, const int32_t *tok,
                                            int BT, int C)
{
    __shared__ int32_t tile[1024];
    int c = blockIdx.x * 32 + threadIdx.x;
    int bucket = blockIdx.y * 8 + threadIdx.y;
    int tid = threadIdx.y * 32 + threadIdx.x;
    for (int t0 = 0; t0 < BT; t0 += 1024) {
        int n = BT - t0 < 1024 ? BT - t0 : 1024;
        __syncthreads();
        for (int i = tid; i < n; i += 256)
            tile[i] = tok[t0 + i];
        __syncthreads();
        if (c >= C)
            continue;
        for (int i = 0; i < n; i++) {
            int v = tile[i];
            if (v % ENC_BUCKETS == bucket)
                dwte[(size_t)v * C + c] += dout[(size_t)(t0 + i) * C + c];
        }
    }
}

__global__ static void encoder_backward_wpe(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C)
        return;
    size_t t = i / C, c = i % C;
    float s = 0.0f;
    for (int b = 0; b < B; b++)
        s += dout[((size_t)b * T + t) * C + c];
    dwpe[i] += s;
}

static void cu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                                int B, int T, int C)
{
    PROF("encoder_backward");
    encoder_backward_wte<<<dim3((C + 31) / 32, ENC_BUCKETS / 8), dim3(32, 8), 0, g.stream>>>(
        dwte, dout, tok, B * T, C);
    LAUNCHED();
    if (!dwpe) /* no position embedding (Llama) */
        return;
    size_t n = (size_t)T * C;
    encoder_backward_wpe<<<(unsigned)((n + 255) / 256), 256, 0, g.stream>>>(dwpe, dout, B, T, C);
    LAUNCHED();
}

/* ---- layernorm --------------------------------------------------------------------- */

/* one warp per row; O: float, or uint16_t for the bf16 copy */
template <typename O>
__global__ static void layernorm_forward_k(O *out, float *mean, float *rstd, const float *inp,
                                           const float *w, const float *b, size_t N, int C)
{
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const float *x = inp + row * C;
    float m = 0.0f;
    for (int c = lane; c < C; c += 32)
        m += x[c];
    m = warp_sum(m) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32)
        v += (x[c] - m) * (x[c] - m);
    v = warp_sum(v) / (float)C;
    float s = rsqrtf(v + 1e-5f);
    O *o = out + row * C;
    for (int c = lane; c < C; c += 32)
        put(&o[c], (x[c] - m) * s * w[c] + b[c]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

static void cu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, size_t N, int C)
{
    PROF("layernorm_forward");
    layernorm_forward_k<<<(unsigned)((N + 7) / 8), 256, 0, g.stream>>>(out, mean, rstd, inp, w, b,
                                                                       N, C);
    LAUNCHED();
}

static void cu_layernorm_forward_bf16(uint16_t *out16, float *mean, float *rstd, const float *inp,
                                      const float *w, const float *b, size_t N, int C)
{
    PROF("layernorm_forward_bf16");
    layernorm_forward_k<<<(unsigned)((N + 7) / 8), 256, 0, g.stream>>>(out16, mean, rstd, inp, w, b,
                                                                       N, C);
    LAUNCHED();
}

__global__ static void layernorm_backward_dinp(float *dinp, const float *dout, const float *inp,
                                               const float *w, const float *mean, const float *rstd,
                                               size_t N, int C)
{
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const float *x = inp + row * C, *d = dout + row * C;
    float m = mean[row], s = rstd[row];
    float dm = 0.0f, dnm = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dn = w[c] * d[c];
        dm += dn;
        dnm += dn * (x[c] - m) * s;
    }
    dm = warp_sum(dm) / (float)C;
    dnm = warp_sum(dnm) / (float)C;
    float *di = dinp + row * C;
    for (int c = lane; c < C; c += 32) {
        float norm = (x[c] - m) * s;
        di[c] += (w[c] * d[c] - dm - norm * dnm) * s;
    }
}

__global__ static void layernorm_backward_partial(float *pw, float *pb, const float *dout,
                                                  const float *inp, const float *mean,
                                                  const float *rstd, size_t N, int C, int S)
{
    __shared__ float aw[8][33], ab[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, s = blockIdx.y;
    size_t r0 = N * s / S, r1 = N * (s + 1) / S;
    float vw = 0.0f, vb = 0.0f;
    if (c < C)
        for (size_t r = r0 + threadIdx.y; r < r1; r += 8) {
            float d = dout[r * C + c];
            vw += (inp[r * C + c] - mean[r]) * rstd[r] * d;
            vb += d;
        }
    aw[threadIdx.y][threadIdx.x] = vw;
    ab[threadIdx.y][threadIdx.x] = vb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int y = 0; y < 8; y++) {
            tw += aw[y][threadIdx.x];
            tb += ab[y][threadIdx.x];
        }
        pw[(size_t)s * C + c] = tw;
        pb[(size_t)s * C + c] = tb;
    }
}

static void cu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                  const float *inp, const float *w, const float *mean,
                                  const float *rstd, size_t N, int C)
{
    PROF("layernorm_backward");
    layernorm_backward_dinp<<<(unsigned)((N + 7) / 8), 256, 0, g.stream>>>(dinp, dout, inp, w, mean,
                                                                           rstd, N, C);
    LAUNCHED();
    int S = col_splits(N);
    float *pw = (float *)scratch(S_PARTIAL, (size_t)S * C * sizeof(float));
    float *pb = (float *)scratch(S_PARTIAL2, (size_t)S * C * sizeof(float));
    layernorm_backward_partial<<<dim3((C + 31) / 32, S), dim3(32, 8), 0, g.stream>>>(
        pw, pb, dout, inp, mean, rstd, N, C, S);
    LAUNCHED();
    colsum_finish<<<(C + 255) / 256, 256, 0, g.stream>>>(dw, pw, S, C);
    LAUNCHED();
    colsum_finish<<<(C + 255) / 256, 256, 0, g.stream>>>(db, pb, S, C);
    LAUNCHED();
}

/* ---- matmuls ----------------------------------------------------------------------- */

/* Row-major (N, C) is column-major (C, N): the calls below are llm.c's. */
static void sgemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *Cm, int ldc)
{
    CB(cublasSgemm(g.blas, ta, tb, m, n, k, &alpha, A, lda, B, ldb, &beta, Cm, ldc));
}

static void bgemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                  const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *Cm,
                  int ldc)
{
    CB(cublasGemmEx(g.blas, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                    &beta, Cm, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

__global__ static void bias_rows_k(float *out, const float *bias, size_t N, int OC)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = N * OC;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[i % OC];
}

static void bias_rows(float *out, const float *bias, size_t N, int OC)
{
    bias_rows_k<<<blocks_for(N * OC, 256), 256, 0, g.stream>>>(out, bias, N, OC);
    LAUNCHED();
}

/* Forward matmuls through cuBLASLt with the bias added in the GEMM's
 * epilogue: out = op(A) op(B) + bias, one write of out instead of a bias
 * fill, a read and a write. Plans (descriptors and the heuristic's algorithm)
 * are kept per shape, type and operand alignment; a shape cuBLASLt cannot
 * do (or an out-of-memory) is remembered and takes the cuBLAS path. out16:
 * D in bf16, and then the bias too (cuBLASLt's rule: the bias has D's type). */
#define LT_WS_BYTES (32u << 20)
#define LT_PLANS    64
struct lt_plan {
    int used, ok, m, n, k, bf16, out16, align;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};
static struct lt_plan lt_plans[LT_PLANS];

static int align_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    return (u % 16 == 0) ? 16 : (u % 8 == 0) ? 8 : (u % 4 == 0) ? 4 : 2;
}

static struct lt_plan *lt_plan_for(int m, int n, int k, int bf16, int out16, int align)
{
    struct lt_plan *p = NULL;
    for (int i = 0; i < LT_PLANS; i++) {
        struct lt_plan *q = &lt_plans[i];
        if (q->used && q->m == m && q->n == n && q->k == k && q->bf16 == bf16 &&
            q->out16 == out16 && q->align == align)
            return q;
        if (!q->used && !p)
            p = q;
    }
    if (!p)
        return NULL; /* the cache is full: cuBLAS */
    *p = (struct lt_plan){1, 0, m, n, k, bf16, out16, align, NULL, NULL, NULL, NULL, {}};
    cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F, dt = out16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t bias_t = dt;
    /* the heuristic reads the bias's alignment from this pointer's value */
    const void *bias_at = (const void *)(uintptr_t)align;
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = LT_WS_BYTES;
    uint32_t al = (uint32_t)align;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    /* A: the weight, stored k x m (transposed); B: the input, k x n; D: m x n */
    if (cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t,
                                       sizeof bias_t) ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_at,
                                       sizeof bias_at) ||
        cublasLtMatrixLayoutCreate(&p->a, t, k, m, k) ||
        cublasLtMatrixLayoutCreate(&p->b, t, k, n, k) ||
        cublasLtMatrixLayoutCreate(&p->d, dt, m, n, m) || cublasLtMatmulPreferenceCreate(&pref) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof ws) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
                                             sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
                                             sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                             sizeof al) ||
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                             sizeof al) ||
        cublasLtMatmulAlgoGetHeuristic(g.lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &res,
                                       &found) ||
        found < 1) {
        cudaGetLastError();
    } else {
        p->algo = res.algo;
        p->ok = 1;
    }
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return p;
}

/* 0 when done; -1: use the cuBLAS path. out and bias are bf16 with out16. */
static int lt_forward(void *out, const void *inp, const void *w, const void *bias, size_t N, int C,
                      int OC, int bf16, int out16)
{
    if (!g.lt || N > (size_t)INT32_MAX)
        return -1;
    int align = align_of(out);
    int ai = align_of(inp), aw = align_of(w), ab = align_of(bias);
    align = ai < align ? ai : align;
    align = aw < align ? aw : align;
    align = ab < align ? ab : align;
    struct lt_plan *p = lt_plan_for(OC, (int)N, C, bf16, out16, align);
    if (!p || !p->ok)
        return -1;
    float one = 1.0f, zero = 0.0f;
    CB(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                      sizeof bias));
    CB(cublasLtMatmul(g.lt, p->op, &one, w, p->a, inp, p->b, &zero, out, p->d, out, p->d, &p->algo,
                      g.lt_ws, LT_WS_BYTES, g.stream));
    return 0;
}

static void cu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                              size_t N, int C, int OC)
{
    PROF("matmul_forward");
    if (bias && lt_forward(out, inp, w, bias, N, C, OC, 0, 0) == 0)
        return;
    if (bias)
        bias_rows(out, bias, N, OC);
    sgemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, (int)N, C, 1.0f, w, C, inp, C, bias ? 1.0f : 0.0f, out, OC);
}

static void cu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *w, size_t N, int C, int OC)
{
    PROF("matmul_backward");
    if (dinp)
        sgemm(CUBLAS_OP_N, CUBLAS_OP_N, C, (int)N, OC, 1.0f, w, C, dout, OC, 0.0f, dinp, C);
    sgemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, (int)N, 1.0f, inp, C, dout, OC, 1.0f, dw, C);
    if (dbias)
        dbias_rows(dbias, dout, N, OC);
}

__global__ static void to_bf16_k(uint16_t *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = rne_bf16(src[i]);
}

__global__ static void from_bf16_k(float *dst, const uint16_t *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

static void cu_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    PROF("to_bf16");
    to_bf16_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(dst, src, n);
    LAUNCHED();
}

static void cu_from_bf16(float *dst, const uint16_t *src, size_t n)
{
    PROF("from_bf16");
    from_bf16_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(dst, src, n);
    LAUNCHED();
}

static size_t cu_bf16_scratch(size_t n)
{
    return scratch_try(S_BF16_A, n * sizeof(uint16_t)) ? n * sizeof(uint16_t) : 0;
}

static void cu_matmul_forward_bf16(float *out, const uint16_t *x, const uint16_t *w,
                                   const float *bias, size_t N, int C, int OC)
{
    PROF("matmul_forward_bf16");
    if (bias && lt_forward(out, x, w, bias, N, C, OC, 1, 0) == 0)
        return;
    if (bias)
        bias_rows(out, bias, N, OC);
    bgemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, (int)N, C, 1.0f, w, C, x, C, bias ? 1.0f : 0.0f, out, OC);
}

/* The qkv product of a flash run: out16 = bf16(inp w^T + bias16), the sum
 * in fp32. Where cuBLASLt has no plan for it, the same through an fp32
 * result (the bias widened exactly) and to_bf16, in chunks of rows that
 * keep that scratch to about 16 MiB (grown mid-step, so small). */
#define WIDE_BYTES (16u << 20)
static void cu_matmul_forward_to_bf16(uint16_t *out16, const uint16_t *x, const uint16_t *w,
                                      const uint16_t *bias16, size_t N, int C, int OC)
{
    PROF("matmul_forward_to_bf16");
    if (lt_forward(out16, x, w, bias16, N, C, OC, 1, 1) == 0)
        return;
    size_t rows = WIDE_BYTES / sizeof(float) / (size_t)OC;
    rows = rows > 1 ? rows - 1 : 1; /* one row's worth for the bias */
    float *bias = (float *)scratch(S_WIDE, (rows + 1) * (size_t)OC * sizeof(float));
    float *wide = bias + OC;
    cu_from_bf16(bias, bias16, (size_t)OC);
    for (size_t r0 = 0; r0 < N; r0 += rows) {
        const size_t n = N - r0 < rows ? N - r0 : rows;
        cu_matmul_forward_bf16(wide, x + r0 * (size_t)C, w, bias, n, C, OC);
        cu_to_bf16(out16 + r0 * (size_t)OC, wide, n * (size_t)OC);
    }
}

static void cu_matmul_backward_from_bf16(float *dinp, float *dw, const uint16_t *d,
                                         const uint16_t *x, const uint16_t *w, size_t N, int C,
                                         int OC)
{
    PROF("matmul_backward_from_bf16");
    if (dinp)
        bgemm(CUBLAS_OP_N, CUBLAS_OP_N, C, (int)N, OC, 1.0f, w, C, d, OC, 0.0f, dinp, C);
    bgemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, (int)N, 1.0f, x, C, d, OC, 1.0f, dw, C);
}

static void cu_matmul_backward_bf16(float *dinp, float *dw, float *dbias, const float *dout,
                                    const uint16_t *x, const uint16_t *w, size_t N, int C, int OC)
{
    PROF("matmul_backward_bf16");
    uint16_t *d = (uint16_t *)scratch(S_BF16_A, N * (size_t)OC * sizeof(uint16_t));
    cu_to_bf16(d, dout, N * (size_t)OC);
    cu_matmul_backward_from_bf16(dinp, dw, d, x, w, N, C, OC);
    if (dbias) /* from the fp32 gradient, as in fp32 */
        dbias_rows(dbias, dout, N, OC);
}

/* ---- attention --------------------------------------------------------------------- */

/* Strided batched products over heads of one sequence, on qkv in place
 * (head h of q starts at column h * hs, rows S apart). TF32 only when a
 * bf16 run allowed it. beta 1 adds to Cm (the K/V heads' gradients, summed
 * over the query heads that share them). */
static void att_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                     const float *A, int lda, long long sa, const float *B, int ldb, long long sb,
                     float beta, float *Cm, int ldc, long long sc, int batch)
{
    CB(cublasGemmStridedBatchedEx(g.blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, sa, B,
                                  CUDA_R_32F, ldb, sb, &beta, Cm, CUDA_R_32F, ldc, sc, batch,
                                  g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

/* one warp per row of one head: causal softmax in place, zeros above the
 * diagonal (the CPU's layout) */
__global__ static void att_softmax_k(float *att, int rows, int T)
{
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)rows)
        return;
    int t = (int)(row % T);
    float *a = att + row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        mx = fmaxf(mx, a[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        float e = expf(a[j] - mx);
        a[j] = e;
        sum += e;
    }
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32)
        a[j] = j <= t ? a[j] * inv : 0.0f;
}

/* dA becomes d(pre-softmax) * scale, in place */
__global__ static void att_softmax_backward_k(float *dA, const float *att, int rows, int T,
                                              float scale)
{
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= (size_t)rows)
        return;
    int t = (int)(row % T);
    const float *a = att + row * T;
    float *gr = dA + row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32)
        dot += a[j] * gr[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32)
        gr[j] = j <= t ? a[j] * (gr[j] - dot) * scale : 0.0f;
}

/* Grouped-query attention as KVH-head batches: for each j < grp = NH/KVH,
 * the query heads kv * grp + j (kv < KVH) each with K/V head kv, so every
 * batch has one stride per operand; with KVH = NH (GPT-2) one batch of all
 * heads. Rows of qkv are S = (NH + 2 KVH) hs apart, of out Cq = NH hs. */
struct att_dims {
    int hs, Cq, Ckv, S, grp;
    float scale;
    long long TT;
};

static struct att_dims att_dims(int T, int NH, int KVH, int hs)
{
    struct att_dims d;
    d.hs = hs;
    d.Cq = NH * hs;
    d.Ckv = KVH * hs;
    d.S = d.Cq + 2 * d.Ckv;
    d.grp = NH / KVH;
    d.scale = 1.0f / sqrtf((float)hs);
    d.TT = (long long)T * T;
    return d;
}

static void cu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                                 int KVH, int hs)
{
    PROF("attention_forward");
    const struct att_dims d = att_dims(T, NH, KVH, hs);
    const long long qs = (long long)d.grp * hs, as = (long long)d.grp * d.TT;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < d.grp; j++) { /* pre-softmax scores: A = scale Q K^T */
            const float *row = qkv + (size_t)b * T * d.S, *k = row + d.Cq;
            att_gemm(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, d.scale, k, d.S, hs, row + j * hs, d.S, qs,
                     0.0f, att + ((size_t)b * NH + j) * d.TT, T, as, KVH);
        }
    int rows = B * NH * T;
    att_softmax_k<<<(rows + 7) / 8, 256, 0, g.stream>>>(att, rows, T);
    LAUNCHED();
    for (int b = 0; b < B; b++)
        for (int j = 0; j < d.grp; j++) { /* out = A V */
            const float *v = qkv + (size_t)b * T * d.S + d.Cq + d.Ckv;
            att_gemm(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, d.S, hs,
                     att + ((size_t)b * NH + j) * d.TT, T, as, 0.0f,
                     out + (size_t)b * T * d.Cq + j * hs, d.Cq, qs, KVH);
        }
}

static void cu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                                  const float *att, int B, int T, int NH, int KVH, int hs)
{
    PROF("attention_backward");
    const struct att_dims d = att_dims(T, NH, KVH, hs);
    const long long qs = (long long)d.grp * hs, as = (long long)d.grp * d.TT;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < d.grp; j++) {
            const size_t ro = (size_t)b * T * d.S;
            const float *v = qkv + ro + d.Cq + d.Ckv;
            const float *A = att + ((size_t)b * NH + j) * d.TT;
            const float *dj = dout + (size_t)b * T * d.Cq + j * hs;
            float *dA = datt + ((size_t)b * NH + j) * d.TT, *dv = dqkv + ro + d.Cq + d.Ckv;
            /* dA = dout V^T; dV = A^T dout, summed over the group */
            att_gemm(CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, d.S, hs, dj, d.Cq, qs, 0.0f, dA,
                     T, as, KVH);
            att_gemm(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dj, d.Cq, qs, A, T, as,
                     j ? 1.0f : 0.0f, dv, d.S, hs, KVH);
        }
    int rows = B * NH * T;
    att_softmax_backward_k<<<(rows + 7) / 8, 256, 0, g.stream>>>(datt, att, rows, T, d.scale);
    LAUNCHED();
    for (int b = 0; b < B; b++)
        for (int j = 0; j < d.grp; j++) {
            const size_t ro = (size_t)b * T * d.S;
            const float *q = qkv + ro + j * hs, *k = qkv + ro + d.Cq;
            const float *dA = datt + ((size_t)b * NH + j) * d.TT;
            float *dq = dqkv + ro + j * hs, *dk = dqkv + ro + d.Cq;
            /* dQ = dpre K; dK = dpre^T Q, summed over the group */
            att_gemm(CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, k, d.S, hs, dA, T, as, 0.0f, dq, d.S,
                     qs, KVH);
            att_gemm(CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, q, d.S, qs, dA, T, as,
                     j ? 1.0f : 0.0f, dk, d.S, hs, KVH);
        }
}

/* bf16 runs: flash.cu's kernels, the T x T matrices never stored */
static void flash_failed(const char *what, int line)
{
    die(what, cudaGetErrorString(cudaGetLastError()), __FILE__, line);
}

static void cu_attention_forward_bf16(uint16_t *out16, float *lse, const uint16_t *qkv, int B,
                                      int T, int C, int NH)
{
    PROF("attention_forward_bf16");
    if (flash_forward(g.stream, out16, lse, qkv, B, T, C, NH))
        flash_failed("flash_forward", __LINE__);
}

static void cu_attention_backward_bf16(float *dqkv, float *d, const float *dout,
                                       const uint16_t *out16, const uint16_t *qkv, const float *lse,
                                       int B, int T, int C, int NH)
{
    PROF("attention_backward_bf16");
    if (flash_backward(g.stream, dqkv, d, dout, out16, qkv, lse, B, T, C, NH))
        flash_failed("flash_backward", __LINE__);
}

/* ---- pointwise --------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

template <typename O> __global__ static void gelu_forward_k(O *out, const float *inp, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        put(&out[i], 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
    }
}

__global__ static void gelu_backward_k(float *dinp, const float *inp, const float *dout, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float gr =
            0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = gr * dout[i];
    }
}

__global__ static void residual_k(float *out, const float *a, const float *b, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ static void add_k(float *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

static void cu_gelu_forward(float *out, const float *inp, size_t n)
{
    PROF("gelu_forward");
    gelu_forward_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(out, inp, n);
    LAUNCHED();
}

static void cu_gelu_forward_bf16(uint16_t *out16, const float *inp, size_t n)
{
    PROF("gelu_forward_bf16");
    gelu_forward_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(out16, inp, n);
    LAUNCHED();
}

static void cu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    PROF("gelu_backward");
    gelu_backward_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(dinp, inp, dout, n);
    LAUNCHED();
}

static void cu_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    PROF("residual_forward");
    residual_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(out, a, b, n);
    LAUNCHED();
}

static void cu_add(float *dst, const float *src, size_t n)
{
    PROF("add");
    add_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(dst, src, n);
    LAUNCHED();
}

/* ---- the Llama family's ------------------------------------------------------------ */

/* RMSNorm: one warp per row; O: float, or uint16_t for the bf16 copy */
template <typename O>
__global__ static void rmsnorm_forward_k(O *out, float *rstd, const float *inp, const float *w,
                                         size_t N, int C, float eps)
{
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const float *x = inp + row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32)
        ss += x[c] * x[c];
    float s = rsqrtf(warp_sum(ss) / (float)C + eps);
    O *o = out + row * C;
    for (int c = lane; c < C; c += 32)
        put(&o[c], x[c] * s * w[c]);
    if (lane == 0)
        rstd[row] = s;
}

static void cu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, size_t N,
                               int C, float eps)
{
    PROF("rmsnorm_forward");
    rmsnorm_forward_k<<<(unsigned)((N + 7) / 8), 256, 0, g.stream>>>(out, rstd, inp, w, N, C, eps);
    LAUNCHED();
}

static void cu_rmsnorm_forward_bf16(uint16_t *out16, float *rstd, const float *inp, const float *w,
                                    size_t N, int C, float eps)
{
    PROF("rmsnorm_forward_bf16");
    rmsnorm_forward_k<<<(unsigned)((N + 7) / 8), 256, 0, g.stream>>>(out16, rstd, inp, w, N, C,
                                                                     eps);
    LAUNCHED();
}

__global__ static void rmsnorm_backward_dinp(float *dinp, const float *dout, const float *inp,
                                             const float *w, const float *rstd, size_t N, int C)
{
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const float *x = inp + row * C, *d = dout + row * C;
    const float s = rstd[row];
    float dot = 0.0f;
    for (int c = lane; c < C; c += 32)
        dot += w[c] * d[c] * x[c];
    const float k = s * s * s * warp_sum(dot) / (float)C;
    float *di = dinp + row * C;
    for (int c = lane; c < C; c += 32)
        di[c] += s * w[c] * d[c] - x[c] * k;
}

/* dw's partial column sums over S row ranges (colsum_finish adds them) */
__global__ static void rmsnorm_backward_partial(float *pw, const float *dout, const float *inp,
                                                const float *rstd, size_t N, int C, int S)
{
    __shared__ float aw[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, s = blockIdx.y;
    size_t r0 = N * s / S, r1 = N * (s + 1) / S;
    float vw = 0.0f;
    if (c < C)
        for (size_t r = r0 + threadIdx.y; r < r1; r += 8)
            vw += inp[r * C + c] * rstd[r] * dout[r * C + c];
    aw[threadIdx.y][threadIdx.x] = vw;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f;
        for (int y = 0; y < 8; y++)
            tw += aw[y][threadIdx.x];
        pw[(size_t)s * C + c] = tw;
    }
}

static void cu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                const float *w, const float *rstd, size_t N, int C)
{
    PROF("rmsnorm_backward");
    rmsnorm_backward_dinp<<<(unsigned)((N + 7) / 8), 256, 0, g.stream>>>(dinp, dout, inp, w, rstd,
                                                                         N, C);
    LAUNCHED();
    int S = col_splits(N);
    float *pw = (float *)scratch(S_PARTIAL, (size_t)S * C * sizeof(float));
    rmsnorm_backward_partial<<<dim3((C + 31) / 32, S), dim3(32, 8), 0, g.stream>>>(pw, dout, inp,
                                                                                   rstd, N, C, S);
    LAUNCHED();
    colsum_finish<<<(C + 255) / 256, 256, 0, g.stream>>>(dw, pw, S, C);
    LAUNCHED();
}

/* one thread per (row, rotated head, channel pair) */
__global__ static void rope_k(float *x, const float *cs, const float *sn, size_t rows, int T,
                              int NROT, int half, int stride, float sign)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = rows * NROT * half;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / ((size_t)NROT * half);
        int rest = (int)(i % ((size_t)NROT * half)), h = rest / half, p = rest % half;
        size_t t = r % (size_t)T;
        float *a = x + r * stride + (size_t)h * 2 * half;
        float c = cs[t * half + p], s = sign * sn[t * half + p];
        float x1 = a[p], x2 = a[p + half];
        a[p] = x1 * c - x2 * s;
        a[p + half] = x2 * c + x1 * s;
    }
}

static void cu_rope(float *x, const float *cos, const float *sin, int B, int T, int NROT, int HS,
                    int stride, int inverse)
{
    PROF("rope");
    size_t n = (size_t)B * T * NROT * (HS / 2);
    rope_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(x, cos, sin, (size_t)B * T, T, NROT, HS / 2,
                                                     stride, inverse ? -1.0f : 1.0f);
    LAUNCHED();
}

template <typename O>
__global__ static void swiglu_forward_k(O *out, const float *inp, size_t N, int F)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = N * F;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / F, j = i % F;
        float gt = inp[r * 2 * F + j], up = inp[r * 2 * F + F + j];
        put(&out[i], gt / (1.0f + expf(-gt)) * up);
    }
}

static void cu_swiglu_forward(float *out, const float *inp, size_t N, int F)
{
    PROF("swiglu_forward");
    swiglu_forward_k<<<blocks_for(N * F, 256), 256, 0, g.stream>>>(out, inp, N, F);
    LAUNCHED();
}

static void cu_swiglu_forward_bf16(uint16_t *out16, const float *inp, size_t N, int F)
{
    PROF("swiglu_forward_bf16");
    swiglu_forward_k<<<blocks_for(N * F, 256), 256, 0, g.stream>>>(out16, inp, N, F);
    LAUNCHED();
}

__global__ static void swiglu_backward_k(float *dinp, const float *inp, const float *dout, size_t N,
                                         int F)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = N * F;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / F, j = i % F;
        float gt = inp[r * 2 * F + j], up = inp[r * 2 * F + F + j], d = dout[i];
        float s = 1.0f / (1.0f + expf(-gt));
        dinp[r * 2 * F + F + j] = d * gt * s;
        dinp[r * 2 * F + j] = d * up * s * (1.0f + gt * (1.0f - s));
    }
}

static void cu_swiglu_backward(float *dinp, const float *inp, const float *dout, size_t N, int F)
{
    PROF("swiglu_backward");
    swiglu_backward_k<<<blocks_for(N * F, 256), 256, 0, g.stream>>>(dinp, inp, dout, N, F);
    LAUNCHED();
}

/* ---- loss -------------------------------------------------------------------------- */

/* One block per row, one pass over it: the running maximum and the sum of
 * exponentials rescaled to it (the "online" softmax); only the row's lse
 * and loss are written. */
__global__ static void crossentropy_forward_k(float *losses, float *lse, const float *logits,
                                              const int32_t *targets, int V, int Vp)
{
    const float *row = logits + (size_t)blockIdx.x * Vp;
    float mx = -INFINITY, sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float x = row[j];
        if (x > mx) {
            sum = sum * expf(mx - x) + 1.0f;
            mx = x;
        } else {
            sum += expf(x - mx);
        }
    }
    float M = block_reduce(mx, 1);
    float S = block_reduce(mx == -INFINITY ? 0.0f : sum * expf(mx - M), 0);
    if (threadIdx.x == 0) {
        float l = M + logf(S);
        lse[blockIdx.x] = l;
        losses[blockIdx.x] = l - row[targets[blockIdx.x]];
    }
}

/* dlogits (fp32, may be logits itself; or bf16) = (exp(x - lse) -
 * onehot) * dloss, zeros past V */
template <typename O>
__global__ static void crossentropy_backward_k(O *dlogits, const float *logits, const float *lse,
                                               const int32_t *targets, float dloss, int V, int Vp)
{
    const size_t r = blockIdx.x;
    const float *x = logits + r * Vp;
    O *d = dlogits + r * Vp;
    const float l = lse[r];
    const int t = targets[r];
    for (int j = threadIdx.x; j < Vp; j += blockDim.x)
        put(&d[j], j < V ? (expf(x[j] - l) - (j == t ? 1.0f : 0.0f)) * dloss : 0.0f);
}

static void cu_crossentropy_forward(float *losses, float *lse, const float *logits,
                                    const int32_t *targets, size_t N, int V, int Vp)
{
    PROF("crossentropy_forward");
    crossentropy_forward_k<<<(unsigned)N, 1024, 0, g.stream>>>(losses, lse, logits, targets, V, Vp);
    LAUNCHED();
}

static void cu_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                                     const int32_t *targets, float dloss, size_t N, int V, int Vp)
{
    PROF("crossentropy_backward");
    crossentropy_backward_k<<<(unsigned)N, 1024, 0, g.stream>>>(dlogits, logits, lse, targets,
                                                                dloss, V, Vp);
    LAUNCHED();
}

static void cu_crossentropy_backward_bf16(uint16_t *dlogits16, const float *logits,
                                          const float *lse, const int32_t *targets, float dloss,
                                          size_t N, int V, int Vp)
{
    PROF("crossentropy_backward_bf16");
    crossentropy_backward_k<<<(unsigned)N, 1024, 0, g.stream>>>(dlogits16, logits, lse, targets,
                                                                dloss, V, Vp);
    LAUNCHED();
}

/* ---- optimizer --------------------------------------------------------------------- */

__global__ static void adamw_k(float *p, const float *gr, float *m, float *v, size_t n, float lr,
                               float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                               float gscale)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = gr[i] * gscale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}

static void cu_adamw(float *p, const float *gr, float *m, float *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float wd, float bc1, float bc2, float gscale)
{
    PROF("adamw");
    adamw_k<<<blocks_for(n, 256), 256, 0, g.stream>>>(p, gr, m, v, n, lr, beta1, beta2, eps, wd,
                                                      bc1, bc2, gscale);
    LAUNCHED();
}

/* a fixed grid: block b sums elements b*256+tid, b*256+tid + 256*SUMSQ_BLOCKS, ...
 * in double; the host adds the blocks' sums in order */
#define SUMSQ_BLOCKS 256
__global__ static void sumsq_k(double *partial, const float *x, size_t n)
{
    __shared__ double part[256];
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * 256 + threadIdx.x; i < n; i += 256 * SUMSQ_BLOCKS)
        s += (double)x[i] * x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partial[blockIdx.x] = part[0];
}

static double cu_sumsq(const float *x, size_t n)
{
    PROF("sumsq");
    double host[SUMSQ_BLOCKS];
    sumsq_k<<<SUMSQ_BLOCKS, 256, 0, g.stream>>>(g.partial, x, n);
    LAUNCHED();
    cu_download(host, g.partial, sizeof host);
    double s = 0.0;
    for (int i = 0; i < SUMSQ_BLOCKS; i++)
        s += host[i];
    return s;
}

/* ---- the table --------------------------------------------------------------------- */

static struct fsdp_kernels cuda_kernels;

/* flash: bf16 runs take flash.cu's attention (where the heads fit) */
static void fill_table(int flash)
{
    struct fsdp_kernels *k = &cuda_kernels;
    k->name = g.desc;
    k->on_device = 1;
    k->host_alloc = cu_host_alloc;
    k->host_free = cu_host_free;
    k->alloc = cu_alloc;
    k->free = cu_free;
    k->zero = cu_zero;
    k->copy = cu_copy;
    k->upload = cu_upload;
    k->download = cu_download;
    k->encoder_forward = cu_encoder_forward;
    k->encoder_backward = cu_encoder_backward;
    k->layernorm_forward = cu_layernorm_forward;
    k->layernorm_forward_bf16 = cu_layernorm_forward_bf16;
    k->layernorm_backward = cu_layernorm_backward;
    k->matmul_forward = cu_matmul_forward;
    k->matmul_backward = cu_matmul_backward;
    k->to_bf16 = cu_to_bf16;
    k->from_bf16 = cu_from_bf16;
    k->matmul_forward_bf16 = cu_matmul_forward_bf16;
    k->matmul_backward_bf16 = cu_matmul_backward_bf16;
    k->bf16_scratch = cu_bf16_scratch;
    k->attention_forward = cu_attention_forward;
    k->attention_backward = cu_attention_backward;
    int max_hs = flash_max_hs(g.smem_optin);
    if (flash && max_hs > 0) {
        k->attention_forward_bf16 = cu_attention_forward_bf16;
        k->attention_backward_bf16 = cu_attention_backward_bf16;
        k->matmul_forward_to_bf16 = cu_matmul_forward_to_bf16;
        k->attention_bf16_max_hs = max_hs;
    }
    k->gelu_forward = cu_gelu_forward;
    k->gelu_forward_bf16 = cu_gelu_forward_bf16;
    k->gelu_backward = cu_gelu_backward;
    k->residual_forward = cu_residual_forward;
    k->rmsnorm_forward = cu_rmsnorm_forward;
    k->rmsnorm_forward_bf16 = cu_rmsnorm_forward_bf16;
    k->rmsnorm_backward = cu_rmsnorm_backward;
    k->rope = cu_rope;
    k->swiglu_forward = cu_swiglu_forward;
    k->swiglu_forward_bf16 = cu_swiglu_forward_bf16;
    k->swiglu_backward = cu_swiglu_backward;
    k->crossentropy_forward = cu_crossentropy_forward;
    k->crossentropy_backward = cu_crossentropy_backward;
    k->crossentropy_backward_bf16 = cu_crossentropy_backward_bf16;
    k->matmul_backward_from_bf16 = cu_matmul_backward_from_bf16;
    k->adamw = cu_adamw;
    k->sumsq = cu_sumsq;
    k->add = cu_add;
}

static int cu_init(int local_rank, char *err, size_t len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, len, "--device cuda: no usable GPU here (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        cudaGetLastError();
        return -1;
    }
    g.dev = local_rank % n;
    cudaDeviceProp p;
    if ((e = cudaSetDevice(g.dev)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&p, g.dev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking)) != cudaSuccess) {
        snprintf(err, len, "--device cuda: device %d: %s", g.dev, cudaGetErrorString(e));
        return -1;
    }
    cublasStatus_t s = cublasCreate(&g.blas);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasSetStream(g.blas, g.stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, len, "--device cuda: cuBLAS: %s", cublasGetStatusString(s));
        return -1;
    }
    /* cuBLASLt for the forward matmuls' bias epilogue; without it, cuBLAS */
    if (cublasLtCreate(&g.lt) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc(&g.lt_ws, LT_WS_BYTES) != cudaSuccess) {
        cudaGetLastError();
        g.lt = NULL;
    }
    g.major = p.major;
    g.minor = p.minor;
    g.smem_optin = p.sharedMemPerBlockOptin;
    g.main_thread = pthread_self();
    snprintf(g.desc, sizeof g.desc, "cuda %s (sm_%d%d, %.0f GiB), device %d", p.name, p.major,
             p.minor, (double)p.totalGlobalMem / (1 << 30), g.dev);
    /* FSDP_CUDA_ATTENTION=gemm: bf16 runs too take the products above
     * (TF32) and keep the softmax, as before flash.cu; flash is the default */
    const char *att = getenv("FSDP_CUDA_ATTENTION");
    if (att && strcmp(att, "flash") != 0 && strcmp(att, "gemm") != 0) {
        snprintf(err, len, "FSDP_CUDA_ATTENTION: '%.40s' is not flash or gemm", att);
        return -1;
    }
    fill_table(!att || strcmp(att, "flash") == 0);
    const char *pe = getenv("FSDP_CUDA_PROFILE");
    if (pe && strcmp(pe, "1") == 0 && cudaEventCreate(&prof.a) == cudaSuccess &&
        cudaEventCreate(&prof.b) == cudaSuccess) {
        prof.on = 1;
        atexit(prof_report);
    }
    g.partial = (double *)cu_alloc(SUMSQ_BLOCKS * sizeof(double));
    if (!g.partial) {
        snprintf(err, len, "--device cuda: out of device memory");
        return -1;
    }
    return 0;
}

static const struct fsdp_kernels *cu_kernels(void) { return &cuda_kernels; }

static int cu_bf16(char *why, size_t len)
{
    if (g.major >= 8)
        return 1;
    snprintf(why, len, "sm_%d%d has no bf16 tensor cores", g.major, g.minor);
    return 0;
}

static void cu_allow_tf32(int on) { g.tf32 = on; }

extern "C" __attribute__((visibility("hidden"))) void *fsdp_cudamod_stream(void)
{
    return g.stream;
}

static size_t cu_peak_bytes(void) { return g.peak; }

extern "C" __attribute__((visibility("default"))) const struct fsdp_cuda_module *
fsdp_cuda_module(void)
{
    static const struct fsdp_cuda_module m = {
        FSDP_CUDA_MODULE_ABI,        cu_init, cu_kernels, cu_bf16, cu_allow_tf32, cu_peak_bytes,
        fsdp_cudamod_comm_nccl_init,
    };
    return &m;
}
