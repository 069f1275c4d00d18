/*
 * test_storage.c - the posix backend's contract: objects appear only when
 * committed, aborts leave nothing, put-if-absent never replaces, listing
 * and deletion, keys that try to leave the root are refused, nothing
 * inside a store is followed (a symlink or FIFO is refused by every
 * operation, naming its path, and what it points at is never touched), and
 * the fault wrapper injects what it is told.
 */
#include "check.h"

#include "storage.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int count_files(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "find '%s' -type f | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

/* Each test's own store, in a directory of its own, and a directory outside
 * it (for what links point at); both removed after the test however it
 * ended. */
struct fixture {
    char root[64], outside[64];
    struct storage *st;
};

static void in_store(void (*body)(struct fixture *fx))
{
    char err[FSDP_ERR_LEN];
    struct fixture fx = {.st = NULL};
    if (check_tmpdir(fx.root, sizeof fx.root, "storage") != 0)
        return;
    if (check_tmpdir(fx.outside, sizeof fx.outside, "outside") == 0) {
        int opened = storage_open(fx.root, &fx.st, err);
        CHECK(opened == 0, "%s", err);
        if (opened == 0) {
            body(&fx);
            storage_close(fx.st);
        }
        check_rmtree(fx.outside);
    }
    check_rmtree(fx.root);
}

static void object_is_invisible_until_commit_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    char err[FSDP_ERR_LEN], buf[16];
    uint64_t size;
    struct storage_writer *w;
    REQUIRE(storage_put_begin(st, "a/b/obj", &w, err) == 0, "%s", err);
    REQUIRE(storage_write(w, "hello ", 6, err) == 0, "%s", err);
    CHECK(storage_stat(st, "a/b/obj", &size, err) == STORAGE_NOT_FOUND, "visible before commit");
    REQUIRE(storage_write(w, "world", 5, err) == 0, "%s", err);
    REQUIRE(storage_writer_commit(w, err) == 0, "%s", err);
    CHECK(storage_stat(st, "a/b/obj", &size, err) == 0 && size == 11, "size %llu",
          (unsigned long long)size);
    CHECK(storage_get_range(st, "a/b/obj", 6, 5, buf, err) == 0 && memcmp(buf, "world", 5) == 0,
          "ranged read");
    CHECK(storage_get_range(st, "a/b/obj", 8, 5, buf, err) == FSDP_ERROR &&
              strstr(err, "truncated"),
          "read past the end: %s", err);
}

static void object_is_invisible_until_commit(void)
{
    in_store(object_is_invisible_until_commit_body);
}

static void abort_leaves_nothing_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    struct storage_writer *w;
    int before = count_files(root);
    REQUIRE(storage_put_begin(st, "c/aborted", &w, err) == 0, "%s", err);
    REQUIRE(storage_write(w, "x", 1, err) == 0, "%s", err);
    storage_writer_abort(w);
    CHECK(count_files(root) == before, "files left behind");
}

static void abort_leaves_nothing(void) { in_store(abort_leaves_nothing_body); }

static void put_if_absent_never_replaces_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN], buf[8];
    REQUIRE(storage_put_if_absent(st, "m/MANIFEST", "first", 5, err) == 0, "%s", err);
    CHECK(storage_put_if_absent(st, "m/MANIFEST", "second", 6, err) == STORAGE_EXISTS,
          "second writer was not refused");
    CHECK(storage_get_range(st, "m/MANIFEST", 0, 5, buf, err) == 0 && memcmp(buf, "first", 5) == 0,
          "content replaced");
    CHECK(count_files(root) >= 0 && count_files(root) == 1, "temporaries left: %d files",
          count_files(root));
}

static void put_if_absent_never_replaces(void) { in_store(put_if_absent_never_replaces_body); }

struct seen {
    int n;
    char keys[8][64];
};

static int on_key(void *arg, const char *key, uint64_t size)
{
    (void)size;
    struct seen *s = arg;
    if (s->n < 8)
        snprintf(s->keys[s->n], 64, "%s", key);
    s->n++;
    return 0;
}

