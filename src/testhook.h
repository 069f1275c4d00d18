/*
 * testhook.h - hooks the test suites use to put a rank at a known point,
 * so that tests never depend on how fast a machine is. Each hook is inert
 * unless its environment variable is set, and only fsdp-super's --chaos
 * (a test option) or a test sets it; a production launch never does, and
 * fsdp-super clears them in every launch's environment unless it means
 * them.
 *
 *   FSDP_TEST_HOLD_AT=STEP   testhook_hold: a rank that has finished a step
 *                            >= STEP (once per process) announces phase
 *                            "hold" in a heartbeat at once and waits there,
 *                            heartbeats flowing, until a signal decides:
 *                            SIGKILL and SIGSTOP do what they do, SIGUSR1
 *                            (preemption) lets it go on into the usual
 *                            emergency-checkpoint agreement. fsdp-super sets
 *                            it a few steps past its next fault's step, so
 *                            even a run that could finish between two
 *                            heartbeats waits for that fault. Every chaos
 *                            fault ends the launch, so a hold is never
 *                            released otherwise; a hold the supervisor forgot
 *                            looks like a hang (no progress) and is treated
 *                            as one.
 *
 *   FSDP_TEST_STOP_AT=POINT:N  testhook_stop: the process stops itself
 *                            (SIGSTOP) at POINT of its N-th save (":N"
 *                            left out: the first), so that a test can
 *                            SIGKILL or SIGCONT the whole job at a moment
 *                            it knows. The points (src/checkpoint.c):
 *                              shard-chunk    the first chunk of this rank's
 *                                             shard is written
 *                              before-commit  rank 0: every shard durable,
 *                                             the manifest not yet written
 *                              fence-checked  rank 0: its generation still
 *                                             the store's, the manifest not
 *                                             yet written
 *                              after-commit   rank 0: the manifest written,
 *                                             retention not yet applied
 *                            tests/ and recovery/chaos.c name them.
 *
 *   FSDP_TEST_OVERFLOW_AT=STEP:RANK  testhook_overflow: rank RANK's
 *                            gradient shard gets an infinity at step STEP
 *                            (1-based), after its reduction and before the
 *                            norm, as a scaled fp16 gradient that overflowed
 *                            on that rank alone.
 */
#ifndef FSDP_TESTHOOK_H
#define FSDP_TESTHOOK_H

#include <stdint.h>

/* Called by the training loop once step `done` (1-based) has finished and
 * the heartbeat says so. Returns at once unless FSDP_TEST_HOLD_AT is set. */
void testhook_hold(uint64_t done);

/* FSDP_TEST_STOP_AT: testhook_save_begins(n) says that this process's n-th
 * save (1 for the first) is under way; testhook_stop(point) stops the
 * process there if the variable names point and that save. Both return at
 * once when it is unset; testhook_stop may be called from any thread (an
 * async save's writer). */
void testhook_save_begins(int nth);
void testhook_stop(const char *point);

/* FSDP_TEST_OVERFLOW_AT: 1 when this rank's gradient at step (1-based)
 * is to overflow, else 0 (at once when it is unset). */
int testhook_overflow(uint64_t step, int rank);

#endif
