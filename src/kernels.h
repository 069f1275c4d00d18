/*
 * kernels.h - the compute backend: memory and the model's kernels behind one
 * struct of function pointers, so the FSDP engine never names a device.
 *
 * The CPU backend (cpu/kernels_cpu.c) uses OpenMP and OpenBLAS; a CUDA backend
 * adds a file that fills the same struct. Pointers passed to kernels are
 * backend memory (from alloc). Dimension names follow llm.c: B batch, T time,
 * C channels, OC output channels, NH heads, V vocabulary, Vp padded vocabulary,
 * N rows (B*T).
 *
 * Accumulation convention, fixed so the engine can be read top to bottom:
 * parameter gradients (dw, db, dwte, dwpe) are always accumulated (+=);
 * activation gradients are overwritten (=) except layernorm_backward's dinp,
 * which accumulates into the residual stream's gradient.
 */
#ifndef FSDP_KERNELS_H
#define FSDP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

struct fsdp_kernels {
    const char *name;
    /* 1 when alloc's memory is on a device (CUDA): the engine and the
     * checkpoint code then never dereference it, they copy it through
     * host_alloc's memory (pinned for fast copies) with upload/download */
    int on_device;
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);

    /* memory: alloc returns zeroed, touched memory; upload/download copy
     * between host and backend memory */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*zero)(float *p, size_t n);
    void (*copy)(float *dst, const float *src, size_t n);
    /* Both return when the copy is done. download waits for the kernels
     * queued before it, from any thread (the async checkpoint writer). */
    void (*upload)(void *dst, const void *src, size_t bytes);
    void (*download)(void *dst, const void *src, size_t bytes);

    /* out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]; wpe (and dwpe) NULL: no
     * position embedding (Llama) */
    void (*encoder_forward)(float *out, const int32_t *tok, const float *wte, const float *wpe,
                            int B, int T, int C);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B,
                             int T, int C);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, size_t N, int C);
    /* layernorm_forward with out rounded to bf16, bit for bit what
     * to_bf16 would make of layernorm_forward's out: a bf16 run writes the
     * next product's input in one pass instead of three (gelu_forward_bf16
     * likewise) */
    void (*layernorm_forward_bf16)(uint16_t *out16, float *mean, float *rstd, const float *inp,
                                   const float *w, const float *b, size_t N, int C);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, size_t N, int C);
    /* out = inp W^T + bias (bias may be NULL); inp (N,C), W (OC,C), out (N,OC) */
    void (*matmul_forward)(float *out, const float *inp, const float *w, const float *bias,
                           size_t N, int C, int OC);
    /* dinp = dout W; dw += dout^T inp; dbias += sum_rows dout (dbias may be NULL) */
    void (*matmul_backward)(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, size_t N, int C, int OC);
    /* bf16 is the upper half of a float. to_bf16 rounds to nearest even
     * (NaN stays NaN); from_bf16 is exact. */
    void (*to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*from_bf16)(float *dst, const uint16_t *src, size_t n);
    /* IEEE half precision (--precision fp16; NULL where the backend has
     * none): to_fp16 rounds to nearest even, 65520 and up become an
     * infinity (what a loss scale too large makes of a gradient);
     * from_fp16 is exact; round_fp16 is the two in place. */
    void (*to_fp16)(uint16_t *dst, const float *src, size_t n);
    void (*from_fp16)(float *dst, const uint16_t *src, size_t n);
    void (*round_fp16)(float *x, size_t n);
    /* matmul_forward / matmul_backward on bf16 operands: inp is the input
     * already rounded to bf16 (the engine keeps that copy for the backward,
     * as autocast does), w the weight in bf16; dout is rounded to bf16 for
     * the products, which accumulate in fp32; dbias is summed from the fp32
     * dout; every output is fp32. Only called when the kernels say they run
     * bf16 (fsdp_kernels_cpu_bf16, fsdp_cuda_bf16). */
    void (*matmul_forward_bf16)(float *out, const uint16_t *inp, const uint16_t *w,
                                const float *bias, size_t N, int C, int OC);
    void (*matmul_backward_bf16)(float *dinp, float *dw, float *dbias, const float *dout,
                                 const uint16_t *inp, const uint16_t *w, size_t N, int C, int OC);
    /* Reserves the scratch matmul_backward_bf16 rounds dout into: room for
     * n elements (a larger dout goes through it in chunks of rows on the
     * CPU; the GPU grows it). Returns the bytes held, 0 when out of memory. */
    size_t (*bf16_scratch)(size_t n);
    /* causal grouped-query attention: NH query heads of HS channels, KVH
     * K/V heads (query head h reads K/V head h / (NH/KVH); KVH = NH is
     * multi-head attention). qkv (B,T,(NH+2KVH)HS) holds each row as [q |
     * k | v]; att (B,NH,T,T) keeps the softmax for the backward pass (the
     * CPU's leaves the masked entries past a row's block of 64 unwritten and
     * never reads them); out (B,T,NH*HS) */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int NH,
                              int KVH, int HS);
    /* datt is scratch of (B,NH,T,T); dqkv (B,T,(NH+2KVH)HS) is overwritten */
    void (*attention_backward)(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, int B, int T, int NH, int KVH, int HS);
    /* bf16 runs (optional: NULL where the backend has none): causal
     * multi-head attention (qkv (B,T,3C), out (B,T,C)) flash-style on bf16 operands, fp32
     * accumulation and softmax, for heads up to attention_bf16_max_hs wide. qkv16 is qkv in bf16,
     * written so by matmul_forward_to_bf16; out16, the output in bf16, is
     * the next product's input and all the backward needs of it. Instead of
     * the softmax the forward keeps lse (B,NH,T), each row's log-sum-exp of
     * the scaled scores, and the backward recomputes the probabilities from
     * it; d is scratch of (B,NH,T). dqkv (fp32) is overwritten. Memory is
     * O(T) per row instead of O(T^2); the results match the fp32 kernels to
     * bf16's precision (tests/unit/flash_ref.c is the reference). */
    void (*attention_forward_bf16)(uint16_t *out16, float *lse, const uint16_t *qkv16, int B, int T,
                                   int C, int NH);
    void (*attention_backward_bf16)(float *dqkv, float *d, const float *dout, const uint16_t *out16,
                                    const uint16_t *qkv16, const float *lse, int B, int T, int C,
                                    int NH);
    /* Set with the two above, for the qkv product: out16 = inp w^T + bias16
     * summed in fp32 and rounded to bf16 once; the bias (required) is bf16
     * too (the bf16 twin of the fp32 one), as autocast's and cuBLASLt's are. */
    void (*matmul_forward_to_bf16)(uint16_t *out16, const uint16_t *inp, const uint16_t *w,
                                   const uint16_t *bias16, size_t N, int C, int OC);
    int attention_bf16_max_hs;
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_forward_bf16)(uint16_t *out16, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    /* out = a + b */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);

    /* The Llama family's (fp32 math; the bf16 forms round the output as
     * they write it, bit for bit what to_bf16 makes of the fp32 output).
     * RMSNorm: out = inp * rstd * w, rstd[i] = 1 / sqrt(mean(inp_i^2) +
     * eps); its backward accumulates dinp (the residual stream's gradient)
     * and dw. */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, size_t N,
                            int C, float eps);
    void (*rmsnorm_forward_bf16)(uint16_t *out16, float *rstd, const float *inp, const float *w,
                                 size_t N, int C, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, size_t N, int C);
    /* Rotary position embedding, in place, on the first NROT heads of HS
     * channels of each row of x (B*T rows, `stride` floats apart; row b*T+t
     * is at position t): Hugging Face's half-split form, channel i < HS/2
     * paired with i + HS/2 and turned by angle t * freq[i], cos and sin from
     * tables (T, HS/2). inverse turns back (the backward: the rotation's
     * transpose). */
    void (*rope)(float *x, const float *cos, const float *sin, int B, int T, int NROT, int HS,
                 int stride, int inverse);
    /* SwiGLU on inp (N, 2F), each row [gate | up]: out (N, F) = silu(gate)
     * * up; the backward writes dinp (N, 2F) from dout (N, F). */
    void (*swiglu_forward)(float *out, const float *inp, size_t N, int F);
    void (*swiglu_forward_bf16)(uint16_t *out16, const float *inp, size_t N, int F);
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, size_t N, int F);
    /* Optional (NULL: swiglu_backward, then matmul_backward_bf16 rounds):
     * dinp rounded as it is written, for gate/up's matmul_backward_from_bf16 */
    void (*swiglu_backward_bf16)(uint16_t *dinp16, const float *inp, const float *dout, size_t N,
                                 int F);
    /* The loss over the first V of each row's Vp logits, which stay as they
     * are: lse[i] = log sum_j exp(logits[i,j]) (what the backward needs of
     * the softmax: one value a row), losses[i] = lse[i] - logits[i,target] */
    void (*crossentropy_forward)(float *losses, float *lse, const float *logits,
                                 const int32_t *targets, size_t N, int V, int Vp);
    /* dlogits = (softmax - onehot(target)) * dloss, the softmax exp(logits -
     * lse); columns V..Vp-1 get 0. dlogits may be logits (in place). */
    void (*crossentropy_backward)(float *dlogits, const float *logits, const float *lse,
                                  const int32_t *targets, float dloss, size_t N, int V, int Vp);
    /* Optional, for bf16 runs (NULL: crossentropy_backward, then
     * matmul_backward_bf16 rounds): dlogits rounded as they are written, the
     * bits to_bf16 makes of crossentropy_backward's, into their own buffer;
     * and the head's matmul backward on that bf16 gradient (it has no bias).
     * The logits, a step's largest tensor, are then read once by each pass
     * and the gradient written once in bf16; before, the forward rewrote
     * them as probabilities, the backward as an fp32 gradient, and the
     * product read that again to round it. */
    void (*crossentropy_backward_bf16)(uint16_t *dlogits16, const float *logits, const float *lse,
                                       const int32_t *targets, float dloss, size_t N, int V,
                                       int Vp);
    void (*matmul_backward_from_bf16)(float *dinp, float *dw, const uint16_t *dout16,
                                      const uint16_t *inp, const uint16_t *w, size_t N, int C,
                                      int OC);

    /* optimizer on one contiguous range of a shard: AdamW with bias
     * corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, gradient scaled by
     * gscale (clipping), decoupled weight decay wd */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float bc1, float bc2, float gscale);
    double (*sumsq)(const float *x, size_t n);
    /* dst += src */
    void (*add)(float *dst, const float *src, size_t n);
    /* Optional (NULL: to_bf16, from_bf16, then add): dst += src rounded to
     * bf16, what a one-rank bf16 run makes of its gradient */
    void (*add_bf16_rounded)(float *dst, const float *src, size_t n);
};

