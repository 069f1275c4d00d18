/*
 * fuzz_common.h - what every libFuzzer target in tests/fuzz shares: a
 * check that turns a broken property into a crash libFuzzer reports, a
 * quiet stderr for parsers that print one line per problem, and a memfd
 * for readers that want a file (a path or a descriptor) instead of bytes.
 *
 * Targets are deterministic (no clocks, no randomness, no state carried
 * from one input to the next beyond reused buffers) and free everything
 * they allocate per input, so LeakSanitizer can run on every input.
 */
#ifndef FSDP_FUZZ_COMMON_H
#define FSDP_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A property of the code under test that must hold for every input. */
#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(fuzz_stderr(), "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond);     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* FUZZ_IGNORE=NAME[,NAME...] turns off the named checks (FUZZ_CHECK_NAMED),
 * so that a long run can search on past a bug already found and reported;
 * CI never sets it. */
#define FUZZ_CHECK_NAMED(name, cond)                                                               \
    do {                                                                                           \
        const char *ign_ = getenv("FUZZ_IGNORE");                                                  \
        if (!ign_ || !strstr(ign_, name))                                                          \
            FUZZ_CHECK(cond);                                                                      \
    } while (0)

static FILE *fuzz_real_stderr;

/* Where the target's own reports go: the real stderr, even when the code
 * under test has been silenced. */
static inline FILE *fuzz_stderr(void) { return fuzz_real_stderr ? fuzz_real_stderr : stderr; }

/* Per-input lines from the code under test (fprintf(stderr, ...)) go to
 * /dev/null unless FUZZ_VERBOSE is set. libFuzzer and the sanitizers keep
 * the real stderr: they write to file descriptor 2 or hold their own
 * FILE *, while the code under test names the `stderr` variable, which is
 * pointed elsewhere here. */
static inline void fuzz_quiet_stderr(void)
{
    if (getenv("FUZZ_VERBOSE") || fuzz_real_stderr)
        return;
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        fuzz_real_stderr = stderr;
        stderr = null;
    }
}

/* An anonymous in-memory file, created once per process and reused. */
static inline int fuzz_memfd(const char *name)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) {
        perror("memfd_create");
        abort();
    }
    return fd;
}

/* Makes the memfd hold exactly data[0, size), followed by a hole of zeros
 * up to total bytes (total >= size). */
static inline void fuzz_memfd_fill(int fd, const void *data, size_t size, size_t total)
{
    const char *p = data;
    size_t done = 0;
    if (ftruncate(fd, 0) != 0)
        abort();
    while (done < size) {
        ssize_t w = pwrite(fd, p + done, size - done, (off_t)done);
        if (w <= 0)
            abort();
        done += (size_t)w;
    }
    if (ftruncate(fd, (off_t)total) != 0)
        abort();
}

/* A NUL-terminated copy of the input (for APIs that take C strings). */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

#endif
