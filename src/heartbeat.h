/*
 * heartbeat.h - a rank's side of the supervisor protocol.
 *
 * When fsdp-super launches the job it sets FSDP_SUPER_ADDR (IPv4:PORT) and
 * FSDP_GENERATION. A background thread then sends one heartbeat datagram
 * every 250 ms (the format is hbmsg.h's, shared with the supervisor).
 * PROGRESS is a counter the training thread bumps at every unit of work (a
 * unit's forward or backward, a checkpoint chunk); the supervisor calls a
 * rank hung when its datagrams stop (a stopped process) or its counter
 * stops moving (a rank stuck in a collective). Long saves and loads bump
 * the counter per chunk, so they are never mistaken for hangs.
 *
 * A malformed FSDP_GENERATION (anything but digits for 1..2^63-1) or
 * FSDP_SUPER_ADDR makes hb_start fail with a message (the trainer exits 2):
 * a rank that ran unfenced or unwatched by mistake could overwrite a newer
 * generation's checkpoint.
 *
 * SIGUSR1 asks for an emergency checkpoint (preemption): hb_preempted()
 * turns true and the trainer checkpoints at the next step boundary.
 */
#ifndef FSDP_HEARTBEAT_H
#define FSDP_HEARTBEAT_H

#include "hbmsg.h"
#include "testhook.h" /* the training loop's hold is a heartbeat phase */

#include <stdint.h>

/* Reads the launch's environment and starts the thread if FSDP_SUPER_ADDR
 * is set; -1 with err (ERR_LEN) on a malformed value. */
int hb_start(int rank, char *err);
/* Stops the thread at once (it is woken, not waited for) and sends the
 * last state. */
void hb_stop(void);
void hb_set(uint64_t step, enum hb_phase phase);
void hb_progress(void);
/* An event for the supervisor's log: "NAME key=value ...", hbmsg.h's
 * grammar (the supervisor drops anything else). */
void hb_event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sends the current state at once (the test hold announces itself). */
void hb_flush(void);
int hb_preempted(void);
/* The launch's generation (FSDP_GENERATION, read by hb_start), 0 outside
 * the supervisor. */
uint64_t hb_generation(void);

#endif
