/*
 * ranks.c - what fsdp-super knows of each rank and how it decides about
 * it, wherever the rank runs.
 *
 * Identity. A rank is (host, pid): its first heartbeat fixes both, and a
 * later heartbeat of the same launch and rank from another host or pid is
 * refused (a pid is only a name on its own host). The rank is local when
 * its host name is this host's and the pid is a process of the job's
 * session here (so another machine that happens to share the name, or a
 * rank in another PID namespace, is never mistaken for a local process).
 *
 * Verdicts. Only for a local rank does /proc say anything: a pid that is
 * gone, reaped or out of the session is a death at once, and a silent one
 * is reported with its state letter ('T': stopped). A remote rank's death,
 * its host's loss and a partition all look the same from here: silence for
 * longer than --heartbeat-timeout (or mpirun's exit, when its daemon
 * notices first). A hang is a progress counter frozen that long, anywhere.
 *
 * Orders. Preemption and chaos faults travel in the supervisor's answers
 * (hbmsg.h's fsdp-ctl, sealed with the launch's secret), which the rank
 * carries out on itself; a local rank is also signalled with kill(), after
 * checking that its pid is still in the job's session. No pid from a
 * datagram of another host is ever given to kill().
 */
#include "super.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

/* ---- identity -------------------------------------------------------------------- */

int rank_admit(struct rank_state *rs, const struct rank_env *e, const struct hbmsg *m)
{
    if (rs->seen && strcmp(rs->host, m->host) != 0)
        return ADMIT_CONFLICT; /* events carry the host; heartbeats the pid too */
    if (m->kind == HBMSG_BEAT && rs->seen && rs->pid != m->pid)
        return ADMIT_CONFLICT;
    if (!hbmsg_window_accept(&rs->win, m->seq))
        return ADMIT_REPLAY;
    if (m->kind == HBMSG_BEAT && !rs->seen) {
        snprintf(rs->host, sizeof rs->host, "%s", m->host);
        rs->pid = m->pid;
        rs->local =
            strcmp(m->host, e->host) == 0 && e->session > 0 && e->session_of(m->pid) == e->session;
    }
    return ADMIT_OK;
}

/* ---- verdicts ---------------------------------------------------------------------- */

int rank_verdict(const struct rank_state *rs, const struct rank_env *e, int pass, double now,
                 double timeout, char *state)
{
    *state = '?';
    if (!rs->seen || rs->phase == HB_DONE || rs->phase == HB_PREEMPTED || rs->phase == HB_STOPPED)
        return RV_OK;
    if (rs->local) {
        char st = e->state(rs->pid);
        *state = st ? st : '?';
        if (pass == 0 &&
            (st == 0 || st == 'Z' || st == 'X' || e->session_of(rs->pid) != e->session))
            return RV_DIED;
    }
    if (pass == 1 && now - rs->last_seen > timeout)
        return RV_SILENT;
    if (pass == 2 && now - rs->last_change > timeout)
        return RV_STALLED;
    return RV_OK;
}

/* ---- orders -------------------------------------------------------------------------- */

int rank_order(struct rank_state *rs, const struct rank_env *e, enum hb_ctl action)
{
    if (!rs->seen || action <= HBCTL_ACK || action >= HBCTL_N)
        return 0;
    if (action > rs->order)
        rs->order = action;
    rs->order_due = 1;
    if (!rs->local || e->session_of(rs->pid) != e->session)
        return 0;
    int sig = action == HBCTL_PREEMPT ? SIGUSR1 : action == HBCTL_STOP ? SIGSTOP : SIGKILL;
    return e->signal(rs->pid, sig) == 0;
}
