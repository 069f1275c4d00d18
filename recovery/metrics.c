/*
 * metrics.c - see metrics.h.
 *
 * Slow clients. libmicrohttpd's connection timeout is an idle timeout:
 * a client that sends one header line every few seconds and never the
 * blank line that ends its request head keeps its connection for ever,
 * and 16 of them (the old connection limit) locked every real scrape out.
 * So each connection is tracked from its accept (libmicrohttpd's connection
 * notifications): its request head must be complete within METRICS_HEAD_S
 * and the whole connection over within METRICS_LIFE_S (one request a
 * connection: every answer says Connection: close), else a watchdog thread
 * shuts its socket down and libmicrohttpd closes it; and when
 * METRICS_MAX_PENDING connections are still sending their heads, a new one
 * cuts the oldest of them at once, so that however many slow clients come,
 * a scrape (whose head arrives in one packet) is always let in and served.
 *
 * shutdown() of a connection's socket from the watchdog is safe because
 * libmicrohttpd sends its closed notification, which takes the
 * connection off the list under conn_mu, before it closes the socket: a
 * socket on the list is always still the connection's.
 */
#include "metrics.h"

#include "util.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define METRICS_MAX_CONN    64u  /* connections at once */
#define METRICS_MAX_PENDING 32   /* of them still sending a request head */
#define METRICS_HEAD_S      3.0  /* to send a whole request head */
#define METRICS_LIFE_S      10.0 /* a connection's whole life */
#define METRICS_WATCH_MS    200  /* how often the watchdog looks */

const double metrics_buckets[METRICS_NBUCKETS] = {0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                                  5,    10,  30,   60,  120, 300};

/* One connection, from its accept to its close. */
struct conn {
    int fd;
    double start;
    int head_done; /* its request head arrived */
    int cut;       /* its socket was shut down */
    struct conn *prev, *next;
};

struct metrics {
    struct MHD_Daemon *d;
    pthread_mutex_t mu; /* the text */
    char *text;
    size_t len;
    /* the connections, oldest first, and the watchdog */
    pthread_mutex_t conn_mu;
    pthread_cond_t wake;
    struct conn *head, *tail;
    int pending; /* not cut and still sending a head */
    int stopping, watching;
    pthread_t watchdog;
};

/* ---- slow clients ------------------------------------------------------------------ */

static void conn_cut(struct metrics *m, struct conn *k)
{
    if (k->cut)
        return;
    shutdown(k->fd, SHUT_RDWR); /* libmicrohttpd reads its end and closes it */
    k->cut = 1;
    if (!k->head_done)
        m->pending--;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct metrics *m = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct conn *k = ci ? calloc(1, sizeof *k) : NULL;
        *socket_context = k;
        if (!k)
            return; /* untracked: only the idle timeout bounds it */
        k->fd = ci->connect_fd;
        k->start = fsdp_now();
        pthread_mutex_lock(&m->conn_mu);
        for (struct conn *o = m->head; o && m->pending >= METRICS_MAX_PENDING; o = o->next)
            if (!o->cut && !o->head_done)
                conn_cut(m, o);
        k->prev = m->tail;
        if (m->tail)
            m->tail->next = k;
        else
            m->head = k;
        m->tail = k;
        m->pending++;
        pthread_mutex_unlock(&m->conn_mu);
        return;
    }
    struct conn *k = *socket_context;
    if (!k)
        return;
    pthread_mutex_lock(&m->conn_mu);
    if (!k->cut && !k->head_done)
        m->pending--;
    if (k->prev)
        k->prev->next = k->next;
    else
        m->head = k->next;
    if (k->next)
        k->next->prev = k->prev;
    else
        m->tail = k->prev;
    pthread_mutex_unlock(&m->conn_mu);
    free(k);
    *socket_context = NULL;
}

/* The request head of c is in: its connection is no longer pending. */
static void head_done(struct metrics *m, struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct conn *k = ci ? ci->socket_context : NULL;
    if (!k)
        return;
    pthread_mutex_lock(&m->conn_mu);
    if (!k->head_done && !k->cut)
        m->pending--;
    k->head_done = 1;
    pthread_mutex_unlock(&m->conn_mu);
}

/* Cuts every connection past its time, every METRICS_WATCH_MS. */
static void *watchdog(void *arg)
{
    struct metrics *m = arg;
    pthread_mutex_lock(&m->conn_mu);
    while (!m->stopping) {
        double now = fsdp_now();
        for (struct conn *k = m->head; k; k = k->next)
            if (now - k->start > (k->head_done ? METRICS_LIFE_S : METRICS_HEAD_S))
                conn_cut(m, k);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += METRICS_WATCH_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&m->wake, &m->conn_mu, &ts);
    }
    pthread_mutex_unlock(&m->conn_mu);
    return NULL;
}

static int watchdog_start(struct metrics *m)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a))
        return -1;
    int rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) || pthread_cond_init(&m->wake, &a);
    pthread_condattr_destroy(&a);
    if (rc)
        return -1;
    pthread_mutex_init(&m->conn_mu, NULL);
    if (pthread_create(&m->watchdog, NULL, watchdog, m)) {
        pthread_cond_destroy(&m->wake);
        pthread_mutex_destroy(&m->conn_mu);
        return -1;
    }
    m->watching = 1;
    return 0;
}

static void watchdog_stop(struct metrics *m)
{
    if (!m->watching)
        return;
    pthread_mutex_lock(&m->conn_mu);
    m->stopping = 1;
    pthread_cond_signal(&m->wake);
    pthread_mutex_unlock(&m->conn_mu);
    pthread_join(m->watchdog, NULL);
    m->watching = 0;
}

/* ---- the endpoint -------------------------------------------------------------------- */

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *body,
                              size_t *body_len, void **state)
{
    (void)version, (void)body, (void)body_len, (void)state;
    struct metrics *m = cls;
    head_done(m, c);
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
    MHD_add_response_header(r, "Connection", "close"); /* one request a connection */
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
    if (watchdog_start(m)) {
        freeaddrinfo(ai);
        snprintf(err, errlen, "--metrics: cannot start a thread");
        pthread_mutex_destroy(&m->mu);
        free(m);
        return NULL;
    }
    /* no MHD_USE_ERROR_LOG: a client's oversized request must not write to
     * the supervisor's stderr (it gets its 413/414 all the same) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    m->d = MHD_start_daemon(flags, 0, NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, METRICS_MAX_CONN,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_LIFE_S,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, m, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!m->d) {
        snprintf(err, errlen,
                 "--metrics '%s': cannot listen there (in use, or not an address "
                 "of this host)",
                 addr);
        metrics_stop(m);
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
    watchdog_stop(m);
    if (m->d)
        MHD_stop_daemon(m->d); /* every connection's closed notification */
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->conn_mu);
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
