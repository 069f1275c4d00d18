/*
 * progress.h - progress of long fsdp-ckpt work (verify, cp, reshard,
 * export, import), read off a store's byte counter (storage.h: updated
 * atomically by every read or write) by a thread of its own, so the work
 * itself carries no hooks. On a terminal, a bar redrawn ten times a second;
 * otherwise a quiet line after 5 s and then every 10 s (logs stay short and
 * quick runs print nothing). Bytes done, rate, and time left when the total
 * is known. FSDP_PROGRESS=0 turns it off; FSDP_PROGRESS_AFTER=S shows it
 * after S seconds (default 0.5 on a terminal, 5 otherwise).
 */
#ifndef FSDP_PROGRESS_H
#define FSDP_PROGRESS_H

#include <pthread.h>
#include <stdint.h>

struct progress {
    const char *label;
    const uint64_t *counter; /* read atomically */
    uint64_t base, total;    /* the counter at the start; bytes expected (0: unknown) */
    int tty, on, stop, shown;
    double t0, after;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

void progress_start(struct progress *p, const char *label, const uint64_t *counter, uint64_t total);
/* Erases the bar from its line (a terminal's), so that a line printed next
 * starts clean; the next redraw comes on the line after. */
void progress_clear(struct progress *p);
/* Ends the thread; a terminal's bar gets its final state and a newline. */
void progress_stop(struct progress *p);

#endif
