/*
 * capacity.c - the capacity of fsdp-super's next launch: the hosts of the
 * host file (--hosts, read again before every launch), less those that do
 * not answer a probe and those with a standing spot notice; fewer than
 * --min-np slots on what is left waits (a waiting_for_capacity event on
 * each change), for at most --capacity-timeout.
 *
 * The host file is read without ever blocking (a FIFO renamed over it
 * would otherwise hang the supervisor in open(), blind to its ranks). One
 * that does not parse counts no capacity until it is fixed (an editor's
 * half-written file, most likely); one that is not a regular file at all
 * is said once (hosts_error) and the last good host list stands.
 *
 * Before each launch every host of the host file that is not this one is
 * probed through the launch agent Open MPI will use (agent.c: `AGENT HOST
 * true`, all at once, bounded by --probe-timeout). A host that does not
 * answer is suspect: a host_suspect event says why, the launch goes ahead
 * on the rest when they offer --min-np slots (else this waits for
 * capacity), and the host is probed again before the next launch. So an
 * unreachable host costs no restart and no generation: mpirun is never
 * started onto it.
 *
 * Per-host spot notices: a --preempt-url with {host} in it is polled for
 * every host of the host file before a launch (and for those of the launch
 * during it: watch.c); a host whose notice stands is left out of launches
 * until the notice is gone.
 *
 * A host that failed twice in a row (policy.c) is set aside: left out of
 * launches for --set-aside seconds, unless the other hosts offer fewer than
 * --min-np slots without it (a host that may fail beats no training).
 */
#include "super_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* ---- capacity --------------------------------------------------------------------- */

void super_host_file_good(struct super *s, const struct host *h, int nh, int total)
{
    memcpy(s->good, h, (size_t)nh * sizeof *h);
    s->ngood = nh;
    s->good_total = total;
    s->hosts_err[0] = 0;
}

int super_host_file(struct super *s, struct host *h, int *nh, int *total, char *err, size_t errlen)
{
    int rc = super_read_hosts(s->o.hosts, h, SUPER_MAX_HOSTS, nh, total, err, errlen);
    if (rc == 0) {
        super_host_file_good(s, h, *nh, *total);
        return 0;
    }
    if (rc != FSDP_NOT_REGULAR)
        return -1;
    /* Not an editor's half-written file, but no host file at all: what
     * was last read stands, and the ranks go on being watched. */
    if (strcmp(err, s->hosts_err) != 0) {
        say("%s; keeping the last good host list (%d host%s, %d slot%s) until it is one again", err,
            s->ngood, s->ngood == 1 ? "" : "s", s->good_total, s->good_total == 1 ? "" : "s");
        ev_emit("hosts_error", "{s:o, s:o}", "error", ev_text(err), "kept",
                super_host_names(s->good, s->ngood));
        snprintf(s->hosts_err, sizeof s->hosts_err, "%s", err);
    }
    memcpy(h, s->good, (size_t)s->ngood * sizeof *h);
    *nh = s->ngood;
    *total = s->good_total;
    return 1;
}

/* The slots on offer; -1 (said once per distinct complaint) when the host
 * file cannot be read or parsed. */
static int capacity(struct super *s, struct host *h, int *nh)
{
    if (!s->o.hosts) {
        snprintf(h[0].name, sizeof h[0].name, "localhost");
        h[0].slots = s->o.np;
        *nh = 1;
        return s->o.np;
    }
    char err[FSDP_ERR_LEN];
    int total;
    if (super_host_file(s, h, nh, &total, err, sizeof err) >= 0)
        return total;
    if (strcmp(err, s->hosts_err) != 0) {
        say("%s; counting no capacity until it is fixed", err);
        ev_emit("hosts_error", "{s:o}", "error", ev_text(err));
        snprintf(s->hosts_err, sizeof s->hosts_err, "%s", err);
    }
    *nh = 0;
    return -1;
}

json_t *super_host_names(const struct host *h, int n)
{
    json_t *names = json_array();
    for (int i = 0; i < n && names; i++)
        json_array_append_new(names, ev_text(h[i].name));
    return names;
}

/* ---- per-host spot notices ----------------------------------------------------------- */

int super_per_host_notices(const struct super *s)
{
    return s->o.preempt_url && strstr(s->o.preempt_url, "{host}");
}

static int noticed_index(const struct super *s, const char *name)
{
    for (int i = 0; i < s->nnoticed; i++)
        if (strcmp(s->noticed[i].name, name) == 0)
            return i;
    return -1;
}

/* Forgets the notices of hosts that have left the host file (a noticed
 * instance usually goes away and never answers a poll again). */
