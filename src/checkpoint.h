/*
 * checkpoint.h - the trainer's side of checkpoints: saving the engine's
 * shards with the commit protocol, and resuming (with fallback) from the
 * newest committed step that loads and verifies.
 *
 * checkpoint.c holds the commit protocol and resume; checkpoint_async.c
 * the background writer of --ckpt-async; checkpoint_verify.c the check of
 * --verify-load; what they share is checkpoint_internal.h, private to them. The format, commit,
 * retention and digests themselves are ckpt/ (ckpt.h).
 *
 * Unless said otherwise a function here is collective: all ranks call it,
 * in the same order, and all ranks return the same status (failures are
 * agreed on, so no rank is left waiting in a collective).
 */
#ifndef FSDP_CHECKPOINT_H
#define FSDP_CHECKPOINT_H

#include "ckpt.h"
#include "comm.h"
#include "fsdp.h"
#include "model.h"

struct tckpt_opts {
    const char *uri;
    long long every, keep;
    int resume;       /* 1: auto, 0: none */
    int verify_load;  /* after loading, compare the state's digest with the checkpoint's */
    int async;        /* --ckpt-async */
    int load_threads; /* threads that fetch, verify and decode chunks at resume */
    /* before a step's shards are read: the trainer's verdict on its state
     * (TCKPT_REFUSED with err: a resume that would be another run) */
    int (*check_trainer)(void *ctx, json_t *trainer, uint64_t step, char *err);
    void *check_ctx;
    struct ckpt_write_opts write;
    /* The in-memory snapshots' store (train_ckpt.c): its launch claims a
     * generation of its own in it even under a supervisor (whose
     * generation is the checkpoint store's), its commits are events with
     * memory=1, the test hooks of saves leave it alone, and what a resume
     * says when none of its steps loads is `fallback`. */
    int memory;
    const char *fallback;
    /* memory only: ranks on several hosts, the store in each host's RAM
     * under the same path, led by the host's lowest rank, each shard also in
     * the next host's (checkpoint_buddy.c) */
    int per_host;
    /* tckpt_resume loads only steps from this one on (0: any): the
     * snapshot loaded from the other store is newer than the rest */
    uint64_t load_from;
};

struct tckpt {
    struct tckpt_opts o;
    struct storage *st;
    struct ckpt_codec *codec;
    struct fsdp_engine *e;
    struct fsdp_comm *comm;
    const struct model_layout *m;
    json_t *model_json;
    int world;                 /* ranks whose shards form a checkpoint (1 for NO_SHARD) */
    int saves;                 /* checkpoints written by this process */
    uint64_t newest_committed; /* 0 if none */
    int tried;                 /* steps tckpt_resume began to load into the engine */
    int skipped;               /* rank 0: the last save met a step already committed, kept it */
    int leader;                /* this rank claims, commits and cleans the store: rank 0, or
                                  with per_host each host's lowest rank */
    int buddy, ward;           /* per_host: see tckpt_pair_ranks */
    unsigned char *piece[2];   /* per_host: the copies' send and receive pieces */
    unsigned char *held;       /* per_host: held[r] = 1 for the shards this host's store
                                  holds (its ranks' and their wards'); NULL: all */
    double save_t0;            /* when the save being committed began (its event's seconds) */
    double load_s;             /* how long the resume's load took (0: none) */
    uint64_t stored_bytes;     /* rank 0: what the last commit's shards hold, every rank's */
    uint64_t generation;       /* of this launch: fsdp-super's, or claimed at open */
    char tag[CKPT_TAG_LEN];    /* this launch's writer tag, in every shard name */
    struct tckpt_async *async; /* --ckpt-async */
    /* Device engines (kernels on_device): the state as the storage code
     * reads and writes it, in host memory; copied from the device before a
     * save and to it after a load. NULL on the CPU, where the engine's own
     * state is host memory. */
    float *host[CKPT_NKINDS];
};

/* The exit status of a rank 0 that found its launch fenced at a commit: a
 * newer generation claimed the store, so nothing this launch does counts
 * any more, and the ranks it would wait for may be gone with its old
 * launch. It says "fenced" on stderr (and in an event, which a supervisor
 * of its own generation still hears) and exits at once, from inside the
 * save. */
#define TCKPT_FENCED_EXIT 4

int tckpt_open(struct tckpt *c, const struct tckpt_opts *o, struct fsdp_engine *e,
               struct fsdp_comm *comm, const struct model_layout *m, char *err);
void tckpt_close(struct tckpt *c);

/* Writes and commits step `step`; trainer is the trainer-state object to
 * store (borrowed). Then applies retention (rank 0). */
int tckpt_save(struct tckpt *c, uint64_t step, json_t *trainer, char *err);

/* With --resume auto, loads the newest committed step that verifies into
 * the engine; *trainer receives its trainer state (new reference) or NULL
 * when starting fresh. Steps that fail to load are reported and skipped,
 * never removed; garbage of older generations is (ckpt_clean). */
int tckpt_resume(struct tckpt *c, json_t **trainer, uint64_t *step, char *err);

/* Asynchronous saves (--ckpt-async, checkpoint_async.c). start/finish are
 * collective; save_async (local: hands the step to the background writer,
 * which copies the state into staging and writes it) is called by every
 * rank at the same step; state tells this rank's side (1 when its write
 * ended, with *failed if it failed), to be summed over ranks on a
 * collective the step makes anyway (train.c's step vote); stop (local)
 * joins the writer. */
int tckpt_async_start(struct tckpt *c, char *err);
void tckpt_async_stop(struct tckpt *c);
int tckpt_save_async(struct tckpt *c, uint64_t step, json_t *trainer, char *err);
int tckpt_async_state(struct tckpt *c, int *in_flight, int *failed);
int tckpt_async_finish(struct tckpt *c, char *err);
/* Blocks while the background thread is still copying the state into
 * staging; the trainer calls it before the optimizer step writes the
 * state. Returns 1 if it had to wait. */
int tckpt_async_snapshot_wait(struct tckpt *c);
uint64_t tckpt_async_step(struct tckpt *c);

/* The loaded state's digest against the checkpoint's (--verify-load):
 * tensor by tensor, ckpt_tensor_digest of the state as loaded against
 * ckpt_digest of the checkpoint. tckpt_resume calls it after a load. */
int tckpt_verify_loaded(struct tckpt *c, const struct ckpt_manifest *man, char *err);

#endif