static void list_by_prefix_and_delete_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN];
    REQUIRE(storage_put(st, "step-1/x", "1", 1, err) == 0, "%s", err);
    REQUIRE(storage_put(st, "step-1/y", "2", 1, err) == 0, "%s", err);
    REQUIRE(storage_put(st, "step-2/x", "3", 1, err) == 0, "%s", err);
    struct seen s = {0};
    REQUIRE(storage_list(st, "step-1/", on_key, &s, err) == 0, "%s", err);
    CHECK(s.n == 2, "%d keys under step-1/", s.n);
    s.n = 0;
    REQUIRE(storage_list(st, "step-", on_key, &s, err) == 0, "%s", err);
    CHECK(s.n == 3, "%d keys under step-", s.n);
    CHECK(storage_delete(st, "step-1/x", err) == 0 && storage_delete(st, "step-1/y", err) == 0,
          "%s", err);
    CHECK(storage_delete(st, "step-1/missing", err) == 0, "deleting a missing key failed");
    char dir[600];
    snprintf(dir, sizeof dir, "%s/step-1", root);
    CHECK(access(dir, F_OK) != 0, "empty directory left behind");
}

static void list_by_prefix_and_delete(void) { in_store(list_by_prefix_and_delete_body); }

static void keys_cannot_escape_the_root_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    char err[FSDP_ERR_LEN];
    const char *bad[] = {"../x", "a/../../x", "/etc/passwd", "a//b", "",    "a/..",
                         "./x",  "a/./b",     "a/.",         "a/",   "a\nb"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t size;
        CHECK(storage_stat(st, bad[i], &size, err) == FSDP_ERROR && strstr(err, "invalid key"),
              "key '%s' was accepted", bad[i]);
    }
}

static void keys_cannot_escape_the_root(void) { in_store(keys_cannot_escape_the_root_body); }

/* ---- nothing inside a store is followed ------------------------------------ */

#define REFUSAL "; a checkpoint store holds only directories and regular files"

/* Every file under dir with its type, size and bytes: what must not change. */
static void snapshot(const char *dir, char *out, size_t n)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && find . -printf '%%p %%y %%s\\n' | sort && find . -type f | sort | "
             "xargs -r md5sum",
             dir);
    FILE *p = popen(cmd, "r");
    size_t got = p ? fread(out, 1, n - 1, p) : 0;
    out[got] = 0;
    if (p)
        pclose(p);
}

static int refused_naming(int rc, const char *err, const char *path, const char *what)
{
    char want[700];
    snprintf(want, sizeof want, "%s: is %s" REFUSAL, path, what);
    if ((rc == FSDP_ERROR || rc == FSDP_NOT_REGULAR) && strstr(err, want))
        return 1;
    fprintf(stderr, "  rc %d, err '%s'; wanted '%s'\n", rc, err, want);
    return 0;
}

static int count_keys(void *arg, const char *key, uint64_t size)
{
    (void)key, (void)size;
    ++*(int *)arg;
    return 0;
}

/* Every operation on key refuses with path named as what. */
static void every_operation_refuses(struct storage *st, const char *key, const char *path,
                                    const char *what)
{
    char err[FSDP_ERR_LEN] = "", buf[16];
    uint64_t size;
    struct storage_writer *w = NULL;
    int n = 0;
    CHECK(refused_naming(storage_put(st, key, "evil", 4, err), err, path, what), "put %s", key);
    CHECK(refused_naming(storage_put_begin(st, key, &w, err), err, path, what) && !w,
          "put_begin %s", key);
    CHECK(refused_naming(storage_put_if_absent(st, key, "evil", 4, err), err, path, what),
          "put_if_absent %s", key);
    CHECK(refused_naming(storage_get_range(st, key, 0, 4, buf, err), err, path, what), "get %s",
          key);
    CHECK(refused_naming(storage_stat(st, key, &size, err), err, path, what), "stat %s", key);
    storage_prefetch(st, key, 0, 4); /* a hint: returns at once, opens nothing it refuses */
    CHECK(refused_naming(storage_delete(st, key, err), err, path, what), "delete %s", key);
    CHECK(refused_naming(storage_list(st, key, count_keys, &n, err), err, path, what), "list %s",
          key);
}

