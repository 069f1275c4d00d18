/*
 * mpiout.c - mpirun's stderr, line by line.
 *
 * The ranks' lines go through to the terminal (the last few are kept for
 * the chaos checks); Open MPI's own reports (the dashed boxes, "[host:pid]
 * ..." crash dumps of an mpirun whose rank we killed, signal forwarding
 * notes) go to the event log instead. When a launch fails and there is no
 * event log, the last few of those are printed.
 *
 * mpirun's word on a rank or a daemon becomes an event naming the host,
 * since from another host that is often all there is to know:
 *   "mpirun noticed that process rank 1 with PID 77 on node n2 exited on
 *    signal 9 (Killed)."                          -> rank_died, source mpirun
 *   "  Remote daemon: [[41772,0],1] on node n2"   -> daemon_lost
 *   "  Peer host:  n2"                            -> peer_lost
 * (the last from a rank's box "An MPI communication peer process has
 * unexpectedly disconnected": a whole host killed at once often ends the
 * job with only that and "ORTE was unable to reliably start one or more
 * daemons", which names no host.)
 * (Open MPI 4.1 prints "PID 0" in the first: the pid is passed on as said.)
 * Nothing read here is trusted further: numbers are bounded, host names
 * must be the datagrams' grammar.
 */
#include "super.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- what mpirun says about ranks and daemons ----------------------------------------- */

/* Copies a host name of the envelope's grammar that ends at a space or the
 * end of the line (a sentence's full stop dropped). */
