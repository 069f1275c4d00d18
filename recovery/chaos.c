/*
 * chaos.c - faults on training steps, for the chaos suite.
 *
 * SPEC: comma-separated, e.g. "seed=7,kill=10,stop=10,preempt=10,storage=10,
 * commit=10,hosts=6":
 *   kill=N      SIGKILL of a random rank
 *   stop=N      SIGSTOP of a random rank (found by the heartbeat timeout)
 *               (kill and stop are orders in the supervisor's answers that the
 *               rank carries out on itself, and kill() too for a rank of
 *               this host: ranks.c)
 *   preempt=N   a preemption notice: emergency checkpoint, relaunch
 *   storage=N   a preemption, and the next launch's checkpoint store fails
 *               a write (EIO)
 *   commit=N    a preemption, and the next launch is killed while rank 0
 *               commits a checkpoint
 *   hosts=N     the host file shrinks (a rank's host is lost with it) or
 *               grows (the job is preempted to use it), between --min-np
 *               and --np
 *   seed=S      (default 1)
 * (interval=A-B of earlier versions is refused: time is not used.)
 *
 * The plan: the faults are shuffled with the seed, and each gets a step
 * drawn from the seed in [5%, 90%] of the trainer's --steps, strictly
 * increasing, so every fault lands before the run ends on any machine,
 * however fast or slow. Steps only grow across relaunches: a relaunch that
 * resumes below the next fault's step trains up to it. A fault fires at
 * the first pass of the watch loop in which every rank is up (training,
 * saving or holding) and has reported the fault's step. So that a run can
 * never slip past between two heartbeats, each launch that has a fault to
 * come gets FSDP_TEST_HOLD_AT a few steps past its step (src/testhook.h):
 * the ranks wait there, beating, for the fault.
 *
 * The life of a fault: fired (a "chaos" event), then the launch ends,
 * and how it ended is the fault's effect, checked against what the fault
 * must cause; storage and commit faults are checked on the launch they
 * arm, a hosts fault also on the world size of the next launch. One
 * "chaos_landed" event per fault says what it caused and whether that was
 * the expected effect (the chaos tests assert it for every planned fault):
 *   kill      restart cause rank-died or exit (mpirun may notice first);
 *             for a rank on another host also heartbeat-lost (its death is
 *             silence, unless mpirun notices first)
 *   stop      heartbeat-lost
 *   preempt   preemption
 *   storage   preemption; then the armed launch fails: a rank exits
 *             (rank-died, or exit when mpirun notices first), its last
 *             lines naming the injected error
 *   commit    preemption; then chaos-restart (killed in the commit: rank 0
 *             stopped before it, seen in /proc here, or as a second of
 *             silence from another host)
 *   hosts     shrink: rank-died or exit; grow: preemption; then the next
 *             launch runs on the new world size (a resize)
 * Only one fault is in flight at a time: none fires until the one before
 * has landed.
 */
#include "chaos.h"

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HOLD_GAP   3 /* the ranks hold this many steps past a fault's step */
#define MAX_FAULTS 100000

static const char *kind_names[K_NKINDS] = {"kill", "stop", "preempt", "storage", "commit", "hosts"};

enum stage {
    ST_FIRED,  /* injected; its launch has not ended yet */
    ST_ARM,    /* storage/commit: the next launch is armed */
    ST_ARMED,  /* ... and running */
    ST_RESIZE, /* hosts: the next launch's world size is the proof */
};

static uint64_t below(struct chaos *c, uint64_t n)
{
    struct fsdp_rng r = {c->rng};
    uint64_t v = fsdp_rng_below(&r, n);
    c->rng = r.state;
    return v;
}

/* ---- the plan ------------------------------------------------------------------- */

static int parse_spec(const char *spec, int *counts, uint64_t *seed, char *err, size_t n)
{
    char buf[512];
    if (strlen(spec) >= sizeof buf) {
        snprintf(err, n, "--chaos: the SPEC is too long");
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            snprintf(err, n, "--chaos: '%s' is not KEY=VALUE (see recovery/chaos.c)", tok);
            return -1;
        }
        *eq = 0;
        const char *v = eq + 1;
        int k;
        for (k = 0; k < K_NKINDS && strcmp(tok, kind_names[k]) != 0; k++)
            ;
        uint64_t x;
        if (strcmp(tok, "interval") == 0) {
            snprintf(err, n,
                     "--chaos: interval= is gone: faults are placed on training steps "
                     "drawn from the seed now (see recovery/chaos.c)");
            return -1;
        } else if (k == K_NKINDS && strcmp(tok, "seed") != 0) {
            snprintf(err, n, "--chaos: unknown fault '%s' (see recovery/chaos.c)", tok);
            return -1;
        } else if (hbmsg_parse_uint(v, strlen(v), k < K_NKINDS ? MAX_FAULTS : HBMSG_MAX_GENERATION,
                                    &x)) {
            snprintf(err, n, "--chaos: %s=%s is not a whole number%s", tok, v,
                     k < K_NKINDS ? " (at most 100000)" : "");
            return -1;
        }
        if (k < K_NKINDS)
            counts[k] = (int)x;
        else
            *seed = x;
    }
    return 0;
}

