/*
 * gemm_gpu.cu - fsdp-gemm-bench: gpt2-124m's matmuls alone on one GPU, in
 * the ways the CUDA backend could run them, so that a short GPU session
 * says where the step's matmul time goes and what bf16 outputs would buy.
 *
 * The backend's bf16 matmuls take bf16 operands and write fp32 (kernels.h):
 * the forward through cuBLASLt with the bias in the epilogue, the backward
 * through cublasGemmEx. Each shape (N = 16 x 1024 rows; qkv, attproj, fc,
 * fcproj, the lm head) and pass (forward; backward: dinp = dout W, dW +=
 * dout^T inp) runs in each mode below, and the table gives ms and TFLOP/s
 * (the median of --reps timed with events, after 3 untimed):
 *   lt-f32     cuBLASLt, fp32 out, bias epilogue (the backend's forward)
 *   ex-f32     cublasGemmEx, fp32 out (the backend's backward)
 *   lt-bf16    cuBLASLt, bf16 out, bias epilogue (bf16 activations)
 *   ex-bf16    cublasGemmEx, bf16 out
 * (the backward has no epilogue to use, so only cublasGemmEx runs it, and
 * dW is fp32 in both), and one step's sum (12 blocks, the lm head once) as
 * the backend runs it now (lt-f32 forward, ex-f32 backward) and with bf16
 * activations (lt-bf16 forward, ex-bf16 backward).
 * Inputs are random bf16 values; no result is checked (test_cuda.c does).
 *
 *   fsdp-gemm-bench [--rows N] [--reps R]      exits 77 without a GPU
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

namespace
{

void fail(const char *what, const char *why)
{
    fprintf(stderr, "fsdp-gemm-bench: %s: %s\n", what, why);
    exit(1);
}
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess)                                                                     \
            fail(#x, cudaGetErrorString(e_));                                                      \
    } while (0)
#define CB(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            fail(#x, cublasGetStatusString(s_));                                                   \
    } while (0)

struct shape {
    const char *name;
    int C, OC, bias;
};
const shape shapes[] = {{"qkv", 768, 2304, 1},
                        {"attproj", 768, 768, 1},
                        {"fc", 768, 3072, 1},
                        {"fcproj", 3072, 768, 1},
                        {"lm-head", 768, 50304, 0}};
enum { LT_F32, EX_F32, LT_BF16, EX_BF16, MODES };
const char *mode_name[MODES] = {"lt-f32", "ex-f32", "lt-bf16", "ex-bf16"};

struct ctx {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    cudaStream_t stream;
};

/* D (m x n, column-major) = op(A) op(B) [+ bias per row of D]: A is k x m
 * stored (transposed, the weight), B k x n (the input). 0, or -1 when
 * cuBLASLt has no algorithm for it. */