/* Step 7 of another store in outside: what the links point at. */
static int make_outside_step(const char *outside, char *err)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/step-00000007", outside);
    if (mkdir(dir, 0755) != 0) {
        snprintf(err, FSDP_ERR_LEN, "mkdir %s: %s", dir, strerror(errno));
        return -1;
    }
    struct storage *other;
    if (storage_open(outside, &other, err) != 0)
        return -1;
    int rc = storage_put(other, "step-00000007/shard-00000-of-00001", "committed", 9, err) == 0 &&
                     storage_put(other, "step-00000007/MANIFEST.json", "{}", 2, err) == 0
                 ? 0
                 : -1;
    storage_close(other);
    return rc;
}

static void a_symlinked_step_directory_is_refused_and_its_target_untouched_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root, *outside = fx->outside;
    char err[FSDP_ERR_LEN], link[600], target[600], before[8192], after[8192];
    REQUIRE(make_outside_step(outside, err) == 0, "%s", err);
    snprintf(target, sizeof target, "%s/step-00000007", outside);
    snapshot(outside, before, sizeof before);
    snprintf(link, sizeof link, "%s/step-00000007", root);
    REQUIRE(symlink(target, link) == 0, "symlink %s", link);

    every_operation_refuses(st, "step-00000007/shard-00000-of-00001", link, "a symbolic link");
    every_operation_refuses(st, "step-00000007/MANIFEST.json", link, "a symbolic link");
    every_operation_refuses(st, "step-00000007/new/deeper", link, "a symbolic link");
    int n = 0;
    CHECK(refused_naming(storage_list(st, "step-", count_keys, &n, err), err, link,
                         "a symbolic link"),
          "listing step-");
    CHECK(refused_naming(storage_list(st, "", count_keys, &n, err), err, link, "a symbolic link"),
          "listing the whole store");
    CHECK(storage_list(st, "a/", count_keys, &n, err) == 0, "a listing elsewhere: %s", err);

    snapshot(outside, after, sizeof after);
    CHECK(strcmp(before, after) == 0, "the link's target changed:\n%s\nnow:\n%s", before, after);
    struct stat sb;
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "the link itself was replaced");
    unlink(link);
}

static void a_symlinked_step_directory_is_refused_and_its_target_untouched(void)
{
    in_store(a_symlinked_step_directory_is_refused_and_its_target_untouched_body);
}

static void a_symlinked_leaf_is_refused_and_its_target_untouched_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root, *outside = fx->outside;
    char err[FSDP_ERR_LEN], link[600], target[600], dangling[600], before[8192], after[8192];
    REQUIRE(make_outside_step(outside, err) == 0, "%s", err);
    snprintf(target, sizeof target, "%s/step-00000007/MANIFEST.json", outside);
    snprintf(link, sizeof link, "%s/leaf/MANIFEST.json", root);
    snprintf(dangling, sizeof dangling, "%s/leaf/dangling", root);
    snprintf(after, sizeof after, "%s/leaf", root);
    REQUIRE(mkdir(after, 0755) == 0, "mkdir %s", after);
    REQUIRE(symlink(target, link) == 0 && symlink("/nonexistent/x", dangling) == 0, "symlink");
    snapshot(outside, before, sizeof before);

    every_operation_refuses(st, "leaf/MANIFEST.json", link, "a symbolic link");
    every_operation_refuses(st, "leaf/dangling", dangling, "a symbolic link");

    snapshot(outside, after, sizeof after);
    CHECK(strcmp(before, after) == 0, "the link's target changed:\n%s\nnow:\n%s", before, after);
    struct stat sb;
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "the link itself was replaced");
    CHECK(access("/nonexistent/x", F_OK) != 0, "a dangling link's target was created");
}

static void a_symlinked_leaf_is_refused_and_its_target_untouched(void)
{
    in_store(a_symlinked_leaf_is_refused_and_its_target_untouched_body);
}

static void a_fifo_leaf_is_refused_without_blocking_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/ff", root);
    REQUIRE(mkdir(fifo, 0755) == 0, "mkdir %s", fifo);
    snprintf(fifo, sizeof fifo, "%s/ff/obj", root);
    REQUIRE(mkfifo(fifo, 0644) == 0, "mkfifo %s", fifo);
    alarm(20); /* a read that blocks on the FIFO ends the test here */
    every_operation_refuses(st, "ff/obj", fifo, "a FIFO");
    every_operation_refuses(st, "ff/obj/deeper", fifo, "a FIFO"); /* where a directory belongs */
    alarm(0);
    struct stat sb;
    CHECK(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced or removed");
}

