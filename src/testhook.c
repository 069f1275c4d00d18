/*
 * testhook.c - the test hooks of testhook.h. Why this is safe in
 * production: every hook reads its environment variable once and does
 * nothing when it is unset; a malformed value is reported once and
 * ignored (a test that set it will then fail on its own assertions).
 */
#include "testhook.h"

#include "heartbeat.h"

#include <pthread.h>
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
