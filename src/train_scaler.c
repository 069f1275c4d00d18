/*
 * train_scaler.c - fp16's dynamic loss scale, as ShardedGradScaler keeps
 * it: the update after each step's vote, and its state in the checkpoint
 * (train.h). The scaling itself is train.c's (the loss's gradient times
 * the scale, the optimizer's unscale) and the engine's (fp16 gradients).
 */
#include "train.h"

#include "heartbeat.h"
#include "util.h"

#include <stdint.h>
#include <stdio.h>

/* fp16, once every rank has voted: a step whose scaled gradients overflow
 * on some rank is skipped on every rank and the scale halved; N clean
 * steps in a row (--loss-scale-window) double it (GradScaler's update).
 * Returns 1 to skip the step, -1 when the scale has fallen too low. */
int train_scale_update(struct trainer *t, long long step, int overflow, char *err)
{
    if (!t->fp16)
        return 0;
    if (!overflow) {
        if (++t->clean >= t->o.scale_window && 2 * t->scale <= TRAIN_SCALE_MAX) {
            t->scale *= 2;
            t->clean = 0;
        } else if (t->clean >= t->o.scale_window) {
            t->clean = t->o.scale_window; /* at the largest scale: stays */
        }
        return 0;
    }
    t->skipped++;
    t->clean = 0;
    t->scale *= 0.5;
    if (t->scale < TRAIN_SCALE_MIN) {
        t->agreed_error = 1; /* every rank's vote said so: rank 0 reports */
        return fsdp_err(err,
                        "training diverged: the gradients overflow at every loss scale down to "
                        "2^-24 (step %lld)",
                        step + 1);
    }
    if (t->comm.rank == 0) /* %f: the events' grammar has no exponents */
        hb_event("loss_scale_skip step=%lld scale=%.24f", step + 1, t->scale);
    return 1;
}

/* AdamW's own step count (fp16 skips steps; older checkpoints say the
 * step) and fp16's scaler (absent: an fp32 or bf16 run's), checked:
 * check_unchanged refuses a checkpoint whose values are not these before
 * a byte of its shards is read. -1 with err. */
struct scaler_state {
    long long skipped;
    int have; /* grad_scaler recorded */
    double scale;
    long long tracker, interval;
};

static int read_scaler(const json_t *j, uint64_t step, struct scaler_state *st, char *err)
{
    const json_t *opt = json_object_get(j, "optimizer"), *tv = json_object_get(opt, "t");
    *st = (struct scaler_state){0};
    if (tv) {
        json_int_t n = json_is_integer(tv) ? json_integer_value(tv) : -1;
        if (n < 0 || (uint64_t)n > step)
            return fsdp_err(err, "optimizer.t is not a step count from 0 to %llu",
                            (unsigned long long)step);
        st->skipped = (long long)(step - (uint64_t)n);
    }
    const json_t *gs = json_object_get(j, "grad_scaler");
    if (!gs)
        return 0;
    json_int_t tracker = -1, interval = 0;
    st->scale = -1;
    if (json_unpack((json_t *)gs, "{s:F, s:I, s?I}", "scale", &st->scale, "growth_tracker",
                    &tracker, "growth_interval", &interval) ||
        !(st->scale >= TRAIN_SCALE_MIN && st->scale <= TRAIN_SCALE_MAX) || tracker < 0 ||
        tracker > INT32_MAX || interval < 0 || interval > INT32_MAX)
        return fsdp_err(err,
                        "grad_scaler needs a scale from 2^-24 to 1e30 and a growth_tracker and "
                        "growth_interval from 0 to 2^31-1");
    st->have = 1;
    st->tracker = tracker;
    st->interval = interval;
    return 0;
}

int train_scaler_check(const json_t *j, uint64_t step, char *err)
{
    struct scaler_state st;
    return read_scaler(j, step, &st, err);
}

json_t *train_scaler_state(const struct trainer *t)
{
    return json_pack("{s:f, s:I, s:I}", "scale", t->scale, "growth_tracker", (json_int_t)t->clean,
                     "growth_interval", (json_int_t)t->o.scale_window);
}

/* Resuming fp16 from fp16, the scale where it was; an fp32 or bf16
 * checkpoint starts fp16 at --loss-scale, and an fp16 one resumed in fp32
 * or bf16 leaves its scale unused. AdamW's count goes on either way. */
int train_scaler_restore(struct trainer *t, const json_t *j, uint64_t step, char *err)
{
    struct scaler_state st;
    char why[FSDP_ERR_LEN];
    if (read_scaler(j, step, &st, why)) /* check_unchanged refused it first */
        return fsdp_err(err, "checkpoint step %llu: %s", (unsigned long long)step, why);
    t->skipped = st.skipped;
    if (!st.have || !t->fp16)
        return 0;
    t->scale = st.scale;
    t->clean = st.tracker;
    if (t->comm.rank != 0)
        return 0;
    fprintf(stderr,
            "fsdp-train: loss scale %g from the checkpoint (%lld clean steps, %lld steps skipped "
            "so far)\n",
            st.scale, st.tracker, st.skipped);
    if (st.interval && st.interval != t->o.scale_window)
        fprintf(stderr,
                "fsdp-train: the checkpoint's run doubled its scale every %lld clean steps, this "
                "one every %lld (--loss-scale-window)\n",
                st.interval, t->o.scale_window);
    return 0;
}
