/*
 * test_cleanup.c - what ckpt_clean and ckpt_discard_own may delete, on a
 * real directory: retention keeps the newest K committed steps (and every
 * step above the one just committed), garbage goes only when its writer's
 * generation is fenced, a committed step is never touched because its
 * manifest cannot be read, names ckpt does not know stay, and the store is
 * listed once however many steps it holds. Each test makes its own store.
 */
#include "check.h"

#include "ckpt.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { NUMEL = 64 };

/* Each test's own store, in a directory of its own, removed after the test
 * however it ended. */
struct fixture {
    char root[64];
    struct storage *st;
};

static void in_store(void (*body)(struct fixture *fx))
{
    char err[FSDP_ERR_LEN];
    struct fixture fx = {.st = NULL};
    if (check_tmpdir(fx.root, sizeof fx.root, "cleanup") != 0)
        return;
    int opened = storage_open(fx.root, &fx.st, err);
    CHECK(opened == 0, "%s", err);
    if (opened == 0) {
        body(&fx);
        storage_close(fx.st);
    }
    check_rmtree(fx.root);
}

/* A real committed step of a one-unit model, written by `world` ranks with
 * writer tag `tag` (NULL: untagged, as before tags). */
static int commit_step(struct storage *st, uint64_t step, int world, const char *tag, char *err)
{
    static float data[3][NUMEL];
    struct ckpt_manifest m = {0};
    m.version = CKPT_FORMAT_VERSION;
    m.chunk_bytes = 1024;
    m.step = step;
    m.world = world;
    if (tag)
        ckpt_tag_generation(tag, &m.generation); /* the writer's, as every writer records */
    snprintf(m.sharding, sizeof m.sharding, "full");
    m.model = json_pack("{s:i}", "toy", 1);
    m.trainer = json_pack("{s:I}", "step", (json_int_t)step);
    m.nunits = 1;
    m.units = calloc(1, sizeof *m.units);
    m.units[0] = (struct ckpt_unit){"u", NUMEL, NUMEL, 1, calloc(1, sizeof(struct ckpt_tensor))};
    m.units[0].tensors[0] = (struct ckpt_tensor){"u.w", 1, {NUMEL}, 0, NUMEL};
    m.nshards = world;
    m.shards = calloc((size_t)world, sizeof *m.shards);
    struct ckpt_write_opts o = {CKPT_CODEC_RAW, 0, 1024, CKPT_HASH_SHA256};
    struct ckpt_codec *c = ckpt_codec_new(o.chunk_bytes);
    char dir[32];
    ckpt_step_dir(step, dir, sizeof dir);
    int rc = 0;
    uint64_t per = NUMEL / (uint64_t)world;
    for (int r = 0; !rc && r < world; r++) {
        struct ckpt_src src[CKPT_NKINDS];
        for (int k = 0; k < CKPT_NKINDS; k++)
            src[k] = (struct ckpt_src){0, k, (uint64_t)r * per, per, data[k] + r * per};
        char file[CKPT_TAG_LEN + 32], key[160];
        ckpt_shard_file(r, world, tag, file, sizeof file);
        snprintf(key, sizeof key, "%s/%s", dir, file);
        rc = ckpt_shard_write(st, key, file, &o, c, src, CKPT_NKINDS, r, &m.shards[r], NULL, err);
    }
    if (!rc)
        rc = ckpt_commit(st, &m, err);
    ckpt_codec_free(c);
    ckpt_manifest_free(&m);
    return rc;
}

static int put(struct storage *st, const char *key)
{
    char err[FSDP_ERR_LEN];
    return storage_put(st, key, "x", 1, err);
}

static int exists(const char *root, const char *key)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", root, key);
    return access(path, F_OK) == 0;
}

static void claim_generations(struct storage *st, int n)
{
    char err[FSDP_ERR_LEN];
    for (int i = 0; i < n; i++) {
        uint64_t g;
        CHECK(ckpt_fence_claim(st, &g, err) == 0, "%s", err);
    }
}

