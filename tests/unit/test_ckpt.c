/*
 * test_ckpt.c - the checkpoint format on a real directory: shards written
 * with every codec and several chunk sizes read back exactly, for any
 * world size; a flipped byte is caught and named, in a chunk or in a
 * shard's chunk index; a manifest whose numbers do not fit its layout is
 * refused, no mutation of one crashes the parser, and a malformed index is
 * refused entry by entry.
 */
#include "check.h"

#include "ckpt.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

enum { NUNITS = 2, W = 3 };
static const uint64_t numel[NUNITS] = {1000, 37};
/* logical values, padded with zeros: made by the first test that needs
 * them (make_state), read-only after that */
static float *state[NUNITS][CKPT_NKINDS];

static uint64_t padded(uint64_t n, int w)
{
    return (n + (uint64_t)w - 1) / (uint64_t)w * (uint64_t)w;
}

static void fill_units(struct ckpt_manifest *m, int world)
{
    m->nunits = NUNITS;
    m->units = calloc(NUNITS, sizeof *m->units);
    for (int u = 0; u < NUNITS; u++) {
        struct ckpt_unit *U = &m->units[u];
        snprintf(U->name, sizeof U->name, "unit%d", u);
        U->numel = numel[u];
        U->padded = padded(numel[u], world);
        U->ntensors = 2;
        U->tensors = calloc(2, sizeof *U->tensors);
        uint64_t half = numel[u] / 2;
        U->tensors[0] = (struct ckpt_tensor){"a", 1, {half}, 0, half};
        U->tensors[1] = (struct ckpt_tensor){"b", 1, {numel[u] - half}, half, numel[u] - half};
        snprintf(U->tensors[0].name, 64, "u%d.a", u);
        snprintf(U->tensors[1].name, 64, "u%d.b", u);
    }
}

/* Writes step `step` as world W with the given codec, chunk size and chunk
 * hash. */
static int write_step_hashed(struct storage *st, uint64_t step, int codec, size_t chunk, int hash,
                             char *err)
{
    struct ckpt_manifest m = {0};
    m.version = CKPT_FORMAT_VERSION;
    m.chunk_bytes = chunk;
    m.chunk_hash = hash;
    m.step = step;
    m.world = W;
    snprintf(m.sharding, sizeof m.sharding, "full");
    m.model = json_pack("{s:i}", "toy", 1);
    m.trainer = json_pack("{s:I}", "step", (json_int_t)step);
    fill_units(&m, W);
    m.nshards = W;
    m.shards = calloc(W, sizeof *m.shards);
    struct ckpt_write_opts o = {codec, 3, chunk, hash};
    struct ckpt_codec *c = ckpt_codec_new(chunk);
    char dir[32];
    ckpt_step_dir(step, dir, sizeof dir);
    int rc = 0;
    for (int r = 0; !rc && r < W; r++) {
        struct ckpt_src src[NUNITS * CKPT_NKINDS];
        for (int u = 0; u < NUNITS; u++) {
            uint64_t per = padded(numel[u], W) / W;
            for (int k = 0; k < CKPT_NKINDS; k++)
                src[u * CKPT_NKINDS + k] =
                    (struct ckpt_src){u, k, r * per, per, state[u][k] + r * per};
        }
        char file[64], key[128];
        ckpt_shard_file(r, W, NULL, file, sizeof file); /* untagged, as before tags */
        snprintf(key, sizeof key, "%s/%s", dir, file);
        rc = ckpt_shard_write(st, key, file, &o, c, src, NUNITS * CKPT_NKINDS, r, &m.shards[r],
                              NULL, err);
    }
    if (!rc)
        rc = ckpt_commit(st, &m, err);
    ckpt_codec_free(c);
    ckpt_manifest_free(&m);
    return rc;
}

static int write_step(struct storage *st, uint64_t step, int codec, size_t chunk, char *err)
{
    return write_step_hashed(st, step, codec, chunk, CKPT_HASH_SHA256, err);
}

