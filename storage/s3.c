/*
 * s3.c - the S3 backend: s3://BUCKET/PREFIX.
 *
 * Objects are written through a streaming writer: bytes go into a part
 * buffer; an object that ends before the first part is full is one
 * PutObject, a larger one becomes a multipart upload whose parts (>= 5 MiB
 * but the last, at most 10,000) are sent several at a time over the
 * client's curl multi handle (one connection pool). The object appears
 * only when CompleteMultipartUpload succeeds; any failure or abort sends
 * AbortMultipartUpload, so no part lingers. put_if_absent is PutObject with
 * If-None-Match: *; 412 (and 409, a concurrent conditional write) mean the
 * object exists. On servers that ignore the header the put succeeds and
 * replaces the object: the commit protocol then relies on the generation
 * record (fencing) rather than on the condition.
 *
 * Keys and the bucket prefix are paths of plain names (storage_key_check):
 * a "." or ".." part is refused, never sent, so s3://b/../x cannot leave
 * its bucket or prefix. XML request bodies (DeleteObjects,
 * CompleteMultipartUpload) are built with s3_buf's appends only, keys
 * through the one escaping append.
 *
 * GetObject and HeadObject may run on several threads at once (a load's
 * threads): each request takes an idle curl handle from the client (or a
 * new one) and gives it back, so each thread keeps its own connection.
 * Writes, listings and deletes are one thread's at a time.
 */
#include "s3_internal.h"

#include "sigv4.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARTS 10000
#define MAX_KEY   1024 /* bytes in an S3 object key, the prefix included */

struct s3_store {
    struct storage base;
    struct s3_client c;
    char bucket[64];
    char prefix[512]; /* "" or "a/b" (no slashes at either end) */
};

#define S(s) ((struct s3_store *)(s))

/* PREFIX/KEY into out (MAX_KEY + 1 bytes at least), after checking key:
 * plain names only, and the whole within S3's limit. */
static int full_key(const struct s3_store *s, const char *key, char *out, size_t n, char *err)
{
    if (storage_key_check(key, err))
        return FSDP_ERROR;
    size_t len = (size_t)snprintf(out, n, "%s%s%s", s->prefix, s->prefix[0] ? "/" : "", key);
    if (len > MAX_KEY || len >= n) {
        fsdp_err(err,
                 "storage: invalid key '%.100s...': s3://%s/%.100s... is "
                 "longer than S3's %d bytes",
                 key, s->bucket, out, MAX_KEY);
        return FSDP_ERROR;
    }
    return 0;
}

/* A listing prefix may end inside a name ("step-"); what comes before its
 * last '/' follows the key rule, and none of it is a control character. */
static int list_prefix_ok(const char *prefix, char *err)
{
    const char *slash = strrchr(prefix, '/');
    char dirs[MAX_KEY + 1];
    int bad = strlen(prefix) > MAX_KEY;
    for (const char *p = prefix; !bad && *p; p++)
        bad = (unsigned char)*p < 0x20 || *p == 0x7f;
    if (!bad && slash) {
        snprintf(dirs, sizeof dirs, "%.*s", (int)(slash - prefix), prefix);
        bad = storage_key_problem(dirs) != NULL;
    }
    if (bad)
        fsdp_err(err,
                 "storage: invalid listing prefix '%.200s' (a path of "
                 "plain names: no '.', '..' or empty parts, no control characters)",
                 prefix);
    return bad ? FSDP_ERROR : 0;
}

/* ---- the writer ---------------------------------------------------------- */

struct slot {
    unsigned char *buf;
    size_t len;
    int part; /* 1-based part number while busy, 0 when free */
    int attempt;
    CURL *h;
    struct curl_slist *hdrs;
    struct s3_request req;
    char query[1024];
};

struct s3_writer {
    struct storage_writer base;
    char key[1100];
    char upload_id[512], upload_id_enc[1600];
    struct slot *slots;
    int nslots, cur, next_part, failed;
    char (*etags)[128];
    char err[FSDP_ERR_LEN];
};

static int simple(struct s3_store *s, struct s3_request *r, const char *op, char *err)
{
    int rc = s3_perform(&s->c, r, op, err);
    return rc;
}