static void retention_keeps_the_newest_k_and_every_step_above_upto_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 1);
    for (uint64_t s = 10; s <= 50; s += 10)
        REQUIRE(commit_step(st, s, 2, "g1-00000000000000aa", err) == 0, "%s", err);
    /* a run resumed from 20 (30..50 did not load for it) just committed 25 */
    REQUIRE(commit_step(st, 25, 2, "g1-00000000000000bb", err) == 0, "%s", err);
    struct ckpt_clean_policy p = {.generation = 1, .keep = 2, .upto = 25};
    struct ckpt_clean_report rep;
    REQUIRE(ckpt_clean(st, &p, &rep, err) == 0, "%s", err);
    struct ckpt_step_info *steps;
    int n;
    REQUIRE(ckpt_list_steps(st, &steps, &n, err) == 0, "%s", err);
    char got[200] = "";
    for (int i = 0; i < n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%llu%s ",
                 (unsigned long long)steps[i].step, steps[i].committed ? "" : "?");
    CHECK(strcmp(got, "20 25 30 40 50 ") == 0, "left: %s", got);
    CHECK(rep.steps_removed == 1 && rep.steps_kept == 5, "removed %d kept %d", rep.steps_removed,
          rep.steps_kept);
    free(steps);
}

static void retention_keeps_the_newest_k_and_every_step_above_upto(void)
{
    in_store(retention_keeps_the_newest_k_and_every_step_above_upto_body);
}

static void garbage_goes_only_when_its_generation_is_fenced_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 3);
    /* incomplete steps: an old launch's shard, a live one's (generation 3),
     * a shard from before tags, a temporary of an old launch, a stranger */
    put(st, "step-00000005/shard-00000-of-00002.g2-0000000000000001");
    put(st, "step-00000005/shard-00000-of-00002.g3-0000000000000002");
    put(st, "step-00000006/shard-00001-of-00002");
    put(st, "step-00000007/shard-00001-of-00002.g1-0000000000000003.tmp.77.1");
    put(st, "step-00000008/notes.txt");
    struct ckpt_clean_policy p = {.generation = 3, .keep = 0};
    struct ckpt_clean_report rep;
    REQUIRE(ckpt_clean(st, &p, &rep, err) == 0, "%s", err);
    CHECK(!exists(root, "step-00000005/shard-00000-of-00002.g2-0000000000000001"), "old shard");
    CHECK(exists(root, "step-00000005/shard-00000-of-00002.g3-0000000000000002"), "live shard");
    CHECK(!exists(root, "step-00000006"), "untagged leftover");
    CHECK(!exists(root, "step-00000007"), "old temporary");
    CHECK(exists(root, "step-00000008/notes.txt"), "a name ckpt does not know");
    CHECK(rep.incomplete_removed == 2 && rep.incomplete_left == 2, "removed %d left %d",
          rep.incomplete_removed, rep.incomplete_left);
    /* a tool (generation 0) judges by the store's current generation: same verdicts */
    put(st, "step-00000009/shard-00000-of-00001.g2-0000000000000004");
    p.generation = 0;
    REQUIRE(ckpt_clean(st, &p, &rep, err) == 0, "%s", err);
    CHECK(!exists(root, "step-00000009"), "a tool removes fenced garbage");
    CHECK(exists(root, "step-00000005/shard-00000-of-00002.g3-0000000000000002"), "live shard");
    /* a fenced caller deletes nothing */
    claim_generations(st, 1);
    p.generation = 3;
    CHECK(ckpt_clean(st, &p, &rep, err) != 0 && strstr(err, "fenced"), "%s", err);
}

static void garbage_goes_only_when_its_generation_is_fenced(void)
{
    in_store(garbage_goes_only_when_its_generation_is_fenced_body);
}

