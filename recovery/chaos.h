/*
 * chaos.h - fault injection for fsdp-super (--chaos SPEC).
 */
#ifndef FSDP_CHAOS_H
#define FSDP_CHAOS_H

#include "super.h"

enum { CHAOS_NONE, CHAOS_PREEMPT, CHAOS_KILL_NOW };

enum chaos_kind { K_KILL, K_STOP, K_PREEMPT, K_STORAGE, K_COMMIT, K_HOSTS, K_NKINDS };

struct chaos {
    int enabled, nfaults, next;
    int *seq;
    double lo, hi, next_at;
    uint64_t rng;
    const struct super_opts *o;
    int pending_storage, pending_commit; /* for the next launch */
    int storage_armed, commit_armed;     /* in this launch */
    int capacity;                        /* slots written to the host file last */
    int waiting;                         /* a fault is in flight: none until the relaunch */
    int injected[K_NKINDS];
    char ckpt[1400], env[64];
};

int chaos_init(struct chaos *c, const char *spec, const struct super_opts *o);
void chaos_free(struct chaos *c);
const char *chaos_launch_env(struct chaos *c);
const char *chaos_launch_ckpt(struct chaos *c, const char *ckpt);
void chaos_launched(struct chaos *c);
int chaos_tick(struct chaos *c, struct job *j, double now);

#endif
