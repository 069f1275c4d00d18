/*
 * test_manifest_safety.c - shard entries from hostile manifests: every
 * refusal is a clean error (no read of memory it has just freed, no leak),
 * whatever part of the entry is wrong, in both formats: a format-2 entry
 * (ckpt_shard_from_json: what a rank sends the committer, and what a
 * manifest holds) and a format-1 entry with its sections and chunk table
 * (inside ckpt_manifest_parse). Meant to run under the ASan/UBSan build
 * too, where a use-after-free aborts the test.
 */
#include "check.h"

#include "ckpt.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <string.h>

#define HEX64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

/* A well-formed format-2 shard entry. */
static json_t *good_shard(void)
{
    json_error_t je;
    return json_loads("{\"rank\": 0, \"file\": \"shard-00000-of-00001\", \"raw_size\": 64,"
                      " \"stored_size\": 160, \"sha256\": \"" HEX64 "\", \"chunks\": 2,"
                      " \"index\": {\"offset\": 48, \"length\": 112}}",
                      0, &je);
}

static void a_good_shard_entry_parses(void)
{
    json_t *j = good_shard();
    REQUIRE(j, "the test's JSON does not parse");
    struct ckpt_shard s;
    char err[FSDP_ERR_LEN] = "";
    CHECK(ckpt_shard_from_json(j, &s, err) == 0, "%s", err);
    CHECK(s.nchunks == 2 && s.index_off == 48 && s.index_len == 112 && s.digest[1] == 0x11 &&
              !s.chunks,
          "parsed other values");
    json_t *back = ckpt_shard_to_json(&s);
    CHECK(json_equal(back, j), "the entry does not survive a round trip");
    json_decref(back);
    ckpt_shard_free(&s);
    json_decref(j);
}

/* Sets member key of the entry (or of its "index" object) to value and
 * expects a refusal whose message holds needle. */
static int refused(int in_index, const char *key, json_t *value, const char *needle)
{
    json_t *j = good_shard();
    if (!j)
        return 0;
    json_object_set_new(in_index ? json_object_get(j, "index") : j, key, value);
    struct ckpt_shard s;
    char err[FSDP_ERR_LEN] = "";
    int rc = ckpt_shard_from_json(j, &s, err);
    json_decref(j);
    if (rc == 0) {
        ckpt_shard_free(&s);
        fprintf(stderr, "  %s accepted\n", key);
        return 0;
    }
    if (!strstr(err, needle)) {
        fprintf(stderr, "  %s: '%s' lacks '%s'\n", key, err, needle);
        return 0;
    }
    ckpt_shard_free(&s); /* a refused entry is empty: freeing it again is harmless */
    return s.chunks == NULL;
}

static void bad_format2_entries_are_refused(void)
{
    CHECK(refused(0, "chunks", json_string("2"), "'chunks'"), "a string as count");
    CHECK(refused(0, "chunks", json_integer(-1), "'chunks'"), "a negative count");
    CHECK(refused(0, "index", json_null(), "chunk index"), "no index");
    CHECK(refused(1, "offset", json_integer(-5), "'offset'"), "a negative index offset");
    CHECK(refused(1, "length", json_string("112"), "'length'"), "a string as index length");
    CHECK(refused(0, "sha256", json_string("xyz"), "sha256"), "a bad digest");
    CHECK(refused(0, "sha256", json_string(HEX64 "00"), "sha256"), "a long digest");
}

/* ---- format 1, through the whole manifest ------------------------------------ */

/* A format-1 manifest of one unit of 8 elements on one rank, two chunks. */
static json_t *good_v1(void)
{
    struct ckpt_tensor t = {"w", 1, {8}, 0, 8};
    struct ckpt_unit u = {"u", 8, 8, 1, &t};
    struct ckpt_chunk ch[2] = {{0, 48, 0, 48, CKPT_CODEC_RAW, {0}},
                               {48, 48, 48, 20, CKPT_CODEC_ZSTD, {0}}};
    struct ckpt_shard s = {.file = "shard-00000-of-00001",
                           .raw_size = 96,
                           .stored_size = 68,
                           .nchunks = 2,
                           .chunks = ch};
    struct ckpt_manifest m = {.version = 1,
                              .step = 5,
                              .world = 1,
                              .chunk_bytes = 48,
                              .sharding = "full",
                              .nunits = 1,
                              .units = &u,
                              .nshards = 1,
                              .shards = &s};
    m.model = json_object();
    m.trainer = json_object();
    char *doc = ckpt_manifest_dump(&m);
    json_decref(m.model);
    json_decref(m.trainer);
    json_error_t je;
    json_t *j = doc ? json_loads(doc, 0, &je) : NULL;
    free(doc);
    return j;
}