static void a_losing_writers_shards_in_a_committed_step_go_the_winners_stay_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 2);
    REQUIRE(commit_step(st, 10, 2, "g2-00000000000000aa", err) == 0, "%s", err);
    put(st, "step-00000010/shard-00000-of-00002.g1-00000000000000bb"); /* fenced loser */
    put(st, "step-00000010/shard-00001-of-00002.g2-00000000000000cc"); /* live rival */
    put(st, "step-00000010/MANIFEST.json.tmp.99.1");                   /* a losing commit */
    struct ckpt_clean_policy p = {.generation = 2, .keep = 0};
    struct ckpt_clean_report rep;
    REQUIRE(ckpt_clean(st, &p, &rep, err) == 0, "%s", err);
    CHECK(!exists(root, "step-00000010/shard-00000-of-00002.g1-00000000000000bb"), "loser");
    CHECK(exists(root, "step-00000010/shard-00001-of-00002.g2-00000000000000cc"), "live rival");
    CHECK(!exists(root, "step-00000010/MANIFEST.json.tmp.99.1"), "losing commit's temporary");
    CHECK(exists(root, "step-00000010/shard-00000-of-00002.g2-00000000000000aa") &&
              exists(root, "step-00000010/shard-00001-of-00002.g2-00000000000000aa") &&
              exists(root, "step-00000010/MANIFEST.json"),
          "the committed step lost an object");
    /* with its manifest damaged, nothing of the step is judged */
    put(st, "step-00000010/shard-00000-of-00002.g1-00000000000000dd");
    char path[600];
    snprintf(path, sizeof path, "%s/step-00000010/MANIFEST.json", root);
    FILE *f = fopen(path, "r+");
    REQUIRE(f, "open %s", path);
    fputs("{garbage", f);
    fclose(f);
    REQUIRE(ckpt_clean(st, &p, &rep, err) == 0, "%s", err);
    CHECK(exists(root, "step-00000010/shard-00000-of-00002.g1-00000000000000dd"),
          "deleted on the word of an unreadable manifest");
}

static void a_losing_writers_shards_in_a_committed_step_go_the_winners_stay(void)
{
    in_store(a_losing_writers_shards_in_a_committed_step_go_the_winners_stay_body);
}

static void discard_own_removes_exactly_this_writers_shards_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    REQUIRE(commit_step(st, 0, 2, "g0-00000000000000aa", err) == 0, "%s", err);
    put(st, "step-00000000/shard-00000-of-00002.g0-00000000000000bb");
    put(st, "step-00000000/shard-00001-of-00002.g0-00000000000000bb");
    REQUIRE(ckpt_discard_own(st, 0, 2, "g0-00000000000000bb", err) == 0, "%s", err);
    CHECK(!exists(root, "step-00000000/shard-00000-of-00002.g0-00000000000000bb") &&
              !exists(root, "step-00000000/shard-00001-of-00002.g0-00000000000000bb"),
          "own shards left");
    struct ckpt_manifest m;
    CHECK(ckpt_load_manifest(st, 0, &m, err) == 0, "the committed step: %s", err);
    ckpt_manifest_free(&m);
    CHECK(ckpt_discard_own(st, 0, 2, "", err) != 0, "an untagged writer owns nothing");
}

static void discard_own_removes_exactly_this_writers_shards(void)
{
    in_store(discard_own_removes_exactly_this_writers_shards_body);
}

/* ---- wrapping stores (mocks inside a unit test) ------------------------------ */

/* Every wrapper starts with this; the plain operations pass through. */
struct wrap {
    struct storage base;
    struct storage *inner;
};
#define INNER(s) (((struct wrap *)(s))->inner)

static int w_list(struct storage *s, const char *prefix, int (*fn)(void *, const char *, uint64_t),
                  void *arg, char *err)
{
    return storage_list(INNER(s), prefix, fn, arg, err);
}
static int w_del(struct storage *s, const char *key, char *err)
{
    return storage_delete(INNER(s), key, err);
}
static int w_del_many(struct storage *s, const char *const *keys, int n, char *err)
{
    return storage_delete_many(INNER(s), keys, n, err);
}
static int w_stat(struct storage *s, const char *key, uint64_t *size, char *err)
{
    return storage_stat(INNER(s), key, size, err);
}
static int w_get(struct storage *s, const char *key, uint64_t off, size_t len, void *buf, char *err)
{
    return storage_get_range(INNER(s), key, off, len, buf, err);
}

