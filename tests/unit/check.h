/*
 * check.h - a minimal test harness: each unit test program lists its tests;
 * without arguments it runs all of them, given test names it runs those (in
 * the order given), printing one line per test, and exits non-zero if any
 * failed. A name that is not one of its tests is an error (exit 2, nothing
 * run); --list prints the names, one a line. CHECK records a failure with
 * file:line and keeps going inside the test; REQUIRE ends the function it
 * is in.
 *
 * Tests share nothing mutable, so that any one runs alone by name: each
 * makes what it needs and removes it. A test with something to remove puts
 * its body in a function of its own, called between making and removing
 * (a REQUIRE then returns to the remover); check_in_tmpdir does that for a
 * temporary directory.
 */
#ifndef FSDP_CHECK_H
#define FSDP_CHECK_H

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            check_failures++;                                                                      \
            fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        int before_ = check_failures;                                                              \
        CHECK(cond, __VA_ARGS__);                                                                  \
        if (check_failures != before_)                                                             \
            return;                                                                                \
    } while (0)

/* ---- temporary directories ------------------------------------------------------ */

/* Makes a fresh directory /tmp/fsdp-test-WHAT-XXXXXX, its path in dir (n
 * bytes); 0, or -1 with a failed check. */
static inline int check_tmpdir(char *dir, size_t n, const char *what)
{
    snprintf(dir, n, "/tmp/fsdp-test-%s-XXXXXX", what);
    int before = check_failures;
    CHECK(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
    return check_failures == before ? 0 : -1;
}

static inline int check_remove_one(const char *path, const struct stat *sb, int type,
                                   struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    if (remove(path) == 0)
        return 0;
    fprintf(stderr, "  cannot remove %s: %s\n", path, strerror(errno));
    return -1;
}

/* Removes dir and everything under it, following no link (a failure is the
 * test's). */
static inline void check_rmtree(const char *dir)
{
    CHECK(nftw(dir, check_remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0, "removing %s", dir);
}

/* Runs body(dir) in a fresh directory of its own (named for what) and
 * removes the directory afterwards, however the body ended. */
static inline void check_in_tmpdir(const char *what, void (*body)(const char *dir))
{
    char dir[64];
    if (check_tmpdir(dir, sizeof dir, what) != 0)
        return;
    body(dir);
    check_rmtree(dir);
}

/* ---- running tests ----------------------------------------------------------------- */

struct check_test {
    const char *name;
    void (*fn)(void);
};

static inline const struct check_test *check_find(const struct check_test *tests, int n,
                                                  const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(tests[i].name, name) == 0)
            return &tests[i];
    return NULL;
}

/* Runs the tests named in argv (all with none); prepare, if not NULL, runs
 * once before the first test, and a non-zero return ends the program with
 * that status before any test runs (77: skipped). */
static inline int check_run(const struct check_test *tests, int n, int argc, char **argv,
                            int (*prepare)(void))
{
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < n; i++)
            printf("%s\n", tests[i].name);
        return 0;
    }
    for (int a = 1; a < argc; a++)
        if (!check_find(tests, n, argv[a])) {
            fprintf(stderr, "%s: %s '%s' (--list alone prints the names)\n", argv[0],
                    argv[a][0] == '-' ? "unknown option" : "no test named", argv[a]);
            return 2;
        }
    if (prepare) {
        int rc = prepare();
        if (rc != 0)
            return rc;
    }
    int failed = 0, count = argc > 1 ? argc - 1 : n;
    for (int i = 0; i < count; i++) {
        const struct check_test *t = argc > 1 ? check_find(tests, n, argv[i + 1]) : &tests[i];
        int before = check_failures;
        t->fn();
        int bad = check_failures != before;
        failed += bad;
        printf("%s %s\n", bad ? "FAIL" : "ok  ", t->name);
        fflush(stdout);
    }
    return failed ? 1 : 0;
}

#define CHECK_MAIN(...)                                                                            \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        static const struct check_test tests_[] = {__VA_ARGS__};                                   \
        return check_run(tests_, (int)(sizeof tests_ / sizeof tests_[0]), argc, argv, NULL);       \
    }
#define TEST(fn)                                                                                   \
    {                                                                                              \
#fn, fn                                                                                    \
    }

#endif
