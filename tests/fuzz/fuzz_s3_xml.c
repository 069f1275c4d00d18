/*
 * fuzz_s3_xml.c - the S3 backend's reading of the XML a server answers
 * (storage/s3_http.c: s3_xml_parse, s3_xml_first, s3_http_error), and the
 * request bodies it then builds from what it read (storage/s3.c:
 * s3_delete_body, s3_complete_body).
 *
 * The input is one answer body. It is read the way each caller in
 * storage/s3.c reads one:
 *   - any error answer: Code (s3_finish) and Message (s3_http_error, called
 *     here on a request that carries the input as its body);
 *   - InitiateMultipartUpload: UploadId, kept when shorter than 512 bytes and
 *     URI-encoded for the part requests (create_upload);
 *   - ListObjectsV2: the (Key, Size) pairs under Contents, IsTruncated and
 *     NextContinuationToken, the token URI-encoded for the next request
 *     (s3_list; that walk is static there and needs a server, so it is
 *     written out again here from s3.c);
 *   - the keys listed are what a cleanup deletes: the DeleteObjects body is
 *     built from them (with and without a bucket prefix), and the ETags in
 *     the answer become a CompleteMultipartUpload body. Each body must parse
 *     back to exactly the keys (prefix/key) and ETags it was built from.
 */
#include "fuzz_common.h"
#include "s3_internal.h"
#include "sigv4.h"

#define MAX_ITEMS 2000

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    return 0;
}

/* The delete body for keys parses back to exactly prefix/key, in order. */
static void delete_round_trip(const char *prefix, const char *const *keys, int n)
{
    struct s3_buf body = {0};
    if (s3_delete_body(prefix, keys, n, &body) != 0) {
        FUZZ_CHECK(body.p == NULL); /* freed on failure */
        return;
    }
    FUZZ_CHECK(body.p && strlen(body.p) == body.len);
    struct s3_xml x;
    FUZZ_CHECK(s3_xml_parse(body.p, body.len, &x) == 0);
    int k = 0;
    for (int i = 0; i < x.n; i++) {
        if (strcmp(x.v[i].name, "Key") != 0)
            continue;
        FUZZ_CHECK(strcmp(x.v[i].parent, "Object") == 0);
        FUZZ_CHECK(k < n);
        size_t pl = strlen(prefix);
        const char *t = x.v[i].text;
        if (pl) {
            FUZZ_CHECK(strncmp(t, prefix, pl) == 0 && t[pl] == '/');
            t += pl + 1;
        }
        FUZZ_CHECK(strcmp(t, keys[k]) == 0);
        k++;
    }
    FUZZ_CHECK(k == n);
    s3_xml_free(&x);
    s3_buf_free(&body);
}

static void complete_round_trip(const char (*etags)[128], int n)
{
    struct s3_buf body = {0};
    if (s3_complete_body(etags, n, &body) != 0) {
        FUZZ_CHECK(body.p == NULL);
        return;
    }
    struct s3_xml x;
    FUZZ_CHECK(s3_xml_parse(body.p, body.len, &x) == 0);
    int k = 0;
    for (int i = 0; i < x.n; i++) {
        if (strcmp(x.v[i].name, "ETag") == 0) {
            FUZZ_CHECK(k < n && strcmp(x.v[i].text, etags[k]) == 0);
            k++;
        }
    }
    FUZZ_CHECK(k == n);
    s3_xml_free(&x);
    s3_buf_free(&body);
}

/* s3_http_error on a 403 answer carrying the input, as after any request. */
static void error_answer(const uint8_t *data, size_t size, const char *code)
{
    struct s3_request r = {.method = "GET", .bucket = "bucket", .key = "step-00000001/x"};
    r.status = 403;
    snprintf(r.code, sizeof r.code, "%s", code ? code : "");
    r.resp.p = fuzz_strndup(data, size);
    r.resp.len = size;
    r.resp.cap = size + 1;
    char err[FSDP_ERR_LEN];
    err[0] = 0;
    FUZZ_CHECK(s3_http_error(&r, "GetObject", err) == FSDP_ERROR);
    FUZZ_CHECK(err[0] != 0 && memchr(err, 0, sizeof err) != NULL);
    s3_buf_free(&r.resp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct s3_xml x;
    if (s3_xml_parse((const char *)data, size, &x) != 0) {
        error_answer(data, size, NULL);
        return 0;
    }
    for (int i = 0; i < x.n; i++)
        FUZZ_CHECK(x.v[i].text != NULL);

    /* errors */
    const char *code = s3_xml_first(&x, "Code");
    error_answer(data, size, code);

    /* InitiateMultipartUpload */
    const char *id = s3_xml_first(&x, "UploadId");
    char upload_id[512], upload_id_enc[1600];
    if (id && *id && strlen(id) < sizeof upload_id) {
        snprintf(upload_id, sizeof upload_id, "%s", id);
        FUZZ_CHECK(sigv4_uri_encode(upload_id, strlen(upload_id), 0, upload_id_enc,
                                    sizeof upload_id_enc) >= 0);
    }

    /* ListObjectsV2 */
    static const char *keys[MAX_ITEMS];
    static char etags[MAX_ITEMS][128];
    int nkeys = 0, netags = 0, truncated = 0;
    const char *key = NULL;
    char token[2048] = "", etok[6200];
    for (int i = 0; i < x.n; i++) {
        const struct s3_xml_item *it = &x.v[i];
        if (strcmp(it->parent, "Contents") == 0 && strcmp(it->name, "Key") == 0) {
            key = it->text;
        } else if (strcmp(it->parent, "Contents") == 0 && strcmp(it->name, "Size") == 0 && key) {
            (void)strtoull(it->text, NULL, 10);
            if (nkeys < MAX_ITEMS)
                keys[nkeys++] = key;
            key = NULL;
        } else if (strcmp(it->name, "IsTruncated") == 0) {
            truncated = strcmp(it->text, "true") == 0;
        } else if (strcmp(it->name, "NextContinuationToken") == 0) {
            snprintf(token, sizeof token, "%s", it->text);
        }
        if (strcmp(it->name, "ETag") == 0 && strlen(it->text) < sizeof etags[0] &&
            netags < MAX_ITEMS)
            snprintf(etags[netags++], sizeof etags[0], "%s", it->text);
    }
    (void)truncated;
    FUZZ_CHECK(sigv4_uri_encode(token, strlen(token), 0, etok, sizeof etok) >= 0);

    /* what a cleanup would send back: at most 1000 keys a request */
    int n = nkeys < 1000 ? nkeys : 1000;
    delete_round_trip("", keys, n);
    delete_round_trip("ckpt/run-1", keys, n);
    complete_round_trip((const char(*)[128])etags, netags);

    s3_xml_free(&x);
    return 0;
}