static int create_upload(struct s3_store *s, struct s3_writer *w, char *err)
{
    struct s3_request r = {
        .method = "POST", .bucket = s->bucket, .key = w->key, .query = "uploads="};
    int rc = simple(s, &r, "CreateMultipartUpload", err);
    if (!rc && r.status != 200)
        rc = s3_http_error(&r, "CreateMultipartUpload", err);
    struct s3_xml x;
    if (!rc && s3_xml_parse(r.resp.p, r.resp.len, &x) == 0) {
        const char *id = s3_xml_first(&x, "UploadId");
        if (id && *id && strlen(id) < sizeof w->upload_id)
            snprintf(w->upload_id, sizeof w->upload_id, "%s", id);
        s3_xml_free(&x);
    }
    if (!rc && !w->upload_id[0]) {
        fsdp_err(err, "s3 CreateMultipartUpload %s/%s: no UploadId in the answer", s->bucket,
                 w->key);
        rc = FSDP_ERROR;
    }
    if (!rc)
        sigv4_uri_encode(w->upload_id, strlen(w->upload_id), 0, w->upload_id_enc,
                         sizeof w->upload_id_enc);
    s3_buf_free(&r.resp);
    return rc;
}

static int start_part(struct s3_store *s, struct s3_writer *w, struct slot *sl, char *err)
{
    snprintf(sl->query, sizeof sl->query, "partNumber=%d&uploadId=%s", sl->part, w->upload_id_enc);
    s3_buf_free(&sl->req.resp);
    sl->req = (struct s3_request){.method = "PUT",
                                  .bucket = s->bucket,
                                  .key = w->key,
                                  .query = sl->query,
                                  .body = sl->buf,
                                  .body_len = sl->len};
    if (!sl->h && !(sl->h = curl_easy_init())) {
        fsdp_err(err, "s3: out of curl handles");
        return FSDP_ERROR;
    }
    if (s3_prepare(&s->c, sl->h, &sl->req, &sl->hdrs, err))
        return FSDP_ERROR;
    curl_easy_setopt(sl->h, CURLOPT_PRIVATE, sl);
    if (curl_multi_add_handle(s->c.multi, sl->h) != CURLM_OK) {
        fsdp_err(err, "s3 UploadPart %s/%s part %d: cannot start the transfer", s->bucket, w->key,
                 sl->part);
        return FSDP_ERROR;
    }
    return 0;
}

/* Runs the multi handle until no part is in flight (all) or until at least
 * one slot is free. Failed parts are retried with backoff; a part that
 * fails for good fails the writer. */
static int drive(struct s3_store *s, struct s3_writer *w, int all, char *err)
{
    for (;;) {
        int busy = 0;
        for (int i = 0; i < w->nslots; i++)
            busy += w->slots[i].part != 0 && i != w->cur;
        if (busy == 0 || (!all && busy < w->nslots - 1))
            return w->failed ? FSDP_ERROR : 0;
        int running;
        curl_multi_perform(s->c.multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(s->c.multi, &left))) {
            if (m->msg != CURLMSG_DONE)
                continue;
            struct slot *sl;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&sl);
            CURLcode cc = m->data.result;
            curl_multi_remove_handle(s->c.multi, sl->h);
            curl_slist_free_all(sl->hdrs);
            sl->hdrs = NULL;
            int retry;
            char why[256];
            int rc = s3_finish(&s->c, sl->h, &sl->req, cc, &retry, why, sizeof why);
            if (rc == 0 && sl->req.status == 200 && sl->req.etag[0]) {
                snprintf(w->etags[sl->part - 1], sizeof w->etags[0], "%s", sl->req.etag);
                sl->part = 0;
                sl->len = 0;
                continue;
            }
            if (rc == 0) { /* a final HTTP error */
                s3_http_error(&sl->req, "UploadPart", w->err);
                w->failed = 1;
                sl->part = 0;
                continue;
            }
            if (retry && ++sl->attempt < s->c.cfg.max_attempts) {
                s3_backoff(&s->c, sl->attempt);
                if (start_part(s, w, sl, w->err) == 0)
                    continue;
            } else {
                snprintf(w->err, sizeof w->err, "s3 UploadPart %s/%s part %d: %s", s->bucket,
                         w->key, sl->part, why);
            }
            w->failed = 1;
            sl->part = 0;
        }
        if (w->failed) {
            fsdp_err(err, "%s", w->err);
            /* let the others finish or fail; the upload is aborted anyway */
        }
        if (running)
            curl_multi_poll(s->c.multi, NULL, 0, 100, NULL);
    }
}

