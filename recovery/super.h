/*
 * super.h - fsdp-super's pieces: the job (launch, watch, teardown), the
 * ranks (identity, verdicts, orders: ranks.c), mpirun's output (mpiout.c),
 * the datagrams (link.c: secrets, answers), the heartbeat socket and the
 * address the ranks are given (net.c), the launch agent and the probe of
 * the hosts before each launch (agent.c), what every launch tells mpirun
 * (mpiargs.c: keepalives, the environment carried to other hosts), the
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
#include "util.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#define SUPER_MAX_RANKS  256
#define SUPER_MAX_HOSTS  64
#define SUPER_MAX_SLOTS  4096      /* on one host line */
#define SUPER_HOSTS_MAX  (1 << 20) /* bytes of host file read */
#define SUPER_TAIL_LINES 5         /* mpirun's own lines shown when a launch fails */
#define SUPER_TAIL_KEEP  8         /* lines kept of each kind */

struct super_opts {
    int np, min_np, max_restarts;
    const char *hosts, *preempt_url, *events, *chaos, *mpirun, *listen, *metrics;
    double hb_timeout, startup_timeout, grace, backoff, healthy_after, preempt_poll,
        preempt_deadline, capacity_timeout, rank_silence, probe_timeout, set_aside;
    int targc;
    char **targv;         /* the trainer's command line (after --) */
    const char *ckpt;     /* its --ckpt value, if any */
    uint64_t train_steps; /* its --steps value, 0 if not given */
};

/* One rank of the launch. Its identity is (host, pid), fixed by its first
 * heartbeat; local says whether that is a process of this host in the
 * job's session, the only kind /proc and kill() apply to. */
struct rank_state {
    int seen, local;
    char host[HBMSG_HOST_LEN];
    pid_t pid;
    uint64_t step, progress;
    enum hb_phase phase;
    double last_seen, last_change;
    double step_at; /* rank 0: when a training heartbeat last showed a new step (0: none) */
    struct hbmsg_window win;      /* its SEQs: replays are dropped */
    enum hb_ctl order;            /* what every answer to it says */
    int order_due;                /* an order to send before the next beat */
    struct sockaddr_storage from; /* where its last datagram came from */
    socklen_t fromlen;
};

/* How the supervisor sees its own host: ranks.c decides through these, so
 * that tests can inject another host's view. */
