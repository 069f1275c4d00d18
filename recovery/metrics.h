/*
 * metrics.h - fsdp-super's Prometheus endpoint (--metrics HOST:PORT): GET
 * /metrics answers the text exposition format (version 0.0.4), served by
 * libmicrohttpd on a thread of its own. The supervisor's loop renders the
 * text (report.c: super_render_metrics) and publishes it here; the server
 * thread only copies the latest text out, under a mutex. Anything but GET
 * /metrics is 404 (405 for another method on /metrics). One request a
 * connection, its head within 3 s and the whole connection within 10 s:
 * slow clients cannot lock a scrape out (metrics.c).
 */
#ifndef FSDP_METRICS_H
#define FSDP_METRICS_H

#include <stddef.h>

struct metrics;

/* Listens on addr, a numeric "IPv4:PORT" or "[IPv6]:PORT"; NULL with err on
 * a malformed address or a port that cannot be bound. */
struct metrics *metrics_start(const char *addr, char *err, size_t errlen);
/* The text the next scrape gets (copied). */
void metrics_publish(struct metrics *m, const char *text, size_t len);
void metrics_stop(struct metrics *m);

/* Appends printf-style text at buf + *len (never past n). */
void metrics_put(char *buf, size_t n, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The cumulative buckets of a Prometheus histogram of seconds. */
#define METRICS_NBUCKETS 12
extern const double metrics_buckets[METRICS_NBUCKETS];
struct histogram {
    unsigned long long count[METRICS_NBUCKETS + 1]; /* the last: +Inf */
    double sum;
};
void histogram_observe(struct histogram *h, double v);
/* Appends NAME_bucket{le=...}, NAME_sum and NAME_count lines to buf. */
void histogram_render(const struct histogram *h, const char *name, char *buf, size_t n,
                      size_t *len);

#endif
