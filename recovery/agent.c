/*
 * agent.c - the launch agent Open MPI uses to reach other hosts, and the
 * probe of every host through it before a launch.
 *
 * Open MPI starts its daemons on other hosts with a launch agent: ssh, or
 * the plm_rsh_agent MCA parameter (OMPI_MCA_plm_rsh_agent in the
 * environment: "A : B" alternatives, the first whose command is found on
 * PATH, each a command with words of its own), followed by the words of
 * plm_rsh_args. One host the agent cannot reach fails the whole mpirun
 * (exit 255 after the agent's connect timeout, nothing started anywhere),
 * and launching onto it again fails the same way: each try would burn a
 * restart and a generation. So before each launch fsdp-super runs
 * `AGENT [ARGS] HOST true` for every host of the host file that is not
 * this one, all at once, each in a process group of its own and bounded:
 * ssh gets -o ConnectTimeout=N -o BatchMode=yes (no prompt can stall it),
 * and whatever the agent is, it is killed with its group N + 1 s after it
 * started. A host whose probe does not exit 0 is suspect: left out of this
 * launch (an event names it and says why: the agent's exit and its first
 * line on stderr, or no answer in time) and probed again before the next
 * one. Hosts that are this one (net.c) are not probed: Open MPI starts no
 * agent for them.
 *
 * The probe also clears the host of this job's earlier launches
 * (agent_probe_clears): a rank that outlived its launch there - its
 * daemon killed before it could kill it, or the rank frozen while mpirun
 * went away - would share the host's cores (a GPU's memory) with the next
 * launch and could still act. Each launch gives its ranks FSDP_SUPER_JOB
 * (a job id: a digest of the checkpoint store's address, so a new
 * fsdp-super that takes over the job clears the old one's ranks too); the
 * probe's POSIX shell command SIGKILLs every process whose environment
 * holds it, waits about 1 s until none is left, says how many it killed,
 * and fails (the host is suspect) when some would not die. What Open MPI
 * can tear down it still tears down first; this is the confirmation.
 *
 * The probe is the agent's own answer, so it is as good as Open MPI's
 * view of the host at that moment and no better: a host that answers can
 * still fail to start a daemon a second later (a failed launch then, as
 * without the probe). The probes get fsdp-super's environment, in which
 * the launch's secret never is (it exists only in mpirun's).
 */
#include "super.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- which agent ------------------------------------------------------------------ */

/* Appends the blank-separated words of s to a's words. */
static int add_words(struct agent *a, size_t *used, const char *s, char *err, size_t errlen)
{
    while (*s) {
        while (*s == ' ' || *s == '\t')
            s++;
        size_t n = strcspn(s, " \t");
        if (!n)
            break;
        if (a->nwords >= AGENT_MAX_WORDS || *used + n + 1 > sizeof a->text) {
            snprintf(err, errlen, "the launch agent's command line is too long (at most %d words)",
                     AGENT_MAX_WORDS);
            return -1;
        }
        a->word[a->nwords++] = a->text + *used;
        memcpy(a->text + *used, s, n);
        a->text[*used + n] = 0;
        *used += n + 1;
        s += n;
    }
    return 0;
}

/* 1 if the command would be found: a path that can be run, or a name on PATH. */
static int runnable(const char *cmd, size_t n)
{
    char path[4096];
    if (memchr(cmd, '/', n)) {
        snprintf(path, sizeof path, "%.*s", (int)n, cmd);
        return access(path, X_OK) == 0;
    }
    const char *p = getenv("PATH");
    while (p && *p) {
        size_t d = strcspn(p, ":");
        snprintf(path, sizeof path, "%.*s/%.*s", (int)d, d ? p : ".", (int)n, cmd);
        if (access(path, X_OK) == 0)
            return 1;
        p += d + (p[d] == ':');
    }
    return 0;
}

/* The alternative at p (up to ':' or the end): its length, and in *cmd and
 * *cmd_len its first word. */
static size_t alternative(const char *p, const char **cmd, size_t *cmd_len)
{
    size_t n = strcspn(p, ":");
    const char *w = p;
    while (w < p + n && (*w == ' ' || *w == '\t'))
        w++;
    *cmd = w;
    *cmd_len = strcspn(w, " \t:");
    return n;
}