/* Sends the current slot as the next part and moves to a free slot. */
static int ship(struct s3_store *s, struct s3_writer *w, char *err)
{
    if (!w->upload_id[0] && create_upload(s, w, err))
        return FSDP_ERROR;
    if (w->next_part >= MAX_PARTS) {
        fsdp_err(err, "s3 UploadPart %s/%s: more than %d parts of %zu MiB", s->bucket, w->key,
                 MAX_PARTS, s->c.cfg.part_size >> 20);
        return FSDP_ERROR;
    }
    struct slot *sl = &w->slots[w->cur];
    sl->part = ++w->next_part;
    sl->attempt = 0;
    if (start_part(s, w, sl, err))
        return FSDP_ERROR;
    int free_slot = -1;
    for (;;) {
        for (int i = 0; i < w->nslots && free_slot < 0; i++)
            if (w->slots[i].part == 0)
                free_slot = i;
        if (free_slot >= 0)
            break;
        w->cur = -1; /* every slot is in flight */
        if (drive(s, w, 0, err))
            return FSDP_ERROR;
    }
    w->cur = free_slot;
    struct slot *n = &w->slots[free_slot];
    if (!n->buf && !(n->buf = malloc(s->c.cfg.part_size))) {
        fsdp_err(err, "s3: out of memory for a %zu-byte part", s->c.cfg.part_size);
        return FSDP_ERROR;
    }
    n->len = 0;
    return w->failed ? (fsdp_err(err, "%s", w->err), FSDP_ERROR) : 0;
}

static void free_writer(struct s3_store *s, struct s3_writer *w)
{
    for (int i = 0; i < w->nslots; i++) {
        struct slot *sl = &w->slots[i];
        if (sl->h) {
            curl_multi_remove_handle(s->c.multi, sl->h);
            curl_easy_cleanup(sl->h);
        }
        curl_slist_free_all(sl->hdrs);
        s3_buf_free(&sl->req.resp);
        free(sl->buf);
    }
    free(w->slots);
    free(w->etags);
    free(w);
}

static void abort_upload(struct s3_store *s, struct s3_writer *w)
{
    if (!w->upload_id[0])
        return;
    char q[1700], err[FSDP_ERR_LEN];
    snprintf(q, sizeof q, "uploadId=%s", w->upload_id_enc);
    struct s3_request r = {.method = "DELETE", .bucket = s->bucket, .key = w->key, .query = q};
    s3_perform(&s->c, &r, "AbortMultipartUpload", err);
    s3_buf_free(&r.resp);
}

static int s3_put_begin(struct storage *st, const char *key, struct storage_writer **out, char *err)
{
    struct s3_store *s = S(st);
    struct s3_writer *w = calloc(1, sizeof *w);
    if (!w)
        goto oom;
    w->base.store = st;
    snprintf(w->base.key, sizeof w->base.key, "%s", key);
    if (full_key(s, key, w->key, sizeof w->key, err)) {
        free(w);
        return FSDP_ERROR;
    }
    int nslots = s->c.cfg.parallel_parts + 1; /* one filling, the rest in flight */
    w->slots = calloc((size_t)nslots, sizeof *w->slots);
    if (w->slots)
        w->nslots = nslots; /* free_writer walks the slots only once they exist */
    w->etags = calloc(MAX_PARTS, sizeof *w->etags);
    if (!w->slots || !w->etags || !(w->slots[0].buf = malloc(s->c.cfg.part_size))) {
        free_writer(s, w);
        goto oom;
    }
    *out = &w->base;
    return 0;
oom:
    fsdp_err(err, "s3: out of memory for a writer");
    return FSDP_ERROR;
}

static int s3_write(struct storage_writer *wb, const void *buf, size_t n, char *err)
{
    struct s3_writer *w = (struct s3_writer *)wb;
    struct s3_store *s = S(wb->store);
    const unsigned char *p = buf;
    while (n) {
        struct slot *sl = &w->slots[w->cur];
        size_t take = s->c.cfg.part_size - sl->len;
        take = take < n ? take : n;
        memcpy(sl->buf + sl->len, p, take);
        sl->len += take;
        p += take;
        n -= take;
        if (sl->len == s->c.cfg.part_size && ship(s, w, err))
            return FSDP_ERROR;
    }
    return 0;
}

static void s3_abort(struct storage_writer *wb)
{
    struct s3_writer *w = (struct s3_writer *)wb;
    struct s3_store *s = S(wb->store);
    abort_upload(s, w);
    free_writer(s, w);
}

/* The ETag S3 gives a multipart object: the MD5 of the parts' binary MD5s,
 * "-" and the number of parts (quoted, as the ETag header sends it). */
