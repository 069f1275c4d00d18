/*
 * heartbeat.c - the heartbeat thread, the supervisor's answers and the
 * preemption flag.
 *
 * The thread sends a heartbeat every 250 ms and in between waits in poll()
 * on its socket (the supervisor's answers) and on an eventfd that hb_stop
 * writes, so hb_stop wakes it and joins at once. The state it reads (step,
 * phase, progress, running, the socket) is atomic: the training thread
 * writes it without a lock on every unit of work.
 *
 * Freshness of an answer: every datagram sent takes the next SEQ and notes
 * its send time in a ring of the last 64 (a tiny seqlock per slot, since
 * the training thread sends events and the last beat too). An answer
 * echoing SEQ s proves the supervisor was alive after s was sent, so
 * contact is the send time of the newest datagram answered; anything that
 * echoes a SEQ no longer in the ring is ignored.
 */
#include "heartbeat.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define BEAT_S          0.25
#define RING            64
#define DEFAULT_SILENCE 120.0

static struct {
    atomic_int fd, running;
    int wake; /* eventfd: hb_stop -> the thread */
    int rank;
    struct sockaddr_storage to;
    socklen_t tolen;
    char addr[300]; /* FSDP_SUPER_ADDR as given, for the lost-contact line */
    char host[HBMSG_HOST_LEN];
    struct hbmsg_key key;
    double silence_s;
    double contact; /* the thread's own: the newest send time answered (fsdp_now) */
    _Atomic uint64_t seq;
    struct {
        _Atomic uint64_t seq;
        _Atomic double at; /* fsdp_now() when sent */
    } sent[RING];
    pthread_t thread;
    _Atomic uint64_t step, progress;
    _Atomic int phase;
    uint64_t generation;
} hb = {.fd = -1, .wake = -1};

static atomic_int preempt_requested;

static sigset_t preempt_signals; /* SIGUSR1 */

/* For threads that started before main (a pthreads OpenBLAS starts its
 * pool in a constructor) and so do not block SIGUSR1: they never run
 * oneDNN's kernels, and the flag is all this does. */
static void on_usr1(int sig)
{
    (void)sig;
    atomic_store(&preempt_requested, 1);
}

static void *preempt_main(void *arg)
{
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&preempt_signals, &sig) == 0 && sig == SIGUSR1)
            atomic_store(&preempt_requested, 1);
    }
    return NULL;
}

int hb_catch_preemption(char *err)
{
    sigemptyset(&preempt_signals);
    sigaddset(&preempt_signals, SIGUSR1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    pthread_t t;
    pthread_attr_t a;
    int rc = pthread_sigmask(SIG_BLOCK, &preempt_signals, NULL);
    if (!rc && !(rc = pthread_attr_init(&a))) {
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&t, &a, preempt_main, NULL);
        pthread_attr_destroy(&a);
    }
    return rc ? fsdp_err(err, "cannot start the thread that takes SIGUSR1: %s", strerror(rc)) : 0;
}

int hb_preempted(void) { return atomic_load(&preempt_requested) != 0; }

/* ---- the launch's environment ------------------------------------------------ */

/* Names a bad environment value without echoing bytes that could upset a
 * terminal. Never used for the token. */
static int bad_env(char *err, const char *name, const char *v, const char *want)
{
    int printable = strlen(v) <= 64;
    for (const char *p = v; *p && printable; p++)
        printable = *p >= 0x20 && *p < 0x7f;
    return fsdp_err(err, "%s='%s' is not %s (fsdp-super sets it; unset it to train unsupervised)",
                    name, printable ? v : "...", want);
}

uint64_t hb_generation(void) { return hb.generation; }

