/*
 * super.c - fsdp-super: launch the ranks, watch them, tear the job down
 * on any failure, and launch again on whatever capacity is left.
 *
 *   fsdp-super [--np N] [--min-np M] [--hosts FILE] [--max-restarts K]
 *              [--heartbeat-timeout SEC] [--preempt-url URL] [--events FILE]
 *              [--chaos SPEC] -- fsdp-train ARGS...
 *
 * Each launch claims a new generation in the checkpoint store (fencing,
 * ckpt.h), writes a hostfile from the `host slots` lines of --hosts (read
 * again before every launch), and starts `mpirun` in a session of its own
 * with FSDP_SUPER_ADDR (this process's UDP heartbeat port) and
 * FSDP_GENERATION. The job has failed when mpirun exits non-zero, a rank's
 * process disappears, a rank's heartbeats stop (a stopped process) or its
 * progress counter stops moving (a rank stuck in a collective) for longer
 * than --heartbeat-timeout. Then every process of the job's session gets
 * SIGCONT, SIGTERM and after a grace period SIGKILL, and the job starts
 * again after a backoff (up to --max-restarts times; the count resets after
 * --healthy-after seconds of progress). The trainer resumes from the newest
 * committed checkpoint and reshards when the world size changed.
 *
 * Preemption: SIGTERM or SIGINT to fsdp-super, or a notice at
 * --preempt-url in AWS's spot/instance-action form
 * ({"action":"terminate","time":"...Z"}; 404 means none), polled every few
 * seconds. The ranks get SIGUSR1, agree on the next step boundary, write an
 * emergency checkpoint and exit; fsdp-super then exits 0 (signal) or
 * relaunches on the capacity the host file still offers (notice).
 */
#include "super.h"

#include "chaos.h"
#include "ckpt.h"
#include "storage.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fsdp-super: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int capacity(const struct super_opts *o, struct host *h, int *nh)
{
    if (!o->hosts) {
        snprintf(h[0].name, sizeof h[0].name, "localhost");
        h[0].slots = o->np;
        *nh = 1;
        return o->np;
    }
    return super_read_hosts(o->hosts, h, 64, nh);
}

/* ---- state ------------------------------------------------------------------ */

struct super {
    struct super_opts o;
    int sock, port;
    char workdir[256];
    uint64_t generation;
    struct job job;
    struct chaos chaos;
    /* accounting */
    double start, downtime, fail_at;
    int launches, restarts_in_a_row, prev_np;
    int by_cause[8];
    uint64_t steps_lost, last_committed, max_step_seen, final_step;
    double step_time_sum;
    uint64_t step_count;
    char notice_seen[128];
};

enum cause { C_EXIT, C_DIED, C_HUNG, C_PREEMPT, C_CHAOS, C_STARTUP, C_NCAUSE };
static const char *cause_names[] = {"exit", "rank-died", "heartbeat-lost", "preemption",
                                    "chaos-restart", "startup-timeout"};

static uint64_t next_generation(struct super *s)
{
    char err[STORAGE_ERR_LEN];
    if (s->o.ckpt) {
        struct storage *st;
        uint64_t g;
        if (storage_open(s->o.ckpt, &st, err) == 0) {
            int rc = ckpt_fence_claim(st, &g, err);
            storage_close(st);
            if (rc == 0)
                return g;
        }
        say("cannot record a generation in %s (%s); fencing is off for this launch",
            s->o.ckpt, err);
    }
    return s->generation + 1;
}

