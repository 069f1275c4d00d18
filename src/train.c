/*
 * train.c - fsdp-train: the training loop around the FSDP engine.
 *
 * Started by mpirun it runs one rank per process over Open MPI; started
 * alone it is one rank with no MPI at all. Rank 0 prints and logs; every
 * rank runs the same loop so the collectives line up. Its checkpoints are
 * train_ckpt.c's, its validation and samples train_eval.c's (train.h: the
 * trainer's state, which the three share).
 */
#include "train.h"

#include "cuda/cuda.h"
#include "heartbeat.h"
#include "testhook.h" /* the training loop's hold: a heartbeat phase (FSDP_TEST_HOLD_AT) */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <malloc.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static int pick_threads(const struct trainer *t)
{
    if (t->o.threads)
        return (int)t->o.threads;
    const char *env = getenv("OMP_NUM_THREADS");
    long long n;
    if (env && fsdp_parse_i64(env, 1, 1024, &n) == 0)
        return (int)n;
    cpu_set_t set;
    int avail = 1;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        avail = CPU_COUNT(&set);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (avail < online) /* mpirun bound this rank to its own cores */
        return avail;
    int per = avail / (t->comm.local_size > 0 ? t->comm.local_size : 1);
    return per > 0 ? per : 1;
}

static double lr_at(const struct train_opts *o, long long step)
{
    if (step < o->warmup)
        return o->lr * (double)(step + 1) / (double)o->warmup;
    double min_lr = o->lr * o->min_lr_frac;
    long long span = o->steps - o->warmup;
    double progress = span > 0 ? (double)(step - o->warmup) / (double)span : 1.0;
    if (progress > 1.0)
        progress = 1.0;
    return min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (o->lr - min_lr);
}

static double mib(size_t b) { return (double)b / 1048576.0; }

static void print_banner(const struct trainer *t)
{
    const struct model_config *c = &t->model.cfg;
    const struct fsdp_mem *m = &t->eng.mem;
    char ac[32], buckets[48] = "", shape[256];
    /* "tiny (L4 C128 H4 T128 V256)"; other families name themselves */
    model_config_describe(c, shape, sizeof shape);
    const char *desc = c->arch == MODEL_GPT2 ? strchr(shape, ' ') + 1 : shape;
    size_t full = 0;
    if (t->eng.nbuckets) /* none on several ranks */
        snprintf(buckets, sizeof buckets, ", gradients all-reduced in %d bucket%s", t->eng.nbuckets,
                 t->eng.nbuckets > 1 ? "s" : "");
    for (int u = 0; u < t->model.nunits; u++)
        full += t->model.units[u].numel * sizeof(float);
    fprintf(stderr,
            "fsdp-train: model %s (%s), %.2fM parameters; %d rank%s, shard %s, "
            "%s%s, prefetch %s, %d block%s per unit%s, %d thread%s per rank; %s kernels; %s\n",
            t->o.model_label, desc, (double)t->model.numel / 1e6, t->comm.world,
            t->comm.world > 1 ? "s" : "", fsdp_shard_name(t->o.shard), t->precision,
            t->o.reduce_bf16 ? ", gradients reduced in bf16" : "", t->eng.prefetch ? "on" : "off",
            t->eng.unit_blocks, t->eng.unit_blocks > 1 ? "s" : "", buckets, t->threads,
            t->threads > 1 ? "s" : "", t->eng.k->name,
            t->o.cuda ? (t->eng.flash ? "cuBLAS matmuls, flash attention, NCCL collectives"
                                      : "cuBLAS matmuls, NCCL collectives")
                      : fsdp_kernels_cpu_blas());
    char slices[64] = "";
    if (m->rs_slices > 1)
        snprintf(slices, sizeof slices, "; the embedding's gradient reduced in %d slices",
                 m->rs_slices);
    fprintf(stderr,
            "fsdp-train: per rank: params %.2f MiB, grads %.2f MiB, optimizer %.2f MiB "
            "(unsharded %.2f / %.2f / %.2f MiB); gathered params %.2f MiB, full grads %.2f MiB, "
            "activations %.2f MiB (activation checkpointing %s)%s\n",
            mib(m->state_bytes[0]), mib(m->state_bytes[1]),
            mib(m->state_bytes[2] + m->state_bytes[3]), mib(full), mib(full), mib(2 * full),
            mib(m->gather_bytes), mib(m->grad_full_bytes), mib(m->act_bytes),
            fsdp_recompute_name(t->o.recompute_every, ac, sizeof ac), slices);
    fprintf(stderr,
            "fsdp-train: global batch %lld = %d ranks x %d micro-batch x %d accumulation, %zu "
            "training sequences\n",
            t->o.global_batch, t->comm.world, t->micro, t->accum, (size_t)t->stream.nsamples);
    if (t->train_file.remote)
        fprintf(stderr,
                "fsdp-train: data %s: %zu tokens in a store, read with ranged GETs, each step's "
                "samples and the next %d steps' asked for ahead\n",
                t->o.data, t->train_file.ntokens, DATA_AHEAD_STEPS);
}

/* Data in a store: this rank's samples of this step and the next
 * DATA_AHEAD_STEPS, asked of the read-ahead (those asked for already stay
 * as they are). */
