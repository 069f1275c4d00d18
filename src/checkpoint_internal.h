/*
 * checkpoint_internal.h - what checkpoint.c (the commit protocol, resume),
 * checkpoint_async.c (the background writer) and checkpoint_verify.c
 * (--verify-load) and checkpoint_buddy.c (snapshots on several hosts)
 * share. Private to those files: the trainer uses checkpoint.h.
 */
#ifndef FSDP_CHECKPOINT_INTERNAL_H
#define FSDP_CHECKPOINT_INTERNAL_H

#include "checkpoint.h"

/* Collective. All ranks learn whether any failed (rc != 0 on that rank);
 * rank 0 learns the first failing rank's message in err, the others "another
 * rank failed" unless they failed themselves. Returns 0 if every rank
 * succeeded, -1 otherwise. */
int tckpt_agree(struct fsdp_comm *comm, int rc, char *err);

/* The engine's state of one kind (CKPT_PARAM ...), in backend memory. */
float *tckpt_kind_base(struct fsdp_engine *e, int kind);

/* Writes this rank's shard of step from bases[kind] (host memory: the
 * engine's state, or the async staging copy of it); *json_out receives the
 * shard's record for the manifest (malloc'd). */
int tckpt_write_own_shard(struct tckpt *c, uint64_t step, float *const bases[CKPT_NKINDS],
                          char **json_out, char *err);

/* Collective, after every rank wrote (or failed to write, rc != 0) its
 * shard: the agreement, the shard records to rank 0, the commit, retention.
 * Takes mine (this rank's record, or NULL). */
int tckpt_finish_save(struct tckpt *c, uint64_t step, json_t *trainer, char *mine, int rc,
                      char *err);

/* A store's leader (tckpt.leader), after committing step upto: retention
 * (ckpt_clean). */
int tckpt_retain(struct tckpt *c, uint64_t upto, char *err);

/* A leader with --ckpt-async: the writer thread applies retention up to upto
 * (tckpt_async_retain); tckpt_async_quiesce waits until it has. */
void tckpt_async_retain(struct tckpt *c, uint64_t upto);
void tckpt_async_quiesce(struct tckpt *c);

/* checkpoint_buddy.c, for a store on each host (tckpt_opts.per_host).
 * Collective: this rank's buddy (it takes our shard) and ward (we take
 * its), the ranks with our local number on the next and previous host. */
int tckpt_pair_ranks(struct tckpt *c, char *err);
/* The snapshot writer's thread, after writing its own shard of step (ok:
 * it did): the shard to the buddy, the ward's into this host's store. Both
 * of a pair always take part. */
int tckpt_buddy_copy(struct tckpt *c, uint64_t step, int ok, char *err);
/* Collective, at open: every host's store is given what it lacks of the
 * newest step some host committed (what cannot be given is said, and the
 * resume then fails that step). -1 only when the collectives fail. */
int tckpt_complete_hosts(struct tckpt *c, char *err);

#endif
