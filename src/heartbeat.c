/*
 * heartbeat.c - the heartbeat thread and the preemption flag.
 *
 * The thread sleeps on a condition variable between beats, so hb_stop
 * wakes it and joins at once instead of waiting out the 250 ms. The state
 * it reads (step, phase, progress, running, the socket) is atomic: the
 * training thread writes it without a lock on every unit of work.
 */
#include "heartbeat.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BEAT_NS (250L * 1000 * 1000)

static struct {
    atomic_int fd, running;
    int rank;
    struct sockaddr_in to;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* hb_stop -> the thread */
    _Atomic uint64_t step, progress;
    _Atomic int phase;
    uint64_t generation;
} hb = {.fd = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

static volatile sig_atomic_t preempt_requested;

static void on_usr1(int sig)
{
    (void)sig;
    preempt_requested = 1;
}

int hb_preempted(void) { return preempt_requested != 0; }

/* ---- the launch's environment ------------------------------------------------ */

/* Names a bad environment value without echoing bytes that could upset a
 * terminal. */
static int bad_env(char *err, const char *name, const char *v, const char *want)
{
    int printable = strlen(v) <= 64;
    for (const char *p = v; *p && printable; p++)
        printable = *p >= 0x20 && *p < 0x7f;
    return fsdp_err(err, "%s='%s' is not %s (fsdp-super sets it; unset it to train unsupervised)",
                    name, printable ? v : "...", want);
}

uint64_t hb_generation(void) { return hb.generation; }

/* "A.B.C.D:PORT" into hb.to; -1 if malformed. */
static int parse_addr(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    char host[64];
    uint64_t port;
    if (!colon || (size_t)(colon - addr) >= sizeof host ||
        hbmsg_parse_uint(colon + 1, strlen(colon + 1), 65535, &port) || port == 0)
        return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    memset(&hb.to, 0, sizeof hb.to);
    hb.to.sin_family = AF_INET;
    hb.to.sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &hb.to.sin_addr) == 1 ? 0 : -1;
}

/* ---- sending -------------------------------------------------------------------- */

static void send_now(void)
{
    int fd = atomic_load(&hb.fd);
    if (fd < 0)
        return;
    char msg[HBMSG_MAX_LEN + 1];
    int n = hbmsg_format_beat(msg, sizeof msg, hb.generation, hb.rank, (int)getpid(),
                              atomic_load(&hb.step), (enum hb_phase)atomic_load(&hb.phase),
                              atomic_load(&hb.progress));
    if (n > 0)
        sendto(fd, msg, (size_t)n, MSG_DONTWAIT, (struct sockaddr *)&hb.to, sizeof hb.to);
}

static void *beat(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&hb.mu);
    while (atomic_load(&hb.running)) {
        pthread_mutex_unlock(&hb.mu);
        send_now();
        pthread_mutex_lock(&hb.mu);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += BEAT_NS;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        /* hb_stop clears running under the lock before signalling, so the
         * wake-up cannot be missed between the check and the wait */
        while (atomic_load(&hb.running) && pthread_cond_timedwait(&hb.wake, &hb.mu, &until) == 0)
            ;
    }
    pthread_mutex_unlock(&hb.mu);
    return NULL;
}

int hb_start(int rank, char *err)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    const char *g = getenv("FSDP_GENERATION");
    if (g && hbmsg_parse_generation(g, &hb.generation))
        return bad_env(err, "FSDP_GENERATION", g, "a generation number (digits for 1..2^63-1)");
    const char *addr = getenv("FSDP_SUPER_ADDR");
    if (!addr)
        return 0;
    if (parse_addr(addr))
        return bad_env(err, "FSDP_SUPER_ADDR", addr, "an IPv4 address and port (A.B.C.D:PORT)");
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0; /* unwatched: the supervisor's startup timeout says so */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&hb.wake, &ca);
    pthread_condattr_destroy(&ca);
    hb.rank = rank;
    atomic_store(&hb.fd, fd);
    atomic_store(&hb.running, 1);
    if (pthread_create(&hb.thread, NULL, beat, NULL)) {
        atomic_store(&hb.running, 0);
        atomic_store(&hb.fd, -1);
        close(fd);
    }
    return 0;
}

void hb_stop(void)
{
    if (!atomic_load(&hb.running))
        return;
    pthread_mutex_lock(&hb.mu);
    atomic_store(&hb.running, 0);
    pthread_cond_signal(&hb.wake);
    pthread_mutex_unlock(&hb.mu);
    pthread_join(hb.thread, NULL);
    send_now();
    int fd = atomic_exchange(&hb.fd, -1);
    close(fd);
    pthread_cond_destroy(&hb.wake);
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
    char text[HBMSG_MAX_LEN], msg[HBMSG_MAX_LEN + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    int n = hbmsg_format_event(msg, sizeof msg, hb.generation, hb.rank, text);
    if (n > 0)
        sendto(fd, msg, (size_t)n, 0, (struct sockaddr *)&hb.to, sizeof hb.to);
}

void hb_flush(void) { send_now(); }
