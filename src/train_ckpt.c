/*
 * train_ckpt.c - fsdp-train's checkpoints: the trainer's state in them,
 * resume, and the saves, now or in the background (train.h; the protocol
 * itself is checkpoint.c's).
 */
#include "train.h"

#include "heartbeat.h"
#include "util.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static json_t *trainer_state(const struct trainer *t, long long step)
{
    const struct train_opts *o = &t->o;
    char rng[24];
    snprintf(rng, sizeof rng, "%016llx", (unsigned long long)t->sample_rng);
    return json_pack(
        "{s:I, s:I, s:I, s:I, s:s, s:I, s:i, s:{s:f, s:f, s:I, s:I}, "
        "s:{s:s, s:f, s:f, s:f, s:f, s:I}}",
        "step", (json_int_t)step, "tokens_seen", (json_int_t)(t->cursor * (uint64_t)o->cfg.seq),
        "data_cursor", (json_int_t)t->cursor, "seed", (json_int_t)o->seed, "rng_state", rng,
        "global_batch", (json_int_t)o->global_batch, "seq", o->cfg.seq, "schedule", "lr", o->lr,
        "min_lr_frac", o->min_lr_frac, "warmup", (json_int_t)o->warmup, "total_steps",
        (json_int_t)o->steps, "optimizer", "name", "adamw", "beta1", o->beta1, "beta2", o->beta2,
        "eps", o->eps, "weight_decay", o->weight_decay, "t", (json_int_t)step);
}

static int restore_state(struct trainer *t, json_t *j, uint64_t step, char *err)
{
    json_int_t s = -1, cursor = -1;
    const char *rng = NULL;
    char *end = NULL;
    if (json_unpack(j, "{s:I, s:I, s:s}", "step", &s, "data_cursor", &cursor, "rng_state", &rng) ||
        s < 0 || cursor < 0 || (uint64_t)s != step)
        return fsdp_err(err,
                        "checkpoint step %llu: trainer state lacks step, data_cursor or "
                        "rng_state",
                        (unsigned long long)step);
    unsigned long long r = strtoull(rng, &end, 16);
    if (!*rng || *end)
        return fsdp_err(err, "checkpoint step %llu: rng_state '%s' is not hexadecimal",
                        (unsigned long long)step, rng);
    t->start_step = s;
    t->cursor = (uint64_t)cursor;
    t->sample_rng = (uint64_t)r;
    return 0;
}

int train_save(struct trainer *t, long long step, char *err)
{
    json_t *state = trainer_state(t, step);
    if (!state)
        return fsdp_err(err, "checkpoint: out of memory");
    double t0 = fsdp_now();
    int rc = tckpt_save(&t->ck, (uint64_t)step, state, err);
    json_decref(state);
    if (rc) {
        t->agreed_error = 1;
        char msg[FSDP_ERR_LEN];
        snprintf(msg, sizeof msg, "%s", err);
        if (t->ck.newest_committed == (uint64_t)step) /* the commit held; retention failed */
            return fsdp_err(err,
                            "checkpoint step %lld is committed, but removing older "
                            "checkpoints (--keep) failed: %s",
                            step, msg);
        if (t->ck.newest_committed)
            return fsdp_err(err,
                            "checkpoint of step %lld failed: %s (the newest committed "
                            "checkpoint is step %llu)",
                            step, msg, (unsigned long long)t->ck.newest_committed);
        return fsdp_err(err, "checkpoint of step %lld failed: %s", step, msg);
    }
    t->ckpt_s += fsdp_now() - t0;
    if (fsdp_now() - t0 > t->save_max)
        t->save_max = fsdp_now() - t0;
    if (t->comm.rank == 0 && !t->ck.skipped)
        fprintf(stderr, "fsdp-train: checkpoint step %lld committed in %.2f s\n", step,
                fsdp_now() - t0);
    return 0;
}