static void forget_gone_notices(struct super *s)
{
    struct host h[SUPER_MAX_HOSTS];
    int nh, total;
    char err[FSDP_ERR_LEN];
    if (!s->o.hosts ||
        super_read_hosts(s->o.hosts, h, SUPER_MAX_HOSTS, &nh, &total, err, sizeof err))
        return;
    for (int i = 0; i < s->nnoticed;) {
        int listed = 0;
        for (int k = 0; k < nh && !listed; k++)
            listed = strcmp(h[k].name, s->noticed[i].name) == 0;
        if (listed)
            i++;
        else
            s->noticed[i] = s->noticed[--s->nnoticed];
    }
}

/* Polls the notice of every host of h at once and updates the standing
 * ones: a notice that appears (or changes its time) is said once and
 * counted in the return value, one that is gone is said too. */
int super_poll_host_notices(struct super *s, const struct host *h, int nh)
{
    static char urls[SUPER_MAX_HOSTS][2048];
    const char *u[SUPER_MAX_HOSTS] = {0};
    int idx[SUPER_MAX_HOSTS], n = 0, found[SUPER_MAX_HOSTS], fresh = 0;
    char when[SUPER_MAX_HOSTS][64];
    for (int i = 0; i < nh && n < SUPER_MAX_HOSTS; i++) {
        if (super_notice_url(s->o.preempt_url, h[i].name, urls[n], sizeof urls[n]))
            continue; /* too long to poll: no notice */
        u[n] = urls[n];
        idx[n++] = i;
    }
    super_poll_notices(u, n, found, when);
    for (int k = 0; k < n; k++) {
        const char *name = h[idx[k]].name;
        int i = noticed_index(s, name);
        if (found[k] < 0)
            continue; /* cannot be told: a standing notice stands */
        if (!found[k]) {
            if (i >= 0) {
                say("host %s: its spot notice is gone; it may be used again", name);
                ev_emit("host_notice_gone", "{s:o}", "host", ev_text(name));
                s->noticed[i] = s->noticed[--s->nnoticed];
            }
            continue;
        }
        if (i >= 0 && strcmp(s->noticed[i].time, when[k]) == 0)
            continue; /* the one already acted on */
        if (i < 0 && s->nnoticed == SUPER_MAX_HOSTS)
            forget_gone_notices(s);
        if (i < 0 && s->nnoticed == SUPER_MAX_HOSTS)
            continue; /* cannot happen: at most SUPER_MAX_HOSTS hosts in the file */
        if (i < 0)
            i = s->nnoticed++;
        snprintf(s->noticed[i].name, sizeof s->noticed[i].name, "%s", name);
        snprintf(s->noticed[i].time, sizeof s->noticed[i].time, "%s", when[k]);
        say("preemption notice for host %s (time %s): it is left out of launches while the "
            "notice stands",
            name, when[k][0] ? when[k] : "not given");
        ev_emit("preemption_notice", "{s:s, s:o, s:o}", "source", "url", "host", ev_text(name),
                "time", ev_text(when[k]));
        fresh++;
    }
    return fresh;
}

/* Moves the hosts of h whose notice stands to left; returns the slots kept. */
static int leave_out_noticed(struct super *s, struct host *h, int *nh, struct host *left,
                             int *nleft)
{
    forget_gone_notices(s);
    super_poll_host_notices(s, h, *nh);
    int m = 0, slots = 0;
    for (int i = 0; i < *nh; i++) {
        if (noticed_index(s, h[i].name) >= 0 && *nleft < SUPER_MAX_HOSTS) {
            left[(*nleft)++] = h[i];
            continue;
        }
        h[m++] = h[i];
        slots += h[i].slots;
    }
    *nh = m;
    return slots;
}

/* ---- hosts set aside ------------------------------------------------------------------- */

int super_set_aside(struct super *s, const char *name)
{
    if (!s->o.hosts || s->o.set_aside <= 0 || !name || !*name)
        return 0;
    const char *entry = NULL;
    for (int i = 0; i < s->nlaunched && !entry; i++)
        if (strcmp(s->launched[i].name, name) == 0)
            entry = s->launched[i].name;
    if (!entry)
        return 0; /* not a name of the host file's: nothing to leave out */
    int i = 0;
    while (i < s->naside && strcmp(s->aside[i].name, entry) != 0)
        i++;
    if (i == SUPER_MAX_HOSTS)
        return 0; /* cannot happen: at most SUPER_MAX_HOSTS hosts in a launch */
    if (i == s->naside)
        s->naside++;
    snprintf(s->aside[i].name, sizeof s->aside[i].name, "%s", entry);
    s->aside[i].until = fsdp_now() + s->o.set_aside;
    say("host %s failed twice in a row: set aside for %.0f s (--set-aside)", entry, s->o.set_aside);
    ev_emit("host_set_aside", "{s:o, s:f}", "host", ev_text(entry), "for_s", s->o.set_aside);
    return 1;
}

