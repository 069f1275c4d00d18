/*
 * gemm.c - fsdp_gemm: oneDNN's matmul primitive or OpenBLAS's sgemm (see
 * gemm.h).
 *
 * A oneDNN primitive is planned (and its kernel JIT-compiled) for one shape,
 * about 0.5 ms here, then reused: plans live in a small table keyed by the
 * shape, transposes and beta; when it is full the oldest plan goes. A
 * training step uses a dozen shapes, so after the first step every call is
 * a lookup. A call that oneDNN cannot plan (out of memory) falls back to
 * OpenBLAS for that call, with one line on stderr the first time.
 *
 * Results: each library gives the same bits every run for the same shape
 * and thread count; the two libraries round differently, so a run keeps the
 * library it started with (--matmul names one).
 */
#include "gemm.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FSDP_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

static int use_onednn = -1; /* -1: not chosen yet (auto) */

int fsdp_gemm_select(const char *want, char *err, size_t errlen)
{
#ifdef FSDP_HAVE_ONEDNN
    const int have = 1;
#else
    const int have = 0;
#endif
    if (strcmp(want, "auto") == 0)
        use_onednn = have;
    else if (strcmp(want, "openblas") == 0)
        use_onednn = 0;
    else if (strcmp(want, "onednn") == 0 && have)
        use_onednn = 1;
    else if (strcmp(want, "onednn") == 0) {
        snprintf(err, errlen,
                 "--matmul onednn: this build has no oneDNN (install libdnnl-dev "
                 "and rebuild)");
        return -1;
    } else {
        snprintf(err, errlen, "--matmul '%s' is not auto, onednn or openblas", want);
        return -1;
    }
    return 0;
}

void fsdp_gemm_max_isa(const char *level)
{
#ifdef FSDP_HAVE_ONEDNN
    dnnl_cpu_isa_t isa = strcmp(level, "x86-64-v4") == 0   ? dnnl_cpu_isa_avx512_core
                         : strcmp(level, "x86-64-v3") == 0 ? dnnl_cpu_isa_avx2
                         : strcmp(level, "x86-64") == 0    ? dnnl_cpu_isa_sse41
                                                           : dnnl_cpu_isa_all;
    dnnl_set_max_cpu_isa(isa); /* fails only after the first primitive: none yet */
#else
    (void)level;
#endif
}

const char *fsdp_gemm_name(void)
{
    if (use_onednn < 0) {
        char err[160];
        fsdp_gemm_select("auto", err, sizeof err);
    }
#ifdef FSDP_HAVE_ONEDNN
    static char name[48];
    if (use_onednn) {
        const dnnl_version_t *v = dnnl_version();
        snprintf(name, sizeof name, "onednn %d.%d.%d", v->major, v->minor, v->patch);
        return name;
    }
#endif
    return "openblas";
}

static void blas_gemm(char ta, char tb, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta == 'T' ? CblasTrans : CblasNoTrans,
                tb == 'T' ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

/* Lane 0 is the compute thread's, its plans for all the threads. Each
 * thread that runs a share of fsdp_gemm_bf16_rows takes a lane of its own
 * the first time (thread-local: oneDNN wants a primitive run by the thread
 * that made it), with plans for one thread and a stream; a plan is found by
 * its shape, so one lane's plans never mix with another's. */
#define LANES 65
static _Thread_local int my_lane; /* 0: none taken yet; -1: none left */
static int lanes_taken;

#ifdef FSDP_HAVE_ONEDNN

#define PLANS 64

struct plan {
    int used, failed, bf16; /* failed: oneDNN cannot plan this; OpenBLAS takes it */
    char ta, tb;
    int M, N, K, lda, ldb, ldc, accumulate;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
};

static struct plan plans[LANES][PLANS];
static int next_victim[LANES];
static dnnl_engine_t engine;
static dnnl_stream_t stream[LANES];
static int broken; /* the engine could not be created: OpenBLAS from then on */

static void plan_free(struct plan *p)
{
    if (p->prim)
        dnnl_primitive_destroy(p->prim);
    if (p->a)
        dnnl_memory_destroy(p->a);
    if (p->b)
        dnnl_memory_destroy(p->b);
    if (p->c)
        dnnl_memory_destroy(p->c);
    memset(p, 0, sizeof *p);
}

/* Row-major op(X) of r x c as a oneDNN memory descriptor over X's storage. */
static dnnl_status_t matrix_md(dnnl_memory_desc_t *md, char trans, int r, int c, int ld,
                               dnnl_data_type_t type)
{
    dnnl_dims_t dims = {r, c};
    dnnl_dims_t strides = {trans == 'T' ? 1 : ld, trans == 'T' ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides);
}

static int plan_make(struct plan *p)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    const dnnl_data_type_t in = p->bf16 ? dnnl_bf16 : dnnl_f32;
    int ok = matrix_md(&a, p->ta, p->M, p->K, p->lda, in) == dnnl_success &&
             matrix_md(&b, p->tb, p->K, p->N, p->ldb, in) == dnnl_success &&
             matrix_md(&c, 'N', p->M, p->N, p->ldc, dnnl_f32) == dnnl_success &&
             dnnl_matmul_desc_init(&d, &a, &b, NULL, &c) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && p->accumulate) /* C += A B: the "sum" post-op adds the old C */
        ok = dnnl_post_ops_create(&ops) == dnnl_success &&
             dnnl_post_ops_append_sum(ops, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, ops) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL) == dnnl_success &&
         dnnl_primitive_create(&p->prim, pd) == dnnl_success &&
         dnnl_memory_create(&p->a, &a, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&p->b, &b, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&p->c, &c, engine, DNNL_MEMORY_NONE) == dnnl_success;
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (!ok)
        plan_free(p); /* clears the entry; plan_for marks it failed */
    return ok ? 0 : -1;
}

