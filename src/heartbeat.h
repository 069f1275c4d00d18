/*
 * heartbeat.h - a rank's side of the supervisor protocol.
 *
 * When fsdp-super launches the job it sets, in the launch's environment
 * (never on a command line):
 *   FSDP_SUPER_ADDR       where it listens: HOST:PORT or [V6]:PORT, HOST a
 *                         name or an address, resolved here (getaddrinfo,
 *                         IPv4 or IPv6)
 *   FSDP_SUPER_TOKEN      the launch's secret (64 hex digits): every
 *                         datagram either way is sealed with an HMAC keyed
 *                         by it (hbmsg.h); it is never printed
 *   FSDP_SUPER_SILENCE_S  how long a rank may go without hearing from the
 *                         supervisor before it stops itself (default 120)
 *   FSDP_GENERATION       the launch's generation (fencing)
 * A background thread then sends one heartbeat datagram every 250 ms (the
 * format is hbmsg.h's, shared with the supervisor) carrying this host's
 * name and the process's pid: the rank's identity is (host, pid), since a
 * pid means nothing on another host. PROGRESS is a counter the training
 * thread bumps at every unit of work (a unit's forward or backward, a
 * checkpoint chunk); the supervisor calls a rank hung when its datagrams
 * stop (a stopped process, a lost host) or its counter stops moving (a
 * rank stuck in a collective). Long saves and loads bump the counter per
 * chunk, so they are never mistaken for hangs.
 *
 * The supervisor answers every heartbeat with a sealed control datagram
 * (hbmsg.h's fsdp-ctl) that echoes the heartbeat's SEQ: "ack", or an order
 * the rank carries out on itself - "preempt" (an emergency checkpoint, as
 * SIGUSR1), "stop" and "kill" (raise SIGSTOP / SIGKILL: chaos faults on a
 * rank the supervisor cannot signal, being on another host). An answer
 * counts only if it echoes one of this process's last 64 datagrams, so an
 * old one replayed proves nothing. A rank that has heard no answer to
 * anything it sent in the last FSDP_SUPER_SILENCE_S seconds (the
 * supervisor was killed, or its host is cut off) prints one line,
 *   fsdp-train: rank R: lost contact with fsdp-super at ADDR for N s: stopping
 * and exits with status 3 at once, from the heartbeat thread, committing
 * nothing: a new supervisor relaunches the job under a new generation.
 *
 * A malformed FSDP_GENERATION (anything but digits for 1..2^63-1),
 * FSDP_SUPER_ADDR, FSDP_SUPER_TOKEN or FSDP_SUPER_SILENCE_S makes hb_start
 * fail with a message (the trainer exits 2): a rank that ran unfenced or
 * unwatched by mistake could overwrite a newer generation's checkpoint.
 * Without FSDP_SUPER_ADDR (an unsupervised run) nothing of this runs.
 *
 * SIGUSR1 asks for an emergency checkpoint (preemption) too: hb_preempted()
 * turns true and the trainer checkpoints at the next step boundary. It is
 * taken by a thread of its own, never by a thread that computes (see
 * hb_catch_preemption).
 */
#ifndef FSDP_HEARTBEAT_H
#define FSDP_HEARTBEAT_H

#include "hbmsg.h"

#include <stdint.h>

#define HB_LOST_CONTACT_EXIT 3 /* the exit status of a rank that lost its supervisor */

/* Blocks SIGUSR1 in the calling thread, and so in every thread it starts
 * from now on, and starts the one thread that waits for it (sigwait) and
 * sets the preemption flag. Call first thing in main, before MPI and
 * OpenMP start their threads. Why not a handler: a handler runs on
 * whichever thread the signal lands on, with that thread's stack pointer,
 * and oneDNN's JIT f32 sgemm for AVX-512 (Debian 12's 2.6.3; fixed in
 * oneDNN 3.11.2, its issue 4845) points the stack pointer into the heap
 * while it computes: the handler's frame is written over malloc's chunks
 * and a later free aborts ("corrupted size vs. prev_size"). Threads that
 * started before main (a pthreads OpenBLAS's pool) get a handler that only
 * sets the flag: they run no oneDNN kernel. -1 with err when the thread
 * cannot start. */
int hb_catch_preemption(char *err);
/* Reads the launch's environment and starts the thread if FSDP_SUPER_ADDR
 * is set; -1 with err (FSDP_ERR_LEN) on a malformed value. */
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
