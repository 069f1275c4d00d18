/*
 * checkpoint_async.c - asynchronous saves (--ckpt-async): the background
 * writer of each rank, and its hand-offs with the training loop.
 *
 * How it fits: a save is the same commit protocol as checkpoint.c's
 * tckpt_save, cut in two. tckpt_save_async hands the step to this rank's
 * writer thread, which snapshots the state and writes the shard
 * (tckpt_write_own_shard) while training goes on; tckpt_async_finish,
 * called by every rank at the same step, runs the rest collectively
 * (tckpt_finish_save: the agreement, the shard records to rank 0, the
 * commit). train.c decides that step: each step's loss all-reduce carries
 * every rank's "write ended" and "write failed" (its enum step_vote), read
 * here by tckpt_async_state.
 *
 * One background thread per rank, at nice 10 so the compute threads keep
 * their cores (when it competes with one, the fair scheduler gives it about
 * a tenth of that core). The in-memory snapshots' store (--mem-snapshot-every,
 * train_ckpt.c) has a writer of its own, at nice 0: its write is waited for
 * at the next step's vote, so it must not be starved, and on the CPU it
 * writes the state itself, with no staging copy (tckpt_async_start); with
 * ranks on several hosts it then copies the shard to its buddy's
 * (checkpoint_buddy.c) before the write counts as done.
 *
 * At a due step boundary the trainer only hands the writer the step: the
 * thread of the checkpoint store (and a device's snapshot writer) first
 * copies this rank's shard of every state kind into staging buffers
 * (allocated and touched once), which overlaps with the next
 * step's forward and backward, since those only read the shard; the
 * trainer waits for the copy (tckpt_async_snapshot_wait) only before the
 * optimizer step, the first thing that writes the shard. Then the thread
 * chunks, shuffles, compresses, hashes and writes the staged copy. Each
 * step the trainer adds "my write is done" and "my write failed" to the
 * loss all-reduce it makes anyway; the step in which every rank is done
 * runs the commit (the chunk-table gather and rank 0's manifest), so no
 * step waits on storage unless a checkpoint is due while the previous one
 * is still being written. After a commit, rank 0's thread applies
 * retention (tckpt_async_retain); a synchronous save in between (an
 * emergency checkpoint) first waits for it (tckpt_async_quiesce).
 */
#include "checkpoint_internal.h"

#include "testhook.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { A_IDLE, A_COPYING, A_WRITING, A_DONE, A_FAILED };

struct tckpt_async {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state, quit, job;
    int retain, retain_failed; /* rank 0: retention to apply; it failed */
    uint64_t retain_upto;      /* the step just committed */
    uint64_t step;
    json_t *trainer;
    int direct; /* the state itself is written: no staging (see tckpt_async_start) */
    float *staging[CKPT_NKINDS];
    char *json;
    char err[FSDP_ERR_LEN], retain_err[FSDP_ERR_LEN];
};

static void async_snapshot(struct tckpt *c, struct tckpt_async *a)
{
    /* Staging is host memory: on the CPU the copy is a memcpy, on a GPU a
     * device-to-host copy on this thread's own stream (kernels.h). */
    struct fsdp_engine *e = c->e;
    for (int k = 0; k < CKPT_NKINDS; k++)
        e->k->download(a->staging[k], tckpt_kind_base(e, k), e->shard_total * sizeof(float));
}

static void *async_main(void *arg)
{
    struct tckpt *c = arg;
    struct tckpt_async *a = c->async;
    /* a snapshot in RAM is waited for at the next step's vote: no nice */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), c->o.memory ? 0 : 10);
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->job && !a->retain && !a->quit)
            pthread_cond_wait(&a->cv, &a->mu);
        if (a->retain) {
            uint64_t upto = a->retain_upto;
            pthread_mutex_unlock(&a->mu);
            char err[FSDP_ERR_LEN] = "";
            int rc = tckpt_retain(c, upto, err);
            pthread_mutex_lock(&a->mu);
            if (rc && !a->retain_failed) {
                a->retain_failed = 1;
                snprintf(a->retain_err, sizeof a->retain_err, "%s", err);
            }
            a->retain = 0;
            pthread_cond_broadcast(&a->cv);
            continue;
        }
        if (a->quit)
            break;
        uint64_t step = a->step;
        pthread_mutex_unlock(&a->mu);
        float *from[CKPT_NKINDS];
        for (int k = 0; k < CKPT_NKINDS; k++)
            from[k] = a->direct ? tckpt_kind_base(c->e, k) : a->staging[k];
        if (!a->direct)
            async_snapshot(c, a);
        pthread_mutex_lock(&a->mu);
        a->state = A_WRITING;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        char *json = NULL, err[FSDP_ERR_LEN] = "";
        int rc = tckpt_write_own_shard(c, step, from, &json, err);
        if (c->o.per_host) { /* a copy on the next host too (checkpoint_buddy.c) */
            char sub[FSDP_ERR_LEN] = "";
            if (tckpt_buddy_copy(c, step, rc == 0, sub) && !rc)
                rc = fsdp_err(err, "%s", sub);
        }
        pthread_mutex_lock(&a->mu);
        a->json = json;
        snprintf(a->err, sizeof a->err, "%s", err);
        a->state = rc ? A_FAILED : A_DONE;
        a->job = 0;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

