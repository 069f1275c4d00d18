/*
 * train_ckpt.c - fsdp-train's checkpoints: the trainer's state in them,
 * resume, and the saves, now or in the background (train.h; the protocol
 * itself is checkpoint.c's).
 */
#include "train.h"

#include "heartbeat.h"
#include "util.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The training data's identity: its size and the SHA-256 of its header and
 * 64 blocks of 4 KiB spread evenly over it (the whole file when smaller):
 * a few hundred KiB read whatever the file's size, and no two token files
 * a user would mix up agree on all of it. */
static json_t *data_identity(const struct token_file *f)
{
    enum { BLOCKS = 64, BLOCK = 4096 };
    const unsigned char *b = f->map;
    const size_t len = f->map_len;
    unsigned char *buf = malloc((size_t)BLOCKS * BLOCK + 1024);
    size_t n = 0;
    if (!buf)
        return NULL;
    if (len <= (size_t)BLOCKS * BLOCK + 1024) {
        memcpy(buf, b, len);
        n = len;
    } else {
        memcpy(buf, b, 1024);
        n = 1024;
        for (size_t i = 0; i < BLOCKS; i++) {
            size_t at = 1024 + (len - 1024 - BLOCK) / (BLOCKS - 1) * i;
            memcpy(buf + n, b + at, BLOCK);
            n += BLOCK;
        }
    }
    char hex[65];
    int rc = fsdp_sha256_hex(buf, n, hex);
    free(buf);
    return rc ? NULL
              : json_pack("{s:I, s:I, s:s}", "bytes", (json_int_t)len, "tokens",
                          (json_int_t)f->ntokens, "sample_sha256", hex);
}

static json_t *trainer_state(const struct trainer *t, long long step)
{
    const struct train_opts *o = &t->o;
    char rng[24];
    snprintf(rng, sizeof rng, "%016llx", (unsigned long long)t->sample_rng);
    json_t *data = data_identity(&t->train_file);
    if (!data)
        return NULL;
    return json_pack(
        "{s:I, s:I, s:I, s:I, s:s, s:I, s:i, s:o, s:{s:f, s:f, s:I, s:I}, "
        "s:{s:s, s:f, s:f, s:f, s:f, s:f, s:I}}",
        "step", (json_int_t)step, "tokens_seen", (json_int_t)(t->cursor * (uint64_t)o->cfg.seq),
        "data_cursor", (json_int_t)t->cursor, "seed", (json_int_t)o->seed, "rng_state", rng,
        "global_batch", (json_int_t)o->global_batch, "seq", o->cfg.seq, "data", data, "schedule",
        "lr", o->lr, "min_lr_frac", o->min_lr_frac, "warmup", (json_int_t)o->warmup, "total_steps",
        (json_int_t)o->steps, "optimizer", "name", "adamw", "beta1", o->beta1, "beta2", o->beta2,
        "eps", o->eps, "weight_decay", o->weight_decay, "grad_clip", o->grad_clip, "t",
        (json_int_t)step);
}

/* One value of the checkpoint's trainer state against this run's: 0 when
 * equal or not recorded (an imported checkpoint, an older format). */
struct recorded {
    const char *path; /* "seed", "schedule.lr" */
    const char *flag; /* what the user sets it with */
    unsigned allow;   /* the --allow-changed word that lets it differ */
    double now;
    long long inow; /* integers compared as integers (a seed may pass 2^53) */
    int is_int;
};

static int compare_one(const json_t *j, const struct recorded *r, double *was)
{
    char obj[32] = "";
    const char *key = r->path, *dot = strchr(r->path, '.');
    if (dot) {
        snprintf(obj, sizeof obj, "%.*s", (int)(dot - r->path), r->path);
        j = json_object_get(j, obj);
        key = dot + 1;
    }
    const json_t *v = j ? json_object_get(j, key) : NULL;
    if (!v || !json_is_number(v))
        return 0;
    *was = json_number_value(v);
    if (r->is_int)
        return !json_is_integer(v) || json_integer_value(v) != r->inow;
    return *was != r->now;
}

/* the shortest form that reads back as x */
static const char *num(char *buf, size_t n, double x)
{
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    return buf;
}

static const char *change_word(unsigned bit)
{
    return bit == TRAIN_CHANGE_DATA           ? "data"
           : bit == TRAIN_CHANGE_SEED         ? "seed"
           : bit == TRAIN_CHANGE_GLOBAL_BATCH ? "global-batch"
           : bit == TRAIN_CHANGE_LR           ? "lr"
                                              : "optimizer";
}