/* FSDP_SUPER_ADDR into hb.to and a socket of its family; -1 with err. */
static int resolve(const char *addr, int *fd, char *err)
{
    char host[256], port[8];
    int p;
    if (hbmsg_parse_addr(addr, 0, host, sizeof host, &p) || p <= 0)
        return bad_env(err, "FSDP_SUPER_ADDR", addr,
                       "a host and port (HOST:PORT, A.B.C.D:PORT or [V6]:PORT)");
    snprintf(port, sizeof port, "%d", p);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_DGRAM,
                             .ai_flags = AI_NUMERICSERV},
                    *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc)
        return fsdp_err(err, "cannot resolve FSDP_SUPER_ADDR=%s (fsdp-super's address): %s", addr,
                        gai_strerror(rc));
    *fd = -1;
    for (struct addrinfo *a = res; a && *fd < 0; a = a->ai_next) {
        if (a->ai_addrlen > sizeof hb.to)
            continue;
        *fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (*fd >= 0) {
            memcpy(&hb.to, a->ai_addr, a->ai_addrlen);
            hb.tolen = a->ai_addrlen;
        }
    }
    int e = errno;
    freeaddrinfo(res);
    if (*fd < 0)
        return fsdp_err(err, "no socket for FSDP_SUPER_ADDR=%s: %s", addr, strerror(e));
    return 0;
}

static int read_silence(char *err)
{
    const char *v = getenv("FSDP_SUPER_SILENCE_S");
    double s = DEFAULT_SILENCE;
    if (v) {
        char *end;
        s = (*v >= '0' && *v <= '9') ? strtod(v, &end) : -1;
        if (s < 0 || *end || !(s >= 0.5 && s <= 1e6))
            return bad_env(err, "FSDP_SUPER_SILENCE_S", v, "seconds in 0.5..1e6");
    }
    hb.silence_s = s;
    return 0;
}

/* ---- sending -------------------------------------------------------------------- */

/* Seals a formatted body with the next SEQ, notes when, and sends it. */
static void send_body(int fd, const char *body, int n)
{
    if (fd < 0 || n <= 0)
        return;
    uint64_t seq = atomic_fetch_add(&hb.seq, 1) + 1;
    char dgram[HBMSG_DGRAM_MAX + 1];
    int len = hbmsg_seal(dgram, sizeof dgram, &hb.key, hb.host, seq, body, (size_t)n);
    if (len < 0)
        return;
    __typeof__(hb.sent[0]) *slot = &hb.sent[seq % RING];
    atomic_store(&slot->seq, 0);
    atomic_store(&slot->at, fsdp_now());
    atomic_store(&slot->seq, seq);
    sendto(fd, dgram, (size_t)len, MSG_DONTWAIT, (struct sockaddr *)&hb.to, hb.tolen);
}

/* When datagram seq was sent, or -1 if it is not one of the last RING. */
static double sent_at(uint64_t seq)
{
    __typeof__(hb.sent[0]) *slot = &hb.sent[seq % RING];
    if (seq == 0 || atomic_load(&slot->seq) != seq)
        return -1;
    double at = atomic_load(&slot->at);
    return atomic_load(&slot->seq) == seq ? at : -1;
}

static void send_now(void)
{
    char body[HBMSG_MAX_LEN + 1];
    int n = hbmsg_format_beat(body, sizeof body, hb.generation, hb.rank, (int)getpid(),
                              atomic_load(&hb.step), (enum hb_phase)atomic_load(&hb.phase),
                              atomic_load(&hb.progress));
    send_body(atomic_load(&hb.fd), body, n);
}

/* ---- the supervisor's answers ------------------------------------------------------ */

static void obey(enum hb_ctl action)
{
    switch (action) {
    case HBCTL_PREEMPT:
        atomic_store(&preempt_requested, 1);
        break;
    case HBCTL_STOP: /* the whole process stops, this thread with it */
        kill(getpid(), SIGSTOP);
        break;
    case HBCTL_KILL:
        kill(getpid(), SIGKILL);
        break;
    default:
        break;
    }
}

