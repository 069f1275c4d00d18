/*
 * super.h - fsdp-super's pieces: the job (launch, watch, teardown), the
 * event log, the host file, spot notices and the chaos schedule. One
 * process, one job at a time.
 *
 * The parsers of everything that comes from outside (the host file, a spot
 * notice's body; the ranks' datagrams are src/hbmsg.h's) take a buffer and
 * its length, so that tests and fuzz targets can call them on any bytes.
 */
#ifndef FSDP_SUPER_H
#define FSDP_SUPER_H

#include "hbmsg.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define SUPER_MAX_RANKS  256
#define SUPER_MAX_HOSTS  64
#define SUPER_MAX_SLOTS  4096      /* on one host line */
#define SUPER_HOSTS_MAX  (1 << 20) /* bytes of host file read */
#define SUPER_ERR_LEN    512
#define SUPER_TAIL_LINES 5 /* mpirun's own lines shown when a launch fails */
#define SUPER_TAIL_KEEP  8 /* lines kept of each kind */

struct super_opts {
    int np, min_np, max_restarts;
    const char *hosts, *preempt_url, *events, *chaos, *mpirun;
    double hb_timeout, startup_timeout, grace, backoff, healthy_after, preempt_poll,
        preempt_deadline, capacity_timeout;
    int targc;
    char **targv;         /* the trainer's command line (after --) */
    const char *ckpt;     /* its --ckpt value, if any */
    uint64_t train_steps; /* its --steps value, 0 if not given */
};

struct rank_state {
    int seen;
    pid_t pid;
    uint64_t step, progress;
    enum hb_phase phase;
    double last_seen, last_change;
};

/* The last few lines of one kind, oldest first when read from next on. */
struct line_tail {
    char line[SUPER_TAIL_KEEP][256];
    int next, count;
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
    int err_fd; /* mpirun's stderr, filtered by the supervisor */
    char line[4096];
    size_t line_len;
    int in_box, hidden;
    struct line_tail hidden_tail; /* Open MPI's own lines, kept from the terminal */
    struct line_tail rank_tail;   /* the ranks' lines, passed through */
};

struct host {
    char name[128];
    int slots;
};

/* ---- options.c ---- */
/* 0, or 1 after printing --help, or -1 after printing one line. */
int super_parse(struct super_opts *o, int argc, char **argv);
/* `host`, `host N` or `host slots=N` lines, '#' comments, N in
 * 0..SUPER_MAX_SLOTS; a host with 0 slots is left out. Fills h (at most
 * max) and the slot total; -1 with "NAME:LINE: what is wrong" in err for
 * anything else. name labels the messages. */
int super_parse_hosts(const char *buf, size_t len, const char *name, struct host *h, int max,
                      int *nh, int *total, char *err, size_t errlen);
/* The same for a file (at most SUPER_HOSTS_MAX bytes); -1 with err if it
 * cannot be read. */
int super_read_hosts(const char *path, struct host *h, int max, int *nh, int *total, char *err,
                     size_t errlen);
void line_tail_add(struct line_tail *t, const char *line);
/* i-th of the kept lines, oldest first; NULL past the end */
const char *line_tail_get(const struct line_tail *t, int i);

/* ---- notice.c ---- */
/* A spot notice's body: 1 with its time (printable ASCII, else "") when it
 * announces terminate/stop/hibernate, 0 for any other action, -1 when it
 * is not a notice at all (not a JSON object, no string action). */
int super_parse_notice(const char *body, size_t len, char *when, size_t n);
/* Polls the URL: 1 with the time when a notice is up, else 0. */
int super_poll_notice(const char *url, char *when, size_t n);

/* ---- events.c ---- */
/* 1 if an event log is open. */
int ev_open(const char *path);
void ev_close(void);
/* One line {"t":..., "event": event, ...}: fmt is a jansson pack format
 * for an object of the other fields ("{s:i, s:o}", ...), or NULL. */
void ev_emit(const char *event, const char *fmt, ...);
/* A JSON string of any NUL-terminated bytes (invalid UTF-8 becomes '?'),
 * for "o" in a pack format; NULL only when out of memory. */
json_t *ev_text(const char *s);
double super_now(void);

/* ---- proc.c ---- */
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
/* Removes a directory tree without following symbolic links (no shell). */
int remove_tree(const char *path);

#endif