/* fsdp_err's message with a resume's refusal (exit status 2) */
static int refused(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refused(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, FSDP_ERR_LEN, fmt, ap);
    va_end(ap);
    return TCKPT_REFUSED;
}

/* What would make the resumed run another run: refused, naming both
 * values, unless --allow-changed says the user means it. Called by the
 * resume before a byte of the step's shards is read. */
static int check_unchanged(void *ctx, json_t *j, uint64_t step, char *err)
{
    struct trainer *t = ctx;
    const struct train_opts *o = &t->o;
    const char *uri = t->ck.st->uri;
    if ((uint64_t)o->steps < step)
        return refused(err,
                       "checkpoint step %llu in %s is past --steps %lld: nothing to train "
                       "(raise --steps to go on, or use another --ckpt)",
                       (unsigned long long)step, uri, o->steps);
    const struct recorded rs[] = {
        {"seed", "--seed", TRAIN_CHANGE_SEED, (double)o->seed, (long long)o->seed, 1},
        {"global_batch", "--global-batch", TRAIN_CHANGE_GLOBAL_BATCH, (double)o->global_batch,
         o->global_batch, 1},
        {"schedule.lr", "--lr", TRAIN_CHANGE_LR, o->lr, 0, 0},
        {"schedule.min_lr_frac", "--min-lr-frac", TRAIN_CHANGE_LR, o->min_lr_frac, 0, 0},
        {"schedule.warmup", "--warmup", TRAIN_CHANGE_LR, (double)o->warmup, o->warmup, 1},
        {"optimizer.beta1", "--beta1", TRAIN_CHANGE_OPTIMIZER, o->beta1, 0, 0},
        {"optimizer.beta2", "--beta2", TRAIN_CHANGE_OPTIMIZER, o->beta2, 0, 0},
        {"optimizer.eps", "--eps", TRAIN_CHANGE_OPTIMIZER, o->eps, 0, 0},
        {"optimizer.weight_decay", "--weight-decay", TRAIN_CHANGE_OPTIMIZER, o->weight_decay, 0, 0},
        {"optimizer.grad_clip", "--grad-clip", TRAIN_CHANGE_OPTIMIZER, o->grad_clip, 0, 0},
    };
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        double was;
        char a[32], b[32];
        if (!compare_one(j, &rs[i], &was) || (o->allow_changed & rs[i].allow))
            continue;
        return refused(err,
                       "checkpoint step %llu in %s was trained with %s %s, this run has %s %s: "
                       "refusing to resume (the run would not continue its own history; "
                       "--allow-changed %s if you mean it)",
                       (unsigned long long)step, uri, rs[i].flag, num(a, sizeof a, was), rs[i].flag,
                       rs[i].is_int ? (snprintf(b, sizeof b, "%lld", rs[i].inow), b)
                                    : num(b, sizeof b, rs[i].now),
                       change_word(rs[i].allow));
    }
    json_t *was = json_object_get(j, "data");
    if (was && !(o->allow_changed & TRAIN_CHANGE_DATA)) {
        json_t *now = data_identity(&t->train_file);
        if (!now)
            return refused(err, "--data %s: cannot compute its identity", o->data);
        int same = json_equal(was, now);
        json_int_t wb = -1, wt = -1, nb = -1, nt = -1;
        json_unpack(was, "{s?I, s?I}", "bytes", &wb, "tokens", &wt);
        json_unpack(now, "{s:I, s:I}", "bytes", &nb, "tokens", &nt);
        json_decref(now);
        if (!same)
            return refused(err,
                           "checkpoint step %llu in %s was trained on other data (%lld tokens, "
                           "%lld bytes) than --data %s (%lld tokens, %lld bytes%s): refusing to "
                           "resume (--allow-changed data if you mean it)",
                           (unsigned long long)step, uri, (long long)wt, (long long)wb, o->data,
                           (long long)nt, (long long)nb,
                           wb == nb ? ", the same size, other contents" : "");
    }
    json_int_t total = -1;
    json_unpack(j, "{s?{s?I}}", "schedule", "total_steps", &total);
    if (total > 0 && total != o->steps && t->comm.rank == 0)
        fprintf(stderr,
                "fsdp-train: --steps %lld, the checkpoint's run was to take %lld: the "
                "learning-rate schedule is stretched to the new length from step %llu on\n",
                o->steps, (long long)total, (unsigned long long)step);
    return 0;
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
    t->o.ckpt.check_trainer = check_unchanged;
    t->o.ckpt.check_ctx = t;
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
