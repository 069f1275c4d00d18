/*
 * fsdp.h - the fully sharded data-parallel engine.
 *
 * Each unit of the model (model.h) is one flat buffer of its tensors, padded
 * to a multiple of the world size W; rank r owns elements
 * [r * n/W, (r+1) * n/W) of the parameters, gradients and both AdamW moments.
 * Those shards are the only persistent state: one allocation per state kind.
 *
 *   full     FULL_SHARD: a unit is all-gathered before its forward and again
 *            before its backward, and freed after each; its full gradient is
 *            reduce-scattered into the shard as soon as its backward is done.
 *            The embedding unit (whose wte is also the tied output head) stays
 *            gathered from the first forward to the last backward, like
 *            PyTorch's root unit.
 *   grad-op  SHARD_GRAD_OP: gathered once per step and kept until the
 *            optimizer changes the shard; gradients reduce-scattered.
 *   none     NO_SHARD: every rank holds everything; gradients all-reduced.
 *
 * One training step, as the trainer drives it:
 *   fsdp_zero_grad; for each micro-batch { fsdp_set_batch; fsdp_forward;
 *   fsdp_backward }; fsdp_reduce_grads; fsdp_grad_norm; fsdp_adamw_step.
 */
#ifndef FSDP_FSDP_H
#define FSDP_FSDP_H

#include "comm.h"
#include "kernels.h"
#include "model.h"

#include <stddef.h>
#include <stdint.h>

enum fsdp_shard { FSDP_SHARD_FULL, FSDP_SHARD_GRAD_OP, FSDP_SHARD_NONE };

const char *fsdp_shard_name(enum fsdp_shard s);
int fsdp_shard_parse(const char *s, enum fsdp_shard *out);

/* How the engine is run. The recompute setting changes speed and memory,
 * never the numbers (bit-identical losses); bf16 changes the rounding. */
struct fsdp_opts {
    enum fsdp_shard shard;
    int micro_batch; /* B: sequences per forward */
    /* Activation checkpointing: 0 keeps every block's activations; N > 0
     * keeps only the output of blocks 0, N, 2N, ... and recomputes the rest
     * of their forward pass during the backward (1: every block). */
    int recompute_every;
    /* Mixed precision (FSDP's MixedPrecision with param_dtype bf16): the
     * shards stay fp32 (master parameters, gradients, AdamW moments, so
     * checkpoints do not change); units are all-gathered in bf16 and the
     * matmuls run on bf16 operands with fp32 accumulation; LayerNorm,
     * attention, GELU, softmax, the loss and every reduction stay fp32.
     * Gradients are reduce-scattered in fp32. Needs kernels with bf16
     * matmuls (fsdp_kernels_cpu_bf16). */
    int bf16;
    /* --reduce-dtype bf16 (MixedPrecision's reduce_dtype): what crosses
     * the ranks is bf16, half the bytes. full and grad-op round each unit's
     * gradient of each micro-batch and reduce-scatter it in bf16 (one rank
     * too: the rounding happens); the shard accumulates in fp32. none
     * accumulates the micro-batches in fp32 and all-reduces once per step
     * in bf16, so on one rank, with nothing to reduce, it rounds nothing.
     * Independent of bf16 above and of the CPU: conversions only. */
    int reduce_bf16;
    /* --prefetch on: the next unit's all-gather runs while this unit
     * computes (forward and backward), and a unit's reduce-scatter while the
     * next unit's backward computes (FSDP's forward_prefetch and
     * BACKWARD_PRE); non-blocking collectives, advanced between kernels.
     * Costs one more block of gathered parameters and of full gradient
     * (full) or of full gradient (grad-op). The same bits as off. */
    int prefetch;
    /* --unit-blocks K (the auto-wrap policy): K consecutive blocks form
     * one FSDP unit, gathered, freed and reduce-scattered together (one
     * collective each). Each rank still owns the same slice of every block,
     * so the checkpoint does not depend on K. 0 or 1: a unit per block. */
    int unit_blocks;
    /* --bucket-mib with --shard none (DDP's bucket_cap_mb): gradients are
     * all-reduced in buckets of about this many bytes (consecutive units,
     * last to first), each started as soon as the step's last backward has
     * made it final (fsdp_engine.final_micro), so it runs while the rest of
     * the backward computes. 0: one all-reduce after the backward. The sums
     * are taken in rank order, so the bits do not depend on the buckets. */
    size_t bucket_bytes;
    /* Half precision (MixedPrecision with param_dtype fp16, the loss scaled
     * by the caller, fsdp_backward's dloss): units are all-gathered in
     * fp16 (half the bytes) and widened to fp32 for every kernel (no fp16
     * products: fp32 matmuls on fp16 values); each unit's gradient is
     * rounded to fp16 as it leaves the backward, before its reduction, so
     * a scaled gradient past fp16's range is an infinity there, as an fp16
     * backward makes it (none: the step's accumulated gradient, once,
     * before its all-reduce). Not with bf16. Needs the backend's to_fp16. */
    int fp16;
};

