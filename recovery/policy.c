/*
 * policy.c - the restart policy: how long fsdp-super waits before it
 * relaunches a failed job, and when it gives up.
 *
 * Frequent faults are independent of each other (a spot host gone, a rank
 * killed, a link reset): the job trained between them, and every second
 * spent waiting is goodput lost, so such a failure relaunches at once and
 * is not counted against --max-restarts. A failure that recurs is one the
 * job cannot get past: the launch trained no step beyond the one it
 * resumed from (a trainer that cannot start, a store that refuses it), or
 * it failed at the very step, for the same cause, as the failure before
 * (a batch that crashes a rank every time). Only those back off
 * (--restart-backoff, doubling, at most 30 s) and count: after
 * --max-restarts of them in a row fsdp-super gives up. --max-restarts 0
 * never relaunches.
 *
 * A host that fails twice in a row (the two failures blamed on it, no
 * failure elsewhere between them and no stretch of --healthy-after) is
 * set aside: left out of launches for --set-aside seconds (capacity.c),
 * and the relaunch without it goes ahead at once.
 */
#include "super.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int super_failure_recurs(const struct restart_history *h, int cause, uint64_t from,
                         uint64_t reached)
{
    if (reached <= from)
        return 1; /* nothing trained since the launch began */
    return h->failures > 0 && cause == h->cause && reached == h->reached;
}

double super_restart_decide(struct restart_history *h, int cause, uint64_t from, uint64_t reached,
                            double backoff, int max_restarts, int *recurs)
{
    *recurs = super_failure_recurs(h, cause, from, reached);
    h->failures++;
    h->cause = cause;
    h->reached = reached;
    if (max_restarts == 0)
        return -1;
    if (!*recurs) {
        h->in_a_row = 0;
        return 0;
    }
    if (++h->in_a_row > max_restarts)
        return -1;
    double wait = backoff * pow(2, h->in_a_row - 1);
    return wait > 30 ? 30 : wait;
}

int super_blame_host(struct restart_history *h, const char *host)
{
    if (!host || !*host) {
        h->host[0] = 0;
        h->on_host = 0;
        return 0;
    }
    if (h->on_host > 0 && strcmp(h->host, host) == 0) {
        h->on_host++;
    } else {
        snprintf(h->host, sizeof h->host, "%s", host);
        h->on_host = 1;
    }
    if (h->on_host < 2)
        return 0;
    h->on_host = 0; /* set aside: a host that comes back starts a new row */
    return 1;
}