int agent_init(struct agent *a, const char *agent, const char *args, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    if (!agent || !*agent)
        agent = "ssh";
    /* as Open MPI picks: the first alternative whose command is found; when
     * none is, the first (its probes then say that it cannot be run) */
    const char *pick = NULL, *first = NULL;
    size_t pick_len = 0, first_len = 0;
    for (const char *p = agent; *p && !pick;) {
        const char *cmd;
        size_t cmd_len, n = alternative(p, &cmd, &cmd_len);
        if (cmd_len && !first) {
            first = cmd;
            first_len = (size_t)(p + n - cmd);
        }
        if (cmd_len && runnable(cmd, cmd_len)) {
            pick = cmd;
            pick_len = (size_t)(p + n - cmd);
        }
        p += n + (p[n] == ':');
    }
    if (!pick) {
        pick = first;
        pick_len = first_len;
    }
    char one[AGENT_TEXT_LEN];
    if (!pick || pick_len >= sizeof one) {
        snprintf(err, errlen, "the launch agent '%s' names no command", agent);
        return -1;
    }
    memcpy(one, pick, pick_len);
    one[pick_len] = 0;
    size_t used = 0;
    if (add_words(a, &used, one, err, errlen) || add_words(a, &used, args ? args : "", err, errlen))
        return -1;
    const char *base = strrchr(a->word[0], '/');
    a->is_ssh = strcmp(base ? base + 1 : a->word[0], "ssh") == 0;
    return 0;
}

/* ---- one round of probes ------------------------------------------------------------ */

struct probe_run {
    pid_t pid; /* 0 once reaped */
    int fd;    /* its stderr, -1 once closed */
    char err[256];
    size_t len;
    int status, killed;
};

/* In the child: stdin and stdout /dev/null, stderr the pipe, a process
 * group of its own (so that a kill reaches whatever the agent started). */
static void exec_probe(char **argv, int errfd)
{
    setpgid(0, 0);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
    }
    dup2(errfd, 2);
    execvp(argv[0], argv);
    dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

static void read_err(struct probe_run *r)
{
    while (r->fd >= 0) {
        char buf[512];
        ssize_t n = read(r->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0 || errno != EAGAIN) {
                close(r->fd);
                r->fd = -1;
            }
            return;
        }
        size_t room = sizeof r->err - 1 - r->len, k = (size_t)n < room ? (size_t)n : room;
        memcpy(r->err + r->len, buf, k);
        r->len += k;
        r->err[r->len] = 0;
    }
}

/* The first line of what the agent wrote that is not blank, printable. */
static void first_line(const char *s, char *out, size_t n)
{
    while (*s == '\n' || *s == '\r' || *s == ' ')
        s++;
    size_t k = 0;
    for (; s[k] && s[k] != '\n' && s[k] != '\r' && k + 1 < n; k++)
        out[k] = (unsigned char)s[k] < 0x20 || (unsigned char)s[k] >= 0x7f ? '?' : s[k];
    out[k] = 0;
}

void agent_probe_clears(struct agent *a, const char *job)
{
    /* One grep over every process's environment per round (a process per
     * process would take seconds on a busy host), the pids cut from the
     * file names it lists. The whole line goes to /bin/sh in single quotes
     * (the login shell may be csh or fish; the line has no single quote
     * and the job id is hex). Rounds: the kill, then up to 10 checks 0.1 s
     * apart (about 1 s in all), well inside the probe's bound. */
    char find[160];
    snprintf(find, sizeof find, "grep -lsxzF FSDP_SUPER_JOB=%s /proc/[0-9]*/environ", job);
    snprintf(a->probe, sizeof a->probe,
             "exec /bin/sh -c 'n=0; for f in $(%s); do p=${f#/proc/}; "
             "kill -9 ${p%%/environ} 2>/dev/null && n=$((n+1)); done; "
             "for t in 1 2 3 4 5 6 7 8 9 10; do [ -z \"$(%s)\" ] && "
             "{ echo fsdp-cleaned $n >&2; exit 0; }; sleep 0.1; done; "
             "echo processes of an earlier launch of this job would not die: $(%s) >&2; exit 1'",
             find, find, find);
}