static int multipart_etag(const struct s3_writer *w, char *out, size_t n)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md || !EVP_DigestInit_ex(md, EVP_md5(), NULL)) {
        EVP_MD_CTX_free(md);
        return -1;
    }
    int ok = 1;
    for (int i = 0; ok && i < w->next_part; i++) {
        const char *e = w->etags[i] + (w->etags[i][0] == '"');
        unsigned char bin[16];
        for (int j = 0; ok && j < 16; j++)
            ok = sscanf(e + 2 * j, "%2hhx", &bin[j]) == 1;
        ok = ok && EVP_DigestUpdate(md, bin, sizeof bin);
    }
    unsigned char sum[16];
    unsigned int len = 0;
    ok = ok && EVP_DigestFinal_ex(md, sum, &len) && len == 16;
    EVP_MD_CTX_free(md);
    if (!ok)
        return -1;
    char hex[33];
    fsdp_hex(sum, sizeof sum, hex);
    snprintf(out, n, "\"%s-%d\"", hex, w->next_part);
    return 0;
}

/* A CompleteMultipartUpload retried after its answer was lost meets
 * NoSuchUpload when the first attempt did complete it: the object is then
 * there with the ETag of exactly our parts. */
static int completed_before(struct s3_store *s, struct s3_writer *w)
{
    char want[64], err[FSDP_ERR_LEN];
    if (multipart_etag(w, want, sizeof want))
        return 0;
    struct s3_request r = {.method = "HEAD", .bucket = s->bucket, .key = w->key};
    int same = s3_perform(&s->c, &r, "HeadObject", err) == 0 && r.status == 200 &&
               strcmp(r.etag, want) == 0;
    s3_buf_free(&r.resp);
    return same;
}

int s3_complete_body(const char (*etags)[128], int n, struct s3_buf *out)
{
    int bad = s3_buf_append_str(out, "<CompleteMultipartUpload>");
    for (int i = 0; !bad && i < n; i++) {
        char num[32];
        snprintf(num, sizeof num, "%d", i + 1);
        bad = s3_buf_append_str(out, "<Part><PartNumber>") || s3_buf_append_str(out, num) ||
              s3_buf_append_str(out, "</PartNumber><ETag>") ||
              s3_buf_append_xml_text(out, etags[i]) || s3_buf_append_str(out, "</ETag></Part>");
    }
    bad = bad || s3_buf_append_str(out, "</CompleteMultipartUpload>");
    if (bad)
        s3_buf_free(out);
    return bad ? -1 : 0;
}

static int complete(struct s3_store *s, struct s3_writer *w, char *err)
{
    char q[1700];
    struct s3_buf xml = {0};
    if (s3_complete_body((const char(*)[128])w->etags, w->next_part, &xml)) {
        fsdp_err(err,
                 "s3 CompleteMultipartUpload %s/%s: out of memory for "
                 "the request body (or an ETag XML cannot carry)",
                 s->bucket, w->key);
        return FSDP_ERROR;
    }
    snprintf(q, sizeof q, "uploadId=%s", w->upload_id_enc);
    struct s3_request r = {.method = "POST",
                           .bucket = s->bucket,
                           .key = w->key,
                           .query = q,
                           .body = xml.p,
                           .body_len = xml.len};
    int rc = s3_perform(&s->c, &r, "CompleteMultipartUpload", err);
    if (!rc && r.status == 404 && r.attempts > 1 && completed_before(s, w)) {
        s3_buf_free(&r.resp);
        s3_buf_free(&xml);
        return 0;
    }
    /* S3 may answer 200 with an <Error> body; RGW sends an empty ETag */
    if (!rc && (r.status != 200 || (r.resp.p && strstr(r.resp.p, "<Error>")))) {
        if (r.status == 200)
            r.status = 500;
        if (r.resp.p && !r.code[0]) {
            struct s3_xml x;
            if (s3_xml_parse(r.resp.p, r.resp.len, &x) == 0) {
                const char *code = s3_xml_first(&x, "Code");
                snprintf(r.code, sizeof r.code, "%s", code ? code : "");
                s3_xml_free(&x);
            }
        }
        rc = s3_http_error(&r, "CompleteMultipartUpload", err);
    }
    s3_buf_free(&r.resp);
    s3_buf_free(&xml);
    return rc;
}

static int s3_commit(struct storage_writer *wb, char *err)
{
    struct s3_writer *w = (struct s3_writer *)wb;
    struct s3_store *s = S(wb->store);
    int rc = 0;
    if (!w->upload_id[0]) { /* small: one PutObject */
        struct slot *sl = &w->slots[w->cur];
        struct s3_request r = {.method = "PUT",
                               .bucket = s->bucket,
                               .key = w->key,
                               .body = sl->buf,
                               .body_len = sl->len};
        rc = s3_perform(&s->c, &r, "PutObject", err);
        if (!rc && r.status != 200)
            rc = s3_http_error(&r, "PutObject", err);
        s3_buf_free(&r.resp);
    } else {
        if (w->slots[w->cur].len)
            rc = ship(s, w, err);
        w->cur = -1;
        if (!rc)
            rc = drive(s, w, 1, err);
        if (!rc && w->failed)
            rc = (fsdp_err(err, "%s", w->err), FSDP_ERROR);
        if (!rc)
            rc = complete(s, w, err);
        if (rc)
            abort_upload(s, w);
    }
    free_writer(s, w);
    return rc ? FSDP_ERROR : 0;
}

