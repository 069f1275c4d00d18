/*
 * train.h - inside fsdp-train: the trainer's state, and what the training
 * loop (train.c) asks of its checkpoints (train_ckpt.c) and of its
 * validation and sampling (train_eval.c). Not for other programs.
 */
#ifndef FSDP_TRAIN_H
#define FSDP_TRAIN_H

#include "checkpoint.h"
#include "data.h"
#include "fsdp.h"
#include "train_opts.h"

#include <stdint.h>
#include <stdio.h>

/* Data in a store (--data s3://...): each step asks the read-ahead for its
 * own samples and those of this many steps after it. */
#define DATA_AHEAD_STEPS 2

struct trainer {
    struct train_opts o;
    struct fsdp_comm comm;
    struct model_layout model;
    struct fsdp_engine eng;
    struct token_file train_file, val_file;
    struct sample_stream stream;
    int threads, micro, accum; /* micro: sequences per rank per forward */
    int bf16;                  /* --precision bf16, on every rank (agree_precision) */
    int fp16;                  /* --precision fp16, on every rank (agree_precision) */
    /* fp16's dynamic loss scale (ShardedGradScaler): the scale, the steps
     * in a row without overflow since it last changed, the steps skipped
     * so far (AdamW's own count is the steps taken less these) */
    double scale;
    long long clean, skipped;
    char precision[256];  /* what the banner says of it */
    uint64_t cursor;      /* samples of the stream consumed so far */
    int32_t *in, *tgt;    /* host batch, micro * T each */
    uint64_t *consumed;   /* sample indices this rank used in the step */
    int log_fd;           /* rank 0's --log (O_APPEND), -1: none */
    char log_failed[200]; /* rank 0: why a write of the log failed ("": none) */
    struct tckpt ck;
    int have_ckpt;
    struct tckpt snap; /* --mem-snapshot-every: the snapshots' store in RAM */
    int have_snap;
    char snap_dir[512];
    char ck_claim[65];    /* SHA-256 of the checkpoint store's claim of this launch's generation */
    long long start_step; /* steps already done when this process started */
    uint64_t sample_rng;  /* state of the sampling generator */
    int agreed_error;     /* every rank knows: rank 0 reports, nobody aborts */
    int preempted;        /* an emergency checkpoint was written; exit 0 */
    const char *stopped;  /* why the run stopped before --steps (NULL: it did not) */
    long long stopped_at; /* and after which step */
    double start;         /* when main began (--time-limit counts from here) */
    double limit;         /* the time limit, a monotonic time (INFINITY: none; deadline()) */
    const char *limit_from; /* and what set it */
    double step_max;        /* the longest step, validation and checkpoint save of this */
    double val_max;         /* process: the margin kept before a time limit */
    double save_max;
    int async_pending; /* an async checkpoint is being written (same on every rank) */
    double async_t0;
    int snap_pending; /* a snapshot is being written (same on every rank) */
    double train_t0;  /* when the training loop began (the log's elapsed_s) */
    double ckpt_s;    /* time the loop spent in checkpoint work (the log's ckpt_s) */
};

/* train_ckpt.c. Collective, every one: opens the checkpoint store and
 * resumes from it; writes step's checkpoint (save: now; save_async: in the
 * background, committed by finish_async, which waits for this rank's write
 * first; why, when not NULL, says what made it wait). */
int train_setup_checkpoints(struct trainer *t, char *err);
int train_save(struct trainer *t, long long step, char *err);
int train_save_async(struct trainer *t, long long step, char *err);
int train_finish_async(struct trainer *t, const char *why, char *err);
/* Collective: step's snapshot into RAM when --mem-snapshot-every says so
 * (end_of_step skips the steps it checkpoints), handed to the snapshots'
 * background writer, which copies the state while the next step's
 * forward and backward run and writes it; finish_snapshot, right after
 * that step's vote, waits for this rank's write and commits: a snapshot
 * of step s is committed before step s + 1 is reported done. After the
 * run's last checkpoint, the snapshots' store is removed (end_snapshots). */
int train_snapshot(struct trainer *t, long long step, char *err);
int train_finish_snapshot(struct trainer *t, char *err);
void train_end_snapshots(struct trainer *t);

/* train_scaler.c. fp16's loss scale: after every rank's vote, the
 * update (1: the step is skipped on every rank and the scale halved; N
 * clean steps in a row double it; -1 when it has fallen below
 * TRAIN_SCALE_MIN); in a checkpoint's trainer state, the grad_scaler
 * object (state_dict's), checked before a byte of a resume's shards is
 * read (check: -1 with err naming what is wrong), and restored with
 * AdamW's own step count (restore). */
int train_scale_update(struct trainer *t, long long step, int overflow, char *err);
json_t *train_scaler_state(const struct trainer *t);
int train_scaler_check(const json_t *trainer_state, uint64_t step, char *err);
int train_scaler_restore(struct trainer *t, const json_t *trainer_state, uint64_t step, char *err);

/* train_eval.c. Collective: the mean validation loss over the first
 * --val-samples sequences; --sample's tokens, which rank 0 prints. */
int train_validate(struct trainer *t, double *out, char *err);
int train_generate(struct trainer *t, char *err);

#endif