static int check_needs(const int *counts, const struct super_opts *o, char *err, size_t n)
{
    if (counts[K_HOSTS] && (!o->hosts || !o->np || o->min_np >= o->np)) {
        snprintf(err, n, "--chaos hosts=N needs --hosts FILE and --min-np below --np");
        return -1;
    }
    if ((counts[K_STORAGE] || counts[K_COMMIT]) && !o->ckpt) {
        snprintf(err, n, "--chaos storage/commit faults need the trainer's --ckpt");
        return -1;
    }
    return 0;
}

static int by_step(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Shuffled kinds, and distinct steps in [5%, 90%] of the run, ascending. */
static int plan(struct chaos *c, const int *counts, char *err, size_t n)
{
    uint64_t lo = (c->steps * 5 + 99) / 100, hi = c->steps * 90 / 100;
    lo = lo ? lo : 1;
    uint64_t room = hi >= lo ? hi - lo + 1 : 0;
    if ((uint64_t)c->nfaults > room || hi + HOLD_GAP >= c->steps) {
        snprintf(err, n,
                 "--chaos: %d faults do not fit between steps %llu and %llu of the "
                 "trainer's --steps %llu; give more steps or fewer faults",
                 c->nfaults, (unsigned long long)lo, (unsigned long long)hi,
                 (unsigned long long)c->steps);
        return -1;
    }
    c->plan = calloc((size_t)c->nfaults, sizeof *c->plan);
    uint64_t *at = calloc((size_t)c->nfaults, sizeof *at);
    if (!c->plan || !at) {
        free(at);
        snprintf(err, n, "--chaos: out of memory for %d faults", c->nfaults);
        return -1;
    }
    for (int k = 0, i = 0; k < K_NKINDS; k++)
        for (int j = 0; j < counts[k]; j++)
            c->plan[i++].kind = (enum chaos_kind)k;
    for (int i = c->nfaults - 1; i > 0; i--) { /* Fisher-Yates with the seed */
        int j = (int)below(c, (uint64_t)i + 1);
        enum chaos_kind t = c->plan[i].kind;
        c->plan[i].kind = c->plan[j].kind;
        c->plan[j].kind = t;
    }
    /* n draws from room-n+1 values, sorted, plus their index: n distinct
     * steps in order */
    for (int i = 0; i < c->nfaults; i++)
        at[i] = below(c, room - (uint64_t)c->nfaults + 1);
    qsort(at, (size_t)c->nfaults, sizeof *at, by_step);
    for (int i = 0; i < c->nfaults; i++)
        c->plan[i].step = lo + at[i] + (uint64_t)i;
    free(at);
    return 0;
}

int chaos_init(struct chaos *c, const char *spec, const struct super_opts *o, char *err, size_t n)
{
    memset(c, 0, sizeof *c);
    c->o = o;
    c->cur = -1;
    c->steps = o->train_steps;
    if (!spec)
        return 0;
    int counts[K_NKINDS] = {0};
    uint64_t seed = 1;
    if (parse_spec(spec, counts, &seed, err, n) || check_needs(counts, o, err, n))
        return -1;
    c->rng = seed;
    for (int k = 0; k < K_NKINDS; k++)
        c->nfaults += counts[k];
    if (!c->nfaults)
        return 0;
    if (!c->steps) {
        snprintf(err, n,
                 "--chaos needs the trainer's --steps N after -- (faults are placed "
                 "on training steps)");
        return -1;
    }
    if (plan(c, counts, err, n))
        return -1;
    c->enabled = 1;
    json_t *faults = json_array();
    for (int i = 0; i < c->nfaults && faults; i++)
        json_array_append_new(faults, json_pack("{s:s, s:I}", "kind", kind_names[c->plan[i].kind],
                                                "step", (json_int_t)c->plan[i].step));
    ev_emit("chaos_plan", "{s:I, s:I, s:o}", "seed", (json_int_t)seed, "steps",
            (json_int_t)c->steps, "faults", faults);
    return 0;
}

void chaos_free(struct chaos *c)
{
    free(c->plan);
    c->plan = NULL;
}

/* ---- a launch ------------------------------------------------------------------- */

static void land(struct chaos *c, const char *cause, int ok, const char *expected, json_t *detail)
{
    const struct chaos_fault *f = &c->plan[c->cur];
    json_t *fields =
        json_pack("{s:i, s:s, s:I, s:s, s:s, s:b}", "fault", c->cur, "kind", kind_names[f->kind],
                  "step", (json_int_t)f->step, "cause", cause, "expected", expected, "ok", ok);
    if (fields && detail)
        json_object_update(fields, detail);
    json_decref(detail);
    ev_emit("chaos_landed", "o", fields);
    if (!ok)
        fprintf(stderr,
                "fsdp-super: chaos: fault %d (%s at step %llu) ended its launch as %s, "
                "not %s\n",
                c->cur, kind_names[f->kind], (unsigned long long)f->step, cause, expected);
    c->landed++;
    c->landed_ok += ok;
    c->cur = -1;
}

void chaos_launching(struct chaos *c, int np)
{
    c->hold[0] = c->stop[0] = c->ckpt[0] = 0;
    if (c->cur >= 0 && c->stage == ST_RESIZE)
        land(c, c->cause, np == c->hosts_to, "a resize", json_pack("{s:i}", "np", np));
    if (c->cur >= 0 && c->stage == ST_ARM) {
        c->stage = ST_ARMED;
        if (c->plan[c->cur].kind == K_COMMIT)
            snprintf(c->stop, sizeof c->stop, "before-commit:1");
        else /* the N-th write and every later one fail (today write 1 is the trainer's
              * probe of the store at start-up, 2 and 3 are in its first save), so the
              * launch fails however few writes a save makes */
            snprintf(c->ckpt, sizeof c->ckpt, "fault:write=EIO@%d+;%s", 1 + (int)below(c, 3),
                     c->o->ckpt);
        return;
    }
    if (c->cur < 0 && c->enabled && c->next < c->nfaults) {
        uint64_t at = c->plan[c->next].step + HOLD_GAP;
        snprintf(c->hold, sizeof c->hold, "%llu",
                 (unsigned long long)(at < c->steps ? at : c->steps));
    }
}

static int random_rank(struct chaos *c, const struct job *j)
{
    return j->np > 0 ? (int)below(c, (uint64_t)j->np) : -1;
}

static int write_hosts(const char *path, int slots)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    fprintf(f, "localhost %d\n", slots);
    if (fclose(f))
        return -1;
    return rename(tmp, path);
}

