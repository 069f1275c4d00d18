/*
 * s3_internal.h - private to storage/: the S3 backend's configuration,
 * signed HTTP requests with retries, and the XML it reads.
 */
#ifndef FSDP_S3_INTERNAL_H
#define FSDP_S3_INTERNAL_H

#include "storage.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct s3_config {
    char scheme[8]; /* http or https */
    char host[256]; /* host[:port] as in the Host header */
    char region[64];
    char access_key[128], secret_key[256], session_token[4096];
    char ca_bundle[1024];
    int virtual_hosted;
    int max_attempts;
    int retry_base_ms, retry_cap_ms;
    long timeout_s; /* a transfer slower than 1 byte/s for this long fails (and is retried) */
    size_t part_size;
    int parallel_parts;
    int list_max_keys;   /* 0: the server's default (1000) */
    long list_max_pages; /* the most pages one listing may take */
};

/* Reads AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION, AWS_PROFILE with
 * ~/.aws/credentials (or AWS_SHARED_CREDENTIALS_FILE), AWS_CA_BUNDLE, and
 * FSDP_S3_* tuning. Never prints a secret. */
int s3_config_load(struct s3_config *c, char *err);

/* A growing buffer (answers, request bodies), always NUL-terminated;
 * limit: most bytes it may hold (0: S3_BUF_LIMIT). */
#define S3_BUF_LIMIT ((size_t)64 << 20)
/* a listing page: 1,000 keys of up to 1,024 bytes with S3's metadata */
#define S3_LIST_ANSWER_LIMIT ((size_t)8 << 20)
#define S3_IDLE_HANDLES      16 /* easy handles kept for reuse; more threads get fresh ones */
struct s3_buf {
    char *p;
    size_t len, cap, limit;
};
void s3_buf_free(struct s3_buf *b);
/* 0, or -1 (b unchanged) when the bytes would pass the limit or memory ran out. */
int s3_buf_append(struct s3_buf *b, const void *data, size_t n);
int s3_buf_append_str(struct s3_buf *b, const char *s);
/* s as XML character data: & < > " ' escaped, tab, LF and CR as character
 * references; -1 (b unchanged) for any other control character (XML 1.0
 * has no way to carry one), or as s3_buf_append. */
int s3_buf_append_xml_text(struct s3_buf *b, const char *s);

/* Request bodies, built only with the appends above. DeleteObjects (Quiet)
 * for PREFIX/KEY of each key (prefix "" for none); CompleteMultipartUpload
 * for parts 1..n with their ETags. 0, or -1 (out of memory, or a key XML
 * cannot carry); out is freed on failure. */
int s3_delete_body(const char *prefix, const char *const *keys, int n, struct s3_buf *out);
int s3_complete_body(const char (*etags)[128], int n, struct s3_buf *out);

/* One request. body/body_len: what to send; into/into_len: a caller buffer
 * the response body must fill exactly (ranged GET), else resp collects it. */
struct s3_request {
    const char *method;
    const char *bucket;
    const char *key;   /* object key (NULL: the bucket itself) */
    const char *query; /* encoded, "" for none */
    const void *body;
    size_t body_len;
    const char *extra[4]; /* "Name: value" headers, NULL-terminated */
    void *into;
    size_t into_len;
    struct s3_buf resp;
    long status;
    char code[64]; /* S3 error code from an error body */
    uint64_t content_length;
    char etag[128];
    /* per attempt */
    size_t sent, received;
    int overflow;
    int too_large; /* the answer passed resp's limit */
    int attempts;  /* how many were sent (s3_perform) */
    CURL *h;
};

/* Requests may run on several threads at once (s3_perform); everything
 * else here (the multi handle: multipart uploads) is one thread's. */
struct s3_client {
    struct s3_config cfg;
    /* idle easy handles: a request takes one and gives it back, so its
     * connection is reused by the next request (one per thread in flight) */
    pthread_mutex_t mu;
    CURL *idle[S3_IDLE_HANDLES];
    int nidle;
    CURLM *multi;
    uint64_t retries; /* atomic */
};

int s3_client_init(struct s3_client *c, char *err);
void s3_client_free(struct s3_client *c);

/* Performs r with signing and retries (5xx, SlowDown, RequestTimeout,
 * resets, timeouts, truncated bodies; never other 4xx). Returns 0 with
 * r->status set for any HTTP answer that is not retried away; -1 with err
 * ("s3 OP bucket/key: ...") when the transfer itself failed for good. */
int s3_perform(struct s3_client *c, struct s3_request *r, const char *op, char *err);

/* Sets the options of an easy handle for r (URL, headers, signature,
 * body callbacks); the caller performs it (multi for parallel parts). */
struct curl_slist;
int s3_prepare(struct s3_client *c, CURL *h, struct s3_request *r, struct curl_slist **hdrs,
               char *err);
/* After a transfer: status, error code from the body, whether to retry. */
int s3_finish(struct s3_client *c, CURL *h, struct s3_request *r, CURLcode cc, int *retry,
              char *why, size_t why_len);
void s3_backoff(struct s3_client *c, int attempt);

/* Fills err with "s3 OP bucket/key: HTTP status CODE: message". */
int s3_http_error(const struct s3_request *r, const char *op, char *err);

/* XML: the text of every element, in document order, with its parent's
 * name, for the few documents S3 sends. */
struct s3_xml_item {
    char parent[48], name[48];
    char *text;
};
struct s3_xml {
    struct s3_xml_item *v;
    int n, cap;
};
/* The most elements, and the deepest nesting, one answer may have: a
 * listing page of 1,000 keys has about 12,000 elements 4 deep. */
#define S3_XML_MAX_ITEMS 32768
#define S3_XML_MAX_DEPTH 16
/* 0; -1 for a document that is not well-formed XML (or out of memory);
 * -2 for one over the bounds above. */
int s3_xml_parse(const char *doc, size_t len, struct s3_xml *x);
void s3_xml_free(struct s3_xml *x);
const char *s3_xml_first(const struct s3_xml *x, const char *name);

#endif