/* counts listings */
struct counting {
    struct wrap w;
    int lists;
};
static int c_list(struct storage *s, const char *prefix, int (*fn)(void *, const char *, uint64_t),
                  void *arg, char *err)
{
    ((struct counting *)s)->lists++;
    return w_list(s, prefix, fn, arg, err);
}
static const struct storage_ops counting_ops = {.scheme = "count",
                                                .list = c_list,
                                                .del = w_del,
                                                .del_many = w_del_many,
                                                .stat = w_stat,
                                                .get_range = w_get};

static void thousands_of_incomplete_steps_take_one_listing_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 2);
    enum { N = 1000 };
    for (int i = 1; i <= N; i++) {
        char key[96];
        snprintf(key, sizeof key, "step-%08d/shard-00000-of-00001.g1-%016x", i, i);
        REQUIRE(put(st, key) == 0, "put %s", key);
    }
    struct counting c = {.w = {.base = {.ops = &counting_ops}, .inner = st}};
    snprintf(c.w.base.uri, sizeof c.w.base.uri, "count:%s", root);
    struct ckpt_clean_policy p = {.generation = 2, .keep = 3};
    struct ckpt_clean_report rep;
    REQUIRE(ckpt_clean(&c.w.base, &p, &rep, err) == 0, "%s", err);
    CHECK(rep.incomplete_removed == N, "%d of %d removed", rep.incomplete_removed, N);
    /* the fence check lists generations/, the seals fences/, the steps are
     * listed once */
    CHECK(c.lists == 3, "%d listings for %d steps", c.lists, N);
    struct ckpt_step_info *steps;
    int n;
    REQUIRE(ckpt_list_steps(st, &steps, &n, err) == 0, "%s", err);
    CHECK(n == 0, "%d steps left", n);
    free(steps);
}

static void thousands_of_incomplete_steps_take_one_listing(void)
{
    in_store(thousands_of_incomplete_steps_take_one_listing_body);
}

static void junk_generation_names_are_refused_not_parsed_loosely_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 1);
    const char *junk[] = {"generations/99999999999999999999999", "generations/7",
                          "generations/18446744073709551615", "generations/0000000000000000001x",
                          "generations/09223372036854775808"};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        REQUIRE(put(st, junk[i]) == 0, "put");
        uint64_t g = 0;
        CHECK(ckpt_fence_current(st, &g, err) != 0 && strstr(err, junk[i]) &&
                  strstr(err, "not a generation claim"),
              "%s: gen %llu, err '%s'", junk[i], (unsigned long long)g, err);
        CHECK(ckpt_fence_claim(st, &g, err) != 0, "%s: a claim went through", junk[i]);
        storage_delete(st, junk[i], err);
    }
    uint64_t g;
    CHECK(ckpt_fence_current(st, &g, err) == 0 && g == 1, "gen %llu: %s", (unsigned long long)g,
          err);
}

static void junk_generation_names_are_refused_not_parsed_loosely(void)
{
    in_store(junk_generation_names_are_refused_not_parsed_loosely_body);
}