/* The step every rank has reached, if all are up; 0 if not. */
static uint64_t reached(const struct job *j)
{
    uint64_t min = UINT64_MAX;
    for (int r = 0; r < j->np; r++) {
        const struct rank_state *rs = &j->ranks[r];
        if (!rs->seen || (rs->phase != HB_TRAIN && rs->phase != HB_SAVE && rs->phase != HB_HOLD))
            return 0;
        min = rs->step < min ? rs->step : min;
    }
    return j->np > 0 ? min : 0;
}

/* The "chaos" event of a fault being injected: what, where, and two more
 * numbers if ka is not NULL. */
static void fired(struct chaos *c, uint64_t at, const char *ka, int a, const char *kb, int b)
{
    const struct chaos_fault *f = &c->plan[c->cur];
    json_t *e = json_pack("{s:i, s:s, s:I, s:I}", "fault", c->cur, "kind", kind_names[f->kind],
                          "step", (json_int_t)f->step, "at_step", (json_int_t)at);
    json_t *extra = ka ? json_pack("{s:i, s:i}", ka, a, kb, b) : NULL;
    if (e && extra)
        json_object_update(e, extra);
    json_decref(extra);
    ev_emit("chaos", "o", e);
}

static int fire(struct chaos *c, struct job *j, uint64_t at)
{
    const struct chaos_fault *f = &c->plan[c->next];
    c->cur = c->next++;
    c->stage = ST_FIRED;
    int r = random_rank(c, j);
    struct rank_state *rs = &j->ranks[r];
    c->victim_remote = !rs->local;
    switch (f->kind) {
    case K_KILL:
    case K_STOP:
        fired(c, at, "rank", r, "pid", (int)rs->pid);
        rank_order(rs, &j->env, f->kind == K_KILL ? HBCTL_KILL : HBCTL_STOP);
        return CHAOS_NONE;
    case K_PREEMPT:
    case K_STORAGE:
    case K_COMMIT:
        fired(c, at, NULL, 0, NULL, 0);
        ev_emit("preemption_notice", "{s:s}", "source", "chaos");
        return CHAOS_PREEMPT;
    default: { /* hosts */
        int lo = c->o->min_np, hi = c->o->np, cur = j->np, next = cur;
        while (next == cur) /* lo < hi: chaos_init made sure */
            next = lo + (int)below(c, (uint64_t)(hi - lo + 1));
        c->hosts_from = cur;
        c->hosts_to = next;
        if (write_hosts(c->o->hosts, next))
            fprintf(stderr, "fsdp-super: chaos: cannot rewrite %s\n", c->o->hosts);
        fired(c, at, "from", cur, "to", next);
        if (next < cur) { /* a host went away with its rank */
            rank_order(rs, &j->env, HBCTL_KILL);
            return CHAOS_NONE;
        }
        return CHAOS_PREEMPT; /* grow: restart to use it */
    }
    }
}

