/*
 * sigv4.h - AWS Signature Version 4 header signing, written from the spec
 * (docs.aws.amazon.com, "Create a signed AWS API request"), private to
 * storage/ and exposed for its unit test.
 *
 * S3 rules, which differ from other services: the canonical URI is the
 * path with each segment URI-encoded once and no normalisation ("//" and
 * "." stay); every request carries x-amz-content-sha256.
 */
#ifndef FSDP_SIGV4_H
#define FSDP_SIGV4_H

#include <stddef.h>

struct sigv4_kv {
    const char *name, *value;
};

struct sigv4_input {
    const char *method;
    const char *path;               /* raw bytes, e.g. "/bucket/step-1/shard"; encoded here */
    const char *query;              /* as sent, "" or e.g. "list-type=2&prefix=a%2Fb" */
    const struct sigv4_kv *headers; /* as sent (host included), duplicates allowed */
    int nheaders;
    const char *payload_sha256; /* hex digest, or UNSIGNED-PAYLOAD */
    const char *amz_date;       /* YYYYMMDDTHHMMSSZ */
    const char *region, *service;
    const char *access_key, *secret_key, *session_token; /* token may be NULL */
    int sign_content_sha256; /* add x-amz-content-sha256 (always for S3) */
};

struct sigv4_output {
    char canonical_request[16384];
    char string_to_sign[512];
    char signed_headers[2048];
    char signature[65];
    char authorization[2600];
};

/* 0, or -1 when the request does not fit the output buffers. */
int sigv4_sign(const struct sigv4_input *in, struct sigv4_output *out);

/* RFC 3986 encoding of every byte but A-Z a-z 0-9 - . _ ~ (and '/' when
 * keep_slash); returns bytes written (without the NUL), or -1 if n is too small. */
int sigv4_uri_encode(const char *s, size_t len, int keep_slash, char *out, size_t n);

#endif