/* ---- reads, listing, deletion --------------------------------------------- */

static int s3_get_range(struct storage *st, const char *key, uint64_t off, size_t len, void *buf,
                        char *err)
{
    struct s3_store *s = S(st);
    char k[1100], range[96];
    if (full_key(s, key, k, sizeof k, err))
        return FSDP_ERROR;
    if (len == 0)
        return 0;
    snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)off,
             (unsigned long long)(off + len - 1));
    struct s3_request r = {
        .method = "GET", .bucket = s->bucket, .key = k, .into = buf, .into_len = len};
    r.extra[0] = range;
    int rc = s3_perform(&s->c, &r, "GetObject", err);
    if (!rc && r.status == 404) {
        fsdp_err(err, "s3://%s/%s: not found", s->bucket, k);
        rc = STORAGE_NOT_FOUND;
    } else if (!rc && r.status == 416) {
        fsdp_err(err, "s3://%s/%s: truncated: no bytes at %llu..%llu", s->bucket, k,
                 (unsigned long long)off, (unsigned long long)(off + len));
        rc = FSDP_ERROR;
    } else if (!rc && r.status != 206 && !(r.status == 200 && off == 0)) {
        rc = s3_http_error(&r, "GetObject", err);
    }
    s3_buf_free(&r.resp);
    return rc;
}

static int s3_stat(struct storage *st, const char *key, uint64_t *size, char *err)
{
    struct s3_store *s = S(st);
    char k[1100];
    if (full_key(s, key, k, sizeof k, err))
        return FSDP_ERROR;
    struct s3_request r = {.method = "HEAD", .bucket = s->bucket, .key = k};
    int rc = s3_perform(&s->c, &r, "HeadObject", err);
    if (!rc && r.status == 404) {
        fsdp_err(err, "s3://%s/%s: not found", s->bucket, k);
        rc = STORAGE_NOT_FOUND;
    } else if (!rc && r.status != 200) {
        rc = s3_http_error(&r, "HeadObject", err);
    } else if (!rc) {
        *size = r.content_length;
    }
    s3_buf_free(&r.resp);
    return rc;
}

/* FNV-1a: a listing remembers the tokens it was given by their hashes (a
 * collision can only refuse a listing, never repeat one) */
static uint64_t token_hash(const char *t)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *t; t++)
        h = (h ^ (unsigned char)*t) * 1099511628211ULL;
    return h;
}

/* ListObjectsV2, page by page, with every answer checked: S3 sends at most
 * max-keys (1,000) keys a page, in ascending order, under the prefix asked
 * for, with a continuation token never seen before. A server that breaks
 * any of these (one that answers IsTruncated with the same token forever)
 * is refused with one line, and no listing takes more than
 * FSDP_S3_LIST_MAX_PAGES pages (100,000: 100 million keys). */