static int aside_index(const struct super *s, const char *name)
{
    for (int i = 0; i < s->naside; i++)
        if (strcmp(s->aside[i].name, name) == 0)
            return i;
    return -1;
}

/* Moves the hosts of h that are set aside to left, unless the others
 * offer fewer than --min-np slots (then they are used, said); those whose
 * time is over are said and forgotten. Returns the slots kept of the cap
 * slots on offer. */
static int leave_out_aside(struct super *s, struct host *h, int *nh, struct host *left, int *nleft,
                           int cap)
{
    double now = fsdp_now();
    for (int i = 0; i < s->naside;) {
        if (now < s->aside[i].until) {
            i++;
            continue;
        }
        say("host %s: its time set aside is over; it may be used again", s->aside[i].name);
        ev_emit("host_set_aside_over", "{s:o}", "host", ev_text(s->aside[i].name));
        s->aside[i] = s->aside[--s->naside];
    }
    int aside_slots = 0;
    for (int i = 0; i < *nh; i++)
        aside_slots += aside_index(s, h[i].name) >= 0 ? h[i].slots : 0;
    if (!aside_slots)
        return cap;
    if (cap - aside_slots < s->o.min_np) {
        say("the hosts set aside are used: the others offer %d slot%s, fewer than --min-np %d",
            cap - aside_slots, cap - aside_slots == 1 ? "" : "s", s->o.min_np);
        return cap;
    }
    int m = 0;
    for (int i = 0; i < *nh; i++) {
        if (aside_index(s, h[i].name) >= 0 && *nleft < SUPER_MAX_HOSTS)
            left[(*nleft)++] = h[i];
        else
            h[m++] = h[i];
    }
    *nh = m;
    return cap - aside_slots;
}

/* Waits until the hosts of the host file that answer a probe (all of them
 * when there is none: this host) offer at least --min-np slots; returns the
 * world size to launch with those hosts in h, the others in s->left; -1 if
 * a signal arrived meanwhile, -2 after --capacity-timeout. */
int super_wait_capacity(struct super *s, struct host *h, int *nh)
{
    int said_cap = -1, said_offered = -1;
    double until = fsdp_now() + s->o.capacity_timeout;
    for (;;) {
        int offered = capacity(s, h, nh), cap = offered;
        s->nleft = 0;
        if (s->o.hosts && offered >= s->o.min_np)
            cap = hosts_reachable(&s->suspects, &s->agent, s->o.probe_timeout, h, nh, s->left,
                                  &s->nleft);
        if (s->o.hosts && cap >= s->o.min_np && super_per_host_notices(s))
            cap = leave_out_noticed(s, h, nh, s->left, &s->nleft);
        if (s->o.hosts && cap >= s->o.min_np && s->naside)
            cap = leave_out_aside(s, h, nh, s->left, &s->nleft, cap);
        int np = s->o.np && s->o.np < cap ? s->o.np : cap;
        if (np >= s->o.min_np)
            return np;
        cap = cap < 0 ? 0 : cap;
        offered = offered < 0 ? 0 : offered;
        if (cap != said_cap || offered != said_offered) {
            if (cap < offered)
                say("waiting for capacity: %s offers %d slot%s, %d of them on hosts that answer, "
                    "at least %d needed",
                    s->o.hosts, offered, offered == 1 ? "" : "s", cap, s->o.min_np);
            else
                say("waiting for capacity: %s offers %d slot%s, at least %d needed", s->o.hosts,
                    cap, cap == 1 ? "" : "s", s->o.min_np);
            ev_emit("waiting_for_capacity", "{s:i, s:i, s:i, s:o}", "slots", cap, "offered",
                    offered, "min_np", s->o.min_np, "suspect", super_host_names(s->left, s->nleft));
            said_cap = cap;
            said_offered = offered;
        }
        if (super_got_signal)
            return -1;
        if (fsdp_now() >= until) {
            say("no capacity: %s offered %d of the %d slots needed for %.0f s "
                "(--capacity-timeout); giving up",
                s->o.hosts, cap, s->o.min_np, s->o.capacity_timeout);
            ev_emit("capacity_timeout", "{s:i, s:i, s:f}", "slots", cap, "min_np", s->o.min_np,
                    "waited_s", s->o.capacity_timeout);
            return -2;
        }
        /* a round of probes is not repeated at once */
        super_nap_rendering(s, s->nleft ? 1.0 : 0.2);
    }
}