/* The test's own clean-up: every object of one step. */
static void remove_step(struct storage *st, uint64_t step)
{
    char err[FSDP_ERR_LEN], dir[32], key[128];
    struct ckpt_step_objects *s;
    int n;
    REQUIRE(ckpt_list_step_objects(st, &s, &n, err) == 0, "%s", err);
    ckpt_step_dir(step, dir, sizeof dir);
    for (int i = 0; i < n; i++)
        for (int k = 0; s[i].info.step == step && k < s[i].nobj; k++) {
            snprintf(key, sizeof key, "%s/%s", dir, s[i].obj[k].name);
            storage_delete(st, key, err);
        }
    ckpt_step_objects_free(s, n);
}

static void make_state(void)
{
    if (state[0][0])
        return;
    struct fsdp_rng rng = {9};
    for (int u = 0; u < NUNITS; u++)
        for (int k = 0; k < CKPT_NKINDS; k++) {
            state[u][k] = calloc(padded(numel[u], 64), sizeof(float));
            for (uint64_t i = 0; i < numel[u]; i++) /* smooth values: compressible */
                state[u][k][i] =
                    (float)k + 0.001f * (float)(i % 97) + 1e-6f * fsdp_rng_uniform(&rng);
        }
}

/* Each test that needs a store gets a directory of its own, removed after
 * it however it ended; the tests open their stores there. */
static void in_tmpdir(void (*body)(const char *root))
{
    make_state();
    check_in_tmpdir("ckpt", body);
}

/* Reads every unit and kind back as if on `world` ranks, each rank's wants
 * as one plan run by `threads` threads (parallel.c), or with threads 0 by
 * the reader on its own, through its cache (what a store that takes no
 * concurrent reads gets: its ops copied here with concurrent_reads off). */
static int read_back_with(struct storage *st, uint64_t step, int world, int threads, char *err)
{
    const struct storage_ops *ops = st->ops;
    struct storage_ops serial = *ops;
    serial.concurrent_reads = 0;
    struct ckpt_manifest m;
    if (ckpt_load_manifest(st, step, &m, err))
        return 0;
    struct ckpt_reader r;
    ckpt_reader_init(&r, st, &m, err);
    r.threads = threads > 0 ? threads : 1;
    if (threads == 0)
        st->ops = &serial;
    int ok = 1;
    float *buf[NUNITS];
    uint64_t per[NUNITS];
    for (int u = 0; u < NUNITS; u++) {
        per[u] = padded(numel[u], world) / (uint64_t)world;
        buf[u] = calloc(per[u] * CKPT_NKINDS, sizeof(float));
    }
    for (int rank = 0; ok && rank < world; rank++) {
        struct ckpt_want w[NUNITS * CKPT_NKINDS];
        for (int u = 0; u < NUNITS; u++)
            for (int k = 0; k < CKPT_NKINDS; k++) {
                memset(buf[u] + k * per[u], 0xff, per[u] * sizeof(float));
                w[u * CKPT_NKINDS + k] =
                    (struct ckpt_want){u, k, rank * per[u], per[u], buf[u] + k * per[u]};
            }
        if (ckpt_load(&r, w, NUNITS * CKPT_NKINDS, err)) {
            ok = 0;
            break;
        }
        for (int u = 0; ok && u < NUNITS; u++)
            for (int k = 0; ok && k < CKPT_NKINDS; k++)
                for (uint64_t i = 0; i < per[u]; i++) {
                    uint64_t x = rank * per[u] + i;
                    float want = x < numel[u] ? state[u][k][x] : 0.0f;
                    if (memcmp(&buf[u][k * per[u] + i], &want, 4) != 0) {
                        fsdp_err(err, "unit %d kind %d element %llu differs", u, k,
                                 (unsigned long long)x);
                        ok = 0;
                        break;
                    }
                }
    }
    for (int u = 0; u < NUNITS; u++)
        free(buf[u]);
    ckpt_reader_free(&r);
    ckpt_manifest_free(&m);
    st->ops = ops;
    return ok;
}

static int read_back_matches(struct storage *st, uint64_t step, int world, char *err)
{
    return read_back_with(st, step, world, 1, err);
}

