/*
 * progress.c - see progress.h.
 */
#include "progress.h"

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void human(double b, char *out, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4)
        b /= 1024, i++;
    snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void show(struct progress *p, int final)
{
    uint64_t done = __atomic_load_n(p->counter, __ATOMIC_RELAXED) - p->base;
    double secs = fsdp_now() - p->t0, rate = secs > 0 ? (double)done / secs : 0;
    char d[32], t[32], r[32], left[48] = "";
    human((double)done, d, sizeof d);
    human((double)p->total, t, sizeof t);
    human(rate, r, sizeof r);
    double frac = p->total ? (double)done / (double)p->total : 0;
    frac = frac > 1 ? 1 : frac;
    if (p->total && rate > 0 && !final)
        snprintf(left, sizeof left, ", %.0f s left",
                 (double)(p->total > done ? p->total - done : 0) / rate);
    if (p->tty) {
        char bar[31];
        int fill = (int)(frac * 30);
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        if (p->total)
            fprintf(stderr, "\r%s [%s] %3.0f%% %s of %s, %s/s%s\033[K", p->label, bar, 100 * frac,
                    d, t, r, left);
        else
            fprintf(stderr, "\r%s %s, %s/s\033[K", p->label, d, r);
        if (final)
            fputc('\n', stderr);
    } else if (p->total) {
        fprintf(stderr, "fsdp-ckpt: %s: %s of %s (%.0f%%), %s/s%s\n", p->label, d, t, 100 * frac, r,
                left);
    } else {
        fprintf(stderr, "fsdp-ckpt: %s: %s, %s/s\n", p->label, d, r);
    }
    p->shown = 1;
}

static void *run(void *arg)
{
    struct progress *p = arg;
    double next = p->t0 + p->after; /* quick work prints nothing */
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        if (!p->stop && fsdp_now() >= next) {
            show(p, 0);
            next = fsdp_now() + (p->tty ? 0.1 : 10.0);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void progress_start(struct progress *p, const char *label, const uint64_t *counter, uint64_t total)
{
    memset(p, 0, sizeof *p);
    const char *env = getenv("FSDP_PROGRESS");
    p->on = !(env && strcmp(env, "0") == 0);
    if (!p->on)
        return;
    p->label = label;
    p->counter = counter;
    p->base = __atomic_load_n(counter, __ATOMIC_RELAXED);
    p->total = total;
    p->tty = isatty(STDERR_FILENO);
    const char *after = getenv("FSDP_PROGRESS_AFTER"); /* seconds before the first show */
    double a;
    p->after = after && fsdp_parse_f64(after, &a) == 0 && a >= 0 && a < 1e6 ? a
               : p->tty                                                     ? 0.5
                                                                            : 5.0;
    p->t0 = fsdp_now();
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, run, p)) {
        p->on = 0; /* no progress: the work goes on */
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
}

void progress_clear(struct progress *p)
{
    if (!p->on || !p->tty)
        return;
    pthread_mutex_lock(&p->mu);
    if (p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    pthread_mutex_unlock(&p->mu);
}

void progress_stop(struct progress *p)
{
    if (!p->on)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    if (p->tty && (p->shown || fsdp_now() - p->t0 >= p->after))
        show(p, 1);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    p->on = 0;
}