static void a_fifo_leaf_is_refused_without_blocking(void)
{
    in_store(a_fifo_leaf_is_refused_without_blocking_body);
}

static void a_fifo_under_a_listed_prefix_fails_the_listing_body(struct fixture *fx)
{
    struct storage *st = fx->st;
    const char *root = fx->root;
    char err[FSDP_ERR_LEN], fifo[600];
    REQUIRE(storage_put(st, "lst/a", "1", 1, err) == 0, "%s", err);
    snprintf(fifo, sizeof fifo, "%s/lst/p", root);
    REQUIRE(mkfifo(fifo, 0644) == 0, "mkfifo %s", fifo);
    int n = 0;
    alarm(20);
    CHECK(refused_naming(storage_list(st, "lst/", count_keys, &n, err), err, fifo, "a FIFO"),
          "listing lst/");
    CHECK(refused_naming(storage_list(st, "ls", count_keys, &n, err), err, fifo, "a FIFO"),
          "listing ls");
    n = 0;
    CHECK(storage_list(st, "lst/a", count_keys, &n, err) == 0 && n == 1,
          "a prefix the FIFO does not match: %d keys, %s", n, err);
    alarm(0);
}

static void a_fifo_under_a_listed_prefix_fails_the_listing(void)
{
    in_store(a_fifo_under_a_listed_prefix_fails_the_listing_body);
}

static void a_root_that_is_a_symlink_is_the_users_choice_body(struct fixture *fx)
{
    const char *outside = fx->outside;
    char err[FSDP_ERR_LEN], link[600], real[600], buf[4];
    struct storage *s;
    snprintf(real, sizeof real, "%s/real-root", outside);
    snprintf(link, sizeof link, "%s/linked-root", outside);
    REQUIRE(mkdir(real, 0755) == 0 && symlink(real, link) == 0, "setup");
    REQUIRE(storage_open(link, &s, err) == 0, "%s", err);
    CHECK(storage_put(s, "step-1/x", "abc", 3, err) == 0, "put through the root link: %s", err);
    CHECK(storage_get_range(s, "step-1/x", 0, 3, buf, err) == 0 && memcmp(buf, "abc", 3) == 0,
          "read back: %s", err);
    storage_close(s);
    snprintf(real, sizeof real, "%s/real-root/step-1/x", outside);
    CHECK(access(real, F_OK) == 0, "the object is not under the link's target");
}

static void a_root_that_is_a_symlink_is_the_users_choice(void)
{
    in_store(a_root_that_is_a_symlink_is_the_users_choice_body);
}

static void a_root_created_by_the_first_write_body(struct fixture *fx)
{
    const char *outside = fx->outside;
    char err[FSDP_ERR_LEN], path[600];
    struct storage *s;
    uint64_t size;
    int n = 0;
    snprintf(path, sizeof path, "%s/new/root", outside);
    REQUIRE(storage_open(path, &s, err) == 0, "%s", err);
    CHECK(storage_stat(s, "x/y", &size, err) == STORAGE_NOT_FOUND, "stat without a root: %s", err);
    CHECK(storage_list(s, "", count_keys, &n, err) == 0 && n == 0, "list without a root: %s", err);
    CHECK(access(path, F_OK) != 0, "a read created the root");
    CHECK(storage_put(s, "x/y", "z", 1, err) == 0, "first write: %s", err);
    CHECK(storage_stat(s, "x/y", &size, err) == 0 && size == 1, "stat: %s", err);
    storage_close(s);
}

static void a_root_created_by_the_first_write(void)
{
    in_store(a_root_created_by_the_first_write_body);
}

static void fault_wrapper_injects_errors_body(struct fixture *fx)
{
    const char *root = fx->root;
    char err[FSDP_ERR_LEN], uri[600];
    struct storage *f;
    snprintf(uri, sizeof uri, "fault:write=ENOSPC@2,put_if_absent=EIO@1;%s", root);
    REQUIRE(storage_open(uri, &f, err) == 0, "%s", err);
    struct storage_writer *w;
    REQUIRE(storage_put_begin(f, "f/obj", &w, err) == 0, "%s", err);
    CHECK(storage_write(w, "a", 1, err) == 0, "first write failed");
    CHECK(storage_write(w, "b", 1, err) == FSDP_ERROR && strstr(err, "No space left on device") &&
              strstr(err, "f/obj"),
          "second write: %s", err);
    storage_writer_abort(w);
    CHECK(storage_put_if_absent(f, "f/m", "x", 1, err) == FSDP_ERROR &&
              strstr(err, "Input/output error"),
          "put_if_absent: %s", err);
    CHECK(storage_put_if_absent(f, "f/m", "x", 1, err) == 0, "second put_if_absent: %s", err);
    storage_close(f);
    CHECK(storage_open("fault:write=EBOGUS@1;/tmp", &f, err) == FSDP_ERROR &&
              strstr(err, "bad fault rule"),
          "a bad rule was accepted");
}