static void round_trip_every_codec_chunk_size_and_world_body(const char *root)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    REQUIRE(storage_open(root, &st, err) == 0, "%s", err);
    const int codecs[] = {CKPT_CODEC_RAW, CKPT_CODEC_ZSTD, CKPT_CODEC_ZSTD_SHUFFLE4};
    const size_t chunks[] = {64, 1000, 1 << 20};
    uint64_t step = 1;
    for (int ci = 0; ci < 3; ci++)
        for (int si = 0; si < 3; si++, step++) {
            REQUIRE(write_step(st, step, codecs[ci], chunks[si], err) == 0, "%s", err);
            for (int world = 1; world <= 5; world++)
                for (int threads = 0; threads <= 3; threads += threads ? 2 : 1)
                    CHECK(read_back_with(st, step, world, threads, err),
                          "codec %d chunk %zu world %d, %d threads: %s", codecs[ci], chunks[si],
                          world, threads, err);
        }
    struct ckpt_step_info *steps;
    int n;
    REQUIRE(ckpt_list_steps(st, &steps, &n, err) == 0, "%s", err);
    CHECK(n == 9 && steps[0].step == 1 && steps[8].step == 9 && steps[8].committed, "listing");
    free(steps);
    /* XXH3-128 chunk digests: the same round trip, and a manifest saying so */
    for (int ci = 0; ci < 3; ci++, step++) {
        REQUIRE(write_step_hashed(st, step, codecs[ci], 1000, CKPT_HASH_XXH3, err) == 0, "%s", err);
        for (int world = 1; world <= 4; world += 3)
            for (int threads = 0; threads <= 3; threads += threads ? 2 : 1)
                CHECK(read_back_with(st, step, world, threads, err),
                      "xxh3, codec %d world %d, %d threads: %s", codecs[ci], world, threads, err);
        struct ckpt_manifest m;
        REQUIRE(ckpt_load_manifest(st, step, &m, err) == 0, "%s", err);
        CHECK(m.chunk_hash == CKPT_HASH_XXH3, "the manifest lost its chunk hash");
        ckpt_manifest_free(&m);
    }
    REQUIRE(ckpt_list_steps(st, &steps, &n, err) == 0, "%s", err);
    free(steps);
    storage_close(st);
}

static void round_trip_every_codec_chunk_size_and_world(void)
{
    in_tmpdir(round_trip_every_codec_chunk_size_and_world_body);
}

static void count_bad(void *arg, const char *msg)
{
    (void)msg;
    (*(int *)arg)++;
}