static int s3_list(struct storage *st, const char *prefix,
                   int (*fn)(void *, const char *, uint64_t), void *arg, char *err)
{
    struct s3_store *s = S(st);
    char full[1100], efull[3400], token[2048] = "", etok[6200], q[10000], last[MAX_KEY + 2] = "";
    if (list_prefix_ok(prefix, err))
        return FSDP_ERROR;
    if ((size_t)snprintf(full, sizeof full, "%s%s%s", s->prefix, s->prefix[0] ? "/" : "", prefix) >
        MAX_KEY) {
        fsdp_err(err,
                 "storage: listing prefix '%.100s...' longer than S3's %d "
                 "bytes",
                 prefix, MAX_KEY);
        return FSDP_ERROR;
    }
    sigv4_uri_encode(full, strlen(full), 0, efull, sizeof efull);
    size_t strip = s->prefix[0] ? strlen(s->prefix) + 1 : 0;
    int page_keys = s->c.cfg.list_max_keys ? s->c.cfg.list_max_keys : 1000;
    uint64_t *seen = NULL;
    int nseen = 0, capseen = 0, rc = 0;
    for (long page = 1; !rc; page++) {
        if (page > s->c.cfg.list_max_pages) {
            fsdp_err(err,
                     "s3 ListObjectsV2 %s/%s: the listing goes on past %ld pages "
                     "(FSDP_S3_LIST_MAX_PAGES): refused as endless",
                     s->bucket, full, s->c.cfg.list_max_pages);
            rc = FSDP_ERROR;
            break;
        }
        sigv4_uri_encode(token, strlen(token), 0, etok, sizeof etok);
        char mk[32] = "";
        if (s->c.cfg.list_max_keys)
            snprintf(mk, sizeof mk, "&max-keys=%d", s->c.cfg.list_max_keys);
        snprintf(q, sizeof q, "list-type=2%s&prefix=%s%s%s", mk, efull,
                 token[0] ? "&continuation-token=" : "", token[0] ? etok : "");
        struct s3_request r = {.method = "GET",
                               .bucket = s->bucket,
                               .query = q,
                               .resp = {.limit = S3_LIST_ANSWER_LIMIT}};
        rc = s3_perform(&s->c, &r, "ListObjectsV2", err);
        if (!rc && r.status != 200)
            rc = s3_http_error(&r, "ListObjectsV2", err);
        struct s3_xml x = {0};
        int xr = rc ? 0 : s3_xml_parse(r.resp.p ? r.resp.p : "", r.resp.len, &x);
        if (xr == -2)
            fsdp_err(err,
                     "s3 ListObjectsV2 %s: page %ld has more than %d elements or nests deeper "
                     "than %d: more than a page of %d keys holds",
                     s->bucket, page, S3_XML_MAX_ITEMS, S3_XML_MAX_DEPTH, page_keys);
        else if (xr)
            fsdp_err(err, "s3 ListObjectsV2 %s: page %ld: unreadable XML", s->bucket, page);
        rc = rc ? rc : xr ? FSDP_ERROR : 0;
        s3_buf_free(&r.resp);
        const char *key = NULL;
        int truncated = 0, nkeys = 0;
        token[0] = 0;
        for (int i = 0; !rc && i < x.n; i++) {
            const struct s3_xml_item *it = &x.v[i];
            if (strcmp(it->parent, "Contents") == 0 && strcmp(it->name, "Key") == 0) {
                key = it->text;
            } else if (strcmp(it->parent, "Contents") == 0 && strcmp(it->name, "Size") == 0 &&
                       key) {
                /* only keys under our prefix: anything else is the server's error */
                if (++nkeys > page_keys) {
                    fsdp_err(err,
                             "s3 ListObjectsV2 %s: page %ld lists more than the %d keys a page "
                             "may hold",
                             s->bucket, page, page_keys);
                    rc = FSDP_ERROR;
                } else if (strip &&
                           (strncmp(key, s->prefix, strip - 1) != 0 || key[strip - 1] != '/')) {
                    fsdp_err(err,
                             "s3 ListObjectsV2 %s: the answer lists "
                             "'%.200s', outside the prefix '%s/'",
                             s->bucket, key, s->prefix);
                    rc = FSDP_ERROR;
                } else if (strlen(key) > MAX_KEY || (last[0] && strcmp(key, last) <= 0)) {
                    /* S3 lists in ascending UTF-8 byte order, each key once */
                    fsdp_err(err,
                             "s3 ListObjectsV2 %s: the answer lists '%.200s' after '%.200s' "
                             "(S3 lists each key once, in ascending order)",
                             s->bucket, key, last);
                    rc = FSDP_ERROR;
                } else {
                    snprintf(last, sizeof last, "%s", key);
                    rc = fn(arg, key + strip, strtoull(it->text, NULL, 10));
                }
                key = NULL;
            } else if (strcmp(it->name, "IsTruncated") == 0) {
                truncated = strcmp(it->text, "true") == 0;
            } else if (strcmp(it->name, "NextContinuationToken") == 0) {
                if (strlen(it->text) >= sizeof token) {
                    fsdp_err(err,
                             "s3 ListObjectsV2 %s: page %ld: a continuation token of %zu bytes "
                             "(at most %zu)",
                             s->bucket, page, strlen(it->text), sizeof token - 1);
                    rc = FSDP_ERROR;
                } else {
                    snprintf(token, sizeof token, "%s", it->text);
                }
            }
        }
        s3_xml_free(&x);
        if (rc || !truncated)
            break;
        if (!token[0]) {
            fsdp_err(err, "s3 ListObjectsV2 %s: truncated listing without a continuation token",
                     s->bucket);
            rc = FSDP_ERROR;
            break;
        }
        uint64_t h = token_hash(token);
        for (int i = 0; !rc && i < nseen; i++)
            if (seen[i] == h) {
                fsdp_err(err,
                         "s3 ListObjectsV2 %s: page %ld hands back the continuation token of "
                         "page %d: a listing that never ends, refused",
                         s->bucket, page, i + 1);
                rc = FSDP_ERROR;
            }
        if (!rc && nseen == capseen) {
            int cap = capseen ? 2 * capseen : 64;
            uint64_t *p = realloc(seen, (size_t)cap * sizeof *p);
            if (!p) {
                fsdp_err(err, "s3 ListObjectsV2 %s: out of memory", s->bucket);
                rc = FSDP_ERROR;
            } else {
                seen = p, capseen = cap;
            }
        }
        if (!rc)
            seen[nseen++] = h;
    }
    free(seen);
    return rc;
}

