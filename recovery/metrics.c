/*
 * metrics.c - see metrics.h.
 */
#include "metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

const double metrics_buckets[METRICS_NBUCKETS] = {0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                                  5,    10,  30,   60,  120, 300};

struct metrics {
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    char *text;
    size_t len;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *body,
                              size_t *body_len, void **state)
{
    (void)version, (void)body, (void)body_len, (void)state;
    struct metrics *m = cls;
    struct MHD_Response *r;
    unsigned code = MHD_HTTP_OK;
    if (strcmp(url, "/metrics") != 0) {
        static const char nf[] = "not found: fsdp-super serves /metrics\n";
        code = MHD_HTTP_NOT_FOUND;
        r = MHD_create_response_from_buffer(sizeof nf - 1, (void *)nf, MHD_RESPMEM_PERSISTENT);
    } else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static const char na[] = "only GET\n";
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
        r = MHD_create_response_from_buffer(sizeof na - 1, (void *)na, MHD_RESPMEM_PERSISTENT);
    } else {
        pthread_mutex_lock(&m->mu);
        r = MHD_create_response_from_buffer(m->len, m->text ? m->text : (char *)"",
                                            MHD_RESPMEM_MUST_COPY);
        pthread_mutex_unlock(&m->mu);
    }
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type",
                            code == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8"
                                                : "text/plain");
    enum MHD_Result rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return rc;
}

struct metrics *metrics_start(const char *addr, char *err, size_t errlen)
{
    char host[256], port[16];
    const char *colon = strrchr(addr, ':'), *h = addr;
    size_t hl = colon ? (size_t)(colon - addr) : 0;
    if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') { /* [IPv6]:PORT */
        h++;
        hl -= 2;
    }
    char *end = NULL;
    long pn = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || hl == 0 || hl >= sizeof host || !end || *end || end == colon + 1 || pn < 1 ||
        pn > 65535) {
        snprintf(err, errlen, "--metrics '%s': want IPV4:PORT or [IPV6]:PORT, PORT in 1..65535",
                 addr);
        return NULL;
    }
    memcpy(host, h, hl);
    host[hl] = 0;
    snprintf(port, sizeof port, "%ld", pn);
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
                             .ai_socktype = SOCK_STREAM},
                    *ai;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g) {
        snprintf(err, errlen, "--metrics '%s': %s (a numeric address and port)", addr,
                 gai_strerror(g));
        return NULL;
    }
    struct metrics *m = calloc(1, sizeof *m);
    if (!m) {
        freeaddrinfo(ai);
        snprintf(err, errlen, "--metrics: out of memory");
        return NULL;
    }
    pthread_mutex_init(&m->mu, NULL);
    /* no MHD_USE_ERROR_LOG: a client's oversized request must not write to
     * the supervisor's stderr (it gets its 413/414 all the same) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    m->d = MHD_start_daemon(flags, 0, NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!m->d) {
        snprintf(err, errlen,
                 "--metrics '%s': cannot listen there (in use, or not an address "
                 "of this host)",
                 addr);
        pthread_mutex_destroy(&m->mu);
        free(m);
        return NULL;
    }
    return m;
}

void metrics_publish(struct metrics *m, const char *text, size_t len)
{
    char *copy = malloc(len + 1);
    if (!copy)
        return; /* the previous text stays */
    memcpy(copy, text, len);
    copy[len] = 0;
    pthread_mutex_lock(&m->mu);
    char *old = m->text;
    m->text = copy;
    m->len = len;
    pthread_mutex_unlock(&m->mu);
    free(old);
}

void metrics_stop(struct metrics *m)
{
    if (!m)
        return;
    MHD_stop_daemon(m->d);
    pthread_mutex_destroy(&m->mu);
    free(m->text);
    free(m);
}

void histogram_observe(struct histogram *h, double v)
{
    for (int i = 0; i < METRICS_NBUCKETS; i++)
        if (v <= metrics_buckets[i])
            h->count[i]++;
    h->count[METRICS_NBUCKETS]++;
    h->sum += v;
}

void metrics_put(char *buf, size_t n, size_t *len, const char *fmt, ...)
{
    if (*len >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *len, n - *len, fmt, ap);
    va_end(ap);
    *len += w > 0 ? (size_t)w : 0;
    if (*len > n)
        *len = n;
}

void histogram_render(const struct histogram *h, const char *name, char *buf, size_t n, size_t *len)
{
    for (int i = 0; i < METRICS_NBUCKETS; i++)
        metrics_put(buf, n, len, "%s_bucket{le=\"%g\"} %llu\n", name, metrics_buckets[i],
                    h->count[i]);
    metrics_put(buf, n, len, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                h->count[METRICS_NBUCKETS], name, h->sum, name, h->count[METRICS_NBUCKETS]);
}