/* The engine, made by the compute thread before any lane runs. -1: oneDNN
 * is broken here. */
static int engine_ready(void)
{
    if (!engine && !broken)
        broken = dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success;
    return broken ? -1 : 0;
}

static struct plan *plan_for(int lane, int bf16, char ta, char tb, int M, int N, int K, int lda,
                             int ldb, int ldc, int accumulate)
{
    /* a lane's stream is made by the one thread that uses the lane */
    if (engine_ready() ||
        (!stream[lane] &&
         dnnl_stream_create(&stream[lane], engine, dnnl_stream_default_flags) != dnnl_success))
        return NULL;
    for (int i = 0; i < PLANS; i++) {
        struct plan *p = &plans[lane][i];
        if (p->used && p->bf16 == bf16 && p->ta == ta && p->tb == tb && p->M == M && p->N == N &&
            p->K == K && p->lda == lda && p->ldb == ldb && p->ldc == ldc &&
            p->accumulate == accumulate)
            return p->failed ? NULL : p;
    }
    struct plan *p = &plans[lane][next_victim[lane]];
    next_victim[lane] = (next_victim[lane] + 1) % PLANS;
    plan_free(p);
    *p = (struct plan){1,   0,   bf16, ta,         tb,   M,    N,    K,
                       lda, ldb, ldc,  accumulate, NULL, NULL, NULL, NULL};
    if (plan_make(p) == 0)
        return p;
    /* remembered, so a shape that cannot be planned is not tried (and does
     * not evict a good plan) on every call */
    *p = (struct plan){1,   1,   bf16, ta,         tb,   M,    N,    K,
                       lda, ldb, ldc,  accumulate, NULL, NULL, NULL, NULL};
    return NULL;
}

/* -1 before C was touched (OpenBLAS can take the call). A failure once the
 * primitive runs may leave C half-written, and with beta 1 nothing can redo
 * the call: that ends the process. */
static int onednn_gemm(int lane, int bf16, char ta, char tb, int M, int N, int K, const void *A,
                       int lda, const void *B, int ldb, float beta, float *C, int ldc)
{
    struct plan *p = plan_for(lane, bf16, ta, tb, M, N, K, lda, ldb, ldc, beta != 0.0f);
    if (!p)
        return -1;
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
    if (dnnl_memory_set_data_handle(p->a, (void *)A) != dnnl_success ||
        dnnl_memory_set_data_handle(p->b, (void *)B) != dnnl_success ||
        dnnl_memory_set_data_handle(p->c, C) != dnnl_success)
        return -1;
    if (dnnl_primitive_execute(p->prim, stream[lane], 3, args) != dnnl_success ||
        dnnl_stream_wait(stream[lane]) != dnnl_success) {
        fprintf(stderr, "fsdp-train: oneDNN failed while running a %dx%dx%d matmul\n", M, N, K);
        abort();
    }
    return 0;
}

#endif /* FSDP_HAVE_ONEDNN */

/* 0 when oneDNN did the product (the library chosen, M, N, K > 0) on
 * lane's plans; -1 when OpenBLAS must, said once on stderr if oneDNN was
 * chosen but could not. */