/* The manifest's seal (its canonical form's SHA-256), computed here from
 * the rule, not by the code under test. */
static char *sealed(json_t *j)
{
    json_object_del(j, "digest");
    char *doc = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    unsigned char sha[32];
    unsigned int n = 32;
    EVP_Digest(doc, strlen(doc), sha, &n, EVP_sha256(), NULL);
    free(doc);
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", sha[i]);
    json_object_set_new(j, "digest", json_string(hex));
    return json_dumps(j, JSON_INDENT(1));
}

/* Sets member key of element i of shards[0].arr to value; the re-sealed
 * manifest must be refused with needle in the message. */
static int v1_refused(const char *arr, size_t i, const char *key, json_t *value, const char *needle)
{
    json_t *j = good_v1();
    if (!j)
        return 0;
    json_t *shard = json_array_get(json_object_get(j, "shards"), 0);
    json_object_set_new(json_array_get(json_object_get(shard, arr), i), key, value);
    char *doc = sealed(j);
    json_decref(j);
    struct ckpt_manifest m;
    char err[FSDP_ERR_LEN] = "";
    int rc = ckpt_manifest_parse(doc, strlen(doc), &m, err);
    free(doc);
    if (rc == 0) {
        ckpt_manifest_free(&m);
        fprintf(stderr, "  %s[%zu].%s accepted\n", arr, i, key);
        return 0;
    }
    if (!strstr(err, needle)) {
        fprintf(stderr, "  %s[%zu].%s: '%s' lacks '%s'\n", arr, i, key, err, needle);
        return 0;
    }
    return m.shards == NULL && m.units == NULL;
}

static void a_good_format1_manifest_parses(void)
{
    json_t *j = good_v1();
    REQUIRE(j, "a format-1 manifest does not dump");
    char *doc = sealed(j);
    json_decref(j);
    struct ckpt_manifest m;
    char err[FSDP_ERR_LEN] = "";
    CHECK(ckpt_manifest_parse(doc, strlen(doc), &m, err) == 0, "%s", err);
    CHECK(m.version == 1 && m.chunk_bytes == 48 && m.shards[0].nchunks == 2 &&
              m.shards[0].chunks[1].codec == CKPT_CODEC_ZSTD,
          "parsed other values");
    char *again = ckpt_manifest_dump(&m);
    CHECK(again && strcmp(again, doc) == 0, "a format-1 manifest does not dump as it was");
    free(again);
    free(doc);
    ckpt_manifest_free(&m);
}

static void bad_format1_sections_and_chunks_are_refused(void)
{
    CHECK(v1_refused("sections", 0, "kind", json_string("bogus"), "unknown kind"), "first section");
    CHECK(v1_refused("sections", 2, "kind", json_string("bogus"), "unknown kind"), "last section");
    CHECK(v1_refused("sections", 2, "kind", json_integer(1), "unknown kind"), "a number as kind");
    CHECK(v1_refused("sections", 2, "n", json_integer(-1), "'n'"), "a negative count");
    CHECK(v1_refused("sections", 1, "raw_offset", json_integer(36), "does not match the layout"),
          "a section off the layout");
    CHECK(v1_refused("chunks", 0, "codec", json_string("lz4"), "unknown codec"), "first chunk");
    CHECK(v1_refused("chunks", 1, "codec", json_string("lz4"), "unknown codec"), "last chunk");
    CHECK(v1_refused("chunks", 1, "codec", json_null(), "unknown codec"), "a null codec");
    CHECK(v1_refused("chunks", 1, "sha256", json_string("xyz"), "malformed"), "a bad digest");
    CHECK(v1_refused("chunks", 1, "raw_offset", json_integer(44), "chunk table"),
          "a gap in the table");
}

CHECK_MAIN(TEST(a_good_shard_entry_parses), TEST(bad_format2_entries_are_refused),
           TEST(a_good_format1_manifest_parses), TEST(bad_format1_sections_and_chunks_are_refused))
