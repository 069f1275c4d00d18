/*
 * heartbeat.h - a rank's side of the supervisor protocol.
 *
 * When fsdp-super launches the job it sets FSDP_SUPER_ADDR (127.0.0.1:PORT)
 * and FSDP_GENERATION. A background thread then sends one UDP datagram
 * every 250 ms: "fsdp-hb GEN RANK PID STEP PHASE PROGRESS". PROGRESS is a
 * counter the training thread bumps at every unit of work (a unit's
 * forward or backward, a checkpoint chunk); the supervisor calls a rank
 * hung when its datagrams stop (a stopped process) or its counter stops
 * moving (a rank stuck in a collective). Long saves and loads bump the
 * counter per chunk, so they are never mistaken for hangs.
 *
 * SIGUSR1 asks for an emergency checkpoint (preemption): hb_preempted()
 * turns true and the trainer checkpoints at the next step boundary.
 */
#ifndef FSDP_HEARTBEAT_H
#define FSDP_HEARTBEAT_H

#include <stdint.h>

enum hb_phase { HB_START, HB_TRAIN, HB_SAVE, HB_LOAD, HB_DONE, HB_PREEMPTED };

/* Starts the thread if FSDP_SUPER_ADDR is set; harmless otherwise. */
void hb_start(int rank);
void hb_stop(void);
void hb_set(uint64_t step, enum hb_phase phase);
void hb_progress(void);
/* An event for the supervisor's log: "fsdp-ev GEN RANK TEXT". */
void hb_event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sends the current state at once (before exiting). */
void hb_flush(void);
int hb_preempted(void);
/* The launch's generation (FSDP_GENERATION), 0 outside the supervisor. */
uint64_t hb_generation(void);

#endif
