/*
 * watch.c - fsdp-super watching one launch until it ends (super_watch):
 * the ranks' heartbeats and events (datagrams admitted by link.c), the
 * failure checks (mpirun's exit, a dead, silent or stalled rank, a rank
 * that never started), preemption, a host leaving the host file, and the
 * chaos schedule's faults. How the launch ended goes back to main in a
 * struct outcome; what happens next is fsdp_super.c's restart policy.
 *
 * The host file is read once a second during a launch too: a host of the
 * launch that has left it gets a planned restart (host_removed event; an
 * emergency checkpoint, then a relaunch without it; restart cause
 * host-removed), as a spot notice for that one host would.
 *
 * Preemption: SIGTERM or SIGINT to fsdp-super, or a notice at
 * --preempt-url in AWS's spot/instance-action form
 * ({"action":"terminate","time":"...Z"}; 404 means none), polled every few
 * seconds. The ranks are ordered to preempt (as SIGUSR1 does), agree on the
 * next step boundary, write an emergency checkpoint and exit; fsdp-super
 * then exits 0 (signal) or relaunches on the capacity the host file still
 * offers (notice).
 */
#include "super_internal.h"

#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

/* ---- heartbeats ------------------------------------------------------------------- */

static int ev_int(const struct hbmsg *m, const char *key, int *out)
{
    uint64_t v;
    if (hbmsg_event_u64(m, key, &v) || v > (1 << 20))
        return -1;
    *out = (int)v;
    return 0;
}

/* A number an event carries (loss=3.7, seconds=0.25); 0 if it is none. */
static int ev_num(const struct hbmsg *m, const char *key, double *out)
{
    const char *v = hbmsg_event_str(m, key);
    return v && fsdp_parse_f64(v, out) == 0 ? 0 : -1;
}

static void on_event(struct super *s, const struct hbmsg *m)
{
    uint64_t step, bytes;
    int from, to;
    double x, y;
    const char *digest = hbmsg_event_str(m, "digest");
    if (hbmsg_event_u64(m, "step", &step))
        return;
    if (strcmp(m->name, "progress") == 0 && m->rank == 0 && ev_num(m, "loss", &x) == 0 &&
        ev_num(m, "tokens_per_s", &y) == 0) {
        s->loss = x;
        s->tokens_per_s = y;
        s->have_loss = 1;
        uint64_t skipped;
        if (ev_num(m, "loss_scale", &x) == 0 && isfinite(x) &&
            hbmsg_event_u64(m, "skipped", &skipped) == 0) { /* fp16 runs say both */
            s->loss_scale = x;
            s->skipped_steps = skipped;
            s->have_scale = 1;
        }
    } else if (strcmp(m->name, "loaded") == 0 && ev_num(m, "seconds", &x) == 0 && x >= 0) {
        histogram_observe(&s->load_s, x);
    } else if (strcmp(m->name, "checkpoint_committed") == 0) {
        /* a snapshot in RAM (memory=1) is what a relaunch resumes from, so
         * it counts for steps lost; the checkpoint metrics are the store's */
        int memory = 0;
        ev_int(m, "memory", &memory);
        if (!memory && ev_num(m, "seconds", &x) == 0 && x >= 0)
            histogram_observe(&s->save_s, x);
        if (!memory && hbmsg_event_u64(m, "bytes", &bytes) == 0)
            s->bytes_written += bytes;
        if (!memory)
            s->commit_at = fsdp_now();
        s->last_committed = step;
        ev_emit("checkpoint_committed", "{s:I, s:I, s:b}", "step", (json_int_t)step, "generation",
                (json_int_t)s->job.generation, "memory", memory == 1);
    } else if (strcmp(m->name, "resumed") == 0 && ev_int(m, "world", &to) == 0) {
        s->job.resumed_from = step;
        s->job.resumed_known = 1;
        if (!s->first_known && (s->launches == 1 || s->step_count == 0)) /* none trained here */
            s->first_step = step;
        s->first_known = 1;
        /* what it resumed from is committed (a checkpoint or a snapshot):
         * a failure before the next commit loses the steps since then; a
         * resume below the newest commit (a snapshot lost with its host)
         * loses the steps between */
        if (step < s->last_committed)
            s->steps_lost += s->last_committed - step;
        s->last_committed = step;
        s->launch_from = step;
        int memory = 0;
        ev_int(m, "memory", &memory); /* 1: from the snapshots in RAM, no shard from --ckpt */
        ev_emit("resumed", "{s:I, s:i, s:b}", "step", (json_int_t)step, "np", to, "memory",
                memory == 1);
    } else if (strcmp(m->name, "reshard") == 0 && ev_int(m, "from", &from) == 0 &&
               ev_int(m, "to", &to) == 0) {
        ev_emit("reshard", "{s:I, s:i, s:i}", "step", (json_int_t)step, "from", from, "to", to);
    } else if (strcmp(m->name, "load_verified") == 0 && ev_int(m, "from", &from) == 0 &&
               ev_int(m, "to", &to) == 0 && digest) {
        ev_emit("load_verified", "{s:I, s:i, s:i, s:s}", "step", (json_int_t)step, "from", from,
                "to", to, "digest", digest);
    } else if (strcmp(m->name, "refused") == 0) {
        s->job.refused = 1; /* a resume that would be another run, another model's checkpoint */
    } else if (strcmp(m->name, "emergency_checkpoint") == 0) {
        ev_emit("emergency_checkpoint", "{s:I}", "step", (json_int_t)step);
    } else if (strcmp(m->name, "loss_scale_skip") == 0 && ev_num(m, "scale", &x) == 0 &&
               isfinite(x)) { /* fp16: an overflow skipped the step; the scale now */
        s->loss_scale = x;
        s->have_scale = 1;
        ev_emit("loss_scale_skip", "{s:I, s:f}", "step", (json_int_t)step, "scale", x);
    }
}