static int launch(struct super *s, int np, const struct host *hosts, int nh)
{
    s->generation = next_generation(s);
    char hostfile[320], addr[64], gen[32];
    snprintf(hostfile, sizeof hostfile, "%s/hostfile-%llu", s->workdir,
             (unsigned long long)s->generation);
    FILE *f = fopen(hostfile, "w");
    if (!f) {
        say("cannot write %s: %s", hostfile, strerror(errno));
        return -1;
    }
    for (int i = 0; i < nh; i++)
        fprintf(f, "%s slots=%d\n", hosts[i].name, hosts[i].slots);
    fclose(f);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", s->port);
    snprintf(gen, sizeof gen, "%llu", (unsigned long long)s->generation);
    char npstr[16];
    snprintf(npstr, sizeof npstr, "%d", np);

    const char *extra_env = chaos_launch_env(&s->chaos);
    const char *ckpt_override = chaos_launch_ckpt(&s->chaos, s->o.ckpt);
    char **argv = calloc((size_t)s->o.targc + 16, sizeof *argv);
    int a = 0;
    argv[a++] = (char *)s->o.mpirun;
    argv[a++] = "--hostfile";
    argv[a++] = hostfile;
    argv[a++] = "-np";
    argv[a++] = npstr;
    argv[a++] = "-x";
    argv[a++] = "FSDP_SUPER_ADDR";
    argv[a++] = "-x";
    argv[a++] = "FSDP_GENERATION";
    if (extra_env) {
        argv[a++] = "-x";
        argv[a++] = "FSDP_TEST_STOP_AT";
    }
    for (int k = 0; k < s->o.targc; k++) {
        int is_ckpt_value = k > 0 && strcmp(s->o.targv[k - 1], "--ckpt") == 0;
        argv[a++] = is_ckpt_value && ckpt_override ? (char *)ckpt_override : s->o.targv[k];
    }
    argv[a] = NULL;

    int errpipe[2];
    if (pipe2(errpipe, O_CLOEXEC)) {
        say("pipe: %s", strerror(errno));
        free(argv);
        return -1;
    }
    memset(&s->job, 0, sizeof s->job);
    s->job.err_fd = errpipe[0];
    fcntl(errpipe[0], F_SETFL, O_NONBLOCK);
    s->job.generation = s->generation;
    s->job.np = np;
    s->job.launched = super_now();
    pid_t pid = fork();
    if (pid < 0) {
        say("fork: %s", strerror(errno));
        free(argv);
        return -1;
    }
    if (pid == 0) {
        setsid();
        dup2(errpipe[1], 2);
        setenv("FSDP_SUPER_ADDR", addr, 1);
        setenv("FSDP_GENERATION", gen, 1);
        if (extra_env)
            setenv("FSDP_TEST_STOP_AT", extra_env, 1);
        else
            unsetenv("FSDP_TEST_STOP_AT");
        if (getuid() == 0) { /* Open MPI refuses root without both */
            setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
            setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
        }
        execvp(argv[0], argv);
        fprintf(stderr, "fsdp-super: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    free(argv);
    close(errpipe[1]);
    s->job.mpirun = pid;
    s->launches++;
    say("launch %d: generation %llu, %d rank%s%s", s->launches,
        (unsigned long long)s->generation, np, np > 1 ? "s" : "",
        s->prev_np && s->prev_np != np ? " (resized)" : "");
    ev_emit("launch", "\"launch\":%d,\"generation\":%llu,\"np\":%d,\"pid\":%d", s->launches,
            (unsigned long long)s->generation, np, (int)pid);
    if (s->prev_np && s->prev_np != np)
        ev_emit("resize", "\"from\":%d,\"to\":%d", s->prev_np, np);
    s->prev_np = np;
    return 0;
}

/* ---- mpirun's stderr -------------------------------------------------------------- */

/* The ranks' lines go through; Open MPI's own reports (the dashed boxes,
 * "[host:pid] ..." crash dumps of an mpirun whose rank we killed, signal
 * forwarding notes) go to the event log instead of the terminal. */
static int mpi_noise(const char *l)
{
    if (strncmp(l, "mpirun: Forwarding signal", 25) == 0)
        return 1;
    if (l[0] != '[')
        return 0;
    const char *close = strchr(l, ']'), *colon = strchr(l, ':');
    return close && colon && colon < close && close - l < 64;
}

static void on_line(struct super *s, char *l)
{
    struct job *j = &s->job;
    int dashes = strncmp(l, "--------------------", 20) == 0;
    if (dashes || j->in_box || mpi_noise(l)) {
        if (dashes)
            j->in_box = !j->in_box;
        j->hidden++;
        json_t *t = json_string(l);
        char *txt = t ? json_dumps(t, JSON_ENCODE_ANY) : NULL;
        if (txt)
            ev_emit("mpirun_output", "\"generation\":%llu,\"line\":%s",
                    (unsigned long long)j->generation, txt);
        free(txt);
        json_decref(t);
        return;
    }
    fprintf(stderr, "%s\n", l);
}

static void drain_stderr(struct super *s)
{
    struct job *j = &s->job;
    if (j->err_fd < 0)
        return;
    for (;;) {
        ssize_t n = read(j->err_fd, j->line + j->line_len, sizeof j->line - 1 - j->line_len);
        if (n <= 0) {
            if (n == 0) { /* the job closed it */
                if (j->line_len) {
                    j->line[j->line_len] = 0;
                    on_line(s, j->line);
                    j->line_len = 0;
                }
                close(j->err_fd);
                j->err_fd = -1;
            }
            return;
        }
        j->line_len += (size_t)n;
        char *start = j->line, *nl;
        while ((nl = memchr(start, '\n', j->line_len - (size_t)(start - j->line)))) {
            *nl = 0;
            on_line(s, start);
            start = nl + 1;
        }
        size_t rest = j->line_len - (size_t)(start - j->line);
        memmove(j->line, start, rest);
        j->line_len = rest;
        if (j->line_len == sizeof j->line - 1) { /* a line too long to hold: pass it on */
            j->line[j->line_len] = 0;
            on_line(s, j->line);
            j->line_len = 0;
        }
    }
}

/* ---- heartbeats ------------------------------------------------------------------- */

static void on_event_text(struct super *s, int rank, const char *text)
{
    unsigned long long step;
    int from, to;
    char digest[16];
    if (sscanf(text, "checkpoint_committed step=%llu", &step) == 1) {
        s->last_committed = step;
        ev_emit("checkpoint_committed", "\"step\":%llu,\"generation\":%llu", step,
                (unsigned long long)s->job.generation);
    } else if (sscanf(text, "resumed step=%llu world=%d", &step, &to) == 2) {
        s->job.resumed_from = step;
        s->job.resumed_known = 1;
        ev_emit("resumed", "\"step\":%llu,\"np\":%d", step, to);
    } else if (sscanf(text, "reshard step=%llu from=%d to=%d", &step, &from, &to) == 3) {
        ev_emit("reshard", "\"step\":%llu,\"from\":%d,\"to\":%d", step, from, to);
    } else if (sscanf(text, "load_verified step=%llu from=%d to=%d digest=%15s", &step, &from,
                      &to, digest) == 4) {
        ev_emit("load_verified", "\"step\":%llu,\"from\":%d,\"to\":%d,\"digest\":\"%s\"", step,
                from, to, digest);
    } else if (sscanf(text, "emergency_checkpoint step=%llu", &step) == 1) {
        ev_emit("emergency_checkpoint", "\"step\":%llu", step);
    } else {
        (void)rank;
    }
}

static void drain_socket(struct super *s)
{
    char buf[600];
    for (;;) {
        ssize_t n = recv(s->sock, buf, sizeof buf - 1, MSG_DONTWAIT);
        if (n <= 0)
            return;
        buf[n] = 0;
        unsigned long long gen, step, progress;
        int rank, pid, off = 0;
        char phase[16];
        if (sscanf(buf, "fsdp-ev %llu %d %n", &gen, &rank, &off) == 2 && off > 0) {
            if (gen == s->job.generation)
                on_event_text(s, rank, buf + off);
            continue;
        }
        if (sscanf(buf, "fsdp-hb %llu %d %d %llu %15s %llu", &gen, &rank, &pid, &step, phase,
                   &progress) != 6)
            continue;
        if (gen != s->job.generation || rank < 0 || rank >= s->job.np)
            continue; /* a zombie of an older launch, or garbage */
        struct rank_state *r = &s->job.ranks[rank];
        double now = super_now();
        if (!r->seen || r->progress != progress || r->step != step) {
            if (rank == 0 && r->seen && step > r->step && strcmp(phase, "train") == 0 &&
                r->step > 0) {
                s->step_time_sum += now - r->last_change;
                s->step_count += step - r->step;
            }
            r->last_change = now;
        }
        if (strcmp(phase, "train") == 0 && s->job.first_train == 0)
            s->job.first_train = now;
        r->seen = 1;
        r->pid = pid;
        r->step = step;
        r->progress = progress;
        snprintf(r->phase, sizeof r->phase, "%s", phase);
        r->last_seen = now;
        if (step > s->max_step_seen)
            s->max_step_seen = step;
    }
}

/* ---- failure detection ------------------------------------------------------------ */

static const char *signame(int sig)
{
    static char buf[16];
    const char *n = sigabbrev_np(sig);
    snprintf(buf, sizeof buf, "SIG%s", n ? n : "?");
    return buf;
}

/* Returns a cause, or -1 while the job is healthy; sets *done when the job
 * ended cleanly. */
static int check_job(struct super *s, char *why, size_t n, int *done)
{
    struct job *j = &s->job;
    double now = super_now();
    *done = 0;
    if (!j->exited) {
        int st;
        pid_t w = waitpid(j->mpirun, &st, WNOHANG);
        if (w == j->mpirun) {
            j->exited = 1;
            j->status = st;
        }
    }
    if (j->exited) {
        int code = WIFEXITED(j->status) ? WEXITSTATUS(j->status) : -1;
        if (code == 0) {
            *done = 1;
            return -1;
        }
        if (WIFSIGNALED(j->status))
            snprintf(why, n, "mpirun died by %s", signame(WTERMSIG(j->status)));
        else
            snprintf(why, n, "mpirun exited with code %d", code);
        ev_emit("exit", "\"code\":%d,\"signal\":%d", code,
                WIFSIGNALED(j->status) ? WTERMSIG(j->status) : 0);
        return C_EXIT;
    }
    /* three passes, so the culprit is named: a dead rank, then a silent one
     * (stopped, frozen), then one whose progress stalled (stuck waiting in a
     * collective, usually for the silent or dead one) */
    for (int pass = 0; pass < 3; pass++) {
        for (int r = 0; r < j->np; r++) {
            struct rank_state *rs = &j->ranks[r];
            if (!rs->seen)
                continue;
            int finished = strcmp(rs->phase, "done") == 0 || strcmp(rs->phase, "preempted") == 0;
            char st = proc_state(rs->pid);
            if (pass == 0 && (st == 0 || st == 'Z') && !finished) {
                snprintf(why, n, "rank %d (pid %d) ended at step %llu (exited or was killed)", r,
                         (int)rs->pid, (unsigned long long)rs->step);
                ev_emit("rank_died", "\"rank\":%d,\"pid\":%d,\"step\":%llu", r, (int)rs->pid,
                        (unsigned long long)rs->step);
                return C_DIED;
            }
            if (finished)
                continue;
            if (pass == 1 && now - rs->last_seen > s->o.hb_timeout) {
                snprintf(why, n, "rank %d (pid %d): no heartbeat for %.1f s%s", r, (int)rs->pid,
                         now - rs->last_seen, st == 'T' ? " (process stopped)" : "");
                ev_emit("heartbeat_lost",
                        "\"rank\":%d,\"pid\":%d,\"silent_s\":%.1f,\"state\":\"%c\"", r,
                        (int)rs->pid, now - rs->last_seen, st ? st : '?');
                return C_HUNG;
            }
            if (pass == 2 && now - rs->last_change > s->o.hb_timeout) {
                snprintf(why, n, "rank %d (pid %d): no progress for %.1f s in phase %s (hung)", r,
                         (int)rs->pid, now - rs->last_change, rs->phase);
                ev_emit("heartbeat_lost",
                        "\"rank\":%d,\"pid\":%d,\"stalled_s\":%.1f,\"phase\":\"%s\"", r,
                        (int)rs->pid, now - rs->last_change, rs->phase);
                return C_HUNG;
            }
        }
    }
    for (int r = 0; r < j->np; r++) {
        if (!j->ranks[r].seen && now - j->launched > s->o.startup_timeout) {
            snprintf(why, n, "rank %d sent no heartbeat in %.0f s since launch", r,
                     now - j->launched);
            ev_emit("heartbeat_lost", "\"rank\":%d,\"startup\":true", r);
            return C_STARTUP;
        }
    }
    return -1;
}

static void signal_ranks(struct super *s, int sig)
{
    for (int r = 0; r < s->job.np; r++)
        if (s->job.ranks[r].seen)
            kill(s->job.ranks[r].pid, sig);
}

/* ---- the loop ------------------------------------------------------------------------ */

static void nap(double sec)
{
    struct pollfd p = {.fd = -1};
    poll(&p, 0, (int)(sec * 1000));
}

static void account_failure(struct super *s)
{
    uint64_t reached = 0;
    for (int r = 0; r < s->job.np; r++)
        if (s->job.ranks[r].step > reached)
            reached = s->job.ranks[r].step;
    if (reached > s->last_committed)
        s->steps_lost += reached - s->last_committed;
    s->fail_at = super_now();
}

static void summary(struct super *s, const char *end)
{
    double wall = super_now() - s->start;
    double step_s = s->step_count ? s->step_time_sum / (double)s->step_count : 0;
    double productive = step_s * (double)s->final_step;
    int restarts = 0;
    for (int c = 0; c < C_NCAUSE; c++)
        restarts += s->by_cause[c];
    fprintf(stderr, "\nfsdp-super summary (%s)\n", end);
    fprintf(stderr, "  launches        %d\n", s->launches);
    fprintf(stderr, "  restarts        %d", restarts);
    const char *sep = " (";
    for (int c = 0; c < C_NCAUSE; c++)
        if (s->by_cause[c]) {
            fprintf(stderr, "%s%s %d", sep, cause_names[c], s->by_cause[c]);
            sep = ", ";
        }
    fprintf(stderr, "%s\n", restarts ? ")" : "");
    fprintf(stderr, "  steps lost      %llu (computed again after a restart)\n",
            (unsigned long long)s->steps_lost);
    fprintf(stderr, "  downtime        %.1f s (failure detected to training again)\n",
            s->downtime);
    fprintf(stderr, "  final step      %llu, newest committed checkpoint step %llu\n",
            (unsigned long long)s->final_step, (unsigned long long)s->last_committed);
    fprintf(stderr, "  wall time       %.1f s\n", wall);
    fprintf(stderr, "  goodput         %.0f%% (productive step time %.1f s / wall time)\n",
            wall > 0 ? 100.0 * productive / wall : 0, productive);
    ev_emit("summary",
            "\"end\":\"%s\",\"launches\":%d,\"restarts\":%d,\"steps_lost\":%llu,"
            "\"downtime_s\":%.2f,\"wall_s\":%.2f,\"goodput\":%.4f,\"final_step\":%llu",
            end, s->launches, restarts, (unsigned long long)s->steps_lost, s->downtime, wall,
            wall > 0 ? productive / wall : 0, (unsigned long long)s->final_step);
}

static int open_socket(struct super *s)
{
    s->sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    if (s->sock < 0 || bind(s->sock, (struct sockaddr *)&a, sizeof a) ||
        getsockname(s->sock, (struct sockaddr *)&a, &len))
        return -1;
    int big = 1 << 20;
    setsockopt(s->sock, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    s->port = ntohs(a.sin_port);
    return 0;
}

/* Waits until the host file offers at least --min-np slots; returns the
 * world size to launch (-1 if a signal arrived meanwhile). */
static int wait_capacity(struct super *s, struct host *h, int *nh)
{
    int said = 0;
    for (;;) {
        int cap = capacity(&s->o, h, nh);
        int np = s->o.np && s->o.np < cap ? s->o.np : cap;
        if (np >= s->o.min_np)
            return np;
        if (!said) {
            say("waiting for capacity: %s offers %d slot%s, at least %d needed", s->o.hosts, cap,
                cap == 1 ? "" : "s", s->o.min_np);
            ev_emit("waiting_for_capacity", "\"slots\":%d,\"min_np\":%d", cap, s->o.min_np);
            said = 1;
        }
        if (got_signal)
            return -1;
        nap(0.5);
    }
}

int main(int argc, char **argv)
{
    static struct super s;
    if (super_parse(&s.o, argc, argv))
        return 2;
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (open_socket(&s)) {
        say("cannot open a heartbeat socket on 127.0.0.1: %s", strerror(errno));
        return 1;
    }
    snprintf(s.workdir, sizeof s.workdir, "/tmp/fsdp-super-%d", (int)getpid());
    mkdir(s.workdir, 0700);
    ev_open(s.o.events);
    if (chaos_init(&s.chaos, s.o.chaos, &s.o)) 
        return 2;
    s.start = super_now();
    ev_emit("start", "\"heartbeat_port\":%d,\"np\":%d,\"min_np\":%d", s.port, s.o.np,
            s.o.min_np);
    int rc = 0, preempting = 0, preempt_from_signal = 0;
    double next_poll = 0, preempt_deadline = 0;
    struct host hosts[64];
    int nh;
    for (;;) {
        if (got_signal) { /* a preemption or a failure raced with the signal */
            summary(&s, "stopped by a signal");
            break;
        }
        preempting = 0; /* a notice applies to the launch it came to */
        int np = wait_capacity(&s, hosts, &nh);
        if (np < 0) {
            summary(&s, "stopped by a signal while waiting for capacity");
            break;
        }
        if (launch(&s, np, hosts, nh)) {
            rc = 1;
            break;
        }
        chaos_launched(&s.chaos);
        char why[512];
        int cause = -1, done = 0, chaos_kill = 0;
        while (cause < 0 && !done) {
            struct pollfd p[2] = {{.fd = s.sock, .events = POLLIN},
                                  {.fd = s.job.err_fd, .events = POLLIN}};
            poll(p, s.job.err_fd >= 0 ? 2 : 1, 50);
            drain_socket(&s);
            drain_stderr(&s);
            reap_children(&s.job);
            double now = super_now();
            if (s.fail_at && s.job.first_train) { /* back to training after a failure */
                s.downtime += s.job.first_train - s.fail_at;
                s.fail_at = 0;
            }
            if (s.job.first_train && now - s.job.first_train > s.o.healthy_after)
                s.restarts_in_a_row = 0;
            if (got_signal && !preempting) {
                say("%s: preemption: asking the ranks for an emergency checkpoint",
                    got_signal == SIGINT ? "SIGINT" : "SIGTERM");
                ev_emit("preemption_notice", "\"source\":\"signal\"");
                signal_ranks(&s, SIGUSR1);
                preempting = preempt_from_signal = 1;
                preempt_deadline = now + s.o.preempt_deadline;
            }
            if (s.o.preempt_url && !preempting && now >= next_poll) {
                char when[128];
                next_poll = now + s.o.preempt_poll;
                if (super_poll_notice(s.o.preempt_url, when, sizeof when) &&
                    strcmp(when, s.notice_seen) != 0) {
                    snprintf(s.notice_seen, sizeof s.notice_seen, "%s", when);
                    say("preemption notice from %s (time %s): emergency checkpoint",
                        s.o.preempt_url, when);
                    ev_emit("preemption_notice", "\"source\":\"url\",\"time\":\"%s\"", when);
                    signal_ranks(&s, SIGUSR1);
                    preempting = 1;
                    preempt_deadline = now + s.o.preempt_deadline;
                }
            }
            if (!preempting) {
                int action = chaos_tick(&s.chaos, &s.job, now);
                if (action == CHAOS_PREEMPT) {
                    signal_ranks(&s, SIGUSR1);
                    preempting = 1;
                    preempt_deadline = now + s.o.preempt_deadline;
                } else if (action == CHAOS_KILL_NOW) {
                    chaos_kill = 1;
                }
            }
            if (chaos_kill) {
                snprintf(why, sizeof why, "chaos: the job is killed during a checkpoint commit");
                cause = C_CHAOS;
                break;
            }
            cause = check_job(&s, why, sizeof why, &done);
            if (preempting && now > preempt_deadline && cause < 0 && !done) {
                snprintf(why, sizeof why, "no emergency checkpoint before the deadline");
                cause = C_PREEMPT;
            }
        }
        uint64_t reached = 0;
        for (int r = 0; r < s.job.np; r++)
            if (s.job.ranks[r].step > reached)
                reached = s.job.ranks[r].step;
        int left = job_teardown(&s.job, s.o.grace);
        drain_stderr(&s);
        if (s.job.err_fd >= 0) {
            close(s.job.err_fd);
            s.job.err_fd = -1;
        }
        if (s.job.hidden)
            say("(%d lines of Open MPI's own output for generation %llu are in the event log)",
                s.job.hidden, (unsigned long long)s.generation);
        ev_emit("teardown", "\"generation\":%llu,\"left\":%d", (unsigned long long)s.generation,
                left);
        if (left)
            say("warning: %d processes of generation %llu survived SIGKILL", left,
                (unsigned long long)s.generation);
        if (done && !preempting) {
            int all_done = 1;
            for (int r = 0; r < s.job.np; r++)
                all_done &= strcmp(s.job.ranks[r].phase, "done") == 0;
            if (all_done || s.job.np == 0) {
                s.final_step = reached;
                say("training finished at step %llu", (unsigned long long)reached);
                ev_emit("finished", "\"step\":%llu", (unsigned long long)reached);
                summary(&s, "finished");
                break;
            }
            snprintf(why, sizeof why, "the ranks stopped early (preempted by someone else?)");
            cause = C_PREEMPT;
        }
        if (preempting && (done || cause == C_PREEMPT)) {
            preempting = 0;
            s.final_step = reached;
            if (preempt_from_signal) {
                say("stopped after the emergency checkpoint (step %llu); resumable",
                    (unsigned long long)s.last_committed);
                summary(&s, "preempted");
                break;
            }
            s.by_cause[C_PREEMPT]++;
            ev_emit("restart", "\"cause\":\"preemption\",\"step\":%llu",
                    (unsigned long long)s.last_committed);
            s.fail_at = super_now();
            continue; /* relaunch on what the host file still offers */
        }
        /* a failure */
        say("generation %llu failed: %s; stopped every process of the job",
            (unsigned long long)s.generation, why);
        account_failure(&s);
        s.by_cause[cause]++;
        if (++s.restarts_in_a_row > s.o.max_restarts) {
            say("giving up after %d restarts in a row", s.o.max_restarts);
            ev_emit("give_up", "\"restarts\":%d", s.o.max_restarts);
            s.final_step = reached;
            summary(&s, "gave up");
            rc = 1;
            break;
        }
        double wait = s.o.backoff * pow(2, s.restarts_in_a_row - 1);
        wait = wait > 30 ? 30 : wait;
        json_t *w = json_string(why);
        char *wj = json_dumps(w, JSON_ENCODE_ANY);
        ev_emit("restart", "\"cause\":\"%s\",\"why\":%s,\"backoff_s\":%.2f",
                cause_names[cause], wj ? wj : "\"\"", wait);
        free(wj);
        json_decref(w);
        nap(wait);
        if (got_signal) {
            summary(&s, "stopped by a signal");
            break;
        }
    }
    ev_close();
    chaos_free(&s.chaos);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s.workdir);
    if (system(cmd) != 0)
        say("could not remove %s", s.workdir);
    return rc;
}