static void read_ahead(struct trainer *t, long long step)
{
    const uint64_t G = (uint64_t)t->o.global_batch, per_rank = G / (uint64_t)t->comm.world;
    const uint64_t left = (uint64_t)(t->o.steps - step); /* this step's and those after */
    for (uint64_t s = 0; s <= DATA_AHEAD_STEPS && s < left; s++)
        for (uint64_t b = 0; b < per_rank; b++)
            token_file_prefetch(
                &t->train_file,
                sample_stream_index(&t->stream, t->cursor + s * G + t->comm.rank * per_rank + b));
}

/* Loads micro-batch m of this rank for step (0-based), which starts at the
 * cursor. */
static int load_micro(struct trainer *t, long long step, int m, char *err)
{
    const int T = t->model.cfg.seq;
    const uint64_t per_rank = (uint64_t)t->o.global_batch / (uint64_t)t->comm.world;
    uint64_t base = t->cursor + (uint64_t)t->comm.rank * per_rank + (uint64_t)m * t->micro;
    if (m == 0 && t->train_file.remote)
        read_ahead(t, step);
    for (int b = 0; b < t->micro; b++) {
        uint64_t idx = sample_stream_index(&t->stream, base + (uint64_t)b);
        t->consumed[(size_t)m * t->micro + b] = idx;
        if (sample_stream_fetch(&t->stream, idx, t->in + (size_t)b * T, t->tgt + (size_t)b * T,
                                err))
            return -1;
    }
    fsdp_set_batch(&t->eng, t->in, t->tgt);
    return 0;
}

/* --log-samples: every rank's indices of the step, on rank 0, in global
 * order (rank r's slice follows rank r-1's). */
static int gather_samples(struct trainer *t, json_t **out, char *err)
{
    size_t n = (size_t)t->accum * t->micro, lens[t->comm.world];
    char *all = NULL;
    *out = NULL;
    if (t->comm.gather_bytes(&t->comm, t->consumed, n * sizeof *t->consumed, 0, &all, lens, err))
        return -1;
    if (t->comm.rank == 0) {
        *out = json_array();
        size_t total = 0;
        for (int r = 0; r < t->comm.world; r++)
            total += lens[r];
        for (size_t i = 0; i + sizeof(uint64_t) <= total; i += sizeof(uint64_t)) {
            uint64_t v;
            memcpy(&v, all + i, sizeof v);
            json_array_append_new(*out, json_integer((json_int_t)v));
        }
    }
    free(all);
    return 0;
}

/* One line of --log in one write. A failed write (a full disk, /dev/full)
 * takes its part-line back out (a regular file: truncated to where the
 * line began) and stops the run at the next step with a
 * checkpoint (end_of_step): the log is the run's record, the metrics the
 * user and the supervisor read, and what fills a disk under it would fail
 * the next checkpoint too. */