static void on_beat(struct super *s, const struct hbmsg *m)
{
    struct rank_state *r = &s->job.ranks[m->rank];
    double now = fsdp_now();
    if (m->rank == 0 && (!r->seen || r->step != m->step)) {
        /* the mean step time, from one training beat with a new step to the
         * next: the first interval of a launch (start-up, the load) is not
         * one, nor a step's partial time since a beat inside it */
        const int stepping = m->phase == HB_TRAIN || m->phase == HB_SAVE; /* a step's save */
        if (r->seen && r->step_at > 0 && m->step > r->step && stepping) {
            s->step_time_sum += now - r->step_at;
            s->step_count += m->step - r->step;
        }
        r->step_at = stepping && (r->seen || m->step > 0) ? now : 0;
    }
    if (!r->seen || r->progress != m->progress || r->step != m->step)
        r->last_change = now;
    if (m->phase == HB_TRAIN && s->job.first_train == 0)
        s->job.first_train = now;
    if (!r->seen)
        ev_emit("rank_up", "{s:i, s:s, s:i, s:b, s:I}", "rank", m->rank, "host", r->host, "pid",
                (int)r->pid, "local", r->local, "generation", (json_int_t)m->generation);
    r->seen = 1;
    r->step = m->step;
    r->progress = m->progress;
    r->phase = m->phase;
    r->last_seen = now;
    if (m->step > s->max_step_seen)
        s->max_step_seen = m->step;
}

/* A datagram admitted by link.c: an event or a heartbeat of a rank. */
static void on_msg(void *ctx, const struct hbmsg *m)
{
    if (m->kind == HBMSG_EVENT)
        on_event(ctx, m);
    else
        on_beat(ctx, m);
}

/* ---- failure detection ------------------------------------------------------------ */

static const char *signame(int sig)
{
    static char buf[16];
    const char *n = sigabbrev_np(sig);
    snprintf(buf, sizeof buf, "SIG%s", n ? n : "?");
    return buf;
}

static int mpirun_ended(struct super *s, char *why, size_t n, int *done)
{
    struct job *j = &s->job;
    if (!j->exited) {
        int st;
        if (waitpid(j->mpirun, &st, WNOHANG) == j->mpirun) {
            j->exited = 1;
            j->status = st;
        }
    }
    if (!j->exited)
        return -1;
    int code = WIFEXITED(j->status) ? WEXITSTATUS(j->status) : -1;
    if (code == 0) {
        *done = 1;
        return -1;
    }
    if (WIFSIGNALED(j->status))
        snprintf(why, n, "mpirun died by %s", signame(WTERMSIG(j->status)));
    else
        snprintf(why, n, "mpirun exited with code %d", code);
    ev_emit("exit", "{s:i, s:i}", "code", code, "signal",
            WIFSIGNALED(j->status) ? WTERMSIG(j->status) : 0);
    return C_EXIT;
}

