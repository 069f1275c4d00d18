/*
 * check.h - a minimal test harness: each unit test program lists its tests,
 * runs all of them, prints one line per test, and exits non-zero if any
 * failed. CHECK records a failure with file:line and keeps going inside the
 * test; REQUIRE ends the test.
 */
#ifndef FSDP_CHECK_H
#define FSDP_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            check_failures++;                                                                      \
            fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define REQUIRE(cond, ...)                                                                        \
    do {                                                                                           \
        int before_ = check_failures;                                                              \
        CHECK(cond, __VA_ARGS__);                                                                  \
        if (check_failures != before_)                                                             \
            return;                                                                                \
    } while (0)

struct check_test {
    const char *name;
    void (*fn)(void);
};

static inline int check_run(const struct check_test *tests, int n, int argc, char **argv)
{
    int failed = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && strcmp(argv[1], tests[i].name) != 0)
            continue;
        int before = check_failures;
        tests[i].fn();
        int bad = check_failures != before;
        failed += bad;
        printf("%s %s\n", bad ? "FAIL" : "ok  ", tests[i].name);
        fflush(stdout);
    }
    return failed ? 1 : 0;
}

#define CHECK_MAIN(...)                                                                           \
    int main(int argc, char **argv)                                                               \
    {                                                                                              \
        static const struct check_test tests_[] = {__VA_ARGS__};                                  \
        return check_run(tests_, (int)(sizeof tests_ / sizeof tests_[0]), argc, argv);            \
    }
#define TEST(fn) {#fn, fn}

#endif
