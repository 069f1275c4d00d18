/*
 * test_data.c - token file validation and the sample stream.
 */
#include "check.h"

#include "data.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/fsdp-test-data-XXXXXX";

static const char *write_raw(const char *name, const void *bytes, size_t n)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(bytes, 1, n, f);
    fclose(f);
    return path;
}

/* header + n tokens 0..n-1 (mod 256), with header[2] = count */
static const char *write_tokens(const char *name, size_t n, int32_t count, int32_t magic)
{
    size_t bytes = 1024 + 2 * n;
    unsigned char *buf = calloc(1, bytes);
    int32_t h[3] = {magic, 1, count};
    memcpy(buf, h, sizeof h);
    for (size_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i % 256);
        memcpy(buf + 1024 + 2 * i, &t, 2);
    }
    const char *p = write_raw(name, buf, bytes);
    free(buf);
    return p;
}

static int open_fails_with(const char *path, int vocab, const char *needle)
{
    struct token_file f;
    char err[ERR_LEN] = "";
    if (token_file_open(&f, path, vocab, err) == 0) {
        token_file_close(&f);
        return 0;
    }
    return strstr(err, needle) != NULL && strstr(err, path) != NULL;
}

static void token_file_round_trips(void)
{
    uint16_t toks[] = {0, 72, 105, 0, 255};
    char path[256], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/rt.bin", dir);
    REQUIRE(token_file_write(path, toks, 5, err) == 0, "%s", err);
    struct token_file f;
    REQUIRE(token_file_open(&f, path, 256, err) == 0, "%s", err);
    CHECK(f.ntokens == 5, "%zu tokens", f.ntokens);
    CHECK(memcmp(f.tokens, toks, sizeof toks) == 0, "tokens differ");
    token_file_close(&f);
}

static void bad_token_files_are_refused_naming_the_problem(void)
{
    CHECK(open_fails_with(write_raw("tiny.bin", "abc", 3), 256, "shorter than the 1024-byte"),
          "short file");
    CHECK(open_fails_with(write_tokens("magic.bin", 10, 10, 42), 256, "magic 42"), "magic");
    CHECK(open_fails_with(write_tokens("trunc.bin", 10, 11, DATA_MAGIC), 256, "truncated"),
          "truncated");
    CHECK(open_fails_with(write_tokens("extra.bin", 10, 9, DATA_MAGIC), 256, "2 bytes after"),
          "trailing bytes");
    CHECK(open_fails_with(write_tokens("neg.bin", 10, -1, DATA_MAGIC), 256, "negative"),
          "negative count");
    CHECK(open_fails_with(write_tokens("vocab.bin", 300, 300, DATA_MAGIC), 200,
                          "token 200 at index 200"),
          "token beyond vocabulary");
    CHECK(open_fails_with("/nonexistent/x.bin", 256, "cannot open"), "missing file");
}

static void stream_is_a_seeded_permutation_per_epoch(void)
{
    const int T = 4;
    const size_t n = 1 + 50 * T; /* 50 samples */
    uint16_t *toks = calloc(n, sizeof *toks);
    char path[256], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/stream.bin", dir);
    REQUIRE(token_file_write(path, toks, n, err) == 0, "%s", err);
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

static void setup(void) { CHECK(mkdtemp(dir) != NULL, "mkdtemp"); }

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
}

CHECK_MAIN(TEST(setup), TEST(token_file_round_trips),
           TEST(bad_token_files_are_refused_naming_the_problem),
           TEST(stream_is_a_seeded_permutation_per_epoch), TEST(teardown))