/* One pass over the ranks: 0 a dead rank, 1 a silent one, 2 a stalled one. */
static int rank_failed(struct super *s, int pass, int r, double now, char *why, size_t n)
{
    struct rank_state *rs = &s->job.ranks[r];
    char st;
    int v = rank_verdict(rs, &s->job.env, pass, now, s->o.hb_timeout, &st);
    const char *where = rs->local ? "" : " on another host";
    if (v == RV_DIED || v == RV_SILENT || v == RV_STALLED)
        snprintf(s->job.failed, sizeof s->job.failed, "%s", rs->host);
    if (v == RV_DIED) {
        snprintf(why, n, "rank %d (pid %d on %s) ended at step %llu (exited or was killed)", r,
                 (int)rs->pid, rs->host, (unsigned long long)rs->step);
        ev_emit("rank_died", "{s:i, s:s, s:i, s:I, s:s}", "rank", r, "host", rs->host, "pid",
                (int)rs->pid, "step", (json_int_t)rs->step, "source", "proc");
        return C_DIED;
    }
    if (v == RV_SILENT) {
        char state[2] = {st, 0};
        snprintf(why, n, "rank %d (pid %d on %s%s): no heartbeat for %.1f s%s", r, (int)rs->pid,
                 rs->host, where, now - rs->last_seen,
                 st == 'T'   ? " (process stopped)"
                 : rs->local ? ""
                             : " (stopped, dead, or its host lost or cut off)");
        ev_emit("heartbeat_lost", "{s:i, s:s, s:i, s:b, s:f, s:s}", "rank", r, "host", rs->host,
                "pid", (int)rs->pid, "local", rs->local, "silent_s", now - rs->last_seen, "state",
                state);
        return C_HUNG;
    }
    if (v == RV_STALLED) {
        const char *phase = hbmsg_phase_name(rs->phase);
        snprintf(why, n, "rank %d (pid %d on %s): no progress for %.1f s in phase %s (hung)", r,
                 (int)rs->pid, rs->host, now - rs->last_change, phase);
        ev_emit("heartbeat_lost", "{s:i, s:s, s:i, s:b, s:f, s:s}", "rank", r, "host", rs->host,
                "pid", (int)rs->pid, "local", rs->local, "stalled_s", now - rs->last_change,
                "phase", phase);
        return C_HUNG;
    }
    return -1;
}

/* Returns a cause, or -1 while the job is healthy; sets *done when the job
 * ended cleanly. */
static int check_job(struct super *s, char *why, size_t n, int *done)
{
    struct job *j = &s->job;
    double now = fsdp_now();
    *done = 0;
    int cause = mpirun_ended(s, why, n, done);
    if (cause >= 0 || *done)
        return cause;
    /* three passes, so the culprit is named: a dead rank, then a silent one
     * (stopped, frozen), then one whose progress stalled (stuck waiting in a
     * collective, usually for the silent or dead one) */
    for (int pass = 0; pass < 3; pass++)
        for (int r = 0; r < j->np; r++)
            if ((cause = rank_failed(s, pass, r, now, why, n)) >= 0)
                return cause;
    for (int r = 0; r < j->np; r++) {
        if (!j->ranks[r].seen && now - j->launched > s->o.startup_timeout) {
            snprintf(why, n, "rank %d sent no heartbeat in %.0f s since launch", r,
                     now - j->launched);
            ev_emit("heartbeat_lost", "{s:i, s:b}", "rank", r, "startup", 1);
            return C_STARTUP;
        }
    }
    return -1;
}

/* ---- watching one launch ------------------------------------------------------------ */

/* Why a preemption starts now: C_PREEMPT (a signal to fsdp-super or a new
 * notice for the job), C_NOTICE (a new notice for a host of the launch),
 * 0 for none. */
static int preemption_due(struct super *s, double now, double *next_poll)
{
    if (super_got_signal) {
        say("%s: preemption: asking the ranks for an emergency checkpoint",
            super_got_signal == SIGINT ? "SIGINT" : "SIGTERM");
        ev_emit("preemption_notice", "{s:s}", "source", "signal");
        return C_PREEMPT;
    }
    if (!s->o.preempt_url || now < *next_poll)
        return 0;
    char when[128];
    *next_poll = now + s->o.preempt_poll;
    if (super_per_host_notices(s)) {
        if (!super_poll_host_notices(s, s->launched, s->nlaunched))
            return 0;
        say("emergency checkpoint, then a relaunch without the noticed host");
        return C_NOTICE;
    }
    if (!super_poll_notice(s->o.preempt_url, when, sizeof when) ||
        (s->notice_seen && strcmp(when, s->notice_time) == 0))
        return 0; /* none, or the one already acted on */
    s->notice_seen = 1;
    snprintf(s->notice_time, sizeof s->notice_time, "%s", when);
    char shown[512];
    say("preemption notice from %s (time %s): emergency checkpoint",
        fsdp_url_redact(s->o.preempt_url, shown, sizeof shown), when[0] ? when : "not given");
    ev_emit("preemption_notice", "{s:s, s:o}", "source", "url", "time", ev_text(when));
    return C_PREEMPT;
}