static void verdict(const struct agent *a, const struct probe_run *r, int bound, struct probe *out)
{
    char line[160];
    first_line(r->err, line, sizeof line);
    int code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
    out->ok = !r->killed && code == 0;
    out->cleaned = 0;
    const char *said = strstr(r->err, "fsdp-cleaned "); /* after any warning of the agent's */
    if (out->ok && said)
        out->cleaned = atoi(said + 13);
    if (out->ok)
        out->why[0] = 0;
    else if (r->killed)
        snprintf(out->why, sizeof out->why, "no answer through %s within %d s", a->word[0], bound);
    else if (code >= 0)
        snprintf(out->why, sizeof out->why, "%s exited %d%s%s", a->word[0], code,
                 line[0] ? ": " : "", line);
    else
        snprintf(out->why, sizeof out->why, "%s died by signal %d", a->word[0],
                 WTERMSIG(r->status));
}

/* The agent's command line with a slot for the host name, whose index is
 * returned: the agent's words, ssh's options (connect, "ConnectTimeout=N"),
 * the host, the probe command. */
static int probe_argv(const struct agent *a, char *connect, char **argv)
{
    int k = 0;
    for (int w = 0; w < a->nwords; w++)
        argv[k++] = a->word[w];
    if (a->is_ssh) {
        argv[k++] = "-o";
        argv[k++] = connect;
        argv[k++] = "-o";
        argv[k++] = "BatchMode=yes";
    }
    int host_at = k++;
    argv[k++] = a->probe[0] ? (char *)a->probe : "true";
    argv[k] = NULL;
    return host_at;
}

/* Starts one probe, its stderr on a non-blocking pipe; a failure to start
 * it is its verdict (r->pid stays 0). */
static void probe_start(char **argv, struct probe_run *r, struct probe *out)
{
    *r = (struct probe_run){.fd = -1};
    *out = (struct probe){0};
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC)) {
        snprintf(out->why, sizeof out->why, "cannot probe: pipe: %s", strerror(errno));
        return;
    }
    r->pid = fork();
    if (r->pid == 0)
        exec_probe(argv, pfd[1]);
    close(pfd[1]);
    if (r->pid < 0) {
        snprintf(out->why, sizeof out->why, "cannot probe: fork: %s", strerror(errno));
        r->pid = 0;
        close(pfd[0]);
        return;
    }
    setpgid(r->pid, r->pid); /* also here: the kill may come before the child ran */
    r->fd = pfd[0];
    fcntl(r->fd, F_SETFL, O_NONBLOCK);
}

/* Gives each probe that has ended its verdict, and puts the pipes of those
 * still running into p (*np of them); returns how many still run. */
static int probe_reap(const struct agent *a, struct probe_run *run, int n, int bound, double start,
                      struct probe *out, struct pollfd *p, int *np)
{
    int running = 0;
    *np = 0;
    for (int i = 0; i < n; i++) {
        struct probe_run *r = &run[i];
        if (r->pid && waitpid(r->pid, &r->status, WNOHANG) == r->pid) {
            read_err(r); /* what it wrote before it ended */
            r->pid = 0;
            out[i].took = fsdp_now() - start;
            verdict(a, r, bound, &out[i]);
            if (r->fd >= 0) { /* something it started still holds the pipe */
                close(r->fd);
                r->fd = -1;
            }
        }
        running += r->pid != 0;
        if (r->pid && r->fd >= 0)
            p[(*np)++] = (struct pollfd){.fd = r->fd, .events = POLLIN};
    }
    return running;
}

/* Past the bound: kills every probe still running, with whatever its
 * agent started, and gives it its verdict. */
static void probe_kill_all(const struct agent *a, struct probe_run *run, int n, int bound,
                           double start, struct probe *out)
{
    for (int i = 0; i < n; i++) {
        struct probe_run *r = &run[i];
        if (!r->pid)
            continue;
        kill(-r->pid, SIGKILL);
        kill(r->pid, SIGKILL);
        waitpid(r->pid, &r->status, 0);
        read_err(r);
        if (r->fd >= 0)
            close(r->fd);
        r->pid = 0;
        r->killed = 1;
        out[i].took = fsdp_now() - start;
        verdict(a, r, bound, &out[i]);
    }
}