/* Rank 0 stopped itself before its commit (FSDP_TEST_STOP_AT): /proc says
 * so on this host; from another host, a second of silence does. */
static int stopped_to_commit(const struct job *j)
{
    const struct rank_state *r0 = &j->ranks[0];
    if (!r0->seen)
        return 0;
    if (r0->local)
        return j->env.state(r0->pid) == 'T';
    return fsdp_now() - r0->last_seen > 1.0;
}

int chaos_tick(struct chaos *c, struct job *j)
{
    if (c->cur >= 0) {
        if (c->stage == ST_ARMED && c->plan[c->cur].kind == K_COMMIT && stopped_to_commit(j)) {
            ev_emit("chaos_commit_kill", "{s:i, s:I}", "fault", c->cur, "reported_step",
                    (json_int_t)j->ranks[0].step);
            return CHAOS_KILL_NOW;
        }
        return CHAOS_NONE;
    }
    if (!c->enabled || c->next >= c->nfaults)
        return CHAOS_NONE;
    uint64_t at = reached(j);
    return at && at >= c->plan[c->next].step ? fire(c, j, at) : CHAOS_NONE;
}

static int is(const char *cause, const char *a, const char *b)
{
    return strcmp(cause, a) == 0 || (b && strcmp(cause, b) == 0);
}

/* The rank line that names the injected storage error, if any. */
static const char *injected_line(const struct job *j)
{
    const char *l, *found = NULL;
    for (int i = 0; (l = line_tail_get(&j->rank_tail, i)); i++)
        if (strstr(l, "injected"))
            found = l;
    return found;
}

static void first_launch_ended(struct chaos *c, const char *cause)
{
    enum chaos_kind k = c->plan[c->cur].kind;
    snprintf(c->cause, sizeof c->cause, "%s", cause);
    switch (k) {
    case K_KILL:
        if (c->victim_remote)
            land(c, cause, is(cause, "rank-died", "exit") || is(cause, "heartbeat-lost", NULL),
                 "rank-died|exit|heartbeat-lost", NULL);
        else
            land(c, cause, is(cause, "rank-died", "exit"), "rank-died|exit", NULL);
        return;
    case K_STOP:
        land(c, cause, is(cause, "heartbeat-lost", NULL), "heartbeat-lost", NULL);
        return;
    case K_PREEMPT:
        land(c, cause, is(cause, "preemption", NULL), "preemption", NULL);
        return;
    case K_STORAGE:
    case K_COMMIT:
        if (is(cause, "preemption", NULL))
            c->stage = ST_ARM;
        else
            land(c, cause, 0, "preemption (arming the next launch)", NULL);
        return;
    default: { /* hosts */
        int shrink = c->hosts_to < c->hosts_from;
        int died = is(cause, "rank-died", "exit") ||
                   (c->victim_remote && is(cause, "heartbeat-lost", NULL));
        if (shrink ? died : is(cause, "preemption", NULL))
            c->stage = ST_RESIZE;
        else
            land(c, cause, 0, shrink ? "rank-died|exit" : "preemption", NULL);
        return;
    }
    }
}

void chaos_launch_ended(struct chaos *c, const char *cause, const struct job *j)
{
    if (c->cur < 0)
        return;
    if (c->stage == ST_FIRED) {
        first_launch_ended(c, cause);
    } else if (c->stage == ST_ARMED && c->plan[c->cur].kind == K_STORAGE) {
        const char *line = injected_line(j);
        land(c, cause, is(cause, "exit", "rank-died") && line,
             "rank-died|exit, naming the injected error",
             line ? json_pack("{s:o}", "error", ev_text(line)) : NULL);
    } else if (c->stage == ST_ARMED) {
        land(c, cause, is(cause, "chaos-restart", NULL), "chaos-restart", NULL);
    }
}

int chaos_report(struct chaos *c)
{
    if (!c->enabled)
        return 0;
    int missed = c->nfaults - c->landed_ok;
    fprintf(stderr,
            "fsdp-super: chaos: %d of %d planned faults landed with their expected "
            "effect\n",
            c->landed_ok, c->nfaults);
    ev_emit("chaos_summary", "{s:i, s:i, s:i, s:i}", "planned", c->nfaults, "fired", c->next,
            "landed", c->landed, "landed_ok", c->landed_ok);
    return missed;
}
