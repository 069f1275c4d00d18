/*
 * fsdp_super.c - fsdp-super: launch the ranks, watch them, tear the job down
 * on any failure, and launch again on whatever capacity is left.
 *
 *   fsdp-super [--np N] [--min-np M] [--hosts FILE] [--max-restarts K]
 *              [--heartbeat-timeout SEC] [--preempt-url URL] [--events FILE]
 *              [--capacity-timeout SEC] [--chaos SPEC] [--listen HOST[:PORT]]
 *              [--rank-silence SEC] [--probe-timeout SEC] -- fsdp-train ARGS...
 *
 * Each launch claims a new generation in the checkpoint store (fencing,
 * ckpt.h; a store where no generation can be claimed is not launched on
 * at all), writes a hostfile from the `host slots` lines of --hosts (read
 * again before every launch) less the hosts that do not answer a probe
 * (below), and starts `mpirun` in a session of its own; fewer than
 * --min-np slots on hosts that answer for longer than --capacity-timeout
 * ends the run. The job has failed when mpirun exits non-zero, a rank dies, a
 * rank's heartbeats stop (a stopped process, a lost host) or its progress
 * counter stops moving (a rank stuck in a collective) for longer than
 * --heartbeat-timeout. Then every process of the job's session gets
 * SIGCONT, SIGTERM and after a grace period SIGKILL, and the job starts
 * again after a backoff (up to --max-restarts times; the count resets after
 * --healthy-after seconds of progress). The trainer resumes from the newest
 * committed checkpoint and reshards when the world size changed.
 *
 * The ranks and this process, over the network (src/hbmsg.h, heartbeat.h):
 *   - The heartbeat socket takes --listen HOST[:PORT], by default every
 *     interface (net.c). Each launch gives the ranks, in mpirun's
 *     environment and exported with -x (never on a command line):
 *     FSDP_SUPER_ADDR (a name or address and port the ranks resolve: the
 *     interface that routes to the first remote host, 127.0.0.1 when all
 *     are local), FSDP_GENERATION, FSDP_SUPER_SILENCE_S (--rank-silence)
 *     and FSDP_SUPER_TOKEN, 32 fresh random bytes per launch, never
 *     printed or logged.
 *   - Every datagram, both ways, carries its sender's host name and a SEQ
 *     and is sealed with HMAC-SHA256 keyed by the token (hbmsg.h says why
 *     a MAC and not the token itself). What fails the MAC is dropped and
 *     counted (the summary's unauthenticated_datagrams; one
 *     unauthenticated_datagram event per launch names where it came from),
 *     a replayed SEQ too; so a forged "done" or "hold" cannot blind the
 *     supervisor to a rank, nor end a job.
 *   - A rank is (host, pid) (ranks.c). /proc speaks only for a rank on this
 *     host in the job's session: death at once, 'T' for a stopped one. A
 *     remote rank's death is silence beyond --heartbeat-timeout, or mpirun
 *     exiting (its "noticed that process rank N ... on node H", "Remote
 *     daemon ... on node H" and a rank's "Peer host: H" lines become
 *     rank_died, daemon_lost and peer_lost events).
 *     Events name each rank's host (rank_up, rank_died, heartbeat_lost) and
 *     a launch lists its hosts.
 *   - Orders go in the answers (link.c): every heartbeat is answered at
 *     once with a sealed fsdp-ctl echoing its SEQ - "ack", or "preempt",
 *     "stop" or "kill", which the rank carries out on itself. Local ranks
 *     also get the signal by kill(), after a check that the pid is still
 *     in the job's session; a remote rank's pid is never given to kill().
 *     Not SIGUSR1 to mpirun: Open MPI would forward it
 *     (ess_base_forward_signals includes SIGUSR1 by default) also to ranks
 *     that have not yet installed their handler, and SIGUSR1's default
 *     action kills them; an answer reaches exactly the ranks that beat,
 *     wherever they run.
 *   - The answers are the ranks' proof of life of this process: a rank
 *     that hears none for FSDP_SUPER_SILENCE_S stops itself, committing
 *     nothing (heartbeat.h), so killing fsdp-super leaves no job behind.
 *   - Teardown still reaches only this host's processes (the job's session;
 *     mpirun's own teardown reaches its remote daemons while it lives).
 *
 * Other hosts (agent.c, mpiargs.c):
 *   - Before each launch the hosts are probed (capacity.c); mpirun is
 *     never started onto one that does not answer.
 *   - Each launch sets Open MPI's OOB TCP keepalive from
 *     --heartbeat-timeout, so that mpirun and the daemons of a partitioned
 *     host give up on each other within about that time (not Open MPI's 8
 *     minutes), and carries with -x the environment that must be equal on
 *     every host (OpenBLAS, OpenMP: the bits a rank computes depend on it).
 *
 * The pieces of main: super_wait_capacity (capacity.c: the host file, the
 * probe of the hosts, per-host spot notices), launch (here), super_watch
 * (watch.c: one launch until it ends: heartbeats, preemption, a host
 * leaving the host file, chaos, failure checks), and end_launch (here: the
 * restart policy: finished, relaunch or give up; teardown). report.c
 * renders the --metrics page and the run's summary; the state the files
 * share, and what one calls in another, is in super_internal.h.
 *
 * Datagrams are opened, admitted and answered by link.c (src/hbmsg.c's
 * grammar, ranks.c's identity); events are JSON built by jansson
 * (events.c). mpirun's output is sorted by mpiout.c: Open MPI's own lines
 * go to the event log (when there is none, the last few are printed after
 * a failed launch).
 */