void agent_probe(const struct agent *a, const char *const *names, int n, double timeout,
                 struct probe *out)
{
    int bound = timeout < 1 ? 1 : (int)(timeout + 0.999); /* ssh takes whole seconds */
    char connect[48];
    snprintf(connect, sizeof connect, "ConnectTimeout=%d", bound);
    char *argv[AGENT_MAX_WORDS + 8];
    int host_at = probe_argv(a, connect, argv);

    struct probe_run run[SUPER_MAX_HOSTS];
    n = n > SUPER_MAX_HOSTS ? SUPER_MAX_HOSTS : n;
    double start = fsdp_now(), kill_at = start + bound + 1;
    for (int i = 0; i < n; i++) {
        argv[host_at] = (char *)names[i];
        probe_start(argv, &run[i], &out[i]);
    }
    for (;;) {
        struct pollfd p[SUPER_MAX_HOSTS];
        int np;
        if (!probe_reap(a, run, n, bound, start, out, p, &np))
            break;
        double now = fsdp_now();
        if (now >= kill_at) {
            probe_kill_all(a, run, n, bound, start, out);
            break;
        }
        int wait_ms = (int)((kill_at - now) * 1000) + 1;
        poll(p, (nfds_t)np, wait_ms < 20 ? wait_ms : 20); /* an exit closes no pipe: poll short */
        for (int i = 0; i < n; i++)
            if (run[i].pid)
                read_err(&run[i]);
    }
}

/* ---- suspects ------------------------------------------------------------------------ */

static int suspect_index(const struct suspects *sp, const char *name)
{
    for (int i = 0; i < sp->n; i++)
        if (strcmp(sp->host[i].name, name) == 0)
            return i;
    return -1;
}

/* Notes how a host's probe went: an event when it becomes suspect (or its
 * reason changes), and when a suspect host answers again. */
static void note(struct suspects *sp, const char *name, const struct probe *p)
{
    int i = suspect_index(sp, name);
    if (p->ok && p->cleaned > 0) {
        fprintf(stderr, "fsdp-super: host %s: killed %d process%s of an earlier launch\n", name,
                p->cleaned, p->cleaned == 1 ? "" : "es");
        ev_emit("host_cleaned", "{s:o, s:i}", "host", ev_text(name), "killed", p->cleaned);
    }
    if (p->ok) {
        if (i < 0)
            return;
        fprintf(stderr, "fsdp-super: host %s answers again through the launch agent\n", name);
        ev_emit("host_answers", "{s:o, s:f}", "host", ev_text(name), "probe_s", p->took);
        sp->host[i] = sp->host[--sp->n];
        return;
    }
    if (i >= 0 && strcmp(sp->host[i].why, p->why) == 0)
        return;
    if (i < 0) {
        if (sp->n >= SUPER_MAX_HOSTS)
            return;
        i = sp->n++;
        snprintf(sp->host[i].name, sizeof sp->host[i].name, "%s", name);
    }
    snprintf(sp->host[i].why, sizeof sp->host[i].why, "%s", p->why);
    fprintf(stderr, "fsdp-super: host %s is suspect (%s); left out until it answers\n", name,
            p->why);
    ev_emit("host_suspect", "{s:o, s:o, s:f}", "host", ev_text(name), "why", ev_text(p->why),
            "probe_s", p->took);
}

int hosts_reachable(struct suspects *sp, const struct agent *a, double timeout, struct host *h,
                    int *nh, struct host *left, int *nleft)
{
    const char *names[SUPER_MAX_HOSTS];
    int idx[SUPER_MAX_HOSTS], keep[SUPER_MAX_HOSTS], n = 0;
    for (int i = 0; i < *nh; i++) {
        keep[i] = 1;
        if (timeout > 0 && !net_host_is_local(h[i].name)) {
            idx[n] = i;
            names[n++] = h[i].name;
        }
    }
    if (n) {
        struct probe res[SUPER_MAX_HOSTS];
        agent_probe(a, names, n, timeout, res);
        for (int k = 0; k < n; k++) {
            note(sp, names[k], &res[k]);
            keep[idx[k]] = res[k].ok;
        }
    }
    int m = 0, slots = 0;
    *nleft = 0;
    for (int i = 0; i < *nh; i++) {
        if (!keep[i]) {
            left[(*nleft)++] = h[i];
            continue;
        }
        h[m++] = h[i];
        slots += h[i].slots;
    }
    *nh = m;
    return slots;
}