static void shard_names_parse_strictly(void)
{
    int r, w;
    uint64_t g;
    CHECK(ckpt_parse_shard_name("shard-00001-of-00004", &r, &w, &g) == 0 && r == 1 && w == 4 &&
              g == 0,
          "untagged");
    CHECK(ckpt_parse_shard_name("shard-00003-of-00004.g17-0123456789abcdef", &r, &w, &g) == 0 &&
              r == 3 && g == 17,
          "tagged");
    const char *bad[] = {"shard-00004-of-00004",
                         "shard-0001-of-00004",
                         "shard-00001-of-00000",
                         "shard-00001-of-00004.",
                         "shard-00001-of-00004.g1-0123",
                         "shard-00001-of-00004.g01-0123456789abcdef",
                         "shard-00001-of-00004.g1-0123456789ABCDEF",
                         "shard-00001-of-00004.g99999999999999999999-0123456789abcdef",
                         "shard-00001-of-00004/../x",
                         "shard-+0001-of-00004"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(ckpt_parse_shard_name(bad[i], &r, &w, &g) != 0, "accepted %s", bad[i]);
    char tag[CKPT_TAG_LEN], name[CKPT_TAG_LEN + 32];
    CHECK(ckpt_writer_tag(UINT64_C(9223372036854775807), tag, sizeof tag) == 0, "tag");
    ckpt_shard_file(65535, 65536, tag, name, sizeof name);
    CHECK(ckpt_parse_shard_name(name, &r, &w, &g) == 0 && g == UINT64_C(9223372036854775807),
          "the longest name %s", name);
    CHECK(strlen(name) < sizeof(((struct ckpt_shard *)0)->file), "%s does not fit", name);
}

static void only_steps_that_load_count_toward_keep_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 1);
    for (uint64_t s = 3; s <= 12; s += 3)
        REQUIRE(commit_step(st, s, 1, "g1-00000000000000aa", err) == 0, "%s", err);
    for (int s = 9; s <= 12; s += 3) { /* the two newest are damaged */
        char path[600];
        snprintf(path, sizeof path, "%s/step-%08d/MANIFEST.json", root, s);
        FILE *f = fopen(path, "r+");
        REQUIRE(f, "open %s", path);
        fputs("{garbage", f);
        fclose(f);
    }
    /* a directory that spells step 6 another way is not step 6 */
    put(st, "step-0000000006/MANIFEST.json");
    struct ckpt_clean_policy p = {.generation = 1, .keep = 2, .upto = UINT64_MAX};
    struct ckpt_clean_report rep;
    REQUIRE(ckpt_clean(st, &p, &rep, err) == 0, "%s", err);
    CHECK(rep.steps_removed == 0 && exists(root, "step-00000003/MANIFEST.json") &&
              exists(root, "step-00000006/MANIFEST.json"),
          "two damaged steps pushed out the good ones (removed %d)", rep.steps_removed);
    CHECK(exists(root, "step-0000000006/MANIFEST.json"), "an odd spelling was deleted");
    p.keep = 1;
    REQUIRE(ckpt_clean(st, &p, &rep, err) == 0, "%s", err);
    CHECK(rep.steps_removed == 1 && !exists(root, "step-00000003") &&
              exists(root, "step-00000006/MANIFEST.json") &&
              exists(root, "step-00000009/MANIFEST.json"),
          "keep 1: removed %d", rep.steps_removed);
}

static void only_steps_that_load_count_toward_keep(void)
{
    in_store(only_steps_that_load_count_toward_keep_body);
}

/* A manifest for `step` whose shards carry `tag`, written but not committed. */
static int prepare_step(struct storage *st, uint64_t step, int world, const char *tag,
                        struct ckpt_manifest *m, char *err)
{
    if (commit_step(st, step, world, tag, err) || ckpt_load_manifest(st, step, m, err))
        return -1;
    char key[96];
    snprintf(key, sizeof key, "step-%08llu/MANIFEST.json", (unsigned long long)step);
    return storage_delete(st, key, err);
}

static void a_commit_whose_shards_were_removed_is_withdrawn_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    struct ckpt_manifest m;
    REQUIRE(prepare_step(st, 4, 2, "g1-00000000000000aa", &m, err) == 0, "%s", err);
    /* a newer launch's clean-up removed one shard while this writer was
     * stopped between its fence check and its commit */
    REQUIRE(storage_delete(st, "step-00000004/shard-00001-of-00002.g1-00000000000000aa", err) == 0,
            "%s", err);
    struct ckpt_commit_result res;
    CHECK(ckpt_commit_step(st, &m, "g1-00000000000000aa", &res, err) != 0 &&
              res.outcome == CKPT_NOT_COMMITTED && strstr(err, "withdrawn"),
          "outcome %d: %s", res.outcome, err);
    ckpt_commit_result_free(&res);
    CHECK(!exists(root, "step-00000004"), "a manifest naming a missing shard stands");
    ckpt_manifest_free(&m);
}

static void a_commit_whose_shards_were_removed_is_withdrawn(void)
{
    in_store(a_commit_whose_shards_were_removed_is_withdrawn_body);
}

