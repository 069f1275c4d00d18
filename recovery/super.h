/*
 * super.h - fsdp-super's pieces: the job (launch, watch, teardown), the
 * event log, and the chaos schedule. One process, one job at a time.
 */
#ifndef FSDP_SUPER_H
#define FSDP_SUPER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define SUPER_MAX_RANKS 256

struct super_opts {
    int np, min_np, max_restarts;
    const char *hosts, *preempt_url, *events, *chaos, *mpirun;
    double hb_timeout, startup_timeout, grace, backoff, healthy_after, preempt_poll,
        preempt_deadline;
    int targc;
    char **targv;     /* the trainer's command line (after --) */
    const char *ckpt; /* its --ckpt value, if any */
};

struct rank_state {
    int seen;
    pid_t pid;
    uint64_t step, progress;
    char phase[16];
    double last_seen, last_change;
};

struct job {
    pid_t mpirun; /* also the job's session id */
    uint64_t generation;
    int np;
    double launched, first_train;
    uint64_t resumed_from;
    int resumed_known;
    struct rank_state ranks[SUPER_MAX_RANKS];
    int exited, status;
    int err_fd;       /* mpirun's stderr, filtered by the supervisor */
    char line[4096];
    size_t line_len;
    int in_box, hidden;
};

struct host {
    char name[128];
    int slots;
};

/* ---- options.c ---- */
int super_parse(struct super_opts *o, int argc, char **argv);
/* `host slots` (or `host slots=N`) lines; returns the slot total. */
int super_read_hosts(const char *path, struct host *h, int max, int *nh);

/* ---- notice.c ---- */
/* 1 with the notice's time when the URL announces terminate/stop/hibernate. */
int super_poll_notice(const char *url, char *when, size_t n);

/* ---- events ---- */
void ev_open(const char *path);
void ev_close(void);
/* "key":value pairs as a JSON object body, e.g. "\"rank\":1" */
void ev_emit(const char *event, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double super_now(void);

/* ---- processes ---- */
/* Pids of every live process in the session sid (zombies excluded). */
int job_pids(pid_t sid, pid_t *out, int max);
/* 'R', 'S', 'T', 'Z', ... or 0 if the process is gone */
char proc_state(pid_t pid);
/* SIGCONT, SIGTERM, grace, SIGKILL; returns once no process of the session
 * is left (or after 20 s, returning the number still there). */
int job_teardown(struct job *j, double grace);
/* Reaps any exited child (the supervisor is a subreaper), noting mpirun's
 * exit status in j. */
void reap_children(struct job *j);

#endif