/* 1 when a host of the running launch has left the host file (read once a
 * second): a planned restart without it, like a spot notice for one host.
 * A file that does not parse right now, or names no host at all (both
 * what an editor writing it in place shows for a moment), decides
 * nothing, nor does one that is no longer a regular file (said once, the
 * last good list kept: capacity.c); fewer slots on a host that stays is
 * for the next launch. */
static int host_removed(struct super *s, double now)
{
    if (!s->o.hosts || now < s->next_hosts_check)
        return 0;
    s->next_hosts_check = now + 1;
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    char err[FSDP_ERR_LEN];
    if (super_host_file(s, h, &nh, &total, err, sizeof err) || nh == 0)
        return 0;
    for (int i = 0; i < s->nlaunched; i++) {
        int still = 0;
        for (int k = 0; k < nh && !still; k++)
            still = strcmp(h[k].name, s->launched[i].name) == 0;
        if (still)
            continue;
        say("host %s left %s: emergency checkpoint, then a relaunch without it",
            s->launched[i].name, s->o.hosts);
        ev_emit("host_removed", "{s:o}", "host", ev_text(s->launched[i].name));
        return 1;
    }
    return 0;
}

static void account_progress(struct super *s, double now)
{
    if (s->fail_at && s->job.first_train) { /* back to training after a failure */
        s->downtime += s->job.first_train - s->fail_at;
        s->fail_at = 0;
    }
    if (s->job.first_train && now - s->job.first_train > s->o.healthy_after) {
        s->restarts.in_a_row = 0;
        s->restarts.on_host = 0;
    }
}

/* Watches the launch until it ends. */
void super_watch(struct super *s, struct outcome *out, int *preempt_from_signal)
{
    double next_poll = 0, deadline = 0;
    *out = (struct outcome){.cause = -1};
    while (out->cause < 0 && !out->done) {
        struct pollfd p[2] = {{.fd = s->link.net.sock, .events = POLLIN},
                              {.fd = s->job.err_fd, .events = POLLIN}};
        poll(p, s->job.err_fd >= 0 ? 2 : 1, 50);
        link_drain(&s->link, &s->job, on_msg, s);
        job_drain_stderr(&s->job);
        reap_children(&s->job);
        double now = fsdp_now();
        account_progress(s, now);
        super_render_metrics(s, 1);
        int from_signal = super_got_signal != 0;
        int action = CHAOS_NONE;
        int due = out->preempting ? 0 : preemption_due(s, now, &next_poll);
        if (due) {
            action = CHAOS_PREEMPT;
            out->planned = due;
            *preempt_from_signal |= from_signal && due == C_PREEMPT;
        } else if (!out->preempting && host_removed(s, now)) {
            action = CHAOS_PREEMPT;
            out->planned = C_HOSTS;
        } else if (!out->preempting) {
            action = chaos_tick(&s->chaos, &s->job);
        }
        link_send_orders(&s->link, &s->job); /* a chaos fault's order to one rank */
        if (action == CHAOS_PREEMPT) {
            if (!out->planned)
                out->planned = C_PREEMPT; /* chaos */
            link_order_all(&s->link, &s->job, HBCTL_PREEMPT);
            out->preempting = 1;
            deadline = now + s->o.preempt_deadline;
        } else if (action == CHAOS_KILL_NOW) {
            snprintf(out->why, sizeof out->why,
                     "chaos: the job is killed during a checkpoint commit");
            out->cause = C_CHAOS;
            break;
        }
        out->cause = check_job(s, out->why, sizeof out->why, &out->done);
        if (out->preempting && now > deadline && out->cause < 0 && !out->done) {
            snprintf(out->why, sizeof out->why, "no emergency checkpoint before the deadline");
            out->cause = C_PREEMPT;
        }
    }
}