static void another_writers_commit_stays_and_ours_goes_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    struct ckpt_manifest m;
    REQUIRE(prepare_step(st, 5, 2, "g1-00000000000000aa", &m, err) == 0, "%s", err);
    REQUIRE(commit_step(st, 5, 1, "g2-00000000000000bb", err) == 0, "%s", err);
    struct ckpt_commit_result res;
    CHECK(ckpt_commit_step(st, &m, "g1-00000000000000aa", &res, err) != 0 &&
              res.outcome == CKPT_OTHER && res.other.world == 1,
          "outcome %d: %s", res.outcome, err);
    ckpt_commit_result_free(&res);
    CHECK(!exists(root, "step-00000005/shard-00000-of-00002.g1-00000000000000aa"), "ours left");
    CHECK(exists(root, "step-00000005/shard-00000-of-00001.g2-00000000000000bb"), "theirs gone");
    struct ckpt_manifest back;
    CHECK(ckpt_load_manifest(st, 5, &back, err) == 0 && back.world == 1, "theirs: %s", err);
    ckpt_manifest_free(&back);
    ckpt_manifest_free(&m);
}

static void another_writers_commit_stays_and_ours_goes(void)
{
    in_store(another_writers_commit_stays_and_ours_goes_body);
}

/* puts, then loses the answer: it becomes an error or EXISTS */
struct lossy {
    struct wrap w;
    int answer;
};
static int l_pia(struct storage *s, const char *key, const void *buf, size_t n, char *err)
{
    storage_put_if_absent(INNER(s), key, buf, n, err);
    fsdp_err(err, "%s: connection reset (the answer was lost)", key);
    return ((struct lossy *)s)->answer;
}
static const struct storage_ops lossy_ops = {.scheme = "lossy",
                                             .put_if_absent = l_pia,
                                             .list = w_list,
                                             .get_range = w_get,
                                             .stat = w_stat,
                                             .del = w_del,
                                             .del_many = w_del_many};

static void a_commit_whose_answer_was_lost_is_found_to_be_ours_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    int answers[] = {FSDP_ERROR, STORAGE_EXISTS};
    for (int i = 0; i < 2; i++) {
        struct ckpt_manifest m;
        REQUIRE(prepare_step(st, 7 + (uint64_t)i, 2, "g1-00000000000000aa", &m, err) == 0, "%s",
                err);
        struct lossy l = {.w = {.base = {.ops = &lossy_ops}, .inner = st}, .answer = answers[i]};
        snprintf(l.w.base.uri, sizeof l.w.base.uri, "lossy:%s", root);
        struct ckpt_commit_result res;
        CHECK(ckpt_commit_step(&l.w.base, &m, "g1-00000000000000aa", &res, err) == 0 &&
                  res.outcome == CKPT_COMMITTED,
              "answer %d: outcome %d: %s", answers[i], res.outcome, err);
        ckpt_commit_result_free(&res);
        char dir[32];
        ckpt_step_dir(m.step, dir, sizeof dir);
        char key[128];
        snprintf(key, sizeof key, "%s/shard-00000-of-00002.g1-00000000000000aa", dir);
        CHECK(exists(root, key), "answer %d: our own committed shard was removed", answers[i]);
        ckpt_manifest_free(&m);
    }
}

static void a_commit_whose_answer_was_lost_is_found_to_be_ours(void)
{
    in_store(a_commit_whose_answer_was_lost_is_found_to_be_ours_body);
}

/* A writer of generation 1 stopped past its fence check while generation 2
 * claimed and sealed the store (step 3 then); its shards survive. */
