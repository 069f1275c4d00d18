/*
 * chaos.h - fault injection for fsdp-super (--chaos SPEC), placed on
 * training steps; the SPEC and the life of a fault are in chaos.c.
 *
 * fsdp-super drives it at four points of a launch: chaos_launching (before:
 * the launch's test environment and store), chaos_tick (every pass of the
 * watch loop: maybe a fault now), chaos_launch_ended (after: how the launch
 * ended, which is the effect of the fault in flight) and chaos_report (at
 * the end: how many faults landed as planned).
 */
#ifndef FSDP_CHAOS_H
#define FSDP_CHAOS_H

#include "super.h"

enum { CHAOS_NONE, CHAOS_PREEMPT, CHAOS_KILL_NOW };

enum chaos_kind { K_KILL, K_STOP, K_PREEMPT, K_STORAGE, K_COMMIT, K_HOSTS, K_NKINDS };

struct chaos_fault {
    enum chaos_kind kind;
    uint64_t step; /* fires once every rank has reported this step */
};

struct chaos {
    int enabled, nfaults, next; /* next: the next fault of the plan to fire */
    struct chaos_fault *plan;   /* strictly increasing steps */
    uint64_t rng, steps;
    const struct super_opts *o;
    int cur, stage; /* the fault in flight (-1: none) and where it is */
    int hosts_from, hosts_to;
    int victim_remote; /* the rank it hit is on another host */
    char cause[32];    /* how its first launch ended */
    int landed, landed_ok;
    char hold[32], stop[32]; /* this launch's FSDP_TEST_HOLD_AT / _STOP_AT, "" if none */
    char ckpt[1400];         /* this launch's --ckpt override, "" if none */
};

/* -1 with one line in err when SPEC is malformed or cannot be planned. */
int chaos_init(struct chaos *c, const char *spec, const struct super_opts *o, char *err, size_t n);
void chaos_free(struct chaos *c);
/* Before a launch of np ranks: fills hold, stop and ckpt for it. */
void chaos_launching(struct chaos *c, int np);
/* Every pass of the watch loop: CHAOS_PREEMPT (ask the ranks for an
 * emergency checkpoint), CHAOS_KILL_NOW (end the launch at once) or
 * CHAOS_NONE. */
int chaos_tick(struct chaos *c, struct job *j);
/* The launch ended: cause is the restart cause ("exit", "rank-died",
 * "heartbeat-lost", "preemption", "chaos-restart", "startup-timeout") or
 * "finished"; j holds the ranks' last lines. */
void chaos_launch_ended(struct chaos *c, const char *cause, const struct job *j);
/* One line on stderr and a chaos_summary event; returns the number of
 * planned faults that did not land with their expected effect. */
int chaos_report(struct chaos *c);

#endif