struct rank_env {
    char host[HBMSG_HOST_LEN]; /* this host's name, as hbmsg_host_name gives it */
    pid_t session;             /* the job's session (mpirun's pid) */
    char (*state)(pid_t pid);  /* proc_state */
    pid_t (*session_of)(pid_t pid);
    int (*signal)(pid_t pid, int sig);
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
    int refused; /* rank 0 said the trainer refused the run (fsdp-train's exit status 2) */
    struct rank_state ranks[SUPER_MAX_RANKS];
    struct rank_env env;
    int exited, status;
    int err_fd; /* mpirun's stderr, filtered by the supervisor */
    char line[4096];
    size_t line_len;
    int in_box, hidden;
    struct line_tail hidden_tail; /* Open MPI's own lines, kept from the terminal */
    struct line_tail rank_tail;   /* the ranks' lines, passed through */
    char blamed[HBMSG_HOST_LEN];  /* the first host mpirun said lost a rank or daemon */
    char failed[HBMSG_HOST_LEN];  /* the host of the rank found dead, silent or stalled */
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
/* The same for a file (at most SUPER_HOSTS_MAX bytes), opened without ever
 * blocking (fsdp_open_regular); -1 with err if it cannot be read,
 * FSDP_NOT_REGULAR with err if it is a FIFO, a device, a directory. */
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
/* The restart policy (policy.c): what fsdp-super remembers of the
 * failures so far. */
struct restart_history {
    int failures; /* all of them */
    int in_a_row; /* recurring failures since the last independent one */
    int cause;    /* the last one's cause and the step the job had reached */
    uint64_t reached;
    char host[128]; /* the host the last failure was blamed on ("" none) */
    int on_host;    /* failures in a row blamed on it, none healthy between */
};
/* 1 when a launch that resumed at step FROM and reached step REACHED
 * failed in a way that recurs: it trained nothing new, or it failed at the
 * same step for the same cause as the failure before. */
int super_failure_recurs(const struct restart_history *h, int cause, uint64_t from,
                         uint64_t reached);
/* Records the failure; returns the seconds to wait before the relaunch (0:
 * at once) or -1 to give up, and whether it recurred. */
double super_restart_decide(struct restart_history *h, int cause, uint64_t from, uint64_t reached,
                            double backoff, int max_restarts, int *recurs);

/* Records the host a failure was blamed on (NULL or "": none, which ends
 * any row): 1 when that makes two failures in a row on the same host with
 * no stretch of --healthy-after between them (watch.c clears on_host
 * then): the host is to be set aside. The row starts again after that. */
int super_blame_host(struct restart_history *h, const char *host);

/* Polls the URL: 1 with the time when a notice is up, else 0. */
int super_poll_notice(const char *url, char *when, size_t n);
/* tmpl with each "{host}" replaced by host (percent-encoded); -1 if it
 * does not fit in n. */
int super_notice_url(const char *tmpl, const char *host, char *out, size_t n);
/* The n URLs at once (n <= SUPER_MAX_HOSTS, 1 s for all): found[i] 1 (a
 * notice, its time in when[i]), 0 (none) or -1 (cannot be told). */
void super_poll_notices(const char *const *urls, int n, int *found, char (*when)[64]);

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

/* ---- ranks.c ---- */
enum rank_admit { ADMIT_OK, ADMIT_REPLAY, ADMIT_CONFLICT };
/* A datagram of rank rs, already opened and of this launch: ADMIT_REPLAY
 * for a SEQ seen before, ADMIT_CONFLICT for a heartbeat from another
 * (host, pid) than the rank's first; the first heartbeat fixes the
 * identity and whether the rank is local. */
int rank_admit(struct rank_state *rs, const struct rank_env *e, const struct hbmsg *m);
enum rank_verdict { RV_OK, RV_DIED, RV_SILENT, RV_STALLED };
/* One of three passes over a rank that has been seen and has not ended:
 * pass 0 RV_DIED (a local process gone or reaped, never said of a remote
 * rank), pass 1 RV_SILENT (no datagram for longer than timeout), pass 2
 * RV_STALLED (progress frozen that long). *state: the local process's
 * state letter, '?' for a remote rank. */
int rank_verdict(const struct rank_state *rs, const struct rank_env *e, int pass, double now,
                 double timeout, char *state);
/* Orders a rank to preempt, stop or be killed: every answer to it says so
 * from now on (order_due: send one at once), and a local rank that is still
 * in the job's session gets the signal too. Never a kill() of a remote
 * rank's pid. Returns 1 if a signal was sent. */
int rank_order(struct rank_state *rs, const struct rank_env *e, enum hb_ctl action);
/* ---- mpiout.c ---- */
/* Reads what mpirun wrote since the last call (non-blocking): the ranks'
 * lines to stderr, Open MPI's own to the event log; closes err_fd at its
 * end. */
void job_drain_stderr(struct job *j);
/* After a failed launch: the last of Open MPI's own lines, or where they
 * are (ev_on: in the event log). */
void job_show_hidden_tail(const struct job *j, int ev_on);
/* What mpirun said about a rank or a daemon, from one line of its output. */
struct mpirun_report {
    enum { MPIRUN_NOTHING, MPIRUN_RANK_SIGNALED, MPIRUN_DAEMON_LOST, MPIRUN_PEER_LOST } kind;
    int rank, pid, signal;
    char host[HBMSG_HOST_LEN];
};
void mpirun_report_parse(const char *line, struct mpirun_report *r);

/* ---- net.c ---- */
struct super_net {
    int sock, family, port;
    int wildcard;    /* bound to every interface */
    char host[256];  /* --listen's HOST when not a wildcard */
    char bound[300]; /* the address bound, "A.B.C.D:PORT" or "[V6]:PORT" */
};
/* Binds the heartbeat socket per --listen HOST[:PORT] (NULL: every
 * interface, any port); -1 with err. */
int net_listen(struct super_net *n, const char *spec, char *err, size_t errlen);
/* FSDP_SUPER_ADDR for a launch on these hosts: the address bound for
 * --listen HOST, or for a wildcard the address of the interface that routes
 * to the first host that is not this one (127.0.0.1 when all are local).
 * *note says how it was chosen. */
void net_advertise(const struct super_net *n, const struct host *h, int nh, char *out,
                   size_t outlen, const char **note);
/* 1 if name is this host: localhost, 127.x, ::1, its own name, or names
 * and addresses that resolve only to addresses of its interfaces. */
int net_host_is_local(const char *name);
/* "A.B.C.D:PORT" or "[V6]:PORT" of a socket address. */
void net_format(const struct sockaddr *a, socklen_t len, char *out, size_t n);

/* ---- link.c ---- */
/* fsdp-super's end of the datagrams. */
struct link {
    struct super_net net;
    struct hbmsg_key key, prev_key; /* this launch's secret, the one before */
    int launches;                   /* secrets drawn */
    char addr[300];                 /* FSDP_SUPER_ADDR of this launch */
    uint64_t seq;                   /* of the answers */
    enum hb_ctl job_order;          /* said to every rank, even one not seen yet */
    int unauth_said;                /* this launch's unauthenticated_datagram event */
    /* dropped: malformed or of no rank of the launch; failing the MAC;
     * sealed with the previous launch's secret; replayed SEQs; another
     * (host, pid) for a rank */
    uint64_t dropped, unauthenticated, stale, replayed, conflicts;
};
/* A launch on these hosts: a fresh secret and the address its ranks are
 * given (an advertise event); -1 if no secret can be drawn. */
int link_launch(struct link *l, const struct host *h, int nh);
/* Every datagram waiting: each authentic heartbeat or event of a rank of j
 * that ranks.c admits goes to on_msg, and each heartbeat is answered with
 * the rank's standing order. */
void link_drain(struct link *l, struct job *j, void (*on_msg)(void *ctx, const struct hbmsg *m),
                void *ctx);
/* Sends at once the orders given since the last call (rank_order). */
void link_send_orders(struct link *l, struct job *j);
/* Orders every rank of the job, those not seen yet included (when they
 * first beat). */
void link_order_all(struct link *l, struct job *j, enum hb_ctl action);

/* ---- agent.c ---- */
#define AGENT_MAX_WORDS 32
#define AGENT_TEXT_LEN  1024
/* The launch agent Open MPI uses: its command and words. */
struct agent {
    char text[AGENT_TEXT_LEN]; /* the words, each NUL-terminated */
    char *word[AGENT_MAX_WORDS];
    int nwords;
    int is_ssh;       /* the command is ssh: it takes -o ConnectTimeout, BatchMode */
    char probe[1024]; /* the command a probe runs on each host ("" : true) */
};
/* From the values of plm_rsh_agent (NULL or empty: ssh; "A : B": the first
 * alternative whose command is found, else the first) and plm_rsh_args
 * (NULL: none); -1 with err when there are too many words or none. */
int agent_init(struct agent *a, const char *agent, const char *args, char *err, size_t errlen);
/* How one host's probe went: ok, or why not (the agent's exit and first
 * line on stderr, or no answer in time); took: seconds. */
struct probe {
    int ok;
    double took;
    char why[224];
    int cleaned; /* processes of an earlier launch the probe killed */
};
/* Makes a's probe also clear the host of this job's earlier launches: it
 * kills every process whose environment holds FSDP_SUPER_JOB=job (what
 * each launch gives its ranks) and answers only when none is left. job
 * must be 1..32 hex digits. */
void agent_probe_clears(struct agent *a, const char *job);
/* Runs `AGENT HOST true` for the n hosts at once (at most SUPER_MAX_HOSTS),
 * each bounded by timeout seconds (ssh: ConnectTimeout, BatchMode) and
 * killed with its process group a second after that; fills out[i]. */
void agent_probe(const struct agent *a, const char *const *names, int n, double timeout,
                 struct probe *out);
/* The hosts that did not answer their last probe. */
struct suspects {
    int n;
    struct {
        char name[128];
        char why[224];
    } host[SUPER_MAX_HOSTS];
};
/* Probes every host of h that is not this one (none when timeout is 0),
 * moves those that do not answer to left (*nleft) and returns the slots of
 * the hosts kept in h. A host that becomes suspect (or whose reason
 * changes) is a host_suspect event, a suspect one that answers again a
 * host_answers event. */
int hosts_reachable(struct suspects *sp, const struct agent *a, double timeout, struct host *h,
                    int *nh, struct host *left, int *nleft);

/* ---- mpiargs.c ---- */
/* Open MPI's OOB TCP keepalive, whole seconds. */
struct keepalive {
    int time, intvl, probes;
};
/* time + intvl x probes about hb_timeout, each at least 1. */
void mpi_keepalive(double hb_timeout, struct keepalive *k);
#define MPIARGS_MAX_FORWARD 64
#define MPIARGS_MAX_EXPORT  (MPIARGS_MAX_FORWARD + 8)
/* mpirun's arguments of every launch: --mca for the keepalive (those the
 * environment does not set) and, for each variable that must reach every
 * host, -x NAME - or, when the environment sets Open MPI's own list of
 * such variables (OMPI_MCA_mca_base_env_list, which mpirun refuses to mix
 * with -x), NAME appended to that list (env_list: the value mpirun's
 * environment gets). Values never go on the command line. The strings
 * live in the struct. */
struct mpiargs {
    const char *argv[9 + 2 * MPIARGS_MAX_EXPORT];
    int argc;
    struct keepalive keepalive;
    int keepalive_set; /* how many of the three went on the command line */
    char num[3][16];
    char names[MPIARGS_MAX_FORWARD][128];
    int nforward;
    int use_env_list;    /* the environment sets OMPI_MCA_mca_base_env_list */
    char env_list[8192]; /* ours, then the user's list (use_env_list) */
    char user_list[4096], our_list[4096];
    char delim;   /* its delimiter (mca_base_env_list_delimiter, ';') */
    int overflow; /* a variable did not fit: the launch must not go */
};
void mpiargs_build(struct mpiargs *m, double hb_timeout, char *const *env);
/* One more variable for every host (name must outlive m): -x NAME, or
 * NAME added to env_list (ours go first: Open MPI stops reading the list
 * at a name it cannot find, and the user's may name one). -1, and
 * m->overflow set, when there is no room. */
int mpiargs_export(struct mpiargs *m, const char *name);

/* ---- proc.c ---- */
/* Pids of every live process in the session sid (zombies excluded). */
int job_pids(pid_t sid, pid_t *out, int max);
/* 'R', 'S', 'T', 'Z', ... or 0 if the process is gone */
char proc_state(pid_t pid);
/* The session of a process, 0 if it is gone. */
pid_t proc_session(pid_t pid);
/* SIGCONT, SIGTERM, grace, SIGKILL; returns once no process of the session
 * is left (or after 20 s, returning the number still there). */
int job_teardown(struct job *j, double grace);
/* Reaps any exited child (the supervisor is a subreaper), noting mpirun's
 * exit status in j. */
void reap_children(struct job *j);
/* Removes a directory tree without following symbolic links (no shell). */
int remove_tree(const char *path);

#endif