static void a_commit_landing_after_a_newer_seal_does_not_count_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 1);
    REQUIRE(commit_step(st, 3, 1, "g1-00000000000000aa", err) == 0, "%s", err);
    struct ckpt_manifest m;
    REQUIRE(prepare_step(st, 6, 2, "g1-00000000000000aa", &m, err) == 0, "%s", err);
    claim_generations(st, 1);
    CHECK(exists(root, "fences/00000000000000000002"), "generation 2 did not seal the store");
    struct ckpt_commit_result res;
    CHECK(ckpt_commit_step(st, &m, "g1-00000000000000aa", &res, err) != 0 &&
              res.outcome == CKPT_NOT_COMMITTED && strstr(err, "fenced: generation 2 sealed"),
          "outcome %d: %s", res.outcome, err);
    ckpt_commit_result_free(&res);
    /* the manifest stays, dead (removing it could remove a successor's);
     * the writer's shards go */
    CHECK(!exists(root, "step-00000006/shard-00000-of-00002.g1-00000000000000aa"), "shards left");
    struct ckpt_manifest back;
    CHECK(ckpt_load_manifest(st, 6, &back, err) == CKPT_NOT_LIVE && strstr(err, "fenced"),
          "step 6 loads: %s", err);
    CHECK(ckpt_load_manifest(st, 3, &back, err) == 0, "step 3, sealed: %s", err);
    ckpt_manifest_free(&back);
    ckpt_manifest_free(&m);
}

static void a_commit_landing_after_a_newer_seal_does_not_count(void)
{
    in_store(a_commit_landing_after_a_newer_seal_does_not_count_body);
}

/* A late commit that stands: no reader loads it, retention does not count
 * it; the current generation's save of that step takes its place, and the
 * current generation's clean-up removes one it meets. */
static void a_late_commit_is_dead_until_the_current_generation_removes_it_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 1);
    REQUIRE(commit_step(st, 3, 1, "g1-00000000000000aa", err) == 0, "%s", err);
    claim_generations(st, 1);
    REQUIRE(commit_step(st, 6, 2, "g1-00000000000000aa", err) == 0, "%s", err);
    struct ckpt_manifest back;
    CHECK(ckpt_load_manifest(st, 6, &back, err) == CKPT_NOT_LIVE && strstr(err, "fenced"),
          "a late commit loads: %s", err);
    /* generation 2 saves step 6: the dead manifest makes way */
    struct ckpt_manifest m;
    REQUIRE(prepare_step(st, 7, 1, "g2-00000000000000bb", &m, err) == 0, "%s", err);
    m.step = 6;
    REQUIRE(
        storage_put(st, "step-00000006/shard-00000-of-00001.g2-00000000000000bb", "x", 1, err) == 0,
        "%s", err);
    struct ckpt_commit_result res;
    CHECK(ckpt_commit_step(st, &m, "g2-00000000000000bb", &res, err) == 0 &&
              res.outcome == CKPT_COMMITTED,
          "outcome %d: %s", res.outcome, err);
    ckpt_commit_result_free(&res);
    ckpt_manifest_free(&m);
    CHECK(ckpt_load_manifest(st, 6, &back, err) == 0 && back.generation == 2, "step 6: %s", err);
    ckpt_manifest_free(&back);
    /* another late commit (step 9); a fenced writer's clean-up may not touch
     * it, the current generation's removes it (and its shards) and counts
     * only live steps */
    REQUIRE(commit_step(st, 9, 2, "g1-00000000000000cc", err) == 0, "%s", err);
    struct ckpt_clean_policy stale = {.generation = 1, .keep = 1, .upto = 9};
    struct ckpt_clean_report rep;
    CHECK(ckpt_clean(st, &stale, &rep, err) != 0 && strstr(err, "fenced"), "%s", err);
    struct ckpt_clean_policy p = {.generation = 2, .keep = 2, .upto = 9};
    REQUIRE(ckpt_clean(st, &p, &rep, err) == 0, "%s", err);
    CHECK(!exists(root, "step-00000009/MANIFEST.json") &&
              !exists(root, "step-00000009/shard-00000-of-00002.g1-00000000000000cc") &&
              exists(root, "step-00000006/MANIFEST.json") &&
              exists(root, "step-00000003/MANIFEST.json"),
          "clean-up: removed %d", rep.steps_removed);
}

static void a_late_commit_is_dead_until_the_current_generation_removes_it(void)
{
    in_store(a_late_commit_is_dead_until_the_current_generation_removes_it_body);
}

/* A seal names each live manifest by step and writer tag: another writer's
 * commit of a listed step number, landed later, is not live. */