/* Call first thing in main: may re-execute the program so that OpenBLAS
 * loads its kernels for this CPU (see kernels_cpu.c). */
void fsdp_kernels_cpu_fix_blas_core(char **argv);
/* Sets the number of compute threads for the CPU backend (OpenMP + BLAS). */
void fsdp_kernels_cpu_threads(int n);
/* The CPU kernel table: the one fsdp_kernels_cpu_select chose, else the
 * widest this CPU supports (see kernels_cpu.c). */
const struct fsdp_kernels *fsdp_kernels_cpu(void);
/* Picks the table by instruction set: "auto", or one of this build's
 * ("x86-64", "x86-64-v3", "x86-64-v4"; "native" in a -Dnative=true build).
 * -1 with err when the name is unknown or the CPU cannot run that table. */
int fsdp_kernels_cpu_select(const char *want, char *err, size_t errlen);
/* Picks the matmul library: "auto", "onednn" or "openblas" (cpu/gemm.h).
 * -1 with err when unknown or not in this build. */
int fsdp_kernels_cpu_matmul(const char *want, char *err, size_t errlen);
/* 1 when bf16 matmuls run at bf16 speed here (oneDNN chosen, and its
 * instruction set includes AVX512_BF16); else 0 with the reason in why. */
int fsdp_kernels_cpu_bf16(char *why, size_t len);
/* A one-line description of the CPU math libraries in use. */
const char *fsdp_kernels_cpu_blas(void);

#endif
