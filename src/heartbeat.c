/*
 * heartbeat.c - the heartbeat thread and the preemption flag.
 */
#include "heartbeat.h"

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

static const char *phase_names[] = {"start", "train", "save", "load", "done", "preempted"};

static struct {
    int fd, rank, running;
    struct sockaddr_in to;
    pthread_t thread;
    _Atomic uint64_t step, progress;
    _Atomic int phase;
    uint64_t generation;
} hb = {.fd = -1};

static volatile sig_atomic_t preempt_requested;

static void on_usr1(int sig)
{
    (void)sig;
    preempt_requested = 1;
}

int hb_preempted(void) { return preempt_requested != 0; }
uint64_t hb_generation(void)
{
    const char *g = getenv("FSDP_GENERATION");
    return g ? strtoull(g, NULL, 10) : 0;
}

static void send_now(void)
{
    if (hb.fd < 0)
        return;
    char msg[160];
    int n = snprintf(msg, sizeof msg, "fsdp-hb %llu %d %d %llu %s %llu",
                     (unsigned long long)hb.generation, hb.rank, (int)getpid(),
                     (unsigned long long)atomic_load(&hb.step),
                     phase_names[atomic_load(&hb.phase)],
                     (unsigned long long)atomic_load(&hb.progress));
    sendto(hb.fd, msg, (size_t)n, MSG_DONTWAIT, (struct sockaddr *)&hb.to, sizeof hb.to);
}

static void *beat(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 250 * 1000 * 1000};
    while (hb.running) {
        send_now();
        nanosleep(&ts, NULL);
    }
    return NULL;
}

void hb_start(int rank)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    const char *addr = getenv("FSDP_SUPER_ADDR");
    if (!addr)
        return;
    char host[64];
    int port = 0;
    if (sscanf(addr, "%63[^:]:%d", host, &port) != 2 || port <= 0)
        return;
    memset(&hb.to, 0, sizeof hb.to);
    hb.to.sin_family = AF_INET;
    hb.to.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &hb.to.sin_addr) != 1)
        return;
    hb.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (hb.fd < 0)
        return;
    hb.rank = rank;
    hb.generation = hb_generation();
    hb.running = 1;
    if (pthread_create(&hb.thread, NULL, beat, NULL)) {
        hb.running = 0;
        close(hb.fd);
        hb.fd = -1;
    }
}

void hb_stop(void)
{
    if (!hb.running)
        return;
    hb.running = 0;
    pthread_join(hb.thread, NULL);
    send_now();
    close(hb.fd);
    hb.fd = -1;
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
    if (hb.fd < 0)
        return;
    char msg[512];
    int n = snprintf(msg, sizeof msg, "fsdp-ev %llu %d ", (unsigned long long)hb.generation,
                     hb.rank);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof msg - 1)
        n = (int)sizeof msg - 1;
    sendto(hb.fd, msg, (size_t)n, 0, (struct sockaddr *)&hb.to, sizeof hb.to);
}
void hb_flush(void) { send_now(); }