/* Collective: waits for this rank's background write, then commits. */
int train_finish_async(struct trainer *t, const char *why, char *err)
{
    double t0 = fsdp_now();
    uint64_t step = tckpt_async_step(&t->ck);
    int rc = tckpt_async_finish(&t->ck, err);
    t->async_pending = 0;
    if (rc) {
        t->agreed_error = 1;
        char msg[FSDP_ERR_LEN];
        snprintf(msg, sizeof msg, "%s", err);
        if (!t->ck.newest_committed)
            return fsdp_err(err,
                            "background checkpoint of step %llu failed: %s (no checkpoint "
                            "is committed yet)",
                            (unsigned long long)step, msg);
        return fsdp_err(err,
                        "background checkpoint of step %llu failed: %s (the newest "
                        "committed checkpoint is step %llu)",
                        (unsigned long long)step, msg, (unsigned long long)t->ck.newest_committed);
    }
    t->ckpt_s += fsdp_now() - t0;
    if (fsdp_now() - t->async_t0 > t->save_max) /* a whole save, had it been waited for */
        t->save_max = fsdp_now() - t->async_t0;
    if (t->comm.rank == 0 && !t->ck.skipped) {
        if (why)
            fprintf(stderr, "fsdp-train: %s: waited %.2f s for checkpoint step %llu\n", why,
                    fsdp_now() - t0, (unsigned long long)step);
        fprintf(stderr,
                "fsdp-train: checkpoint step %llu committed (async, %.2f s after its "
                "step boundary)\n",
                (unsigned long long)step, fsdp_now() - t->async_t0);
    }
    return 0;
}

int train_save_async(struct trainer *t, long long step, char *err)
{
    if (t->async_pending && train_finish_async(t, "a checkpoint is due", err))
        return -1;
    json_t *state = trainer_state(t, step);
    if (!state)
        return fsdp_err(err, "checkpoint: out of memory");
    double t0 = fsdp_now();
    int rc = tckpt_save_async(&t->ck, (uint64_t)step, state, err);
    json_decref(state);
    if (rc)
        return -1;
    t->async_pending = 1;
    t->async_t0 = fsdp_now();
    t->ckpt_s += t->async_t0 - t0;
    if (t->comm.rank == 0)
        fprintf(stderr,
                "fsdp-train: checkpoint step %lld: snapshot and write in the "
                "background\n",
                step);
    return 0;
}

/* Collective: opens the checkpoint store and resumes from it. */
int train_setup_checkpoints(struct trainer *t, char *err)
{
    if (!t->o.ckpt.uri)
        return 0;
    t->agreed_error = 1; /* everything here is agreed on by all ranks */
    t->o.ckpt.load_threads = t->threads;
    if (tckpt_open(&t->ck, &t->o.ckpt, &t->eng, &t->comm, &t->model, err))
        return -1;
    t->have_ckpt = 1;
    if (t->o.ckpt.async && tckpt_async_start(&t->ck, err))
        return -1;
    json_t *state;
    uint64_t step;
    int rc = tckpt_resume(&t->ck, &state, &step, err);
    if (rc)
        return rc;
    if (state) {
        rc = restore_state(t, state, step, err);
        json_decref(state);
        if (rc)
            return rc;
        if (t->comm.rank == 0) {
            fprintf(stderr, "fsdp-train: resumed from checkpoint step %llu in %s\n",
                    (unsigned long long)step, t->ck.st->uri);
            hb_event("resumed step=%llu world=%d", (unsigned long long)step, t->comm.world);
        }
        hb_set(step, HB_TRAIN);
    } else {
        fsdp_init_params(&t->eng, t->o.seed); /* a failed attempt may have written */
        if (t->comm.rank == 0)
            hb_event("resumed step=0 world=%d", t->comm.world);
        hb_set(0, HB_TRAIN);
    }
    t->agreed_error = 0;
    return 0;
}
