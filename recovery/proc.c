/*
 * proc.c - the process table: finding every process of a job and ending
 * all of them.
 *
 * mpirun is started in a session of its own; Open MPI gives each rank a
 * process group of its own but they all stay in mpirun's session, so the
 * session id names the whole job. The supervisor is a child subreaper
 * (prctl), so ranks orphaned by a dying mpirun are re-parented to it and
 * reaped here instead of lingering as zombies.
 *
 * Also the supervisor's private work directory (made with mkdtemp), removed
 * at the end by a walk of its own rather than a shell.
 */
#include "super.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* fields after the ")" of /proc/PID/stat: state ppid pgrp session ... */
static int read_stat_parent(pid_t pid, char *state, pid_t *sid, pid_t *parent)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    int ppid, pgrp, session;
    char st;
    if (!rp || sscanf(rp + 1, " %c %d %d %d", &st, &ppid, &pgrp, &session) != 4)
        return -1;
    *state = st;
    *sid = session;
    *parent = ppid;
    return 0;
}

static int read_stat(pid_t pid, char *state, pid_t *sid)
{
    pid_t parent;
    return read_stat_parent(pid, state, sid, &parent);
}

char proc_state(pid_t pid)
{
    char st;
    pid_t sid;
    return read_stat(pid, &st, &sid) ? 0 : st;
}

pid_t proc_session(pid_t pid)
{
    char st;
    pid_t sid;
    return read_stat(pid, &st, &sid) ? 0 : sid;
}

int job_pids(pid_t sid, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < max) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char st;
        pid_t s;
        if (read_stat((pid_t)pid, &st, &s) == 0 && s == sid && st != 'Z' && st != 'X')
            out[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

void reap_children(struct job *j)
{
    int st;
    pid_t w;
    while ((w = waitpid(-1, &st, WNOHANG)) > 0) {
        if (j && w == j->mpirun && !j->exited) {
            j->exited = 1;
            j->status = st;
        }
    }
}

static void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void signal_all(pid_t sid, int sig)
{
    pid_t pids[1024];
    int n = job_pids(sid, pids, 1024);
    for (int i = 0; i < n; i++)
        kill(pids[i], sig);
}

/* Processes of session sid that have ended and wait for this process to
 * reap them. */
static int dead_children(pid_t sid)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        char st;
        pid_t s, parent;
        if (!*end && pid > 0 && read_stat_parent((pid_t)pid, &st, &s, &parent) == 0 && s == sid &&
            (st == 'Z' || st == 'X') && parent == getpid())
            n++;
    }
    closedir(d);
    return n;
}

int job_teardown(struct job *j, double grace)
{
    pid_t sid = j->mpirun, pids[1024];
    /* a stopped process would sit on SIGTERM until continued */
    signal_all(sid, SIGCONT);
    signal_all(sid, SIGTERM);
    double until = fsdp_now() + grace;
    while (fsdp_now() < until && job_pids(sid, pids, 1024) > 0) {
        reap_children(j);
        nap(0.05);
    }
    until = fsdp_now() + 20;
    int left;
    while ((left = job_pids(sid, pids, 1024)) > 0 && fsdp_now() < until) {
        signal_all(sid, SIGKILL);
        reap_children(j);
        nap(0.05);
    }
    if (!j->exited) {
        int st;
        if (waitpid(j->mpirun, &st, 0) == j->mpirun) {
            j->exited = 1;
            j->status = st;
        }
    }
    /* the ranks of a dead mpirun are this process's children (the
     * subreaper): each is reaped before the teardown is told, not left a
     * zombie for the next launch's checks (a second at most) */
    until = fsdp_now() + 1;
    do
        reap_children(j);
    while (dead_children(sid) > 0 && fsdp_now() < until && (nap(0.01), 1));
    return left;
}

/* ---- the work directory ------------------------------------------------------ */

static int remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return type == FTW_DP ? rmdir(path) : unlink(path);
}

int remove_tree(const char *path)
{
    /* depth first, never following a link out of the tree, one file system */
    return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}