int lt_gemm(ctx &c, int m, int n, int k, const void *A, const void *B, void *D, int bf16_out,
            const void *bias)
{
    cudaDataType_t dt = bf16_out ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias)
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof bias));
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k));
    CB(cublasLtMatrixLayoutCreate(&ld, dt, m, n, m));
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &c.ws_bytes, sizeof c.ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    int rc = -1;
    if (cublasLtMatmulAlgoGetHeuristic(c.lt, op, la, lb, ld, ld, pref, 1, &res, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
        float one = 1.0f, zero = 0.0f;
        CB(cublasLtMatmul(c.lt, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &res.algo, c.ws,
                          c.ws_bytes, c.stream));
        rc = 0;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    return rc;
}

void ex_gemm(ctx &c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A,
             int lda, const void *B, int ldb, float beta, void *D, int ldd, int bf16_out)
{
    float one = 1.0f;
    CB(cublasGemmEx(c.blas, ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta,
                    D, bf16_out ? CUDA_R_16BF : CUDA_R_32F, ldd, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
}

struct bufs {
    void *x, *w, *d, *bias, *out, *dw; /* input, weight, dout (bf16); bias; outputs */
};

/* One call of (shape, pass, mode); pass 0 forward, 1 dinp, 2 dW. -1: the
 * mode cannot run it. */
int call(ctx &c, const shape &s, int N, int pass, int mode, bufs &b)
{
    const int bf16_out = mode == LT_BF16 || mode == EX_BF16;
    const int lt = mode == LT_F32 || mode == LT_BF16;
    if (pass == 0) {
        if (lt)
            return lt_gemm(c, s.OC, N, s.C, b.w, b.x, b.out, bf16_out, s.bias ? b.bias : NULL);
        ex_gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, s.OC, N, s.C, b.w, s.C, b.x, s.C, 0.0f, b.out, s.OC,
                bf16_out);
        return 0;
    }
    if (lt) /* the backward has no epilogue: cublasGemmEx is what the backend uses */
        return -1;
    if (pass == 1) /* dinp (N x C) = dout (N x OC) W (OC x C) */
        ex_gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, s.C, N, s.OC, b.w, s.C, b.d, s.OC, 0.0f, b.out, s.C,
                bf16_out);
    else /* dW (OC x C) += dout^T inp: fp32, whatever the activations */
        ex_gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, s.C, s.OC, N, b.x, s.C, b.d, s.OC, 1.0f, b.dw, s.C, 0);
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    int N = 16 * 1024, reps = 20;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--rows") == 0)
            N = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: fsdp-gemm-bench [--rows N] [--reps R]\n");
            return 2;
        }
    }
    if (N < 1 || reps < 1) {
        fprintf(stderr, "fsdp-gemm-bench: --rows and --reps must be positive\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skip: no GPU\n");
        return 77;
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    ctx c;
    c.ws_bytes = 32u << 20;
    CK(cudaStreamCreate(&c.stream));
    CB(cublasCreate(&c.blas));
    CB(cublasSetStream(c.blas, c.stream));
    CB(cublasLtCreate(&c.lt));
    CK(cudaMalloc(&c.ws, c.ws_bytes));
    size_t maxC = 3072, maxOC = 50304;
    bufs b;
    size_t big = (size_t)N * maxOC; /* the largest activation: the logits */
    CK(cudaMalloc(&b.x, (size_t)N * maxC * 2));
    CK(cudaMalloc(&b.w, maxC * maxOC * 2));
    CK(cudaMalloc(&b.d, big * 2));
    CK(cudaMalloc(&b.bias, maxOC * 4));
    CK(cudaMalloc(&b.out, big * 4));
    CK(cudaMalloc(&b.dw, maxC * maxOC * 4));
    { /* random bf16 in [-1, 1): any values will do, but not zeros */
        std::vector<__nv_bfloat16> h(big);
        unsigned long long s = 1;
        for (size_t i = 0; i < big; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = __float2bfloat16((float)((s >> 40) & 0xffff) / 32768.0f - 1.0f);
        }
        CK(cudaMemcpy(b.d, h.data(), big * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b.x, h.data(), (size_t)N * maxC * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b.w, h.data(), maxC * maxOC * 2, cudaMemcpyHostToDevice));
        CK(cudaMemset(b.bias, 0, maxOC * 4));
        CK(cudaMemset(b.dw, 0, maxC * maxOC * 4));
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%s (sm_%d%d): gpt2-124m matmuls on %d rows, bf16 operands, median of %d\n", p.name,
           p.major, p.minor, N, reps);
    printf("%-8s %-5s", "shape", "pass");
    for (int m = 0; m < MODES; m++)
        printf(" %18s", mode_name[m]);
    printf("\n");
    const char *pass_name[3] = {"fwd", "dinp", "dW"};
    double now_ms = 0, bf16_ms = 0;
    for (const shape &s : shapes)
        for (int pass = 0; pass < 3; pass++) {
            printf("%-8s %-5s", s.name, pass_name[pass]);
            const double flop = 2.0 * N * s.C * s.OC;
            const int per_step = strcmp(s.name, "lm-head") == 0 ? 1 : 12;
            for (int m = 0; m < MODES; m++) {
                if (pass == 2 && m == EX_BF16) { /* dW is fp32: the same call as ex-f32 */
                    printf(" %18s", "(= ex-f32)");
                    continue;
                }
                if (call(c, s, N, pass, m, b) != 0) {
                    printf(" %18s", "-");
                    continue;
                }
                for (int w = 0; w < 2; w++)
                    call(c, s, N, pass, m, b);
                std::vector<float> ms(reps);
                for (int r = 0; r < reps; r++) {
                    CK(cudaEventRecord(e0, c.stream));
                    call(c, s, N, pass, m, b);
                    CK(cudaEventRecord(e1, c.stream));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms[r], e0, e1));
                }
                std::sort(ms.begin(), ms.end());
                const double med = ms[reps / 2];
                if (m == (pass ? EX_F32 : LT_F32))
                    now_ms += per_step * med;
                if (m == (pass ? (pass == 2 ? EX_F32 : EX_BF16) : LT_BF16))
                    bf16_ms += per_step * med;
                printf(" %7.3f ms %4.0f TF", med, flop / (med * 1e-3) / 1e12);
            }
            printf("\n");
        }
    printf("one step (each block's 4 shapes 12 times, the lm head once): %.2f ms as now "
           "(lt-f32 forward, ex-f32 backward), %.2f ms with bf16 activations (lt-bf16, ex-bf16)\n",
           now_ms, bf16_ms);
    return 0;
}