static void read_answers(int fd)
{
    char buf[HBMSG_DGRAM_MAX + 1];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) >= 0) {
        struct hbmsg m;
        if (hbmsg_open(buf, (size_t)n, &hb.key, &m) || m.kind != HBMSG_CTL ||
            m.generation != hb.generation || m.rank != hb.rank)
            continue; /* not for this process of this launch */
        double sent = sent_at(m.echo);
        if (sent < 0)
            continue; /* stale or replayed */
        if (sent > hb.contact)
            hb.contact = sent;
        obey(m.action);
    }
}

static void lost_contact(double now)
{
    fprintf(stderr,
            "fsdp-train: rank %d: lost contact with fsdp-super at %s for %.0f s: stopping\n",
            hb.rank, hb.addr, now - hb.contact);
    _exit(HB_LOST_CONTACT_EXIT);
}

static void *beat(void *arg)
{
    (void)arg;
    int fd = atomic_load(&hb.fd);
    double next = fsdp_now();
    hb.contact = next; /* the silence is counted from the start */
    while (atomic_load(&hb.running)) {
        double t = fsdp_now();
        if (t >= next) {
            send_now();
            next = t + BEAT_S;
        }
        if (t - hb.contact > hb.silence_s)
            lost_contact(t);
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = hb.wake, .events = POLLIN}};
        int ms = (int)ceil((next - t) * 1e3); /* wake at next, not before */
        if (poll(p, 2, ms > 0 ? ms : 0) > 0 && (p[0].revents & POLLIN))
            read_answers(fd);
    }
    return NULL;
}

int hb_start(int rank, char *err)
{
    const char *g = getenv("FSDP_GENERATION");
    if (g && hbmsg_parse_generation(g, &hb.generation))
        return bad_env(err, "FSDP_GENERATION", g, "a generation number (digits for 1..2^63-1)");
    const char *addr = getenv("FSDP_SUPER_ADDR");
    if (!addr)
        return 0;
    if (hbmsg_key_parse(getenv("FSDP_SUPER_TOKEN"), &hb.key))
        return fsdp_err(err, "FSDP_SUPER_TOKEN is missing or not 64 hex digits (fsdp-super sets it "
                             "with FSDP_SUPER_ADDR; unset FSDP_SUPER_ADDR to train unsupervised)");
    int fd;
    if (read_silence(err) || resolve(addr, &fd, err))
        return -1;
    snprintf(hb.addr, sizeof hb.addr, "%s", addr);
    hbmsg_host_name(hb.host, sizeof hb.host);
    hb.rank = rank;
    hb.wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (hb.wake < 0) {
        close(fd);
        return fsdp_err(err, "eventfd: %s", strerror(errno));
    }
    atomic_store(&hb.fd, fd);
    atomic_store(&hb.running, 1);
    if (pthread_create(&hb.thread, NULL, beat, NULL)) {
        atomic_store(&hb.running, 0);
        atomic_store(&hb.fd, -1);
        close(fd);
        close(hb.wake);
        hb.wake = -1;
        return fsdp_err(err, "cannot start the heartbeat thread");
    }
    return 0;
}

void hb_stop(void)
{
    if (!atomic_load(&hb.running))
        return;
    atomic_store(&hb.running, 0);
    uint64_t one = 1;
    if (write(hb.wake, &one, sizeof one) < 0) {
        /* a full counter still wakes the poll */
    }
    pthread_join(hb.thread, NULL);
    send_now();
    int fd = atomic_exchange(&hb.fd, -1);
    close(fd);
    close(hb.wake);
    hb.wake = -1;
}

void hb_set(uint64_t step, enum hb_phase phase)
{
    atomic_store(&hb.step, step);
    atomic_store(&hb.phase, (int)phase);
    atomic_fetch_add(&hb.progress, 1);
}

void hb_progress(void) { atomic_fetch_add(&hb.progress, 1); }

void hb_event(const char *fmt, ...)
{
    int fd = atomic_load(&hb.fd);
    if (fd < 0)
        return;
    char text[HBMSG_MAX_LEN], body[HBMSG_MAX_LEN + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    send_body(fd, body, hbmsg_format_event(body, sizeof body, hb.generation, hb.rank, text));
}

void hb_flush(void) { send_now(); }