static int take_host(const char *p, char *out)
{
    size_t n = 0;
    while (p[n] && p[n] != ' ' && n < HBMSG_HOST_LEN - 1) {
        char c = p[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_'))
            return -1;
        n++;
    }
    if (p[n] && p[n] != ' ') /* longer than a host name */
        return -1;
    if (n > 0 && p[n - 1] == '.')
        n--;
    if (n == 0)
        return -1;
    memcpy(out, p, n);
    out[n] = 0;
    return 0;
}

/* Reads "PREFIX<digits>" at *p: the number (at most max), *p past it. */
static int take_num(const char **p, const char *prefix, uint64_t max, int *out)
{
    size_t pl = strlen(prefix), n = 0;
    if (strncmp(*p, prefix, pl) != 0)
        return -1;
    const char *d = *p + pl;
    while (d[n] >= '0' && d[n] <= '9')
        n++;
    uint64_t v;
    if (hbmsg_parse_uint(d, n, max, &v))
        return -1;
    *out = (int)v;
    *p = d + n;
    return 0;
}

void mpirun_report_parse(const char *line, struct mpirun_report *r)
{
    memset(r, 0, sizeof *r);
    char host[HBMSG_HOST_LEN];
    const char *p = strstr(line, " noticed that process rank ");
    if (p) {
        int rank, pid, sig;
        p += strlen(" noticed that process");
        if (take_num(&p, " rank ", SUPER_MAX_RANKS, &rank) ||
            take_num(&p, " with PID ", INT32_MAX, &pid) || strncmp(p, " on node ", 9) != 0 ||
            take_host(p + 9, host))
            return;
        p = strstr(p + 9, " exited on signal ");
        if (!p || take_num(&p, " exited on signal ", 128, &sig))
            return;
        r->kind = MPIRUN_RANK_SIGNALED;
        r->rank = rank;
        r->pid = pid;
        r->signal = sig;
        snprintf(r->host, sizeof r->host, "%s", host);
        return;
    }
    p = strstr(line, "Remote daemon:");
    const char *on = p ? strstr(p, " on node ") : NULL;
    if (on && take_host(on + 9, host) == 0) {
        r->kind = MPIRUN_DAEMON_LOST;
        snprintf(r->host, sizeof r->host, "%s", host);
        return;
    }
    /* The launch agent's own word (OpenSSH: "Connection to HOST closed by
     * remote host.", mh-rsh the same): the daemon it carried is gone. Open
     * MPI may then say only that it was "unable to reliably start one or
     * more daemons", naming no host, and exit before any heartbeat times
     * out: this line is what names the host. */
    const char *h = NULL;
    if (strncmp(line, "Connection to ", 14) == 0)
        h = line + 14;
    else if ((p = strstr(line, ": connection to ")) || (p = strstr(line, ": Connection to ")))
        h = p + 16;
    if (h) {
        const char *end = strchr(h, ' ');
        if (end && strncmp(end, " closed by remote host", 22) == 0 && take_host(h, host) == 0) {
            r->kind = MPIRUN_DAEMON_LOST;
            snprintf(r->host, sizeof r->host, "%s", host);
        }
        return;
    }
    p = strstr(line, "Peer host:");
    if (p) {
        p += strlen("Peer host:");
        while (*p == ' ')
            p++;
        if (take_host(p, host) == 0) {
            r->kind = MPIRUN_PEER_LOST;
            snprintf(r->host, sizeof r->host, "%s", host);
        }
    }
}

static void mpirun_said(struct job *j, const char *l)
{
    struct mpirun_report r;
    mpirun_report_parse(l, &r);
    if (r.kind != MPIRUN_NOTHING && !j->blamed[0])
        snprintf(j->blamed, sizeof j->blamed, "%s", r.host);
    if (r.kind == MPIRUN_RANK_SIGNALED)
        ev_emit("rank_died", "{s:i, s:s, s:i, s:i, s:s, s:I}", "rank", r.rank, "host", r.host,
                "pid", r.pid, "signal", r.signal, "source", "mpirun", "generation",
                (json_int_t)j->generation);
    else if (r.kind == MPIRUN_DAEMON_LOST)
        ev_emit("daemon_lost", "{s:s, s:I}", "host", r.host, "generation",
                (json_int_t)j->generation);
    else if (r.kind == MPIRUN_PEER_LOST)
        ev_emit("peer_lost", "{s:s, s:I}", "host", r.host, "generation", (json_int_t)j->generation);
}

/* ---- sorting the lines ------------------------------------------------------------------ */

static int mpi_noise(const char *l)
{
    if (strncmp(l, "mpirun: Forwarding signal", 25) == 0)
        return 1;
    if (l[0] != '[')
        return 0;
    const char *close = strchr(l, ']'), *colon = strchr(l, ':');
    return close && colon && colon < close && close - l < 64;
}

static void on_line(struct job *j, char *l)
{
    mpirun_said(j, l);
    int dashes = strncmp(l, "--------------------", 20) == 0;
    if (dashes || j->in_box || mpi_noise(l)) {
        if (dashes)
            j->in_box = !j->in_box;
        j->hidden++;
        if (!dashes && l[0])
            line_tail_add(&j->hidden_tail, l);
        ev_emit("mpirun_output", "{s:I, s:o}", "generation", (json_int_t)j->generation, "line",
                ev_text(l));
        return;
    }
    line_tail_add(&j->rank_tail, l);
    fprintf(stderr, "%s\n", l);
}

void job_drain_stderr(struct job *j)
{
    if (j->err_fd < 0)
        return;
    for (;;) {
        ssize_t n = read(j->err_fd, j->line + j->line_len, sizeof j->line - 1 - j->line_len);
        if (n <= 0) {
            if (n == 0) { /* the job closed it */
                if (j->line_len) {
                    j->line[j->line_len] = 0;
                    on_line(j, j->line);
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
            on_line(j, start);
            start = nl + 1;
        }
        size_t rest = j->line_len - (size_t)(start - j->line);
        memmove(j->line, start, rest);
        j->line_len = rest;
        if (j->line_len == sizeof j->line - 1) { /* a line too long to hold: pass it on */
            j->line[j->line_len] = 0;
            on_line(j, j->line);
            j->line_len = 0;
        }
    }
}

void job_show_hidden_tail(const struct job *j, int ev_on)
{
    if (!j->hidden)
        return;
    if (ev_on) {
        fprintf(stderr,
                "fsdp-super: (%d lines of Open MPI's own output for generation %llu are in the "
                "event log)\n",
                j->hidden, (unsigned long long)j->generation);
        return;
    }
    int n = j->hidden_tail.count, from = n > SUPER_TAIL_LINES ? n - SUPER_TAIL_LINES : 0;
    fprintf(stderr, "fsdp-super: Open MPI said (last %d of %d lines; --events FILE keeps all):\n",
            n - from, j->hidden);
    const char *l;
    for (int i = from; (l = line_tail_get(&j->hidden_tail, i)); i++)
        fprintf(stderr, "  %s\n", l);
}