void tckpt_async_retain(struct tckpt *c, uint64_t upto)
{
    struct tckpt_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    a->retain = 1;
    a->retain_upto = upto;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void tckpt_async_quiesce(struct tckpt *c)
{
    struct tckpt_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    while (a->retain)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
}

int tckpt_async_start(struct tckpt *c, char *err)
{
    struct tckpt_async *a = calloc(1, sizeof *a);
    int rc = a ? 0 : -1;
    /* A snapshot in RAM is waited for before the next optimizer step (at
     * that step's vote), and until then the state is only read (the
     * forward and backward write activations and gradients): on the CPU
     * its writer reads the state itself, which saves a copy of the shard
     * in RAM and a pass over it. A device's state still comes down first. */
    if (a)
        a->direct = c->o.memory && !c->e->k->on_device;
    for (int k = 0; !rc && !a->direct && k < CKPT_NKINDS; k++)
        if (!(a->staging[k] = c->e->k->host_alloc(c->e->shard_total * sizeof(float))))
            rc = -1;
    if (!rc) {
        pthread_mutex_init(&a->mu, NULL);
        pthread_cond_init(&a->cv, NULL);
        c->async = a;
        if (pthread_create(&a->thread, NULL, async_main, c)) {
            c->async = NULL;
            rc = -1;
        }
    }
    if (rc && a) {
        for (int k = 0; k < CKPT_NKINDS; k++)
            if (a->staging[k])
                c->e->k->host_free(a->staging[k]);
        free(a);
    }
    return tckpt_agree(c->comm, rc ? fsdp_err(err, "checkpoint: cannot set up async saves") : 0,
                       err);
}

void tckpt_async_stop(struct tckpt *c)
{
    struct tckpt_async *a = c->async;
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->quit = 1; /* after any retention it was given */
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    for (int k = 0; k < CKPT_NKINDS; k++)
        if (a->staging[k])
            c->e->k->host_free(a->staging[k]);
    free(a->json);
    json_decref(a->trainer);
    free(a);
    c->async = NULL;
}

int tckpt_async_state(struct tckpt *c, int *in_flight, int *failed)
{
    struct tckpt_async *a = c->async;
    *in_flight = *failed = 0;
    if (!a)
        return 0;
    pthread_mutex_lock(&a->mu);
    int st = a->state;
    pthread_mutex_unlock(&a->mu);
    *in_flight = st != A_IDLE;
    *failed = st == A_FAILED;
    return st == A_DONE || st == A_FAILED;
}

int tckpt_save_async(struct tckpt *c, uint64_t step, json_t *trainer, char *err)
{
    struct tckpt_async *a = c->async;
    if (!c->o.memory) /* the test hooks count the checkpoint store's saves */
        testhook_save_begins(++c->saves);
    c->save_t0 = fsdp_now();
    pthread_mutex_lock(&a->mu);
    a->step = step;
    json_decref(a->trainer);
    a->trainer = json_incref(trainer);
    free(a->json);
    a->json = NULL;
    if (c->comm->rank < c->world) {
        a->state = A_COPYING;
        a->job = 1;
        pthread_cond_broadcast(&a->cv);
    } else {
        a->state = A_DONE; /* NO_SHARD: rank 0's copy is the checkpoint */
    }
    pthread_mutex_unlock(&a->mu);
    (void)err;
    return 0;
}

/* Not for a direct writer (no copy: it returns at once), whose state must
 * not change until tckpt_async_finish; train.c finishes a snapshot before
 * the optimizer step. */
int tckpt_async_snapshot_wait(struct tckpt *c)
{
    struct tckpt_async *a = c->async;
    if (!a)
        return 0;
    pthread_mutex_lock(&a->mu);
    int waited = a->state == A_COPYING;
    while (a->state == A_COPYING)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    return waited;
}

int tckpt_async_finish(struct tckpt *c, char *err)
{
    struct tckpt_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    while (a->state == A_COPYING || a->state == A_WRITING)
        pthread_cond_wait(&a->cv, &a->mu);
    int rc = a->state == A_FAILED;
    if (rc)
        fsdp_err(err, "%s", a->err);
    else if (a->retain_failed) /* of the previous commit; surfaces now */
        rc = fsdp_err(err, "%s", a->retain_err);
    char *mine = a->json;
    a->json = NULL;
    json_t *trainer = a->trainer;
    a->trainer = NULL;
    uint64_t step = a->step;
    pthread_mutex_unlock(&a->mu);
    rc = tckpt_finish_save(c, step, trainer, mine, rc ? -1 : 0, err);
    json_decref(trainer);
    pthread_mutex_lock(&a->mu);
    a->state = A_IDLE;
    pthread_mutex_unlock(&a->mu);
    return rc;
}

uint64_t tckpt_async_step(struct tckpt *c) { return c->async ? c->async->step : 0; }
