/*
 * test_manifest_safety.c - ckpt_shard_from_json on hostile shard entries:
 * every refusal is a clean error (no read of memory it has just freed, no
 * leak), whatever part of the entry is wrong. Meant to run under the
 * ASan/UBSan build too, where a use-after-free aborts the test.
 */
#include "check.h"

#include "ckpt.h"

#include <jansson.h>
#include <string.h>

#define HEX64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

/* A well-formed shard entry with two sections and two chunks. */
static json_t *good_shard(void)
{
    json_error_t je;
    json_t *j = json_loads(
        "{\"rank\": 0, \"file\": \"shard-00000-of-00001\", \"raw_size\": 64,"
        " \"stored_size\": 64, \"sha256\": \"" HEX64 "\","
        " \"sections\": ["
        "  {\"kind\": \"param\", \"unit\": 0, \"lo\": 0, \"n\": 8, \"raw_offset\": 0},"
        "  {\"kind\": \"exp_avg\", \"unit\": 0, \"lo\": 0, \"n\": 8, \"raw_offset\": 32}],"
        " \"chunks\": ["
        "  {\"codec\": \"none\", \"raw_offset\": 0, \"raw_length\": 32, \"stored_offset\": 0,"
        "   \"stored_length\": 32, \"sha256\": \"" HEX64 "\"},"
        "  {\"codec\": \"zstd\", \"raw_offset\": 32, \"raw_length\": 32, \"stored_offset\": 32,"
        "   \"stored_length\": 32, \"sha256\": \"" HEX64 "\"}]}",
        0, &je);
    return j;
}

static void a_good_shard_entry_parses(void)
{
    json_t *j = good_shard();
    REQUIRE(j, "the test's JSON does not parse");
    struct ckpt_shard s;
    char err[CKPT_ERR_LEN] = "";
    CHECK(ckpt_shard_from_json(j, &s, err) == 0, "%s", err);
    CHECK(s.nsections == 2 && s.nchunks == 2 && s.sections[1].kind == 1 && s.chunks[1].codec == 1,
          "parsed other values");
    ckpt_shard_free(&s);
    json_decref(j);
}

/* Sets member key of element i of array arr in the good entry to value
 * and expects a refusal whose message holds needle. */
static int refused(const char *arr, size_t i, const char *key, json_t *value, const char *needle)
{
    json_t *j = good_shard();
    if (!j)
        return 0;
    json_object_set_new(json_array_get(json_object_get(j, arr), i), key, value);
    struct ckpt_shard s;
    char err[CKPT_ERR_LEN] = "";
    int rc = ckpt_shard_from_json(j, &s, err);
    json_decref(j);
    if (rc == 0) {
        ckpt_shard_free(&s);
        fprintf(stderr, "  %s[%zu].%s accepted\n", arr, i, key);
        return 0;
    }
    if (!strstr(err, needle)) {
        fprintf(stderr, "  %s[%zu].%s: '%s' lacks '%s'\n", arr, i, key, err, needle);
        return 0;
    }
    /* a refused entry is left empty: freeing it again is harmless */
    ckpt_shard_free(&s);
    return s.sections == NULL && s.chunks == NULL;
}

static void a_bad_section_kind_is_refused_without_touching_freed_memory(void)
{
    CHECK(refused("sections", 0, "kind", json_string("bogus"), "unknown kind"), "first section");
    CHECK(refused("sections", 1, "kind", json_string("bogus"), "unknown kind"), "last section");
    CHECK(refused("sections", 1, "kind", json_integer(1), "unknown kind"), "a number as kind");
    CHECK(refused("sections", 1, "n", json_integer(-1), "'n'"), "a negative count");
}

static void a_bad_chunk_codec_is_refused_without_touching_freed_memory(void)
{
    CHECK(refused("chunks", 0, "codec", json_string("lz4"), "unknown codec"), "first chunk");
    CHECK(refused("chunks", 1, "codec", json_string("lz4"), "unknown codec"), "last chunk");
    CHECK(refused("chunks", 1, "codec", json_null(), "unknown codec"), "a null codec");
    CHECK(refused("chunks", 1, "sha256", json_string("xyz"), "malformed"), "a bad digest");
}

CHECK_MAIN(TEST(a_good_shard_entry_parses),
           TEST(a_bad_section_kind_is_refused_without_touching_freed_memory),
           TEST(a_bad_chunk_codec_is_refused_without_touching_freed_memory))