#include "super_internal.h"

#include "chaos.h"
#include "ckpt.h"
#include "metrics.h"
#include "storage.h"
#include "util.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t super_got_signal;
static void on_signal(int sig) { super_got_signal = sig; }

const char *const super_cause_names[C_NCAUSE] = {"exit",         "rank-died",     "heartbeat-lost",
                                                 "preemption",   "chaos-restart", "startup-timeout",
                                                 "host-removed", "host-notice"};

/* ---- launch ------------------------------------------------------------------------- */

/* A new generation claimed in the checkpoint store; -1 when none can be:
 * launching without fencing would let an older generation's stray rank
 * commit over this one's checkpoints. Without --ckpt there is nothing to
 * fence and generations just count. */
static int claim_generation(struct super *s)
{
    if (!s->o.ckpt) {
        s->generation++;
        return 0;
    }
    char err[FSDP_ERR_LEN] = "";
    struct storage *st;
    uint64_t g = 0;
    int rc = storage_open(s->o.ckpt, &st, err);
    if (rc == 0) {
        rc = ckpt_fence_claim(st, &g, err);
        storage_close(st);
    }
    if (rc == 0 && (g == 0 || g > HBMSG_MAX_GENERATION || g <= s->generation)) {
        snprintf(err, sizeof err, "the store answered generation %llu after %llu",
                 (unsigned long long)g, (unsigned long long)s->generation);
        rc = -1;
    }
    if (rc) {
        say("cannot claim a generation in %s (%s); refusing to launch without fencing", s->o.ckpt,
            err);
        ev_emit("fence_error", "{s:o}", "error", ev_text(err));
        return -1;
    }
    s->generation = g;
    return 0;
}

static char **launch_argv(struct super *s, const char *hostfile, const char *npstr)
{
    const struct chaos *c = &s->chaos;
    struct mpiargs *m = &s->mpiargs;
    /* -x NAME exports the variable's value; the value is never on a line */
    static const char *const ours[] = {"FSDP_SUPER_ADDR", "FSDP_GENERATION", "FSDP_SUPER_TOKEN",
                                       "FSDP_SUPER_SILENCE_S", "FSDP_SUPER_JOB"};
    for (size_t k = 0; k < sizeof ours / sizeof ours[0]; k++)
        mpiargs_export(m, ours[k]); /* room for these is reserved (MPIARGS_MAX_EXPORT) */
    if (c->hold[0])
        mpiargs_export(m, "FSDP_TEST_HOLD_AT");
    if (c->stop[0])
        mpiargs_export(m, "FSDP_TEST_STOP_AT");
    char **argv = calloc((size_t)s->o.targc + (size_t)m->argc + 8, sizeof *argv);
    if (!argv)
        return NULL;
    int a = 0;
    argv[a++] = (char *)s->o.mpirun;
    argv[a++] = "--hostfile";
    argv[a++] = (char *)hostfile;
    argv[a++] = "-np";
    argv[a++] = (char *)npstr;
    for (int k = 0; k < m->argc; k++) /* keepalives, the environment every host needs */
        argv[a++] = (char *)m->argv[k];
    for (int k = 0; k < s->o.targc; k++) {
        int is_ckpt_value = k > 0 && strcmp(s->o.targv[k - 1], "--ckpt") == 0;
        argv[a++] = is_ckpt_value && c->ckpt[0] ? (char *)c->ckpt : s->o.targv[k];
    }
    argv[a] = NULL;
    return argv;
}

