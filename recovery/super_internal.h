/*
 * super_internal.h - what the pieces of fsdp-super's program share, and
 * no one else: the supervisor's state (struct super), the causes a launch
 * ends for, how one launch ended (struct outcome), and the functions one
 * piece calls in another. The pieces:
 *
 *   capacity.c    the host file, the probe of the hosts and the per-host spot
 *                 notices: super_wait_capacity, the world size of the next launch
 *   watch.c       one launch until it ends: heartbeats and the ranks' events,
 *                 failure checks, preemption, a host leaving: super_watch
 *   report.c      the --metrics page and the run's summary
 *   fsdp_super.c  main, set-up, launch, the restart policy and teardown
 *
 * super.h stays the folder's header of the library the unit tests call;
 * this one is only for the fsdp-super program's files.
 */
#ifndef FSDP_SUPER_INTERNAL_H
#define FSDP_SUPER_INTERNAL_H

#include "super.h"

#include "chaos.h"
#include "metrics.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>

#define WORKDIR_LEN 512

/* SIGTERM or SIGINT to fsdp-super (main's handler sets it): a preemption. */
extern volatile sig_atomic_t super_got_signal;

static inline void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fsdp-super: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- state ------------------------------------------------------------------ */

enum cause { C_EXIT, C_DIED, C_HUNG, C_PREEMPT, C_CHAOS, C_STARTUP, C_HOSTS, C_NOTICE, C_NCAUSE };
extern const char *const super_cause_names[C_NCAUSE]; /* in events and metrics */

struct super {
    struct super_opts o;
    struct link link; /* the datagrams: socket, secret, answers (link.c) */
    int ev_on;
    char workdir[WORKDIR_LEN];
    uint64_t generation;
    struct job job;
    struct chaos chaos;
    /* accounting */
    double start, downtime, fail_at;
    int launches, prev_np;
    struct restart_history restarts; /* the restart policy's memory (policy.c) */
    uint64_t launch_from;            /* the step the current launch resumed at */
    int by_cause[C_NCAUSE];
    uint64_t steps_lost, last_committed, max_step_seen, final_step;
    /* the step this supervisor's first launch started from (a resume of an
     * earlier run's checkpoint: what it trained is its own from there) */
    uint64_t first_step;
    int first_known;
    double step_time_sum;
    uint64_t step_count;
    int notice_seen;
    char notice_time[128];
    char hosts_err[FSDP_ERR_LEN];      /* the host file's last complaint, said once */
    struct host good[SUPER_MAX_HOSTS]; /* the host file's last good list */
    int ngood, good_total;
    /* --metrics: what the ranks' events tell, and the server */
    struct metrics *metrics;
    double next_metrics, loss, tokens_per_s, commit_at;
    int have_loss, running;
    double loss_scale;      /* fp16 runs: rank 0's loss scale at its last report */
    int have_scale;         /* one was reported */
    uint64_t skipped_steps; /* fp16: steps an overflow skipped, as rank 0 counts them */
    struct histogram save_s, load_s;
    uint64_t bytes_written;
    /* other hosts: the launch agent, the hosts that did not answer it, those
     * left out of the coming launch, mpirun's arguments for them */
    struct agent agent;
    struct suspects suspects;
    struct host left[SUPER_MAX_HOSTS];
    int nleft;
    struct mpiargs mpiargs;
    /* the hosts of the running launch, and when the host file is read next */
    struct host launched[SUPER_MAX_HOSTS];
    int nlaunched;
    char job_id[33]; /* FSDP_SUPER_JOB of every rank (agent.c: the probe clears them) */
    double next_hosts_check;
    /* per-host spot notices (--preempt-url with {host}): the hosts whose
     * notice stands, left out of launches until it is gone */
    struct {
        char name[128], time[64];
    } noticed[SUPER_MAX_HOSTS];
    int nnoticed;
    /* hosts that failed twice in a row (policy.c), left out of launches
     * until the time given (capacity.c) */
    struct {
        char name[128];
        double until;
    } aside[SUPER_MAX_HOSTS];
    int naside;
};

/* How one launch ended. */
struct outcome {
    int cause; /* enum cause, -1 for none */
    int done;  /* mpirun exited 0 */
    int preempting;
    int planned; /* why the emergency checkpoint was asked for: C_PREEMPT, C_HOSTS, C_NOTICE */
    char why[512];
};

/* ---- across the pieces -------------------------------------------------------- */

/* capacity.c: waits until the hosts that answer offer --min-np slots; the
 * world size to launch with, those hosts in h, the others in s->left; -1
 * after a signal, -2 after --capacity-timeout. */
int super_wait_capacity(struct super *s, struct host *h, int *nh);
/* The host file now (never blocking on it): 0 with its hosts, which
 * become the last good list; 1 when it has become a FIFO, a device or a
 * directory (renamed over it, say): said once, and h gets the last good
 * list; -1 with err when it cannot be read or does not parse. */
int super_host_file(struct super *s, struct host *h, int *nh, int *total, char *err, size_t errlen);
/* Makes h the last good list (set-up: the list read at start). */
void super_host_file_good(struct super *s, const struct host *h, int nh, int total);
/* The names of n hosts, a JSON array for an event. */
json_t *super_host_names(const struct host *h, int n);
/* Per-host spot notices: whether --preempt-url has {host}; a poll of the
 * notices of the hosts of h, the new ones said, counted in the return value. */
int super_per_host_notices(const struct super *s);
int super_poll_host_notices(struct super *s, const struct host *h, int nh);

/* Sets aside the host of the launch that name names (its host file
 * entry, or the host its ranks report): 1 when one was set aside. */
int super_set_aside(struct super *s, const char *name);

/* watch.c: watches the launch until it ends, how in out; sets
 * *preempt_from_signal when a signal to fsdp-super started a preemption. */
void super_watch(struct super *s, struct outcome *out, int *preempt_from_signal);

/* report.c: the --metrics page, rendered when it is due (now_or_later: at
 * most four times a second) or at once; a wait that keeps it fresh; the
 * summary at the end of the run (end: how it ended). */
void super_render_metrics(struct super *s, int now_or_later);
void super_nap_rendering(struct super *s, double sec);
void super_summary(struct super *s, const char *end);

#endif
