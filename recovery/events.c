/*
 * events.c - the supervisor's event log: one JSON object per line,
 * {"t": seconds since the epoch, "event": NAME, ...}, flushed as written.
 */
#include "super.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static FILE *events;

double super_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ev_open(const char *path)
{
    if (path)
        events = fopen(path, "a");
    if (path && !events)
        fprintf(stderr, "fsdp-super: cannot open %s for events; going on without\n", path);
}

void ev_close(void)
{
    if (events)
        fclose(events);
    events = NULL;
}

void ev_emit(const char *event, const char *fmt, ...)
{
    if (!events)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(events, "{\"t\":%.3f,\"event\":\"%s\"", (double)ts.tv_sec + ts.tv_nsec * 1e-9, event);
    if (fmt && *fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputc(',', events);
        vfprintf(events, fmt, ap);
        va_end(ap);
    }
    fputs("}\n", events);
    fflush(events);
}