static void fault_wrapper_injects_errors(void) { in_store(fault_wrapper_injects_errors_body); }

/* Writes n pattern bytes to key in pieces of 1, 4095, 3 MiB + 7, ... bytes
 * and reads them back whole and at the block-unaligned tail. */
static void round_trip(struct storage *s, const char *key, size_t n)
{
    char err[FSDP_ERR_LEN];
    unsigned char *data = malloc(n + 1), *back = malloc(n + 1);
    REQUIRE(data && back, "out of memory");
    for (size_t i = 0; i < n; i++)
        data[i] = (unsigned char)(i * 2654435761u >> 13);
    struct storage_writer *w;
    REQUIRE(storage_put_begin(s, key, &w, err) == 0, "%s", err);
    const size_t pieces[] = {1, 4095, (3u << 20) + 7, 4096, 9u << 20};
    size_t off = 0;
    for (int i = 0; off < n; i = (i + 1) % 5) {
        size_t take = pieces[i] < n - off ? pieces[i] : n - off;
        REQUIRE(storage_write(w, data + off, take, err) == 0, "%s", err);
        off += take;
    }
    REQUIRE(storage_writer_commit(w, err) == 0, "%s", err);
    uint64_t size = 0;
    CHECK(storage_stat(s, key, &size, err) == 0 && size == n, "%s: size %llu", key,
          (unsigned long long)size);
    CHECK(storage_get_range(s, key, 0, n, back, err) == 0 && memcmp(back, data, n) == 0,
          "%s: other bytes read back", key);
    CHECK(n < 5 || (storage_get_range(s, key, n - 5, 5, back, err) == 0 &&
                    memcmp(back, data + n - 5, 5) == 0),
          "%s: the tail", key);
    free(data);
    free(back);
}

static void objects_of_any_size_round_trip_with_and_without_direct_io_body(struct fixture *fx)
{
    const char *root = fx->root;
    const size_t sizes[] = {
        0, 1, 4095, 4096, 4097, (8u << 20) - 1, 8u << 20, (8u << 20) + 1, (21u << 20) + 12345};
    for (int direct = 1; direct >= 0; direct--) {
        char err[FSDP_ERR_LEN], key[64];
        struct storage *s;
        setenv("FSDP_DIRECT_IO", direct ? "1" : "0", 1);
        REQUIRE(storage_open(root, &s, err) == 0, "%s", err);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            snprintf(key, sizeof key, "sizes/direct-%d-%zu-bytes", direct, sizes[i]);
            round_trip(s, key, sizes[i]);
        }
        storage_close(s);
    }
}

static void objects_of_any_size_round_trip_with_and_without_direct_io(void)
{
    in_store(objects_of_any_size_round_trip_with_and_without_direct_io_body);
    unsetenv("FSDP_DIRECT_IO"); /* however the body ended */
}

CHECK_MAIN(TEST(object_is_invisible_until_commit), TEST(abort_leaves_nothing),
           TEST(put_if_absent_never_replaces), TEST(list_by_prefix_and_delete),
           TEST(keys_cannot_escape_the_root),
           TEST(a_symlinked_step_directory_is_refused_and_its_target_untouched),
           TEST(a_symlinked_leaf_is_refused_and_its_target_untouched),
           TEST(a_fifo_leaf_is_refused_without_blocking),
           TEST(a_fifo_under_a_listed_prefix_fails_the_listing),
           TEST(a_root_that_is_a_symlink_is_the_users_choice),
           TEST(a_root_created_by_the_first_write), TEST(fault_wrapper_injects_errors),
           TEST(objects_of_any_size_round_trip_with_and_without_direct_io))