/* In the child: the launch's environment, stderr into the pipe, mpirun.
 * The token exists as text only here, in mpirun's environment. */
static void exec_mpirun(struct super *s, char **argv, int errfd)
{
    char gen[32], silence[32], token[HBMSG_KEY_HEX + 1];
    snprintf(gen, sizeof gen, "%llu", (unsigned long long)s->generation);
    snprintf(silence, sizeof silence, "%.3f", s->o.rank_silence);
    hbmsg_key_hex(&s->link.key, token);
    setsid();
    dup2(errfd, 2);
    setenv("FSDP_SUPER_ADDR", s->link.addr, 1);
    setenv("FSDP_GENERATION", gen, 1);
    setenv("FSDP_SUPER_SILENCE_S", silence, 1);
    setenv("FSDP_SUPER_TOKEN", token, 1);
    setenv("FSDP_SUPER_JOB", s->job_id, 1);
    /* the test hooks are the supervisor's to set, never inherited */
    if (s->chaos.hold[0])
        setenv("FSDP_TEST_HOLD_AT", s->chaos.hold, 1);
    else
        unsetenv("FSDP_TEST_HOLD_AT");
    if (s->chaos.stop[0])
        setenv("FSDP_TEST_STOP_AT", s->chaos.stop, 1);
    else
        unsetenv("FSDP_TEST_STOP_AT");
    unsetenv("FSDP_TEST_OVERFLOW_AT"); /* a test's, never a supervised launch's */
    if (s->mpiargs.use_env_list)       /* the user's list, ours appended (mpiargs.c) */
        setenv("OMPI_MCA_mca_base_env_list", s->mpiargs.env_list, 1);
    if (getuid() == 0) { /* Open MPI refuses root without both */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    execvp(argv[0], argv);
    fprintf(stderr, "fsdp-super: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

static int write_hostfile(const char *path, const struct host *hosts, int nh)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (int i = 0; i < nh; i++)
        fprintf(f, "%s slots=%d\n", hosts[i].name, hosts[i].slots);
    return fclose(f);
}

static int launch(struct super *s, int np, const struct host *hosts, int nh)
{
    if (claim_generation(s) || link_launch(&s->link, hosts, nh))
        return -1;
    char hostfile[WORKDIR_LEN + 32], npstr[16];
    snprintf(hostfile, sizeof hostfile, "%s/hostfile-%llu", s->workdir,
             (unsigned long long)s->generation);
    if (write_hostfile(hostfile, hosts, nh)) {
        say("cannot write %s: %s", hostfile, strerror(errno));
        return -1;
    }
    snprintf(npstr, sizeof npstr, "%d", np);
    memcpy(s->launched, hosts, (size_t)nh * sizeof *hosts);
    s->nlaunched = nh;
    chaos_launching(&s->chaos, np);
    mpiargs_build(&s->mpiargs, s->o.hb_timeout, environ);
    char **argv = launch_argv(s, hostfile, npstr);
    if (s->mpiargs.overflow) {
        say("too many variables to carry to every host (OMPI_MCA_mca_base_env_list is limited to "
            "%zu bytes here): not launching",
            sizeof s->mpiargs.user_list - 1);
        free(argv);
        return -1;
    }
    int errpipe[2];
    if (!argv || pipe2(errpipe, O_CLOEXEC)) {
        say("cannot start mpirun: %s", argv ? strerror(errno) : "out of memory");
        free(argv);
        return -1;
    }
    memset(&s->job, 0, sizeof s->job);
    s->job.err_fd = errpipe[0];
    fcntl(errpipe[0], F_SETFL, O_NONBLOCK);
    s->job.generation = s->generation;
    s->job.np = np;
    s->job.launched = fsdp_now();
    pid_t pid = fork();
    if (pid == 0)
        exec_mpirun(s, argv, errpipe[1]);
    free(argv);
    close(errpipe[1]);
    if (pid < 0) {
        say("fork: %s", strerror(errno));
        close(errpipe[0]);
        return -1;
    }
    s->job.mpirun = pid;
    s->job.env = (struct rank_env){
        .session = pid, .state = proc_state, .session_of = proc_session, .signal = kill};
    hbmsg_host_name(s->job.env.host, sizeof s->job.env.host);
    s->launches++;
    s->launch_from = s->last_committed;
    s->running = 1;
    int resized = s->prev_np && s->prev_np != np;
    char left[512] = "";
    for (int i = 0; i < s->nleft; i++) {
        size_t at = strlen(left);
        snprintf(left + at, sizeof left - at, "%s%s", i ? ", " : "; left out: ", s->left[i].name);
    }
    say("launch %d: generation %llu, %d rank%s%s%s", s->launches, (unsigned long long)s->generation,
        np, np > 1 ? "s" : "", resized ? " (resized)" : "", left);
    const struct keepalive *ka = &s->mpiargs.keepalive;
    json_t *keepalive = s->mpiargs.keepalive_set == 3
                            ? json_pack("[i, i, i]", ka->time, ka->intvl, ka->probes)
                            : json_null();
    ev_emit("launch", "{s:i, s:I, s:i, s:i, s:o, s:o, s:o, s:o}", "launch", s->launches,
            "generation", (json_int_t)s->generation, "np", np, "pid", (int)pid, "hosts",
            super_host_names(hosts, nh), "addr", ev_text(s->link.addr), "left_out",
            super_host_names(s->left, s->nleft), "oob_keepalive", keepalive);
    if (resized)
        ev_emit("resize", "{s:i, s:i}", "from", s->prev_np, "to", np);
    s->prev_np = np;
    return 0;
}

/* ---- the restart policy ------------------------------------------------------------- */

static void account_failure(struct super *s)
{
    uint64_t reached = 0;
    for (int r = 0; r < s->job.np; r++)
        if (s->job.ranks[r].step > reached)
            reached = s->job.ranks[r].step;
    if (reached > s->last_committed)
        s->steps_lost += reached - s->last_committed;
    s->fail_at = fsdp_now();
}

static uint64_t reached_step(const struct job *j)
{
    uint64_t reached = 0;
    for (int r = 0; r < j->np; r++)
        if (j->ranks[r].step > reached)
            reached = j->ranks[r].step;
    return reached;
}

/* A rank died but mpirun has not noticed yet: it will, and end the job
 * with its own explanation (and the ranks' last lines) if given the
 * chance; wait for that, at most the grace period, reading its output. */
static void let_mpirun_finish(struct super *s)
{
    double until = fsdp_now() + s->o.grace;
    while (!s->job.exited && s->job.err_fd >= 0 && fsdp_now() < until) {
        struct pollfd p = {.fd = s->job.err_fd, .events = POLLIN};
        poll(&p, 1, 50);
        job_drain_stderr(&s->job);
        reap_children(&s->job);
    }
}

static int teardown(struct super *s, int cause)
{
    s->running = 0; /* the metrics' ranks up: none from here */
    if (cause == C_DIED)
        let_mpirun_finish(s);
    int left = job_teardown(&s->job, s->o.grace);
    job_drain_stderr(&s->job);
    if (s->job.err_fd >= 0) {
        close(s->job.err_fd);
        s->job.err_fd = -1;
    }
    ev_emit("teardown", "{s:I, s:i}", "generation", (json_int_t)s->generation, "left", left);
    if (left)
        say("warning: %d processes of generation %llu survived SIGKILL", left,
            (unsigned long long)s->generation);
    return left;
}

enum { NEXT_LAUNCH, STOP_OK, STOP_FAILED, STOP_REFUSED };

/* 1 when another launcher has claimed the store since this launch (its
 * current generation is newer than ours): the launch was fenced. A store
 * that cannot be read decides nothing. */
static int store_taken(struct super *s, uint64_t *owner)
{
    if (!s->o.ckpt)
        return 0;
    char err[FSDP_ERR_LEN];
    struct storage *st;
    uint64_t cur = 0;
    if (storage_open(s->o.ckpt, &st, err))
        return 0;
    int rc = ckpt_fence_current(st, &cur, err);
    storage_close(st);
    *owner = cur;
    return rc == 0 && cur > s->generation;
}

/* Every rank said it was done, with no preemption under way: 1 when they
 * all finished, or all stopped before --steps (a time limit or
 * --stop-at-step: resumable, nothing to relaunch), said and summed up.
 * 0 when some stopped early: that counts as a preemption (out->cause). */
static int ranks_ended(struct super *s, struct outcome *out, uint64_t reached)
{
    int all_done = 1, all_stopped = s->job.np > 0;
    for (int r = 0; r < s->job.np; r++) {
        all_done &= s->job.ranks[r].phase == HB_DONE;
        all_stopped &= s->job.ranks[r].phase == HB_STOPPED;
    }
    if (all_stopped) {
        s->final_step = reached;
        chaos_launch_ended(&s->chaos, "stopped", &s->job);
        say("the ranks stopped at step %llu before --steps (a time limit or "
            "--stop-at-step), after checkpoint step %llu; the same command continues",
            (unsigned long long)reached, (unsigned long long)s->last_committed);
        ev_emit("stopped", "{s:I}", "step", (json_int_t)reached);
        super_summary(s, "stopped");
        return 1;
    }
    if (all_done || s->job.np == 0) {
        s->final_step = reached;
        chaos_launch_ended(&s->chaos, "finished", &s->job);
        say("training finished at step %llu", (unsigned long long)reached);
        ev_emit("finished", "{s:I}", "step", (json_int_t)reached);
        super_summary(s, "finished");
        return 1;
    }
    snprintf(out->why, sizeof out->why, "the ranks stopped early (preempted by someone else?)");
    out->cause = C_PREEMPT;
    return 0;
}

/* A preemption that ran its course: when fsdp-super itself was signalled
 * the job stops there (resumable); after a notice, or a planned one, it
 * relaunches on what the host file still offers. */
static int end_preempted(struct super *s, const struct outcome *out, uint64_t reached,
                         int preempt_from_signal)
{
    s->final_step = reached;
    if (preempt_from_signal) {
        say("stopped after the emergency checkpoint (step %llu); resumable",
            (unsigned long long)s->last_committed);
        super_summary(s, "preempted");
        return STOP_OK;
    }
    int why = out->planned ? out->planned : C_PREEMPT;
    s->by_cause[why]++;
    ev_emit("restart", "{s:s, s:I}", "cause", super_cause_names[why], "step",
            (json_int_t)s->last_committed);
    chaos_launch_ended(&s->chaos, super_cause_names[why], &s->job);
    s->fail_at = fsdp_now();
    return NEXT_LAUNCH;
}

/* The host file entry of the launch that the failure is blamed on: the
 * host mpirun said lost a rank or daemon, else the host of the rank found
 * dead, silent or stalled, when either is a name of the launch; NULL. */
static const char *failed_host(const struct super *s)
{
    const char *named[2] = {s->job.blamed, s->job.failed};
    for (int k = 0; k < 2; k++)
        for (int i = 0; named[k][0] && i < s->nlaunched; i++)
            if (strcmp(s->launched[i].name, named[k]) == 0)
                return s->launched[i].name;
    return NULL;
}

/* A failure: stop if another launcher has taken the store or after too
 * many restarts in a row; otherwise back off and relaunch. */
static int end_failed(struct super *s, const struct outcome *out, uint64_t reached)
{
    say("generation %llu failed: %s; stopped every process of the job",
        (unsigned long long)s->generation, out->why);
    job_show_hidden_tail(&s->job, s->ev_on);
    uint64_t owner;
    if (store_taken(s, &owner)) { /* relaunching would fence the other launcher in turn */
        say("%s now belongs to generation %llu, claimed by another launcher (a second "
            "fsdp-super or an unsupervised fsdp-train on the same store): this fsdp-super stops "
            "rather than take it back",
            s->o.ckpt, (unsigned long long)owner);
        ev_emit("fenced", "{s:I, s:I}", "generation", (json_int_t)s->generation, "by",
                (json_int_t)owner);
        s->final_step = reached;
        super_summary(s, "fenced");
        return STOP_FAILED;
    }
    if (s->job.refused) { /* the same command is refused the same way: nothing to heal */
        say("the trainer refused to run (its line is above): a relaunch would be refused "
            "again, so there is none; fix the command or pass its --allow-changed");
        ev_emit("give_up", "{s:i, s:s}", "restarts", s->restarts.failures, "why", "refused");
        s->final_step = reached;
        super_summary(s, "refused");
        return STOP_REFUSED;
    }
    account_failure(s);
    s->by_cause[out->cause]++;
    int recurs;
    double wait = super_restart_decide(&s->restarts, out->cause, s->launch_from, reached,
                                       s->o.backoff, s->o.max_restarts, &recurs);
    const char *host = failed_host(s);
    int aside = super_blame_host(&s->restarts, host) && super_set_aside(s, host);
    if (aside && s->o.max_restarts > 0) { /* the relaunch is without it: nothing recurs there */
        wait = 0;
        s->restarts.in_a_row = 0;
    }
    if (wait < 0) {
        chaos_launch_ended(&s->chaos, super_cause_names[out->cause], &s->job);
        if (s->o.max_restarts == 0)
            say("no relaunch (--max-restarts 0)");
        else
            say("giving up after %d failures in a row that recurred (none trained past the "
                "failure before)",
                s->restarts.in_a_row);
        ev_emit("give_up", "{s:i}", "restarts", s->o.max_restarts);
        s->final_step = reached;
        super_summary(s, "gave up");
        return STOP_FAILED;
    }
    if (recurs)
        say("the failure recurred (launch from step %llu reached step %llu): relaunch in %.1f s",
            (unsigned long long)s->launch_from, (unsigned long long)reached, wait);
    ev_emit("restart", "{s:s, s:o, s:f, s:b}", "cause", super_cause_names[out->cause], "why",
            ev_text(out->why), "backoff_s", wait, "recurring", recurs);
    chaos_launch_ended(&s->chaos, super_cause_names[out->cause], &s->job);
    super_nap_rendering(s, wait);
    return NEXT_LAUNCH;
}

/* After a launch: finished, relaunch, or give up. */
static int end_launch(struct super *s, struct outcome *out, int preempt_from_signal)
{
    uint64_t reached = reached_step(&s->job);
    teardown(s, out->cause);
    if (out->done && !out->preempting && ranks_ended(s, out, reached))
        return STOP_OK;
    if (out->preempting && (out->done || out->cause == C_PREEMPT))
        return end_preempted(s, out, reached, preempt_from_signal);
    return end_failed(s, out, reached);
}

/* ---- set-up ------------------------------------------------------------------------- */

/* The store's address, the same whatever the working directory and
 * whether the store exists yet: a path's directory made absolute and
 * resolved (when it exists) and its last name; an S3 address with its
 * endpoint. */
static void store_address(const char *uri, char *out, size_t n)
{
    if (strncmp(uri, "s3://", 5) == 0) {
        const char *ep = getenv("AWS_ENDPOINT_URL");
        snprintf(out, n, "%s %s", uri, ep ? ep : "");
        return;
    }
    char path[PATH_MAX], dir[PATH_MAX], cwd[PATH_MAX] = "";
    snprintf(path, sizeof path, "%s", strncmp(uri, "file://", 7) == 0 ? uri + 7 : uri);
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        path[--len] = 0;
    char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if (slash) {
        *slash = 0;
        snprintf(dir, sizeof dir, "%s", path);
    } else
        snprintf(dir, sizeof dir, ".");
    char resolved[PATH_MAX];
    if (realpath(dir, resolved))
        snprintf(out, n, "file://%s/%s", strcmp(resolved, "/") ? resolved : "", base);
    else if (dir[0] != '/' && getcwd(cwd, sizeof cwd))
        snprintf(out, n, "file://%s/%s/%s", cwd, dir, base);
    else
        snprintf(out, n, "file://%s/%s", dir, base);
}

/* The job's id, in every rank's environment (FSDP_SUPER_JOB): with --ckpt
 * a digest of the store's address (store_address), so that a new
 * fsdp-super taking over the job recognises the ranks of the one it
 * replaces, and two jobs on two stores never share an id; else random. */
static int job_id(struct super *s)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (s->o.ckpt) {
        static const char salt[] = "fsdp-super job\n";
        char addr[2 * PATH_MAX + 64];
        store_address(s->o.ckpt, addr, sizeof addr);
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
                 EVP_DigestUpdate(ctx, salt, sizeof salt - 1) &&
                 EVP_DigestUpdate(ctx, addr, strlen(addr)) && EVP_DigestFinal_ex(ctx, d, &n);
        EVP_MD_CTX_free(ctx);
        if (!ok) {
            errno = EIO;
            return -1;
        }
    } else if (getrandom(d, 16, 0) != 16) {
        return -1;
    }
    fsdp_hex(d, 16, s->job_id);
    return 0;
}

/* Everything that can be refused before the first launch, with one line:
 * 2 for a SPEC that cannot be used (like any bad option), 1 otherwise. */
static int set_up(struct super *s)
{
    char err[FSDP_ERR_LEN];
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    if (s->o.hosts &&
        super_read_hosts(s->o.hosts, h, SUPER_MAX_HOSTS, &nh, &total, err, sizeof err)) {
        say("%s", err);
        return 1;
    }
    if (s->o.hosts)
        super_host_file_good(s, h, nh, total);
    if (chaos_init(&s->chaos, s->o.chaos, &s->o, err, sizeof err)) {
        say("%s", err);
        return 2;
    }
    if (agent_init(&s->agent, getenv("OMPI_MCA_plm_rsh_agent"), getenv("OMPI_MCA_plm_rsh_args"),
                   err, sizeof err)) {
        say("%s", err);
        return 1;
    }
    if (job_id(s)) {
        say("cannot make a job id: %s", strerror(errno));
        return 1;
    }
    agent_probe_clears(&s->agent, s->job_id);
    if (net_listen(&s->link.net, s->o.listen, err, sizeof err)) {
        say("%s", err);
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(s->workdir, sizeof s->workdir, "%s/fsdp-super-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(s->workdir)) {
        say("cannot make a work directory %s: %s", s->workdir, strerror(errno));
        s->workdir[0] = 0;
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static struct super s;
    int rc = super_parse(&s.o, argc, argv);
    if (rc)
        return rc > 0 ? 0 : 2;
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    s.ev_on = ev_open(s.o.events);
    if (s.o.metrics) {
        char merr[FSDP_ERR_LEN];
        if (!(s.metrics = metrics_start(s.o.metrics, merr, sizeof merr))) {
            fprintf(stderr, "fsdp-super: %s\n", merr);
            ev_close();
            return 2;
        }
    }
    if ((rc = set_up(&s)) != 0)
        goto out;
    s.start = fsdp_now();
    ev_emit("start", "{s:i, s:s, s:b, s:i, s:i, s:f}", "heartbeat_port", s.link.net.port, "family",
            s.link.net.family == AF_INET6 ? "ipv6" : "ipv4", "every_interface", s.link.net.wildcard,
            "np", s.o.np, "min_np", s.o.min_np, "rank_silence_s", s.o.rank_silence);
    int preempt_from_signal = 0;
    struct host hosts[SUPER_MAX_HOSTS];
    int nh;
    for (;;) {
        if (super_got_signal) { /* a preemption or a failure raced with the signal */
            super_summary(&s, "stopped by a signal");
            break;
        }
        int np = super_wait_capacity(&s, hosts, &nh);
        if (np < 0) {
            if (np == -1)
                super_summary(&s, "stopped by a signal while waiting for capacity");
            rc = np == -1 ? 0 : 1;
            break;
        }
        if (launch(&s, np, hosts, nh)) {
            rc = 1;
            break;
        }
        struct outcome o;
        super_watch(&s, &o, &preempt_from_signal);
        int next = end_launch(&s, &o, preempt_from_signal);
        if (next != NEXT_LAUNCH) {
            rc = next == STOP_REFUSED ? 2 : next == STOP_FAILED;
            break;
        }
    }
out:
    ev_close();
    metrics_stop(s.metrics);
    chaos_free(&s.chaos);
    if (s.workdir[0] && remove_tree(s.workdir))
        say("could not remove %s: %s", s.workdir, strerror(errno));
    curl_global_cleanup();
    return rc;
}