/* "none", "blocks" (every block) or "every-N" (blocks 0, N, 2N, ...). */
int fsdp_recompute_parse(const char *s, int *every);
/* Writes the setting's name ("none", "blocks", "every-3") into buf. */
const char *fsdp_recompute_name(int every, char *buf, size_t len);

struct fsdp_unit {
    size_t numel;     /* logical elements */
    size_t padded;    /* numel rounded up to a multiple of the world size */
    size_t shard_n;   /* elements this rank owns */
    size_t shard_off; /* where this unit's shard starts in each state kind */
    size_t shard_lo;  /* first unit element this rank owns */
    float *full;      /* gathered parameters (valid while gathered; in bf16 only the
                         tensors not twin_only, model.h: the rest is NaN or stale) */
    uint16_t *full16; /* bf16: the same, as gathered (valid while gathered) */
    float *full_grad; /* the unit's full gradient during backward */
    int gathered;
    int group, group_n; /* the FSDP unit (--unit-blocks): its first unit, its size */
};

/* A run of shard elements inside one tensor, for the optimizer. */
struct fsdp_segment {
    size_t off, n;
    int decay;
};

/* Activations the engine's passes share with every family (fsdp_family.h);
 * a family's own (a block's inner activations) are in its struct at
 * `family`. Blocks' inner activations live in slots: every kept block has
 * its own, all recomputed blocks share the last one. Block outputs
 * (residual3) are kept for every block. In bf16 the head's input is kept
 * only in bf16 (lnf16; lnf NULL). */
struct fsdp_acts {
    float *encoded, *residual3, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
    float *loss_lse;              /* each row's log-sum-exp of its logits (the loss's backward) */
    float *scratch, *dres, *dbtc; /* (B*T, C) each, reused by every layer */
    uint16_t *lnf16;
    /* bf16 with the backend's crossentropy_backward_bf16: the head's
     * gradient, written in bf16 for its product (else NULL) */
    uint16_t *dlogits16;
    void *family; /* the family's activations (its plan() allocates the struct) */
    int nslots;
    int *slot;       /* per block: its slot */
    int slot_holder; /* the recomputed block whose activations the shared slot holds, or -1 */
};

struct fsdp_mem {
    size_t state_bytes[4]; /* params, grads, exp_avg, exp_avg_sq shards */
    size_t gather_bytes;   /* full parameter buffers */
    size_t grad_full_bytes;
    size_t act_bytes;
    int rs_slices; /* > 1: the first unit's reduce-scatter outgrows its landing place */
};

struct fsdp_family_passes;

struct fsdp_engine {
    const struct model_layout *m;
    const struct fsdp_kernels *k;
    const struct fsdp_family_passes *passes; /* the model family's (fsdp_family.h) */
    struct fsdp_comm *comm;
    enum fsdp_shard shard;
    int B, T;
    int recompute_every; /* fsdp_opts */
    int bf16;            /* fsdp_opts */
    int fp16;            /* fsdp_opts */
    int half;            /* bf16 or fp16: units are gathered in 16 bits (full16) */
    void (*to16)(uint16_t *dst, const float *src, size_t n); /* the gathers' type */
    void (*from16)(float *dst, const uint16_t *src, size_t n);
    int flash;       /* bf16 with the backend's attention_*_bf16: att holds lse */
    int reduce_bf16; /* fsdp_opts */

