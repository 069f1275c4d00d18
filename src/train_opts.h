/*
 * train_opts.h - fsdp-train's command line.
 */
#ifndef FSDP_TRAIN_OPTS_H
#define FSDP_TRAIN_OPTS_H

#include "checkpoint.h"
#include "fsdp.h"
#include "model.h"

#include <stdint.h>

struct train_opts {
    const char *data, *val_data, *log_path, *model_name;
    const char *h5_dataset;  /* --h5-dataset: an HDF5 file's token dataset */
    const char *cpu_kernels; /* auto, or an instruction set (kernels.h) */
    const char *matmul;      /* auto, onednn or openblas (kernels.h) */
    int cuda;                /* --device cuda (cuda/cuda.h) */
    char model_label[64];    /* the preset, or "custom" when a field was overridden */
    struct model_config cfg;
    long long global_batch, micro_batch; /* micro_batch 0: global / world */
    int log_samples;
    long long steps, warmup, val_every, val_samples, log_every, sample_len, threads;
    /* stopping early with a checkpoint; the schedule still follows --steps */
    long long stop_at_step; /* --stop-at-step: 0 none */
    long long snap_every;   /* --mem-snapshot-every: 0 none */
    const char *snap_dir;   /* --mem-snapshot-dir: NULL for the default under /dev/shm */
    double time_limit;      /* --time-limit, seconds from the start: 0 none */
    double slurm_end;       /* SLURM_JOB_END_TIME, Unix seconds: 0 none */
    double temperature, lr, min_lr_frac, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    enum fsdp_shard shard;
    int recompute_every;    /* --activation-checkpointing (fsdp_opts) */
    int precision;          /* --precision: TRAIN_FP32, TRAIN_BF16, TRAIN_FP16 */
    double loss_scale;      /* --loss-scale: fp16's first scale (GradScaler's init_scale) */
    long long scale_window; /* --loss-scale-window: clean steps before it doubles */
    int reduce_bf16;        /* --reduce-dtype bf16 (fsdp_opts) */
    int prefetch;           /* --prefetch (fsdp_opts) */
    int unit_blocks;        /* --unit-blocks (fsdp_opts); 0 when not given */
    double bucket_mib;      /* --bucket-mib (fsdp_opts); -1 when not given */
    struct tckpt_opts ckpt; /* ckpt.uri NULL: no checkpoints */
    unsigned allow_changed; /* --allow-changed: TRAIN_CHANGE_* bits */
};

enum { TRAIN_FP32, TRAIN_BF16, TRAIN_FP16 }; /* --precision's words, in order */
/* fp16's loss scale stays in [MIN, MAX]: it grows no further than MAX (a
 * scale past it would not resume), and one halved below MIN fails the run */
#define TRAIN_SCALE_MIN (1.0 / (1 << 24))
#define TRAIN_SCALE_MAX 1e30

/* What a resume compares with the checkpoint (train_ckpt.c): each changes
 * the run's trajectory, so a difference is refused unless --allow-changed
 * names it. World size, strategy, micro-batch, precision, prefetch,
 * recompute, hash and chunking are free: they keep the trajectory. */
enum train_change {
    TRAIN_CHANGE_DATA = 1 << 0,
    TRAIN_CHANGE_SEED = 1 << 1,
    TRAIN_CHANGE_GLOBAL_BATCH = 1 << 2,
    TRAIN_CHANGE_LR = 1 << 3,        /* --lr, --min-lr-frac, --warmup */
    TRAIN_CHANGE_OPTIMIZER = 1 << 4, /* --beta1 --beta2 --eps --weight-decay --grad-clip */
    TRAIN_CHANGE_ALL = (1 << 5) - 1,
};
/* "data,seed" -> the bits; -1 for a word that is not one */
int train_change_parse(const char *v, unsigned *bits);

/* Returns 0 to run, 1 when --help was printed, -1 with err on bad input. */
int train_opts_parse(struct train_opts *o, int argc, char **argv, char *err);
void train_opts_usage(void);

#endif