static int by_onednn_on(int lane, int bf16, char ta, char tb, int M, int N, int K, const void *A,
                        int lda, const void *B, int ldb, float beta, float *C, int ldc)
{
    if (use_onednn < 0)
        fsdp_gemm_name(); /* chooses "auto" */
#ifdef FSDP_HAVE_ONEDNN
    if (use_onednn && M > 0 && N > 0 && K > 0) {
        if (onednn_gemm(lane, bf16, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc) == 0)
            return 0;
        static int said; /* lanes may get here at once */
        int before;
#pragma omp atomic capture
        before = said++;
        if (!before)
            fprintf(stderr,
                    "fsdp-train: oneDNN could not plan a %dx%dx%d %s matmul (out of "
                    "memory?); OpenBLAS takes such calls%s\n",
                    M, N, K, bf16 ? "bf16" : "fp32", bf16 ? ", widened to fp32 (slow)" : "");
    }
#else
    (void)lane, (void)bf16, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda,
        (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
#endif
    return -1;
}

static int by_onednn(int bf16, char ta, char tb, int M, int N, int K, const void *A, int lda,
                     const void *B, int ldb, float beta, float *C, int ldc)
{
    return by_onednn_on(0, bf16, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

void fsdp_gemm(char ta, char tb, int M, int N, int K, const float *A, int lda, const float *B,
               int ldb, float beta, float *C, int ldc)
{
    if (by_onednn(0, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc) == 0)
        return;
    blas_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

void fsdp_gemm_small(char ta, char tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc)
{
#ifdef FSDP_HAVE_ONEDNN
    /* use_onednn was chosen before any parallel region (fsdp_gemm_name) */
    if (use_onednn == 1 &&
        dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success)
        return;
#endif
    cblas_sgemm(CblasRowMajor, ta == 'T' ? CblasTrans : CblasNoTrans,
                tb == 'T' ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

/* ---- bf16 ------------------------------------------------------------------ */

static uint16_t *scratch[2];
static size_t scratch_n[2];

uint16_t *fsdp_gemm_scratch(int slot, size_t n)
{
    if (n > scratch_n[slot]) {
        uint16_t *p = realloc(scratch[slot], n * sizeof *p);
        if (!p)
            return NULL;
        scratch[slot] = p;
        scratch_n[slot] = n;
    }
    return scratch[slot];
}

size_t fsdp_gemm_scratch_held(int slot) { return scratch_n[slot]; }

int fsdp_gemm_bf16_fast(char *why, size_t len)
{
    if (use_onednn < 0)
        fsdp_gemm_name();
#ifdef FSDP_HAVE_ONEDNN
    if (!use_onednn) {
        snprintf(why, len, "--matmul openblas has no bf16 products");
        return 0;
    }
    /* after any --cpu-kernels cap: x86-64-v4 itself has no AVX512_BF16 */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
        snprintf(why, len, "this CPU or the --cpu-kernels level lacks AVX512_BF16");
        return 0;
    }
    return 1;
#else
    snprintf(why, len, "this build has no oneDNN (libdnnl-dev)");
    return 0;
#endif
}

/* Widens op(X) of r x c (leading dimension ld) into a dense fp32 copy with
 * the same layout. */
static float *widen(const uint16_t *x, char trans, int r, int c, int ld)
{
    size_t n = trans == 'T' ? (size_t)(c - 1) * ld + r : (size_t)(r - 1) * ld + c;
    float *f = malloc(n * sizeof *f);
    if (!f)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)x[i] << 16;
        memcpy(&f[i], &u, sizeof u);
    }
    return f;
}

/* lane -1: no oneDNN lane for this thread; OpenBLAS on widened copies */
static void gemm_bf16_on(int lane, char ta, char tb, int M, int N, int K, const uint16_t *A,
                         int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0 || K <= 0 ||
        (lane >= 0 && by_onednn_on(lane, 1, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc) == 0))
        return;
    float *a = widen(A, ta, M, K, lda), *b = widen(B, tb, K, N, ldb);
    if (!a || !b) {
        fprintf(stderr, "fsdp-train: out of memory widening a %dx%dx%d bf16 matmul\n", M, N, K);
        abort();
    }
    blas_gemm(ta, tb, M, N, K, a, lda, b, ldb, beta, C, ldc);
    free(a);
    free(b);
}

void fsdp_gemm_bf16(char ta, char tb, int M, int N, int K, const uint16_t *A, int lda,
                    const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
    gemm_bf16_on(0, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

/* Rows of C per lane: a multiple of 32 (AMX tiles are 16 rows). */
#define LANE_ROWS 32

void fsdp_gemm_bf16_rows(char ta, char tb, int M, int N, int K, const uint16_t *A, int lda,
                         const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
    const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (use_onednn < 0)
        fsdp_gemm_name(); /* chooses "auto" before the lanes look */
    if (nt < 2 || use_onednn != 1 || M < 2 * LANE_ROWS * nt || N <= 0 || K <= 0) {
        fsdp_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#ifdef FSDP_HAVE_ONEDNN
    if (engine_ready()) {
        fsdp_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    const int blocks = (M + LANE_ROWS - 1) / LANE_ROWS;
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        omp_set_num_threads(1); /* the lane's products: one thread, planned so */
        if (!my_lane) {
            int l;
#pragma omp atomic capture
            l = ++lanes_taken;
            my_lane = l < LANES ? l : -1; /* -1: OpenBLAS does this thread's shares */
        }
        const int r0 = blocks * t / n * LANE_ROWS, r1e = blocks * (t + 1) / n * LANE_ROWS;
        const int r1 = r1e < M ? r1e : M;
        if (r1 > r0)
            gemm_bf16_on(my_lane, ta, tb, r1 - r0, N, K,
                         A + (size_t)r0 * (ta == 'T' ? 1 : (size_t)lda), lda, B, ldb, beta,
                         C + (size_t)r0 * ldc, ldc);
    }
}
