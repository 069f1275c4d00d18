/*
 * testhook.c - the test hooks of testhook.h. Why this is safe in
 * production: every hook reads its environment variable once and does
 * nothing when it is unset. A malformed FSDP_TEST_HOLD_AT is reported once
 * and ignored; a FSDP_TEST_STOP_AT whose point is too long to be one is
 * ignored, and an N that is not a number matches no save (a test that set
 * either will then fail on its own assertions).
 */
#include "testhook.h"

#include "heartbeat.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t hold_at; /* 0: no hold */
static int held;

static void hold_init(void)
{
    const char *v = getenv("FSDP_TEST_HOLD_AT");
    if (v && hbmsg_parse_uint(v, strlen(v), UINT64_MAX, &hold_at))
        fprintf(stderr, "fsdp-train: test hook: FSDP_TEST_HOLD_AT is not a step; ignored\n");
}

void testhook_hold(uint64_t done)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hold_init);
    if (!hold_at || held || done < hold_at || hb_preempted())
        return;
    held = 1;
    hb_set(done, HB_HOLD);
    hb_flush();
    const struct timespec nap = {0, 10 * 1000 * 1000};
    while (!hb_preempted())
        nanosleep(&nap, NULL);
    hb_set(done, HB_TRAIN);
}

static char stop_point[32]; /* "": no stop */
static int stop_nth;
static int current_save; /* set by the trainer's thread before it hands a save on */

static void stop_init(void)
{
    const char *s = getenv("FSDP_TEST_STOP_AT");
    if (!s)
        return;
    const char *colon = strchr(s, ':');
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    if (n >= sizeof stop_point)
        return;
    memcpy(stop_point, s, n);
    stop_point[n] = 0;
    stop_nth = colon ? atoi(colon + 1) : 1;
}

void testhook_save_begins(int nth) { current_save = nth; }

void testhook_stop(const char *point)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, stop_init);
    if (stop_point[0] && current_save == stop_nth && strcmp(point, stop_point) == 0) {
        fprintf(stderr, "fsdp-train: test hook: stopping at %s of save %d\n", point, current_save);
        raise(SIGSTOP);
    }
}

static uint64_t overflow_step; /* 0: none */
static uint64_t overflow_rank;

static void overflow_init(void)
{
    const char *v = getenv("FSDP_TEST_OVERFLOW_AT"), *colon = v ? strchr(v, ':') : NULL;
    if (!v)
        return;
    if (!colon || hbmsg_parse_uint(v, (size_t)(colon - v), UINT64_MAX, &overflow_step) ||
        hbmsg_parse_uint(colon + 1, strlen(colon + 1), INT32_MAX, &overflow_rank)) {
        overflow_step = 0;
        fprintf(stderr, "fsdp-train: test hook: FSDP_TEST_OVERFLOW_AT is not STEP:RANK; ignored\n");
    }
}

int testhook_overflow(uint64_t step, int rank)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, overflow_init);
    return overflow_step && step == overflow_step && (uint64_t)rank == overflow_rank;
}