    struct fsdp_unit *units;
    size_t shard_total;
    float *params, *grads, *exp_avg, *exp_avg_sq;
    float *gather_buf, *grad_full_buf, *rs_tmp;
    uint16_t *gather16_buf, *shard16; /* half: gathered units; a shard on its way out */
    uint16_t *grad16, *rs16; /* reduce_bf16: a unit's gradient (none: all of them); a shard */
    void *rs_parts;          /* every rank's part of this rank's shard, on their way in */
    size_t rs_parts_bytes;
    int nbuf;        /* group buffers: 2 with prefetch (one computes, one fills) */
    int unit_blocks; /* fsdp_opts: blocks per group */
    int holder[2];   /* FULL: the group (first unit) each group buffer holds */
    int prefetch;    /* fsdp_opts */
    struct fsdp_coll gather_op, rs_op; /* at most one of each in flight: */
    int gather_unit, rs_unit;          /* their groups (first unit), or -1 */
    /* none: buckets of units lo..hi, in the order the backward finishes them */
    struct fsdp_bucket {
        int lo, hi, done;
    } * buckets;
    int nbuckets, bucket_running; /* the bucket in flight in bucket_op, or -1 */
    struct fsdp_coll bucket_op;
    int final_micro; /* set by the caller: this backward is the step's last */

    struct fsdp_segment *segs;
    int nsegs;

    struct fsdp_acts a;
    int32_t *inputs, *targets; /* backend memory, B*T each */
    int have_targets;

    struct fsdp_mem mem;
    double comm_seconds;       /* time the compute thread spent in collectives (not hidden) */
    void (*on_progress)(void); /* after each unit's forward and backward (heartbeats) */
};

struct fsdp_adamw {
    float lr, beta1, beta2, eps, weight_decay;
};

int fsdp_init(struct fsdp_engine *e, const struct model_layout *m, const struct fsdp_kernels *k,
              struct fsdp_comm *comm, const struct fsdp_opts *o, char *err);
void fsdp_free(struct fsdp_engine *e);

/* The family's initialisation of this rank's shard, optimizer moments zeroed;
 * identical values for any world size (each element is a function of seed,
 * tensor and index only). */
void fsdp_init_params(struct fsdp_engine *e, uint64_t seed);

/* Host arrays of B*T tokens; targets may be NULL (no loss). */
void fsdp_set_batch(struct fsdp_engine *e, const int32_t *inputs, const int32_t *targets);

/* Runs the forward pass on the first B rows of length T (B <= e->B, T <=
 * e->T). With targets, returns in *loss_sum the sum of this rank's per-token
 * losses. */
int fsdp_forward(struct fsdp_engine *e, int B, int T, double *loss_sum, char *err);

/* Backward of the last full-size forward; dloss is d(total loss)/d(token
 * loss), 1/(global tokens) for a mean. Gradients are accumulated into the
 * shard (full, grad-op) or the local full gradient (none). */
int fsdp_backward(struct fsdp_engine *e, float dloss, char *err);

void fsdp_zero_grad(struct fsdp_engine *e);
/* After the last micro-batch: for none, the all-reduce of every bucket the
 * backward did not start (all of them unless final_micro was set), and the
 * wait for the ones it did; nothing otherwise. */
int fsdp_reduce_grads(struct fsdp_engine *e, char *err);
int fsdp_grad_norm(struct fsdp_engine *e, double *norm, char *err);
/* One AdamW step (t counts from 1) on the local shard; gscale multiplies the
 * gradient first (clipping). */
void fsdp_adamw_step(struct fsdp_engine *e, const struct fsdp_adamw *o, int t, float gscale);

/* Call after writing the parameter shards directly (initialisation, a
 * checkpoint load, a test): every gathered copy is stale. */
void fsdp_params_changed(struct fsdp_engine *e);

/* Frees every gathered unit (FULL) so memory returns to the shard size. */
void fsdp_release(struct fsdp_engine *e);

/* Logits row of position t of batch row 0 after a forward without targets
 * (host copy of Vp floats). */
void fsdp_logits_row(struct fsdp_engine *e, int t, float *out);

#endif
