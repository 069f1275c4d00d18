/*
 * chaos.c - faults on a schedule, for the chaos suite.
 *
 * SPEC: comma-separated, e.g. "seed=7,kill=10,stop=10,preempt=10,storage=10,
 * commit=10,hosts=6,interval=2-5":
 *   kill=N      SIGKILL of a random rank
 *   stop=N      SIGSTOP of a random rank (found by the heartbeat timeout)
 *   preempt=N   a preemption notice: emergency checkpoint, relaunch
 *   storage=N   the next launch's checkpoint store fails a write (EIO)
 *   commit=N    the next launch is killed while rank 0 commits a checkpoint
 *   hosts=N     the host file shrinks (a rank's host is lost) or grows (the
 *               job is restarted to use it), between --min-np and --np
 *   interval=A-B  seconds of healthy training between faults
 *   seed=S
 * The faults are shuffled with the seed; each one is injected after the
 * job has trained for a random time in the interval since its launch.
 */
#include "chaos.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_names[K_NKINDS] = {"kill", "stop", "preempt", "storage", "commit",
                                           "hosts"};

static uint64_t next_rand(struct chaos *c)
{
    c->rng += 0x9e3779b97f4a7c15ULL;
    uint64_t x = c->rng;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static double uniform(struct chaos *c) { return (double)(next_rand(c) >> 11) * 0x1p-53; }

int chaos_init(struct chaos *c, const char *spec, const struct super_opts *o)
{
    memset(c, 0, sizeof *c);
    c->o = o;
    c->lo = 2;
    c->hi = 5;
    c->rng = 1;
    c->capacity = o->np;
    if (!spec)
        return 0;
    int counts[K_NKINDS] = {0};
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            goto bad;
        *eq = 0;
        const char *v = eq + 1;
        int k;
        for (k = 0; k < K_NKINDS && strcmp(tok, kind_names[k]) != 0; k++)
            ;
        if (k < K_NKINDS)
            counts[k] = atoi(v);
        else if (strcmp(tok, "seed") == 0)
            c->rng = strtoull(v, NULL, 10);
        else if (strcmp(tok, "interval") == 0) {
            if (sscanf(v, "%lf-%lf", &c->lo, &c->hi) != 2 || c->lo < 0 || c->hi < c->lo)
                goto bad;
        } else
            goto bad;
    }
    if (counts[K_HOSTS] && !o->hosts) {
        fprintf(stderr, "fsdp-super: --chaos hosts=N needs --hosts FILE\n");
        return -1;
    }
    if ((counts[K_STORAGE] || counts[K_COMMIT]) && !o->ckpt) {
        fprintf(stderr, "fsdp-super: --chaos storage/commit faults need the trainer's --ckpt\n");
        return -1;
    }
    for (int k = 0; k < K_NKINDS; k++)
        c->nfaults += counts[k];
    c->seq = calloc((size_t)(c->nfaults ? c->nfaults : 1), sizeof *c->seq);
    for (int k = 0, i = 0; k < K_NKINDS; k++)
        for (int n = 0; n < counts[k]; n++)
            c->seq[i++] = k;
    for (int i = c->nfaults - 1; i > 0; i--) { /* Fisher-Yates with the seed */
        int j = (int)(next_rand(c) % (uint64_t)(i + 1)), t = c->seq[i];
        c->seq[i] = c->seq[j];
        c->seq[j] = t;
    }
    c->enabled = c->nfaults > 0;
    return 0;
bad:
    fprintf(stderr, "fsdp-super: bad --chaos '%s' (see recovery/chaos.c)\n", spec);
    return -1;
}

void chaos_free(struct chaos *c)
{
    free(c->seq);
    c->seq = NULL;
}

const char *chaos_launch_env(struct chaos *c)
{
    if (!c->pending_commit)
        return NULL;
    snprintf(c->env, sizeof c->env, "before-commit:1");
    return c->env;
}