static void flipped_byte_is_named(const char *root, int hash)
{
    char err[FSDP_ERR_LEN], path[600];
    struct storage *st;
    REQUIRE(storage_open(root, &st, err) == 0, "%s", err);
    REQUIRE(write_step_hashed(st, 100, CKPT_CODEC_ZSTD_SHUFFLE4, 1000, hash, err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/step-00000100/shard-00001-of-00003", root);
    FILE *f = fopen(path, "r+b");
    REQUIRE(f != NULL, "open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size / 2, SEEK_SET);
    int b = fgetc(f);
    fseek(f, size / 2, SEEK_SET);
    fputc(b ^ 0x10, f);
    fclose(f);
    char mismatch[64];
    snprintf(mismatch, sizeof mismatch, "%s mismatch", ckpt_hash_name(hash));
    CHECK(!read_back_matches(st, 100, 2, err) && strstr(err, "shard-00001-of-00003: chunk") &&
              strstr(err, mismatch),
          "error: %s", err);
    CHECK(!read_back_with(st, 100, 2, 0, err) && strstr(err, "shard-00001-of-00003: chunk") &&
              strstr(err, mismatch),
          "the reader on its own: error: %s", err);
    CHECK(!read_back_with(st, 100, 2, 3, err) && strstr(err, "shard-00001-of-00003: chunk") &&
              strstr(err, mismatch),
          "3 threads: error: %s", err);
    struct ckpt_manifest m;
    REQUIRE(ckpt_load_manifest(st, 100, &m, err) == 0, "%s", err);
    struct ckpt_reader r;
    ckpt_reader_init(&r, st, &m, err);
    for (int threads = 1; threads <= 3; threads += 2) { /* 3: the chunks on 3 threads */
        r.threads = threads;
        int problems = 0, reported = 0;
        for (int s = 0; s < m.nshards; s++)
            problems += ckpt_verify_shard(&r, s, count_bad, &reported) > 0;
        CHECK(problems == 1 && reported == 1,
              "%d threads: %d shards reported bad with %d problems, expected exactly one", threads,
              problems, reported);
    }
    ckpt_reader_free(&r);
    ckpt_manifest_free(&m);
    remove_step(st, 100);
    storage_close(st);
}

static void a_flipped_byte_is_named_by_shard_and_chunk_body(const char *root)
{
    flipped_byte_is_named(root, CKPT_HASH_SHA256);
    flipped_byte_is_named(root, CKPT_HASH_XXH3);
}

static void a_flipped_byte_is_named_by_shard_and_chunk(void)
{
    in_tmpdir(a_flipped_byte_is_named_by_shard_and_chunk_body);
}

/* Breaks one number of a valid manifest, re-serialises (which re-seals its
 * digest), and expects the parser to refuse it naming the problem. */
static void inconsistent_manifests_are_refused_body(const char *root)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    REQUIRE(storage_open(root, &st, err) == 0, "%s", err);
    REQUIRE(write_step(st, 200, CKPT_CODEC_ZSTD, 1000, err) == 0, "%s", err);
    struct {
        const char *what, *needle;
    } cases[] = {
        {"chunk count", "chunk count"}, {"index offset", "index"}, {"padding", "padded"},
        {"tensor outside", "outside"},  {"shard name", "named"},   {"world", "one entry per rank"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct ckpt_manifest m;
        REQUIRE(ckpt_load_manifest(st, 200, &m, err) == 0, "%s", err);
        switch (i) {
        case 0:
            m.shards[1].nchunks += 1;
            break;
        case 1:
            m.shards[2].index_off += 4;
            break;
        case 2:
            m.units[1].padded += 3;
            break;
        case 3:
            m.units[0].tensors[1].shape[0] += 1;
            break;
        case 4:
            snprintf(m.shards[0].file, sizeof m.shards[0].file, "../../etc/passwd");
            break;
        case 5:
            m.world = 2;
            break;
        }
        char *doc = ckpt_manifest_dump(&m);
        ckpt_manifest_free(&m);
        REQUIRE(doc != NULL, "dump");
        struct ckpt_manifest back;
        int rc = ckpt_manifest_parse(doc, strlen(doc), &back, err);
        CHECK(rc != 0 && strstr(err, cases[i].needle), "%s: rc %d, error '%s'", cases[i].what, rc,
              err);
        if (rc == 0)
            ckpt_manifest_free(&back);
        free(doc);
    }
    storage_close(st);
}

static void inconsistent_manifests_are_refused(void)
{
    in_tmpdir(inconsistent_manifests_are_refused_body);
}

/* A real manifest (step 200, zstd, 1000-byte chunks), mutated 3000 ways. */
static void mutated_manifests_never_crash_the_parser_body(const char *root)
{
    char err[FSDP_ERR_LEN], path[600];
    struct storage *st;
    REQUIRE(storage_open(root, &st, err) == 0, "%s", err);
    int written = write_step(st, 200, CKPT_CODEC_ZSTD, 1000, err);
    storage_close(st);
    REQUIRE(written == 0, "%s", err);
    snprintf(path, sizeof path, "%s/step-00000200/MANIFEST.json", root);
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL, "open %s", path);
    static char doc[1 << 20];
    size_t n = fread(doc, 1, sizeof doc, f);
    fclose(f);
    struct fsdp_rng rng = {3};
    int accepted = 0;
    for (int i = 0; i < 3000; i++) {
        static char mut[1 << 20];
        memcpy(mut, doc, n);
        size_t len = n;
        int kind = (int)fsdp_rng_below(&rng, 3);
        size_t at = (size_t)fsdp_rng_below(&rng, n);
        if (kind == 0)
            mut[at] = (char)fsdp_rng_below(&rng, 256);
        else if (kind == 1)
            len = at; /* truncated */
        else
            mut[at] = "0123456789-e.\"{}[],:"[fsdp_rng_below(&rng, 20)];
        struct ckpt_manifest m;
        if (ckpt_manifest_parse(mut, len, &m, err) == 0) {
            accepted++;
            ckpt_manifest_free(&m);
        }
    }
    /* only changes that leave the canonical form alone (whitespace) pass */
    CHECK(accepted < 300, "%d of 3000 mutated manifests accepted", accepted);
}

static void mutated_manifests_never_crash_the_parser(void)
{
    in_tmpdir(mutated_manifests_never_crash_the_parser_body);
}

/* Flips one byte of a shard's chunk index (its last bytes): the reader and
 * verify name the index, and no chunk is trusted. */
static void a_damaged_chunk_index_is_named_body(const char *root)
{
    char err[FSDP_ERR_LEN], path[600];
    struct storage *st;
    REQUIRE(storage_open(root, &st, err) == 0, "%s", err);
    REQUIRE(write_step(st, 300, CKPT_CODEC_ZSTD, 1000, err) == 0, "%s", err);
    snprintf(path, sizeof path, "%s/step-00000300/shard-00002-of-00003", root);
    FILE *f = fopen(path, "r+b");
    REQUIRE(f != NULL, "open %s", path);
    fseek(f, -20, SEEK_END); /* inside the last index entry's digest */
    int b = fgetc(f);
    fseek(f, -20, SEEK_END);
    fputc(b ^ 1, f);
    fclose(f);
    CHECK(!read_back_matches(st, 300, 1, err) && strstr(err, "shard-00002-of-00003: chunk index") &&
              strstr(err, "sha256 mismatch"),
          "error: %s", err);
    struct ckpt_manifest m;
    REQUIRE(ckpt_load_manifest(st, 300, &m, err) == 0, "%s", err);
    struct ckpt_reader r;
    REQUIRE(ckpt_reader_init(&r, st, &m, err) == 0, "%s", err);
    int bad = 0;
    CHECK(ckpt_verify_shard(&r, 2, count_bad, &bad) == 1 && bad == 1, "verify: %d", bad);
    CHECK(ckpt_verify_shard(&r, 0, count_bad, &bad) == 0, "an intact shard");
    ckpt_reader_free(&r);
    ckpt_manifest_free(&m);
    remove_step(st, 300);
    storage_close(st);
}

static void a_damaged_chunk_index_is_named(void) { in_tmpdir(a_damaged_chunk_index_is_named_body); }

/* An index whose digest matched (a writer's bug, a forged manifest) is still
 * checked entry by entry before anything indexes with it. */
static void malformed_chunk_indexes_are_refused(void)
{
    enum { N = 3 };
    struct ckpt_chunk c[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++)
        c[i] = (struct ckpt_chunk){.raw_len = i < 2 ? 64 : 40, .stored_len = 30, .codec = 1};
    struct ckpt_shard s = {
        .file = "shard-00000-of-00001", .raw_size = 168, .nchunks = N, .index_off = 90};
    size_t len;
    struct {
        const char *what;
        int at; /* byte to change (-1: none) */
        unsigned char to;
        size_t len;         /* 0: the whole index */
        uint64_t index_off; /* 0: 90 */
        const char *needle; /* NULL: accepted */
    } cases[] = {
        {"intact", -1, 0, 0, 0, NULL},
        {"magic", 0, 'X', 0, 0, "FSDPCIX1"},
        {"count", 12, 4, 0, 0, "holds 4 chunks"},
        {"truncated", -1, 0, 16 + 48 * 2, 0, "holds 3 chunks"},
        {"raw length", 16 + 8, 65, 0, 0, "entry 0"},
        {"codec", 16 + 48 + 12, 9, 0, 0, "entry 1"},
        {"raw codec with another stored length", 16 + 12, 0, 0, 0, "entry 0"},
        {"stored beyond the index", 16 + 96 + 7, 1, 0, 0, "entry 2"},
        {"stored total", -1, 0, 0, 91, "covers"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *b = ckpt_index_encode(c, N, &len);
        REQUIRE(b != NULL && len == CKPT_INDEX_HEADER + N * CKPT_INDEX_ENTRY, "encode");
        if (cases[i].at >= 0)
            b[cases[i].at] = cases[i].to;
        s.index_off = cases[i].index_off ? cases[i].index_off : 90;
        struct ckpt_chunk *t = NULL;
        char err[FSDP_ERR_LEN] = "";
        int rc = ckpt_index_decode(b, cases[i].len ? cases[i].len : len, &s, 64, &t, err);
        if (!cases[i].needle)
            CHECK(rc == 0 && t && t[2].raw_off == 128 && t[2].stored_off == 60, "%s: %s",
                  cases[i].what, err);
        else
            CHECK(rc != 0 && !t && strstr(err, cases[i].needle), "%s: rc %d, '%s'", cases[i].what,
                  rc, err);
        free(t);
        free(b);
    }
}

/* A shard that would need more chunks than the format allows is refused
 * before a byte is written (a reader would refuse its manifest). */
static void too_many_chunks_are_refused_up_front_body(const char *root)
{
    char err[FSDP_ERR_LEN] = "";
    struct storage *st;
    REQUIRE(storage_open(root, &st, err) == 0, "%s", err);
    struct ckpt_codec *c = ckpt_codec_new(4);
    struct ckpt_write_opts o = {CKPT_CODEC_RAW, 0, 4, CKPT_HASH_SHA256};
    struct ckpt_section sec = {0, 0, 0, (uint64_t)CKPT_MAX_CHUNKS + 1, 0};
    struct ckpt_shard_writer *w = NULL;
    int rc = ckpt_writer_begin(st, "step-00000400/shard-00000-of-00001", "shard-00000-of-00001", &o,
                               c, 0, &sec, 1, NULL, &w, err);
    CHECK(rc != 0 && w == NULL && strstr(err, "use larger chunks"), "rc %d: %s", rc, err);
    struct ckpt_step_info *steps;
    int n;
    REQUIRE(ckpt_list_steps(st, &steps, &n, err) == 0, "%s", err);
    for (int i = 0; i < n; i++)
        CHECK(steps[i].step != 400, "an object of the refused shard was left");
    free(steps);
    ckpt_codec_free(c);
    storage_close(st);
}

static void too_many_chunks_are_refused_up_front(void)
{
    in_tmpdir(too_many_chunks_are_refused_up_front_body);
}

/* The tools read a tensor a few hundred KiB at a time (ckpt_read_unit):
 * each chunk must be fetched once, from the reader's cache after that, on
 * any thread count (a pool fetches what it is given). */
static void small_reads_fetch_each_chunk_once_body(const char *root)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    REQUIRE(storage_open(root, &st, err) == 0, "%s", err);
    REQUIRE(write_step(st, 900, CKPT_CODEC_RAW, 400, err) == 0, "%s", err); /* 100 floats */
    struct ckpt_manifest m;
    REQUIRE(ckpt_load_manifest(st, 900, &m, err) == 0, "%s", err);
    for (int threads = 1; threads <= 2; threads++) {
        struct ckpt_reader r;
        REQUIRE(ckpt_reader_init(&r, st, &m, err) == 0, "%s", err);
        r.threads = threads;
        float piece[10];
        int same = 1;
        for (uint64_t x = 0; x < numel[0]; x += 10) {
            REQUIRE(ckpt_read_unit(&r, 0, CKPT_PARAM, x, 10, piece, err) == 0, "%s", err);
            same &= memcmp(piece, state[0][CKPT_PARAM] + x, sizeof piece) == 0;
        }
        /* 4000 bytes of unit 0's parameters over 3 shards: 10 chunks and
         * the shared ones at the shards' section edges */
        CHECK(same, "%d threads: a piece read back differs", threads);
        CHECK(r.chunks_fetched <= 16, "%d threads: %llu chunk fetches for 100 small reads", threads,
              (unsigned long long)r.chunks_fetched);
        ckpt_reader_free(&r);
    }
    ckpt_manifest_free(&m);
    remove_step(st, 900);
    storage_close(st);
}

static void small_reads_fetch_each_chunk_once(void)
{
    in_tmpdir(small_reads_fetch_each_chunk_once_body);
}

CHECK_MAIN(TEST(round_trip_every_codec_chunk_size_and_world),
           TEST(a_flipped_byte_is_named_by_shard_and_chunk),
           TEST(inconsistent_manifests_are_refused), TEST(mutated_manifests_never_crash_the_parser),
           TEST(a_damaged_chunk_index_is_named), TEST(malformed_chunk_indexes_are_refused),
           TEST(too_many_chunks_are_refused_up_front), TEST(small_reads_fetch_each_chunk_once))
