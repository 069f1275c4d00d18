/*
 * test_signals.c - a preemption signal (SIGUSR1) sent to the trainer's
 * process while it multiplies matrices. It must set the preemption flag
 * and nothing else: oneDNN's JIT f32 sgemm for AVX-512 points the stack
 * pointer into the heap while it computes, so a signal handler run on the
 * computing thread writes over malloc's chunks (a later free aborts with
 * "corrupted size vs. prev_size"). With a handler, as fsdp-train had, this
 * test aborted within a second on an AVX-512 machine; hb_catch_preemption
 * takes the signal on a thread of its own.
 */
#include "check.h"

#include "cpu/gemm.h"
#include "heartbeat.h"
#include "kernels.h"
#include "util.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { N = 1024, C = 1536, OC = 384, T = 256, HS = 64 };

static atomic_int stop;
static atomic_long sent;

/* Sends SIGUSR1 to the process (as fsdp-super and mpirun do) every 20 us;
 * blocks it itself, so the kernel must pick another thread. */
static void *shooter(void *arg)
{
    (void)arg;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    const struct timespec gap = {0, 20000};
    while (!atomic_load(&stop)) {
        kill(getpid(), SIGUSR1);
        atomic_fetch_add(&sent, 1);
        nanosleep(&gap, NULL);
    }
    return NULL;
}

static void a_preemption_signal_during_matmuls_only_sets_the_flag(void)
{
    char err[FSDP_ERR_LEN];
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* fsdp-train's heap (keep_freed_memory) */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    REQUIRE(hb_catch_preemption(err) == 0, "%s", err);
    if (fsdp_kernels_cpu_matmul("onednn", err, sizeof err) != 0)
        printf("  (%s: the matmuls are OpenBLAS's)\n", err);
    const struct fsdp_kernels *k = fsdp_kernels_cpu();
    float *inp = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * OC * C),
          *out = malloc(sizeof(float) * N * OC);
    REQUIRE(inp && w && out, "out of memory");
    for (size_t i = 0; i < (size_t)N * C; i++)
        inp[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)OC * C; i++)
        w[i] = (float)(i % 5) * 0.1f;
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, shooter, NULL) == 0, "cannot start the sender");
    double until = fsdp_now() + 2.0;
    int rounds = 0;
    while (fsdp_now() < until || rounds < 20) {
        k->matmul_forward(out, inp, w, NULL, N, C, OC); /* oneDNN's matmul primitive */
        for (int h = 0; h < 16; h++) /* attention's per-head weights x values: dnnl_sgemm */
            fsdp_gemm_small('N', 'N', T, HS, T, 1.0f, inp + (size_t)h * T * T, T, w, HS, 0.0f, out,
                            HS);
        free(malloc(1000 + (size_t)(rounds % 5000) * 8)); /* the heap in use, as training does */
        rounds++;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    double total = 0;
    for (size_t i = 0; i < (size_t)N * OC; i++)
        total += out[i];
    CHECK(total > 0, "the matmuls computed nothing");
    CHECK(hb_preempted(), "%ld signals sent, the preemption flag is not set", atomic_load(&sent));
    printf("  %d rounds of a (%d x %d) x (%d x %d) matmul and 16 (%d x %d) x (%d x %d) under %ld "
           "signals\n",
           rounds, N, C, C, OC, T, T, T, HS, atomic_load(&sent));
    free(inp);
    free(w);
    free(out);
}

CHECK_MAIN(TEST(a_preemption_signal_during_matmuls_only_sets_the_flag))