const char *chaos_launch_ckpt(struct chaos *c, const char *ckpt)
{
    if (!c->pending_storage || !ckpt)
        return NULL;
    snprintf(c->ckpt, sizeof c->ckpt, "fault:write=EIO@%d;%s", 1 + (int)(next_rand(c) % 3),
             ckpt);
    return c->ckpt;
}

void chaos_launched(struct chaos *c)
{
    c->storage_armed = c->pending_storage;
    c->commit_armed = c->pending_commit;
    c->pending_storage = c->pending_commit = 0;
    c->next_at = 0;
    c->waiting = 0;
}

static int random_rank(struct chaos *c, const struct job *j)
{
    int seen[SUPER_MAX_RANKS], n = 0;
    for (int r = 0; r < j->np; r++)
        if (j->ranks[r].seen)
            seen[n++] = r;
    return n ? seen[next_rand(c) % (uint64_t)n] : -1;
}

static int write_hosts(const char *path, int slots)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    fprintf(f, "localhost %d\n", slots);
    fclose(f);
    return rename(tmp, path);
}

int chaos_tick(struct chaos *c, struct job *j, double now)
{
    if (c->commit_armed && j->ranks[0].seen && proc_state(j->ranks[0].pid) == 'T') {
        ev_emit("chaos", "\"kind\":\"commit\",\"rank\":0,\"step\":%llu",
                (unsigned long long)j->ranks[0].step);
        c->commit_armed = 0;
        return CHAOS_KILL_NOW;
    }
    if (!c->enabled || c->next >= c->nfaults || c->commit_armed || c->storage_armed ||
        c->waiting)
        return CHAOS_NONE;
    int healthy = j->first_train > 0; /* every rank training, heartbeats fresh */
    for (int r = 0; r < j->np; r++)
        healthy &= j->ranks[r].seen && strcmp(j->ranks[r].phase, "train") == 0 &&
                   now - j->ranks[r].last_seen < 1.0;
    if (!healthy)
        return CHAOS_NONE;
    if (c->next_at == 0)
        c->next_at = now + c->lo + (c->hi - c->lo) * uniform(c);
    if (now < c->next_at)
        return CHAOS_NONE;
    int kind = c->seq[c->next++];
    c->next_at = 0;
    c->waiting = 1; /* every fault ends this launch one way or another */
    c->injected[kind]++;
    int r = random_rank(c, j);
    switch (kind) {
    case K_KILL:
        ev_emit("chaos", "\"kind\":\"kill\",\"rank\":%d,\"pid\":%d", r, (int)j->ranks[r].pid);
        kill(j->ranks[r].pid, SIGKILL);
        return CHAOS_NONE;
    case K_STOP:
        ev_emit("chaos", "\"kind\":\"stop\",\"rank\":%d,\"pid\":%d", r, (int)j->ranks[r].pid);
        kill(j->ranks[r].pid, SIGSTOP);
        return CHAOS_NONE;
    case K_PREEMPT:
        ev_emit("chaos", "\"kind\":\"preempt\"");
        ev_emit("preemption_notice", "\"source\":\"chaos\"");
        return CHAOS_PREEMPT;
    case K_STORAGE:
        ev_emit("chaos", "\"kind\":\"storage\"");
        c->pending_storage = 1;
        return CHAOS_PREEMPT;
    case K_COMMIT:
        ev_emit("chaos", "\"kind\":\"commit\",\"armed\":true");
        c->pending_commit = 1;
        return CHAOS_PREEMPT;
    default: { /* hosts */
        int lo = c->o->min_np, hi = c->o->np, cur = j->np, next = cur;
        while (hi > lo && next == cur)
            next = lo + (int)(next_rand(c) % (uint64_t)(hi - lo + 1));
        write_hosts(c->o->hosts, next);
        ev_emit("chaos", "\"kind\":\"hosts\",\"from\":%d,\"to\":%d", cur, next);
        if (next < cur) { /* a host went away with its rank */
            kill(j->ranks[r].pid, SIGKILL);
            return CHAOS_NONE;
        }
        return CHAOS_PREEMPT; /* grow: restart to use it */
    }
    }
}