static void a_seal_names_the_writer_not_only_the_step_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 1);
    REQUIRE(commit_step(st, 6, 1, "g1-00000000000000aa", err) == 0, "%s", err);
    claim_generations(st, 1); /* seals (6, g1-...aa) */
    REQUIRE(storage_delete(st, "step-00000006/MANIFEST.json", err) == 0, "%s", err);
    REQUIRE(commit_step(st, 6, 1, "g1-00000000000000dd", err) == 0, "%s", err);
    struct ckpt_manifest back;
    CHECK(ckpt_load_manifest(st, 6, &back, err) == CKPT_NOT_LIVE, "another writer's step 6: %s",
          err);
}

static void a_seal_names_the_writer_not_only_the_step(void)
{
    in_store(a_seal_names_the_writer_not_only_the_step_body);
}

/* Seals that cannot be read decide nothing: not dead, not live. */
static void an_unreadable_seal_decides_nothing_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 1);
    REQUIRE(commit_step(st, 3, 1, "g1-00000000000000aa", err) == 0, "%s", err);
    claim_generations(st, 1);
    REQUIRE(storage_delete(st, "fences/00000000000000000002", err) == 0, "%s", err);
    REQUIRE(storage_put(st, "fences/00000000000000000002", "{}", 2, err) == 0, "%s", err);
    struct ckpt_manifest back;
    CHECK(ckpt_load_manifest(st, 3, &back, err) == CKPT_CANNOT_JUDGE, "damaged seal: %s", err);
    REQUIRE(storage_put(st, "fences/notes.txt", "x", 1, err) == 0, "%s", err);
    CHECK(ckpt_load_manifest(st, 3, &back, err) == CKPT_CANNOT_JUDGE && strstr(err, "notes.txt"),
          "junk under fences/: %s", err);
}

static void an_unreadable_seal_decides_nothing(void)
{
    in_store(an_unreadable_seal_decides_nothing_body);
}

/* A commit that lands while a newer generation has claimed the store but
 * not sealed it yet is not reported committed. */
static void a_commit_under_a_newer_claim_is_not_reported_committed_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    char err[FSDP_ERR_LEN];
    claim_generations(st, 1);
    struct ckpt_manifest m;
    REQUIRE(prepare_step(st, 3, 1, "g1-00000000000000aa", &m, err) == 0, "%s", err);
    REQUIRE(storage_put(st, "generations/00000000000000000002", "2 x\n", 4, err) == 0, "%s", err);
    struct ckpt_commit_result res;
    CHECK(ckpt_commit_step(st, &m, "g1-00000000000000aa", &res, err) != 0 &&
              res.outcome == CKPT_UNKNOWN && strstr(err, "fenced"),
          "outcome %d: %s", res.outcome, err);
    ckpt_commit_result_free(&res);
    ckpt_manifest_free(&m);
}

static void a_commit_under_a_newer_claim_is_not_reported_committed(void)
{
    in_store(a_commit_under_a_newer_claim_is_not_reported_committed_body);
}

CHECK_MAIN(TEST(retention_keeps_the_newest_k_and_every_step_above_upto),
           TEST(only_steps_that_load_count_toward_keep),
           TEST(a_commit_whose_shards_were_removed_is_withdrawn),
           TEST(another_writers_commit_stays_and_ours_goes),
           TEST(a_commit_whose_answer_was_lost_is_found_to_be_ours),
           TEST(garbage_goes_only_when_its_generation_is_fenced),
           TEST(a_losing_writers_shards_in_a_committed_step_go_the_winners_stay),
           TEST(discard_own_removes_exactly_this_writers_shards),
           TEST(thousands_of_incomplete_steps_take_one_listing),
           TEST(junk_generation_names_are_refused_not_parsed_loosely),
           TEST(shard_names_parse_strictly),
           TEST(a_commit_landing_after_a_newer_seal_does_not_count),
           TEST(a_late_commit_is_dead_until_the_current_generation_removes_it),
           TEST(a_seal_names_the_writer_not_only_the_step),
           TEST(an_unreadable_seal_decides_nothing),
           TEST(a_commit_under_a_newer_claim_is_not_reported_committed))
