/*
 * s3_cat.c - a test tool: raw objects through the storage interface, so
 * the S3 tests can compare our reads and writes with the AWS CLI's.
 *
 *   s3_cat get URI KEY [OFFSET LENGTH]   object bytes (or a range) to stdout
 *   s3_cat put URI KEY                   stdin to an object (multipart when large)
 *   s3_cat stat URI KEY                  size
 *   s3_cat list URI PREFIX               "KEY SIZE" lines
 *   s3_cat delete URI KEY...             DeleteObjects
 *   s3_cat pia URI KEY                   stdin with put-if-absent (exit 3: exists)
 */
#include "storage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int on_key(void *arg, const char *key, uint64_t size)
{
    (void)arg;
    printf("%s %llu\n", key, (unsigned long long)size);
    return 0;
}

int main(int argc, char **argv)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    if (argc < 4 || storage_open(argv[2], &st, err)) {
        fprintf(stderr, "s3_cat: %s\n", argc < 4 ? "usage: s3_cat get|put|stat|list URI KEY" : err);
        return 2;
    }
    const char *cmd = argv[1], *key = argv[3];
    int rc = 0;
    if (strcmp(cmd, "get") == 0) {
        uint64_t off = 0, len;
        if (argc == 6) {
            off = strtoull(argv[4], NULL, 10);
            len = strtoull(argv[5], NULL, 10);
        } else if ((rc = storage_stat(st, key, &len, err))) {
            goto out;
        }
        char *buf = malloc(len ? len : 1);
        if (!(rc = storage_get_range(st, key, off, len, buf, err)))
            fwrite(buf, 1, len, stdout);
        free(buf);
    } else if (strcmp(cmd, "put") == 0) {
        struct storage_writer *w;
        if ((rc = storage_put_begin(st, key, &w, err)))
            goto out;
        static char buf[1 << 20];
        size_t n;
        while (!rc && (n = fread(buf, 1, sizeof buf, stdin)) > 0)
            rc = storage_write(w, buf, n, err);
        if (rc)
            storage_writer_abort(w);
        else
            rc = storage_writer_commit(w, err);
    } else if (strcmp(cmd, "stat") == 0) {
        uint64_t size;
        if (!(rc = storage_stat(st, key, &size, err)))
            printf("%llu\n", (unsigned long long)size);
    } else if (strcmp(cmd, "list") == 0) {
        rc = storage_list(st, key, on_key, NULL, err);
    } else if (strcmp(cmd, "pia") == 0) {
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, stdin);
        rc = storage_put_if_absent(st, key, buf, n, err);
        if (rc == STORAGE_EXISTS) {
            fprintf(stderr, "s3_cat: %s\n", err);
            storage_close(st);
            return 3;
        }
    } else if (strcmp(cmd, "delete") == 0) {
        rc = storage_delete_many(st, (const char *const *)argv + 3, argc - 3, err);
    } else {
        snprintf(err, sizeof err, "unknown command %s", cmd);
        rc = -1;
    }
out:
    if (rc)
        fprintf(stderr, "s3_cat: %s\n", err);
    storage_close(st);
    return rc ? 1 : 0;
}
