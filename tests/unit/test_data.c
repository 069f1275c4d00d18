/*
 * test_data.c - token file validation (regular files only: a FIFO is
 * refused without blocking, an output that is not a regular file is never
 * replaced) and the sample stream.
 */
#include "check.h"

#include "data.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static const char *write_raw(const char *dir, const char *name, const void *bytes, size_t n)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(bytes, 1, n, f);
    fclose(f);
    return path;
}

/* header + n tokens 0..n-1 (mod 256), with header[2] = count */
static const char *write_tokens(const char *dir, const char *name, size_t n, int32_t count,
                                int32_t magic)
{
    size_t bytes = 1024 + 2 * n;
    unsigned char *buf = calloc(1, bytes);
    int32_t h[3] = {magic, 1, count};
    memcpy(buf, h, sizeof h);
    for (size_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i % 256);
        memcpy(buf + 1024 + 2 * i, &t, 2);
    }
    const char *p = write_raw(dir, name, buf, bytes);
    free(buf);
    return p;
}

static int open_fails_with(const char *path, int vocab, const char *needle)
{
    struct token_file f;
    char err[FSDP_ERR_LEN] = "";
    if (token_file_open(&f, path, vocab, err) == 0) {
        token_file_close(&f);
        return 0;
    }
    return strstr(err, needle) != NULL && strstr(err, path) != NULL;
}

static void token_file_round_trips_body(const char *dir)
{
    uint16_t toks[] = {0, 72, 105, 0, 255};
    char path[256], err[FSDP_ERR_LEN];
    snprintf(path, sizeof path, "%s/rt.bin", dir);
    REQUIRE(token_file_write(path, toks, 5, 2, err) == 0, "%s", err);
    struct token_file f;
    REQUIRE(token_file_open(&f, path, 256, err) == 0, "%s", err);
    CHECK(f.ntokens == 5, "%zu tokens", f.ntokens);
    CHECK(f.width == 2 && memcmp(f.tokens, toks, sizeof toks) == 0, "tokens differ");
    token_file_close(&f);
    /* uint32 tokens: llm.c's Llama 3 layout, byte for byte */
    REQUIRE(token_file_write(path, toks, 5, 4, err) == 0, "%s", err);
    REQUIRE(token_file_open(&f, path, 256, err) == 0, "%s", err);
    const uint32_t *wide = f.tokens;
    const int32_t *head = (const int32_t *)f.map;
    CHECK(f.width == 4 && f.ntokens == 5 && head[0] == 20240801 && head[1] == 7 && head[2] == 5,
          "uint32 header: width %d, magic %d, version %d, count %d", f.width, head[0], head[1],
          head[2]);
    CHECK(f.map_len == 1024 + 5 * 4, "uint32 file of %zu bytes", f.map_len);
    for (int i = 0; i < 5; i++)
        CHECK(wide[i] == toks[i] && token_file_at(&f, (size_t)i) == toks[i], "token %d", i);
    token_file_close(&f);
    REQUIRE(token_file_open(&f, path, 255, err) != 0 && strstr(err, "token 255 at index 4"),
            "a uint32 token outside the vocabulary: %s", err);
}

static void token_file_round_trips(void) { check_in_tmpdir("data", token_file_round_trips_body); }

static void bad_token_files_are_refused_naming_the_problem_body(const char *dir)
{
    CHECK(open_fails_with(write_raw(dir, "tiny.bin", "abc", 3), 256, "shorter than the 1024-byte"),
          "short file");
    CHECK(open_fails_with(write_tokens(dir, "magic.bin", 10, 10, 42), 256, "magic 42"), "magic");
    CHECK(open_fails_with(write_tokens(dir, "u32v1.bin", 10, 10, DATA_MAGIC_U32), 256,
                          "version 1 for magic 20240801"),
          "a uint32 magic with the uint16 version");
    CHECK(open_fails_with(write_tokens(dir, "trunc.bin", 10, 11, DATA_MAGIC), 256, "truncated"),
          "truncated");
    CHECK(open_fails_with(write_tokens(dir, "extra.bin", 10, 9, DATA_MAGIC), 256, "2 bytes after"),
          "trailing bytes");
    CHECK(open_fails_with(write_tokens(dir, "neg.bin", 10, -1, DATA_MAGIC), 256, "negative"),
          "negative count");
    CHECK(open_fails_with(write_tokens(dir, "vocab.bin", 300, 300, DATA_MAGIC), 200,
                          "token 200 at index 200"),
          "token beyond vocabulary");
    CHECK(open_fails_with("/nonexistent/x.bin", 256, "cannot open"), "missing file");
}

static void bad_token_files_are_refused_naming_the_problem(void)
{
    check_in_tmpdir("data", bad_token_files_are_refused_naming_the_problem_body);
}

static void special_files_are_refused_as_token_files_without_blocking_body(const char *dir)
{
    char fifo[256], sub[256];
    snprintf(fifo, sizeof fifo, "%s/fifo.bin", dir);
    snprintf(sub, sizeof sub, "%s/subdir.bin", dir);
    REQUIRE(mkfifo(fifo, 0644) == 0 && mkdir(sub, 0755) == 0, "mkfifo, mkdir");
    alarm(20); /* an open() that blocks on the FIFO ends the test here */
    CHECK(open_fails_with(fifo, 256, "is a FIFO, not a regular file"), "a FIFO");
    alarm(0);
    CHECK(open_fails_with(sub, 256, "is a directory, not a regular file"), "a directory");
    CHECK(open_fails_with("/dev/null", 256, "is a character device"), "/dev/null");
}

