/*
 * fsdp_family.h - the seam between the FSDP engine's passes (fsdp_pass.c)
 * and a model family's (model_gpt2_pass.c, model_llama_pass.c).
 *
 * The engine owns the order of a step: it gathers units, prefetches the
 * next, frees them, starts their gradients' reductions, decides which
 * blocks are recomputed and which slot of activations each block uses, and
 * computes the output head and the loss. A family owns what happens inside:
 * the embedding, one block forward and backward, and the final norm, as
 * straight-line calls of the backend's kernels on the unit's gathered
 * parameters. It keeps its activations in a struct of its own
 * (fsdp_acts.family), sized by plan() and carved out of the engine's one
 * allocation.
 *
 * Registered by arch in model_passes.c (fsdp_family_passes); a new family
 * adds its file and a line there.
 */
#ifndef FSDP_FAMILY_H
#define FSDP_FAMILY_H

#include "fsdp.h"
#include "fsdp_units.h"

#include <stddef.h>
#include <stdint.h>

/* The activation allocation's entries: each pointer gets n elements,
 * 64-byte aligned, NULL when n is 0. */
#define FSDP_PLAN_MAX 48
struct fsdp_plan {
    int n, n16;
    struct {
        float **p;
        size_t n;
    } f[FSDP_PLAN_MAX];
    struct {
        uint16_t **p;
        size_t n;
    } h[FSDP_PLAN_MAX];
};
void fsdp_plan_add(struct fsdp_plan *p, float **ptr, size_t n);
void fsdp_plan_add16(struct fsdp_plan *p, uint16_t **ptr, size_t n);

struct fsdp_family_passes {
    /* 1 when the family's attention can take the backend's bf16 flash
     * kernels (attention_forward_bf16: one K/V head per query head) */
    int flash;
    /* Allocates the family's activation struct into e->a.family (freed
     * with free() by the engine) and adds its entries to the plan: e->a's
     * slots (nslots: blocks that keep activations, and one shared by the
     * recomputed) are set. -1: out of memory. */
    int (*plan)(struct fsdp_engine *e, struct fsdp_plan *p);
    /* Once, after the allocation: constants the passes read (RoPE's
     * tables). NULL: none. */
    void (*setup)(struct fsdp_engine *e);
    /* a->encoded from the tokens (e->inputs), on unit 0's gathered
     * parameters; and its backward from a->dres into unit 0's gradient. */
    void (*embed_forward)(struct fsdp_engine *e, int B, int T);
    void (*embed_backward)(struct fsdp_engine *e);
    /* Block l on B x T rows, its input fsdp_block_input(e, l), its output
     * fsdp_block_output(e, l), its activations in slot fsdp_slot(e, l).
     * recompute: the backward's replay, which stops where the block's
     * output (kept) would be computed. */
    void (*block_forward)(struct fsdp_engine *e, int l, int B, int T, int recompute);
    /* a->dres: d(loss)/d(block output) on entry, d(loss)/d(block input)
     * on return; gradients accumulate into the unit's full_grad. */
    void (*block_backward)(struct fsdp_engine *e, int l);
    /* The final norm of the last block's output into a->lnf (fp32) or
     * a->lnf16 (bf16), the head's input; its backward adds d(loss)/d(last
     * block's output) to a->dres from a->dbtc (d(loss)/d(norm output)). */
    void (*final_forward)(struct fsdp_engine *e, size_t BT);
    void (*final_backward)(struct fsdp_engine *e);
};

/* model_passes.c: the passes of family arch (model.h). */
const struct fsdp_family_passes *fsdp_family_passes(int arch);

/* ---- what the engine lends the families (fsdp_pass.c) ---------------------------- */

/* Parameters of unit u: its gathered fp32 buffer; the bf16 twin of a
 * pointer x into it (bf16 runs, where a twin_only tensor, model.h, is valid
 * in its twin alone: its fp32 copy is never widened). */
const uint16_t *fsdp_twin16(const struct fsdp_engine *e, int u, const float *x);
/* The products of unit u, on its fp32 or (bf16) bf16 weights (the twin of
 * w): in bf16 the input's producer wrote it in bf16 (inp16), and the
 * backward reads the same copy. */
void fsdp_mm_forward(struct fsdp_engine *e, int u, float *out, const float *inp,
                     const uint16_t *inp16, const float *w, const float *bias, size_t N, int C,
                     int OC);
void fsdp_mm_backward(struct fsdp_engine *e, int u, float *dinp, float *dw, float *dbias,
                      const float *dout, const float *inp, const uint16_t *inp16, const float *w,
                      size_t N, int C, int OC);
/* Block l's activation slot; its input (the residual stream: a->encoded
 * for block 0) and output (kept for every block). */
int fsdp_slot(const struct fsdp_engine *e, int l);
const float *fsdp_block_input(const struct fsdp_engine *e, int l);
float *fsdp_block_output(const struct fsdp_engine *e, int l);

#endif