static void log_line(struct trainer *t, long long step, const char *line)
{
    if (t->log_fd < 0 || t->log_failed[0])
        return;
    struct stat st;
    const off_t at = fstat(t->log_fd, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : -1;
    size_t n = strlen(line);
    char *buf = malloc(n + 1);
    int bad = !buf, e = ENOMEM;
    if (buf) {
        memcpy(buf, line, n);
        buf[n] = '\n';
        bad = fsdp_write_all(t->log_fd, buf, n + 1) != 0;
        e = errno;
        free(buf);
    }
    if (!bad)
        return;
    int cut = at >= 0 && ftruncate(t->log_fd, at) == 0;
    snprintf(t->log_failed, sizeof t->log_failed, "%.80s: writing step %lld failed: %s%s",
             t->o.log_path, step, strerror(e),
             cut ? " (the part of the line written was taken back out)" : "");
}

static void log_step(struct trainer *t, long long step, double loss, double lr, double norm,
                     double dt, double val, json_t *samples, int skipped)
{
    double tps = (double)t->o.global_batch * t->model.cfg.seq / dt;
    if (t->comm.rank != 0)
        return;
    static double next_progress; /* for a supervisor's metrics: at most one a second */
    if (fsdp_now() >= next_progress) {
        next_progress = fsdp_now() + 1.0;
        if (t->fp16) /* no exponent: the events' grammar */
            hb_event("progress step=%lld loss=%.6f tokens_per_s=%.1f loss_scale=%.24f skipped=%lld",
                     step + 1, loss, tps, t->scale, t->skipped);
        else
            hb_event("progress step=%lld loss=%.6f tokens_per_s=%.1f", step + 1, loss, tps);
    }
    if ((step + 1) % t->o.log_every == 0 || step + 1 == t->o.steps || !isnan(val) || skipped) {
        fprintf(stderr,
                "step %6lld/%lld | loss %.6f | lr %.3e | norm %.4f | %8.0f tok/s | %7.1f ms",
                step + 1, t->o.steps, loss, lr, norm, tps, dt * 1e3);
        if (!isnan(val))
            fprintf(stderr, " | val %.6f", val);
        if (t->fp16)
            fprintf(stderr, " | scale %g%s", t->scale,
                    skipped ? " | skipped: the gradients overflow; scale halved" : "");
        fputc('\n', stderr);
    }
    if (t->log_fd >= 0) {
        json_t *j = json_pack(
            "{s:I, s:f, s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:f, s:I}", "step", (json_int_t)step + 1,
            "loss", loss, "lr", lr, "grad_norm", isfinite(norm) ? norm : 0.0, "tokens_per_s", tps,
            "ms", dt * 1e3, "samples_seen", (json_int_t)t->cursor, "elapsed_s",
            fsdp_now() - t->train_t0, "ckpt_s", t->ckpt_s, "comm_s", t->eng.comm_seconds,
            "activation_bytes", (json_int_t)t->eng.mem.act_bytes);
        if (j && !isnan(val))
            json_object_set_new(j, "val_loss", json_real(val));
        if (j && !isfinite(norm)) /* JSON has no infinity: a skipped step's */
            json_object_set_new(j, "grad_norm", json_null());
        if (j && t->fp16) {
            json_object_set_new(j, "loss_scale", json_real(t->scale));
            json_object_set_new(j, "skipped", json_boolean(skipped));
            json_object_set_new(j, "skipped_steps", json_integer((json_int_t)t->skipped));
        }
        if (j && samples)
            json_object_set(j, "samples", samples);
        if (j && hb_generation()) /* the log is appended to by every launch */
            json_object_set_new(j, "generation", json_integer((json_int_t)hb_generation()));
        char *line = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
        json_decref(j);
        if (line)
            log_line(t, step + 1, line);
        free(line);
    }
}

/* What every rank learns at each step from one allreduce (sums over ranks),
 * riding on the loss's reduction: no extra collective anywhere else. */
enum step_vote {
    VOTE_LOSS,
    VOTE_PREEMPTED,    /* ranks asked to stop (a preemption notice) */
    VOTE_WRITES_ENDED, /* ranks whose background checkpoint write has ended */
    VOTE_WRITES_FAILED,
    VOTE_OUT_OF_TIME, /* rank 0 judged that a time limit is near */
    VOTE_LOG_FAILED,  /* rank 0 could not write the log */
    VOTE_OVERFLOW,    /* fp16: ranks whose scaled gradient is not finite */
    VOTE_N
};

/* The time limit as a monotonic time (INFINITY: none): --time-limit after
 * the start, or SLURM_JOB_END_TIME, whichever comes first. An end time
 * already past is a limit in the past (stop now), whatever the machine's
 * uptime: the monotonic clock may start anywhere, so no value of it means
 * "none". */
static double deadline(const struct trainer *t, const char **which)
{
    double d = INFINITY;
    *which = NULL;
    if (t->o.time_limit > 0) {
        d = t->start + t->o.time_limit;
        *which = "--time-limit";
    }
    if (t->o.slurm_end > 0) {
        double s = fsdp_now() + t->o.slurm_end - fsdp_unix_now();
        if (s < d) {
            d = s;
            *which = "SLURM_JOB_END_TIME";
        }
    }
    return d;
}

/* stop_early's phase for a stop the run's error reports (nothing said) */
#define HB_FAILED_SOON (-1)

/* Collective: a checkpoint of step (when --ckpt is set), then the loop ends
 * (a preemption notice, a time limit, --stop-at-step). */
static int stop_early(struct trainer *t, long long step, const char *why, int phase, char *err)
{
    if (t->comm.rank == 0 && phase != HB_FAILED_SOON)
        fprintf(stderr, "fsdp-train: %s: %s at step %lld\n", why,
                t->have_ckpt ? "checkpoint" : "stopping without a checkpoint (no --ckpt)", step);
    if (t->async_pending && train_finish_async(t, why, err))
        return -1;
    if (t->have_ckpt && train_save(t, step, err))
        return -1;
    if (t->comm.rank == 0 && phase == HB_PREEMPTED)
        hb_event("emergency_checkpoint step=%lld", step);
    t->stopped = why;
    t->stopped_at = step;
    hb_set((uint64_t)step, phase == HB_FAILED_SOON ? HB_STOPPED : phase);
    return 0;
}

/* One step's forward and backward over this rank's micro-batches; *loss:
 * their summed loss (the step's mean comes with the vote). */
static int forward_backward(struct trainer *t, long long step, double tokens, double *loss,
                            char *err)
{
    const int T = t->model.cfg.seq;
    *loss = 0;
    fsdp_zero_grad(&t->eng);
    for (int m = 0; m < t->accum; m++) {
        double l;
        if (load_micro(t, step, m, err))
            return -1;
        t->eng.final_micro = m == t->accum - 1; /* none: reduce buckets as they finish */
        if (fsdp_forward(&t->eng, t->micro, T, &l, err) ||
            fsdp_backward(&t->eng, (float)((t->fp16 ? t->scale : 1.0) / tokens), err))
            return -1;
        *loss += l;
    }
    return 0;
}

/* Collective: the gradients' reduction and norm, and the step's vote.
 * Every rank learns at the same step that some rank was asked to stop,
 * that every rank's background write has ended (the step commits it), and
 * rank 0's judgement of the time limit: after this step there must be time
 * for one more and a checkpoint, with a step to spare (the longest of each
 * seen so far). */
static int reduce_and_vote(struct trainer *t, long long step, double loss, double vote[VOTE_N],
                           double *norm, char *err)
{
    int in_flight = 0, failed = 0, ended = 0;
    if (t->async_pending)
        ended = tckpt_async_state(&t->ck, &in_flight, &failed);
    vote[VOTE_LOSS] = loss;
    vote[VOTE_PREEMPTED] = hb_preempted();
    vote[VOTE_WRITES_ENDED] = ended;
    vote[VOTE_WRITES_FAILED] = failed;
    vote[VOTE_OUT_OF_TIME] = 0;
    vote[VOTE_LOG_FAILED] = t->log_failed[0] != 0;
    /* the margin: two steps, a validation, a save, and a background
     * write still to wait for (the longest seen; a save is at least the
     * resume's load) */
    double save_s = t->save_max > t->ck.load_s ? t->save_max : t->ck.load_s;
    double margin = 2 * t->step_max + t->val_max + save_s * (1 + t->async_pending);
    if (isfinite(t->limit) && t->comm.rank == 0 && step + 1 < t->o.steps)
        vote[VOTE_OUT_OF_TIME] = fsdp_now() + margin >= t->limit;
    if (fsdp_reduce_grads(&t->eng, err))
        return -1;
    if (t->fp16 && testhook_overflow((uint64_t)step + 1, t->comm.rank)) { /* this rank's only */
        const float inf = INFINITY;
        t->eng.k->upload(t->eng.grads, &inf, sizeof inf);
    }
    if (fsdp_grad_norm(&t->eng, norm, err))
        return -1;
    /* a rank's own verdict: --shard none's norm is not summed over ranks */
    vote[VOTE_OVERFLOW] = t->fp16 && !isfinite(*norm);
    return t->comm.allreduce_sum_f64(&t->comm, vote, VOTE_N, err) ? -1 : 0;
}

/* The optimizer step (norm: the gradient's, unscaled; scale: the loss
 * scale its gradients carry, 1 but in fp16): clipping to --grad-clip, the schedule's learning
 * rate (returned), AdamW. An async snapshot of the state is waited for
 * first: this is the step's first write of the state. */
static double optimizer_step(struct trainer *t, long long step, double norm, double scale)
{
    const struct train_opts *o = &t->o;
    float gscale = (float)(1.0 / scale); /* the gradients are the scaled loss's */
    if (o->grad_clip > 0 && norm > o->grad_clip)
        gscale = (float)(o->grad_clip / (norm + 1e-6) / scale);
    double lr = lr_at(o, step);
    struct fsdp_adamw opt = {(float)lr, (float)o->beta1, (float)o->beta2, (float)o->eps,
                             (float)o->weight_decay};
    if (t->async_pending) {
        double w0 = fsdp_now();
        if (tckpt_async_snapshot_wait(&t->ck))
            t->ckpt_s += fsdp_now() - w0;
    }
    fsdp_adamw_step(&t->eng, &opt, (int)(step + 1 - t->skipped), gscale);
    return lr;
}

/* Collective: the validation loss after step (0-based) when one is due,
 * else NAN. */
static int validate_if_due(struct trainer *t, long long step, double *val, char *err)
{
    const struct train_opts *o = &t->o;
    *val = NAN;
    int last = step + 1 == o->steps;
    if (!o->val_data || !((o->val_every && (step + 1) % o->val_every == 0) || last))
        return 0;
    double v0 = fsdp_now();
    if (train_validate(t, val, err))
        return -1;
    t->val_max = fsdp_now() - v0 > t->val_max ? fsdp_now() - v0 : t->val_max;
    return 0;
}

/* Collective: a checkpoint of step, then the run fails with the log's
 * error (rank 0 says it; every rank knows). */
static int log_failure(struct trainer *t, long long step, char *err)
{
    if (stop_early(t, step, "the log failed", HB_FAILED_SOON, err))
        return -1;
    t->agreed_error = 1;
    fsdp_err(err, "--log %s; stopped at step %lld%s", t->log_failed[0] ? t->log_failed : "failed",
             step, t->have_ckpt ? " after a checkpoint of it" : " (no --ckpt)");
    return -1;
}

/* Collective, once step (0-based) is logged: commits a background write
 * every rank has finished, then stops early (a preemption notice, the time
 * limit, --stop-at-step) or checkpoints when one is due. Returns 1 when the
 * loop ends here, 0 to go on, -1 on failure. */
static int end_of_step(struct trainer *t, long long step, const double vote[VOTE_N], char *err)
{
    const struct train_opts *o = &t->o;
    static char limit_why[96];
    int last = step + 1 == o->steps;
    int due = (o->ckpt.every && (step + 1) % o->ckpt.every == 0) || last;
    if (t->async_pending && vote[VOTE_WRITES_ENDED] == t->comm.world &&
        train_finish_async(t, NULL, err))
        return -1;
    if (vote[VOTE_LOG_FAILED] > 0) /* the log's write failed at the step before */
        return log_failure(t, step + 1, err);
    if (vote[VOTE_PREEMPTED] > 0) { /* an emergency checkpoint, then stop */
        t->preempted = 1;
        return stop_early(t, step + 1, "preemption notice", HB_PREEMPTED, err) ? -1 : 1;
    }
    if (vote[VOTE_OUT_OF_TIME] > 0) {
        double left = t->limit - fsdp_now();
        snprintf(limit_why, sizeof limit_why, "time limit (%s) %s %.0f s", t->limit_from,
                 left >= 0 ? "in" : "passed", fabs(left));
        return stop_early(t, step + 1, limit_why, HB_STOPPED, err) ? -1 : 1;
    }
    if (step + 1 == o->stop_at_step && !last)
        return stop_early(t, step + 1, "--stop-at-step", HB_STOPPED, err) ? -1 : 1;
    if (t->have_ckpt && due &&
        (o->ckpt.async ? train_save_async(t, step + 1, err) : train_save(t, step + 1, err)))
        return -1;
    return due ? 0 : train_snapshot(t, step + 1, err); /* a checkpoint of the step is newer */
}

static int train(struct trainer *t, char *err)
{
    const struct train_opts *o = &t->o;
    const double tokens = (double)o->global_batch * t->model.cfg.seq;
    t->limit = deadline(t, &t->limit_from);
    t->train_t0 = fsdp_now();
    for (long long step = t->start_step; step < o->steps; step++) {
        double t0 = fsdp_now(), loss, norm, vote[VOTE_N], val;
        if (forward_backward(t, step, tokens, &loss, err) ||
            reduce_and_vote(t, step, loss, vote, &norm, err) ||
            (t->snap_pending && train_finish_snapshot(t, err))) /* the last step's */
            return -1;
        loss = vote[VOTE_LOSS] / tokens;
        const double used = t->fp16 ? t->scale : 1.0; /* this step's backward's scale */
        int skip = train_scale_update(t, step, vote[VOTE_OVERFLOW] > 0, err);
        if (skip < 0)
            return -1;
        double lr = skip ? lr_at(o, step) : optimizer_step(t, step, norm / used, used);
        norm = skip ? INFINITY : norm / used; /* skipped: some rank's was not finite */
        t->cursor += (uint64_t)o->global_batch;
        double dt = fsdp_now() - t0;
        t->step_max = dt > t->step_max ? dt : t->step_max;
        if (validate_if_due(t, step, &val, err))
            return -1;
        if (!isfinite(loss))
            return fsdp_err(err, "training diverged: loss is %f at step %lld", loss, step + 1);
        json_t *samples = NULL;
        if (o->log_samples && gather_samples(t, &samples, err))
            return -1;
        log_step(t, step, loss, lr, norm, dt, val, samples, skip);
        json_decref(samples);
        hb_set((uint64_t)step + 1, HB_TRAIN);
        testhook_hold((uint64_t)step + 1);
        int rc = end_of_step(t, step, vote, err);
        if (rc)
            return rc < 0 ? -1 : 0;
    }
    /* the final checkpoint is waited for */
    if (t->async_pending && train_finish_async(t, NULL, err))
        return -1;
    double failed = t->log_failed[0] != 0; /* the last step's line, after its vote */
    if (t->comm.allreduce_sum_f64(&t->comm, &failed, 1, err))
        return -1;
    if (failed > 0) {
        t->agreed_error = 1;
        return fsdp_err(err, "--log %s; the run finished its %lld steps",
                        t->log_failed[0] ? t->log_failed : "failed", o->steps);
    }
    hb_set((uint64_t)o->steps, HB_DONE);
    return 0;
}

/* Collective: bf16 only when every rank can run it (a fleet may mix CPUs
 * with and without AVX512_BF16, and the gathers' element type must match). */
static int agree_precision(struct trainer *t, char *err)
{
    char why[128] = "";
    const int want16 = t->o.precision == TRAIN_FP16, want_bf16 = t->o.precision == TRAIN_BF16;
    int can = want16      ? !t->o.cuda /* the CUDA backend has no fp16 conversions yet */
              : t->o.cuda ? fsdp_cuda_bf16(why, sizeof why)
                          : fsdp_kernels_cpu_bf16(why, sizeof why);
    double lacking = t->o.precision != TRAIN_FP32 && !can; /* ranks that cannot */
    if (t->comm.allreduce_sum_f64(&t->comm, &lacking, 1, err))
        return -1;
    t->bf16 = want_bf16 && lacking == 0;
    t->fp16 = want16 && lacking == 0;
    t->scale = t->fp16 ? t->o.loss_scale : 1.0;
    if (t->o.cuda) /* attention's fp32 products too, as under autocast */
        fsdp_cuda_allow_tf32(t->bf16);
    if (t->bf16)
        snprintf(t->precision, sizeof t->precision,
                 "precision bf16 (gathers and matmuls; fp32 master state)");
    else if (t->fp16)
        snprintf(t->precision, sizeof t->precision,
                 "precision fp16 (gathers and gradients, dynamic loss scale from %g, doubled "
                 "after %lld clean steps; fp32 matmuls on the fp16 values; fp32 master state)",
                 t->o.loss_scale, t->o.scale_window);
    else if (t->o.precision == TRAIN_FP32)
        snprintf(t->precision, sizeof t->precision, "precision fp32");
    else if (want16)
        snprintf(t->precision, sizeof t->precision,
                 "precision fp32 (fp16 asked for, but the CUDA backend has no fp16 kernels)");
    else if (why[0]) /* rank 0 prints the banner: its own reason */
        snprintf(t->precision, sizeof t->precision, "precision fp32 (bf16 asked for, but %s)", why);
    else
        snprintf(t->precision, sizeof t->precision,
                 "precision fp32 (bf16 asked for, but %.0f of %d ranks lack %s)", lacking,
                 t->comm.world, t->o.cuda ? "a GPU with bf16" : "AVX512_BF16 or oneDNN");
    return 0;
}

/* --unit-blocks, or for grad-op the blocks that make about --bucket-mib of
 * gradient per reduce-scatter */
static int unit_blocks(const struct trainer *t)
{
    const struct train_opts *o = &t->o;
    if (o->unit_blocks || o->shard != FSDP_SHARD_GRAD_OP || o->bucket_mib < 0)
        return o->unit_blocks;
    double block = (double)t->model.units[model_unit_block(0)].numel * sizeof(float);
    double k = floor(o->bucket_mib * 1048576.0 / block + 0.5);
    return k < 1 ? 1 : k > o->cfg.layers ? o->cfg.layers : (int)k;
}

/* --log: appended to (every launch of a job adds its lines); a FIFO
 * without a reader is refused at once instead of blocking open() */
static int open_log(struct trainer *t, const char *path, char *err)
{
    t->log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
    if (t->log_fd < 0)
        return fsdp_err(err, "--log %s: cannot open for writing: %s", path,
                        errno == ENXIO ? "a FIFO with no reader" : strerror(errno));
    int fl = fcntl(t->log_fd, F_GETFL);
    if (fl == -1 || fcntl(t->log_fd, F_SETFL, fl & ~O_NONBLOCK) == -1)
        return fsdp_err(err, "--log %s: %s", path, strerror(errno));
    return 0;
}

/* A token file, an HDF5 file, or token files in a store (read ahead by
 * up to `ahead` samples). */
static int open_data(struct trainer *t, struct token_file *f, const char *path, int ahead,
                     char *err)
{
    const struct train_opts *o = &t->o;
    if (!token_file_is_store(path))
        return token_file_open_ds(f, path, o->h5_dataset, o->cfg.vocab, err);
    if (o->h5_dataset)
        return fsdp_err(err,
                        "--h5-dataset names an HDF5 file's dataset; %s is a store, whose "
                        "data are token files",
                        path);
    return token_file_open_store(f, path, o->cfg.vocab, o->cfg.seq, ahead, err);
}

static int setup(struct trainer *t, char *err)
{
    const struct train_opts *o = &t->o;
    const int W = t->comm.world;
    if (o->global_batch % W)
        return fsdp_err(err, "--global-batch %lld is not a multiple of the %d ranks",
                        o->global_batch, W);
    long long per_rank = o->global_batch / W;
    long long micro = o->micro_batch ? o->micro_batch : per_rank;
    if (per_rank % micro)
        return fsdp_err(err, "--micro-batch %lld does not divide the %lld sequences per rank",
                        micro, per_rank);
    t->micro = (int)micro;
    t->accum = (int)(per_rank / micro);
    t->threads = pick_threads(t);
    fsdp_kernels_cpu_threads(t->threads);
    if (model_layout_init(&t->model, &o->cfg, err))
        return -1;
    if (open_data(t, &t->train_file, o->data, (DATA_AHEAD_STEPS + 2) * (int)per_rank, err))
        return -1;
    if (o->val_data && open_data(t, &t->val_file, o->val_data, 1, err))
        return -1;
    char sub[FSDP_ERR_LEN];
    if (sample_stream_init(&t->stream, &t->train_file, o->cfg.seq, o->seed, sub))
        return fsdp_err(err, "%s: %s", o->data, sub);
    if (t->stream.nsamples < (uint64_t)o->global_batch)
        return fsdp_err(err, "%s: only %llu sequences of %d+1 tokens, fewer than one global batch",
                        o->data, (unsigned long long)t->stream.nsamples, o->cfg.seq);
    t->in = calloc((size_t)t->micro * o->cfg.seq, sizeof *t->in);
    t->tgt = calloc((size_t)t->micro * o->cfg.seq, sizeof *t->tgt);
    t->consumed = calloc((size_t)per_rank, sizeof *t->consumed);
    if (!t->in || !t->tgt || !t->consumed)
        return fsdp_err(err, "out of memory for the batch");
    const struct fsdp_opts fo = {o->shard,
                                 t->micro,
                                 o->recompute_every,
                                 t->bf16,
                                 o->reduce_bf16,
                                 o->prefetch,
                                 unit_blocks(t),
                                 o->shard != FSDP_SHARD_NONE ? 0
                                 : o->bucket_mib < 0         ? (size_t)25 << 20 /* DDP's */
                                 : o->bucket_mib == 0        ? 0 /* one, after the backward */
                                                      : (size_t)(o->bucket_mib * 1048576.0) + 1,
                                 t->fp16};
    const struct fsdp_kernels *k = o->cuda ? fsdp_kernels_cuda() : fsdp_kernels_cpu();
    if (fsdp_init(&t->eng, &t->model, k, &t->comm, &fo, err))
        return -1;
    t->eng.on_progress = hb_progress;
    fsdp_init_params(&t->eng, o->seed);
    t->sample_rng = fsdp_mix64(o->seed ^ 0x5a3b1e);
    if (o->log_path && t->comm.rank == 0 && open_log(t, o->log_path, err))
        return -1;
    if (t->comm.rank == 0)
        print_banner(t);
    return 0;
}

/* Collective, after set-up: every rank opened the same data in a store (a
 * listing taken while objects were uploaded could differ between ranks,
 * and so would every rank's samples). */
static int agree_data(struct trainer *t, char *err)
{
    if (!t->train_file.remote || t->comm.world == 1)
        return 0;
    struct {
        uint64_t ntokens;
        char sha[65];
    } mine = {t->train_file.ntokens, ""}, root;
    uint64_t bytes;
    snprintf(mine.sha, sizeof mine.sha, "%s", token_file_store_identity(&t->train_file, &bytes));
    root = mine;
    if (t->comm.bcast_bytes(&t->comm, &root, sizeof root, 0, err))
        return -1;
    if (root.ntokens != mine.ntokens || memcmp(root.sha, mine.sha, sizeof mine.sha))
        return fsdp_err(err,
                        "%s: rank %d found %llu tokens, rank 0 %llu, or other bytes (the store "
                        "changed while the ranks listed it): start again",
                        t->o.data, t->comm.rank, (unsigned long long)mine.ntokens,
                        (unsigned long long)root.ntokens);
    return 0;
}

static void teardown(struct trainer *t)
{
    if (t->have_snap) {
        tckpt_async_stop(&t->snap);
        tckpt_close(&t->snap);
    }
    if (t->have_ckpt) {
        tckpt_async_stop(&t->ck);
        tckpt_close(&t->ck);
    }
    if (t->log_fd >= 0)
        close(t->log_fd);
    t->log_fd = -1;
    fsdp_free(&t->eng);
    sample_stream_free(&t->stream);
    if (t->train_file.remote && t->comm.rank == 0) {
        uint64_t ahead, asked, gets, bytes;
        double wait_s;
        token_file_store_stats(&t->train_file, &ahead, &asked, &wait_s, &gets, &bytes);
        if (ahead + asked)
            fprintf(stderr,
                    "fsdp-train: data: rank 0 took %llu samples from its read-ahead, read %llu "
                    "when wanted, waited %.2f s for them (%llu GETs, %.2f MiB)\n",
                    (unsigned long long)ahead, (unsigned long long)asked, wait_s,
                    (unsigned long long)gets, (double)bytes / 1048576.0);
    }
    token_file_close(&t->train_file);
    token_file_close(&t->val_file);
    model_layout_free(&t->model);
    free(t->in);
    free(t->tgt);
    free(t->consumed);
}

/* Collective: rank 0 prints the largest peak resident memory (VmHWM) of
 * any rank, and its own; ranks are reduced 64 at a time (no allocation). */
static void report_peak_memory(struct trainer *t)
{
    const int W = t->comm.world;
    struct rusage ru;
    char err[FSDP_ERR_LEN];
    double mine = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss : 0; /* KiB */
    double top = 0;
    int top_rank = 0;
    for (int base = 0; base < W; base += 64) {
        double kib[64] = {0};
        int n = W - base < 64 ? W - base : 64;
        if (t->comm.rank >= base && t->comm.rank < base + n)
            kib[t->comm.rank - base] = mine;
        if (t->comm.allreduce_sum_f64(&t->comm, kib, (size_t)n, err))
            return; /* the same answer on every rank: all stop here */
        for (int i = 0; i < n; i++)
            if (kib[i] > top)
                top = kib[i], top_rank = base + i;
    }
    if (t->comm.rank != 0)
        return;
    fprintf(stderr, "fsdp-train: peak resident memory per rank: %.1f MiB (rank %d)", top / 1024,
            top_rank);
    if (W > 1)
        fprintf(stderr, ", rank 0 %.1f MiB", mine / 1024);
    if (t->o.cuda)
        fprintf(stderr, "; rank 0 device memory peak %.1f MiB",
                (double)fsdp_cuda_peak_bytes() / 1048576.0);
    fputc('\n', stderr);
}

/* Collective: every rank takes its GPU, or none goes on; then the engine's
 * collectives move to NCCL. A rank that failed says why (err set); the
 * others return with err empty. */
static int start_cuda(struct trainer *t, char *err)
{
    char agree_err[FSDP_ERR_LEN];
    double failed = fsdp_cuda_init(t->comm.local_rank, err, FSDP_ERR_LEN) != 0;
    if (t->comm.allreduce_sum_f64(&t->comm, &failed, 1, agree_err))
        return fsdp_err(err, "%s", agree_err);
    if (failed > 0) {
        if (failed == t->comm.world && t->comm.rank != 0)
            err[0] = 0; /* the same reason everywhere: rank 0 says it once */
        else if (!err[0] && t->comm.rank == 0)
            fsdp_err(err, "--device cuda: %.0f of %d ranks have no usable GPU", failed,
                     t->comm.world);
        return -1;
    }
    return fsdp_comm_nccl_init(&t->comm, err);
}

/* Keep freed memory in the process. Open MPI's reduce-scatter allocates a
 * temporary of the unit's size on every call; with glibc's defaults each
 * free gives it back to the kernel (munmap, or a trim of the heap) and the
 * next call faults it in again: 5.4 ms per block's reduce-scatter instead
 * of 0.43 ms here, a third of a 2-rank step. */
static void keep_freed_memory(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's largest: temporaries above it
                                            (gpt2-124m's embedding unit, 154 MB)
                                            are still mapped per call */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

/* The ranks' communicator (Open MPI when mpirun started us, else one local
 * rank) and, with --device cuda, every rank's GPU. Returns 0, or the exit
 * status after saying why. */
static int start_ranks(struct trainer *t, int *argc, char ***argv, char *err)
{
    if (fsdp_comm_launched_by_mpi()) {
        /* a snapshot writer copies to its buddy host from its own thread
         * (the library's locks on every call only when ranks span hosts) */
        const char *all = getenv("OMPI_COMM_WORLD_SIZE"),
                   *here = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        int side = t->o.snap_every > 0 && !(all && here && strcmp(all, here) == 0);
        if (fsdp_comm_mpi_init(&t->comm, argc, argv, side, err)) {
            fprintf(stderr, "fsdp-train: %s\n", err);
            return 1;
        }
    } else {
        fsdp_comm_local_init(&t->comm);
    }
    if (t->o.cuda && start_cuda(t, err)) {
        if (err[0])
            fprintf(stderr, "fsdp-train: %s\n", err);
        t->comm.finalize(&t->comm);
        return 1;
    }
    return 0;
}

/* The heartbeat to a supervisor, and the precision every rank agrees on.
 * Returns 0, or the exit status after saying why. */
static int join_run(struct trainer *t, char *err)
{
    if (hb_start(t->comm.rank, err)) { /* the same environment on every rank */
        if (t->comm.rank == 0)
            fprintf(stderr, "fsdp-train: %s\n", err);
        t->comm.finalize(&t->comm);
        return 2;
    }
    if (agree_precision(t, err)) {
        fprintf(stderr, "fsdp-train: rank %d: %s\n", t->comm.rank, err);
        hb_stop();
        t->comm.abort(&t->comm, 1); /* a collective failed: no agreeing now */
        return 1;
    }
    return 0;
}

/* Collective: set-up errors (a bad file, a bad batch size) are usually the
 * same on every rank: agree on them and exit cleanly, rank 0 speaking for
 * all. Returns 1 when some rank's setup failed (said), 0 when none did or
 * the agreement itself failed (rc then goes on to the usual error path). */
static int setup_failed(struct trainer *t, int rc, const char *err)
{
    double failed[2] = {rc != 0, t->comm.rank == 0 && rc != 0};
    char agree_err[FSDP_ERR_LEN];
    if (t->comm.allreduce_sum_f64(&t->comm, failed, 2, agree_err) || failed[0] == 0)
        return 0;
    if (rc && (t->comm.rank == 0 || failed[1] == 0))
        fprintf(stderr, "fsdp-train: %s\n", err);
    return 1;
}

/* A failure after set-up: said once (rank 0) when every rank knows,
 * otherwise by this rank, which then ends the job. Returns the exit
 * status. */
static int end_after_failure(struct trainer *t, int rc, const char *err)
{
    if (rc == TCKPT_REFUSED && t->comm.rank == 0) { /* fsdp-super: relaunching cannot help */
        hb_event("refused step=0");
        hb_event("refused step=0"); /* a datagram: once more, in case one is lost */
    }
    if (t->agreed_error) { /* every rank knows; rank 0 speaks for all */
        if (t->comm.rank == 0)
            fprintf(stderr, "fsdp-train: %s\n", err);
    } else {
        fprintf(stderr, "fsdp-train: rank %d: %s\n", t->comm.rank, err);
        if (t->comm.world > 1)
            t->comm.abort(&t->comm, 1);
    }
    hb_stop();
    teardown(t);
    t->comm.finalize(&t->comm);
    return rc == TCKPT_REFUSED ? 2 : 1;
}

/* Rank 0: how the run ended (t0: when the ranks had started). */
static void report_end(const struct trainer *t, double t0)
{
    if (t->comm.rank != 0)
        return;
    if (t->preempted)
        fprintf(stderr, "fsdp-train: preempted: stopped after an emergency checkpoint\n");
    else if (t->stopped)
        fprintf(stderr, "fsdp-train: stopped at step %lld of %lld (%s)%s\n", t->stopped_at,
                t->o.steps, t->stopped,
                t->have_ckpt ? "; the same command continues from its checkpoint" : "");
    else {
        char scaled[96] = "";
        if (t->fp16)
            snprintf(scaled, sizeof scaled, "; %lld step%s skipped, loss scale %g", t->skipped,
                     t->skipped == 1 ? "" : "s", t->scale);
        fprintf(stderr,
                "fsdp-train: done: %lld steps in %.1f s (%.1f s in collectives on rank 0)%s\n",
                t->o.steps, fsdp_now() - t0, t->eng.comm_seconds, scaled);
    }
}

int main(int argc, char **argv)
{
    static struct trainer t;
    t.start = fsdp_now();
    t.log_fd = -1;
    char err[FSDP_ERR_LEN] = "";
    keep_freed_memory();
    fsdp_kernels_cpu_fix_blas_core(argv);
    if (hb_catch_preemption(err)) { /* before any other thread starts */
        fprintf(stderr, "fsdp-train: %s\n", err);
        return 1;
    }
    int rc = train_opts_parse(&t.o, argc, argv, err);
    if (rc == 1) {
        train_opts_usage();
        return 0;
    }
    if (rc || fsdp_kernels_cpu_select(t.o.cpu_kernels, err, sizeof err) ||
        fsdp_kernels_cpu_matmul(t.o.matmul, err, sizeof err)) {
        fprintf(stderr, "fsdp-train: %s (see fsdp-train --help)\n", err);
        return 2;
    }
    if ((rc = start_ranks(&t, &argc, &argv, err)))
        return rc;
    double t0 = fsdp_now();
    if ((rc = join_run(&t, err)))
        return rc;
    rc = setup(&t, err);
    int failed = setup_failed(&t, rc, err);
    if (!failed) {
        rc = agree_data(&t, err);
        failed = setup_failed(&t, rc, err);
    }
    if (failed) {
        teardown(&t);
        t.comm.finalize(&t.comm);
        return 1;
    }
    if (!rc)
        rc = train_setup_checkpoints(&t, err);
    if (!rc)
        rc = train(&t, err);
    if (!rc)
        train_end_snapshots(&t);
    if (!rc && t.o.sample_len > 0 && !t.stopped)
        rc = train_generate(&t, err);
    if (rc)
        return end_after_failure(&t, rc, err);
    report_peak_memory(&t);
    report_end(&t, t0);
    hb_stop();
    teardown(&t);
    t.comm.finalize(&t.comm);
    return 0;
}