static int s3_del(struct storage *st, const char *key, char *err)
{
    struct s3_store *s = S(st);
    char k[1100];
    if (full_key(s, key, k, sizeof k, err))
        return FSDP_ERROR;
    struct s3_request r = {.method = "DELETE", .bucket = s->bucket, .key = k};
    int rc = s3_perform(&s->c, &r, "DeleteObject", err);
    if (!rc && r.status != 204 && r.status != 200 && r.status != 404)
        rc = s3_http_error(&r, "DeleteObject", err);
    s3_buf_free(&r.resp);
    return rc;
}

int s3_delete_body(const char *prefix, const char *const *keys, int n, struct s3_buf *out)
{
    int bad = s3_buf_append_str(out, "<Delete><Quiet>true</Quiet>");
    for (int i = 0; !bad && i < n; i++) {
        bad = s3_buf_append_str(out, "<Object><Key>") ||
              (prefix[0] && (s3_buf_append_xml_text(out, prefix) || s3_buf_append_str(out, "/"))) ||
              s3_buf_append_xml_text(out, keys[i]) || s3_buf_append_str(out, "</Key></Object>");
    }
    bad = bad || s3_buf_append_str(out, "</Delete>");
    if (bad)
        s3_buf_free(out);
    return bad ? -1 : 0;
}

/* DeleteObjects, up to 1000 keys a request (Content-MD5 is required). */
static int s3_del_many(struct storage *st, const char *const *keys, int n, char *err)
{
    struct s3_store *s = S(st);
    for (int i = 0; i < n; i++) { /* every key checked before anything is deleted */
        char k[1100];
        if (full_key(s, keys[i], k, sizeof k, err))
            return FSDP_ERROR;
    }
    for (int at = 0; at < n; at += 1000) {
        int m = n - at < 1000 ? n - at : 1000;
        struct s3_buf xml = {0};
        unsigned char md5[16];
        unsigned int mdlen = 0;
        if (s3_delete_body(s->prefix, keys + at, m, &xml) ||
            !EVP_Digest(xml.p, xml.len, md5, &mdlen, EVP_md5(), NULL) || mdlen != 16) {
            s3_buf_free(&xml);
            fsdp_err(err,
                     "s3 DeleteObjects %s: cannot build the request "
                     "(out of memory, or OpenSSL failed)",
                     s->bucket);
            return FSDP_ERROR;
        }
        char b64[32], hdr[64];
        EVP_EncodeBlock((unsigned char *)b64, md5, 16);
        snprintf(hdr, sizeof hdr, "Content-MD5: %s", b64);
        struct s3_request r = {.method = "POST",
                               .bucket = s->bucket,
                               .query = "delete=",
                               .body = xml.p,
                               .body_len = xml.len};
        r.extra[0] = hdr;
        int rc = s3_perform(&s->c, &r, "DeleteObjects", err);
        if (!rc && r.status != 200)
            rc = s3_http_error(&r, "DeleteObjects", err);
        if (!rc && r.resp.p && strstr(r.resp.p, "<Error>")) {
            struct s3_xml x;
            fsdp_err(err, "s3 DeleteObjects %s: an error in the answer", s->bucket);
            if (s3_xml_parse(r.resp.p, r.resp.len, &x) == 0) {
                const char *key = s3_xml_first(&x, "Key"), *code = s3_xml_first(&x, "Code");
                fsdp_err(err, "s3 DeleteObjects %s: %s: %s", s->bucket, key ? key : "?",
                         code ? code : "error");
                s3_xml_free(&x);
            }
            rc = FSDP_ERROR;
        }
        s3_buf_free(&r.resp);
        s3_buf_free(&xml);
        if (rc)
            return rc;
    }
    return 0;
}