static void special_files_are_refused_as_token_files_without_blocking(void)
{
    check_in_tmpdir("data", special_files_are_refused_as_token_files_without_blocking_body);
}

/* Writing onto path fails naming it, and path is still what it was. */
static int write_refused(const char *path, mode_t type)
{
    uint16_t toks[] = {0, 1, 2};
    char err[FSDP_ERR_LEN] = "";
    struct stat st;
    int rc = token_file_write(path, toks, 3, 2, err);
    if (rc == 0 || !strstr(err, path) || !strstr(err, "not a regular file; refusing to replace"))
        fprintf(stderr, "  %s: rc %d: %s\n", path, rc, err);
    return rc != 0 && strstr(err, path) && strstr(err, "refusing to replace") &&
           lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == type;
}

static void outputs_that_are_not_regular_files_are_never_replaced_body(const char *dir)
{
    char fifo[256], sub[256], link[256], dev[256], target[256];
    snprintf(fifo, sizeof fifo, "%s/out-fifo.bin", dir);
    snprintf(sub, sizeof sub, "%s/out-dir.bin", dir);
    snprintf(link, sizeof link, "%s/out-link.bin", dir);
    snprintf(target, sizeof target, "%s/link-target.bin", dir);
    snprintf(dev, sizeof dev, "%s/out-null", dir);
    REQUIRE(mkfifo(fifo, 0644) == 0 && mkdir(sub, 0755) == 0, "mkfifo, mkdir");
    REQUIRE(symlink(target, link) == 0, "symlink");
    alarm(20);
    CHECK(write_refused(fifo, S_IFIFO), "a FIFO");
    alarm(0);
    CHECK(write_refused(sub, S_IFDIR), "a directory");
    CHECK(write_refused(link, S_IFLNK) && access(target, F_OK) != 0, "a symbolic link");
    /* a device node of our own (a copy of /dev/null), where we may make one */
    if (mknod(dev, S_IFCHR | 0666, makedev(1, 3)) == 0)
        CHECK(write_refused(dev, S_IFCHR), "a character device");
    char err[FSDP_ERR_LEN];
    CHECK(token_file_check_output(fifo, err) != 0 && token_file_check_output(target, err) == 0,
          "the check alone");
}

static void outputs_that_are_not_regular_files_are_never_replaced(void)
{
    check_in_tmpdir("data", outputs_that_are_not_regular_files_are_never_replaced_body);
}

static void stream_is_a_seeded_permutation_per_epoch_body(const char *dir)
{
    const int T = 4;
    const size_t n = 1 + 50 * T; /* 50 samples */
    uint16_t *toks = calloc(n, sizeof *toks);
    char path[256], err[FSDP_ERR_LEN];
    snprintf(path, sizeof path, "%s/stream.bin", dir);
    REQUIRE(token_file_write(path, toks, n, 2, err) == 0, "%s", err);
    struct token_file f;
    REQUIRE(token_file_open(&f, path, 256, err) == 0, "%s", err);
    struct sample_stream a, b, c;
    REQUIRE(sample_stream_init(&a, &f, T, 7, err) == 0, "%s", err);
    REQUIRE(sample_stream_init(&b, &f, T, 7, err) == 0, "%s", err);
    REQUIRE(sample_stream_init(&c, &f, T, 8, err) == 0, "%s", err);
    CHECK(a.nsamples == 50, "%llu samples", (unsigned long long)a.nsamples);
    int seen[2][50] = {{0}}, same_seed_differs = 0, other_seed_differs = 0, epochs_differ = 0;
    for (uint64_t k = 0; k < 100; k++) {
        uint64_t i = sample_stream_index(&a, k);
        REQUIRE(i < 50, "index %llu", (unsigned long long)i);
        seen[k / 50][i]++;
        same_seed_differs += sample_stream_index(&b, k) != i;
        other_seed_differs += sample_stream_index(&c, k) != i;
    }
    for (uint64_t k = 0; k < 50; k++)
        epochs_differ += sample_stream_index(&a, k) != sample_stream_index(&a, k + 50);
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 50; i++)
            CHECK(seen[e][i] == 1, "epoch %d: sample %d seen %d times", e, i, seen[e][i]);
    CHECK(same_seed_differs == 0, "same seed, different order");
    CHECK(other_seed_differs > 25, "another seed gives nearly the same order");
    CHECK(epochs_differ > 25, "epochs repeat the same order");
    sample_stream_free(&a);
    sample_stream_free(&b);
    sample_stream_free(&c);
    token_file_close(&f);
    free(toks);
}

static void stream_is_a_seeded_permutation_per_epoch(void)
{
    check_in_tmpdir("data", stream_is_a_seeded_permutation_per_epoch_body);
}

CHECK_MAIN(TEST(token_file_round_trips), TEST(bad_token_files_are_refused_naming_the_problem),
           TEST(special_files_are_refused_as_token_files_without_blocking),
           TEST(outputs_that_are_not_regular_files_are_never_replaced),
           TEST(stream_is_a_seeded_permutation_per_epoch))