/* After a retried conditional PUT, 412 may answer our own earlier attempt:
 * one whose request reached the server but whose answer was lost (a reset,
 * a timeout, a 5xx from a proxy after the write). The object then holds
 * exactly our bytes, and the put succeeded. Anything else there is another
 * writer's: STORAGE_EXISTS. Callers make their bodies unique to the writer
 * (the generation record carries a nonce) so that equal bytes mean "ours". */
static int holds_exactly(struct storage *st, const char *key, const void *buf, size_t n)
{
    char err[FSDP_ERR_LEN];
    uint64_t size;
    if (st->ops->stat(st, key, &size, err) || size != n)
        return 0;
    void *got = malloc(n ? n : 1);
    int same = got && st->ops->get_range(st, key, 0, n, got, err) == 0 && memcmp(got, buf, n) == 0;
    free(got);
    return same;
}

static int s3_put_if_absent(struct storage *st, const char *key, const void *buf, size_t n,
                            char *err)
{
    struct s3_store *s = S(st);
    char k[1100];
    if (full_key(s, key, k, sizeof k, err))
        return FSDP_ERROR;
    struct s3_request r = {
        .method = "PUT", .bucket = s->bucket, .key = k, .body = buf, .body_len = n};
    r.extra[0] = "If-None-Match: *";
    int rc = s3_perform(&s->c, &r, "PutObject", err);
    if (!rc && (r.status == 412 || r.status == 409)) {
        if (r.attempts > 1 && holds_exactly(st, key, buf, n)) {
            rc = 0;
        } else {
            fsdp_err(err, "s3://%s/%s already exists", s->bucket, k);
            rc = STORAGE_EXISTS;
        }
    } else if (!rc && r.status != 200) {
        rc = s3_http_error(&r, "PutObject", err);
    }
    s3_buf_free(&r.resp);
    return rc;
}

static void s3_close(struct storage *st)
{
    s3_client_free(&S(st)->c);
    free(st);
}

static const struct storage_ops s3_ops = {
    .scheme = "s3",
    .put_begin = s3_put_begin,
    .write = s3_write,
    .commit = s3_commit,
    .abort = s3_abort,
    .get_range = s3_get_range,
    .stat = s3_stat,
    .list = s3_list,
    .del = s3_del,
    .del_many = s3_del_many,
    .put_if_absent = s3_put_if_absent,
    .close = s3_close,
    .concurrent_reads = 1, /* each request takes its own curl handle (s3_perform) */
};

static int alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

int storage_s3_open(const char *uri, struct storage **out, char *err)
{
    const char *p = uri + 5; /* after s3:// */
    const char *slash = strchr(p, '/');
    size_t bl = slash ? (size_t)(slash - p) : strlen(p);
    /* S3's bucket naming rules: no "." or ".." can stand in for a bucket */
    int ok = bl >= 3 && bl <= 63 && alnum(p[0]) && alnum(p[bl - 1]);
    for (size_t i = 0; ok && i < bl; i++)
        ok = (alnum(p[i]) || p[i] == '-' || p[i] == '.') && !(p[i] == '.' && p[i + 1] == '.');
    if (!ok) {
        fsdp_err(err,
                 "storage: '%s': a bucket name is 3-63 of a-z 0-9 . -, "
                 "starting and ending with a letter or digit, without '..'",
                 uri);
        return FSDP_ERROR;
    }
    struct s3_store *s = calloc(1, sizeof *s);
    if (!s) {
        fsdp_err(err, "storage: out of memory");
        return FSDP_ERROR;
    }
    memcpy(s->bucket, p, bl);
    if (slash) {
        const char *pre = slash + 1;
        size_t pl = strlen(pre);
        while (pl && pre[pl - 1] == '/')
            pl--;
        if (pl >= sizeof s->prefix) {
            free(s);
            fsdp_err(err, "storage: '%s': prefix too long", uri);
            return FSDP_ERROR;
        }
        memcpy(s->prefix, pre, pl);
        /* a prefix is a path of plain names: s3://b/../x would leave the bucket */
        const char *why = pl ? storage_key_problem(s->prefix) : NULL;
        if (why) {
            fsdp_err(err,
                     "storage: '%s': the prefix has %s (a bucket prefix "
                     "is a path of plain names)",
                     uri, why);
            free(s);
            return FSDP_ERROR;
        }
    }
    if (s3_client_init(&s->c, err)) {
        free(s);
        return FSDP_ERROR;
    }
    s->base.ops = &s3_ops;
    snprintf(s->base.uri, sizeof s->base.uri, "s3://%s%s%s", s->bucket, s->prefix[0] ? "/" : "",
             s->prefix);
    *out = &s->base;
    return 0;
}
