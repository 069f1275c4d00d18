/*
 * test_sigv4.c - the signer against the AWS SigV4 test suite
 * (tests/vectors/sigv4, the cases valid for S3: no path normalisation) and
 * the S3 API reference's GET Object example (tests/vectors/s3). For every
 * case the canonical request, the string to sign and the signature must
 * match byte for byte; a wrong secret must change the signature.
 */
#include "check.h"

#include "sigv4.h"

#include <dirent.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

static const char *vectors(void)
{
    const char *d = getenv("SIGV4_VECTORS");
    return d ? d : "tests/vectors";
}

static char *slurp(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *s = strdup(buf);
    size_t l = strlen(s); /* expected files may end without a newline */
    while (l && (s[l - 1] == '\n' || s[l - 1] == '\r') && strcmp(name, "request.txt"))
        s[--l] = 0;
    return s;
}

struct parsed {
    char method[16], path[1024], query[2048];
    struct sigv4_kv h[32];
    char names[32][128], values[32][2048];
    int nh;
    const char *body;
};

static int parse_request(char *req, struct parsed *p)
{
    memset(p, 0, sizeof *p);
    char *eol = strchr(req, '\n');
    if (!eol)
        return -1;
    *eol = 0;
    char *sp = strchr(req, ' '), *http = strstr(req, " HTTP/1.1");
    if (!sp || !http)
        return -1;
    snprintf(p->method, sizeof p->method, "%.*s", (int)(sp - req), req);
    *http = 0;
    char *target = sp + 1, *q = strchr(target, '?');
    if (q) {
        snprintf(p->query, sizeof p->query, "%s", q + 1);
        *q = 0;
    }
    snprintf(p->path, sizeof p->path, "%s", target);
    char *line = eol + 1;
    while (*line && *line != '\n') {
        char *next = strchr(line, '\n');
        if (next)
            *next = 0;
        if ((*line == ' ' || *line == '\t') && p->nh > 0) { /* folded continuation */
            size_t l = strlen(p->values[p->nh - 1]);
            snprintf(p->values[p->nh - 1] + l, sizeof p->values[0] - l, "\n%s", line);
        } else {
            char *colon = strchr(line, ':');
            if (!colon || p->nh == 32)
                return -1;
            snprintf(p->names[p->nh], sizeof p->names[0], "%.*s", (int)(colon - line), line);
            snprintf(p->values[p->nh], sizeof p->values[0], "%s", colon + 1);
            p->nh++;
        }
        if (!next) {
            line = "";
            break;
        }
        line = next + 1;
    }
    p->body = *line == '\n' ? line + 1 : "";
    for (int i = 0; i < p->nh; i++)
        p->h[i] = (struct sigv4_kv){p->names[i], p->values[i]};
    return 0;
}

static void sha_hex(const char *s, char out[65])
{
    unsigned char d[32];
    unsigned int n = 32;
    EVP_Digest(s, strlen(s), d, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static int s3_case(const char *name)
{
    size_t n = strlen(name);
    return !(n > 11 && strcmp(name + n - 11, "-normalized") == 0);
}

static void aws_suite_cases_valid_for_s3_match(void)
{
    char base[1024];
    snprintf(base, sizeof base, "%s/sigv4", vectors());
    DIR *d = opendir(base);
    REQUIRE(d != NULL, "cannot open %s (set SIGV4_VECTORS)", base);
    struct dirent *de;
    int cases = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !s3_case(de->d_name))
            continue;
        char dir[1400];
        snprintf(dir, sizeof dir, "%s/%s", base, de->d_name);
        char *ctx = slurp(dir, "context.json"), *req = slurp(dir, "request.txt");
        if (!ctx || !req) {
            free(ctx);
            free(req);
            continue; /* LICENSE, NOTICE */
        }
        char *want_c = slurp(dir, "header-canonical-request.txt");
        char *want_s = slurp(dir, "header-string-to-sign.txt");
        char *want_sig = slurp(dir, "header-signature.txt");
        json_t *j = json_loads(ctx, 0, NULL);
        const char *ak = NULL, *sk = NULL, *tok = NULL, *region = NULL, *service = NULL, *ts = NULL;
        int sign_body = 0, omit_token = 0;
        json_unpack(j, "{s:{s:s, s:s, s?s}, s:s, s:s, s:s, s:b, s?b}", "credentials",
                    "access_key_id", &ak, "secret_access_key", &sk, "token", &tok, "region",
                    &region, "service", &service, "timestamp", &ts, "sign_body", &sign_body,
                    "omit_session_token", &omit_token);
        if (omit_token) /* the case adds the token after signing (not how S3 works) */
            tok = NULL;
        struct parsed p;
        CHECK(parse_request(req, &p) == 0 && ts, "%s: cannot parse", de->d_name);
        char date[32] = "";
        if (ts) /* 2015-08-30T12:36:00Z -> 20150830T123600Z */
            snprintf(date, sizeof date, "%.4s%.2s%.2sT%.2s%.2s%.2sZ", ts, ts + 5, ts + 8, ts + 11,
                     ts + 14, ts + 17);
        char body_sha[65];
        sha_hex(p.body, body_sha);
        struct sigv4_input in = {p.method, p.path,  p.query, p.h, p.nh, body_sha, date,
                                 region,   service, ak,      sk,  tok,  sign_body};
        static struct sigv4_output out;
        CHECK(sigv4_sign(&in, &out) == 0, "%s: sign failed", de->d_name);
        CHECK(want_c && strcmp(out.canonical_request, want_c) == 0,
              "%s: canonical request\n--- got\n%s\n--- want\n%s", de->d_name, out.canonical_request,
              want_c ? want_c : "?");
        CHECK(want_s && strcmp(out.string_to_sign, want_s) == 0, "%s: string to sign", de->d_name);
        CHECK(want_sig && strcmp(out.signature, want_sig) == 0, "%s: signature %s, want %s",
              de->d_name, out.signature, want_sig ? want_sig : "?");
        cases++;
        json_decref(j);
        free(ctx), free(req), free(want_c), free(want_s), free(want_sig);
    }
    closedir(d);
    printf("  %d cases of the AWS suite checked\n", cases);
    CHECK(cases >= 25, "only %d cases found", cases);
}

static void s3_reference_get_object_example_matches(void)
{
    struct sigv4_kv h[] = {{"Host", "examplebucket.s3.amazonaws.com"}, {"Range", "bytes=0-9"}};
    struct sigv4_input in = {"GET",
                             "/test.txt",
                             "",
                             h,
                             2,
                             "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                             "20130524T000000Z",
                             "us-east-1",
                             "s3",
                             "AKIAIOSFODNN7EXAMPLE",
                             "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                             NULL,
                             1};
    static struct sigv4_output out;
    REQUIRE(sigv4_sign(&in, &out) == 0, "sign failed");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/s3", vectors());
    char *ref = slurp(dir, "get-object-range.txt");
    REQUIRE(ref != NULL, "no %s/get-object-range.txt", dir);
    char *sig = strstr(ref, "signature: "), *signed_h = strstr(ref, "signed_headers: ");
    REQUIRE(sig && signed_h, "reference file lacks signature lines");
    CHECK(strncmp(out.signature, sig + 11, 64) == 0, "signature %s, reference %.64s", out.signature,
          sig + 11);
    CHECK(strncmp(out.signed_headers, signed_h + 16, strlen(out.signed_headers)) == 0,
          "signed headers %s", out.signed_headers);
    /* a wrong secret gives another signature, and the secret is nowhere in the output */
    char good[65];
    snprintf(good, sizeof good, "%s", out.signature);
    in.secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEZ";
    REQUIRE(sigv4_sign(&in, &out) == 0, "sign failed");
    CHECK(strcmp(out.signature, good) != 0, "a wrong secret signed the same");
    CHECK(!strstr(out.authorization, "EXAMPLEKEZ") && !strstr(out.canonical_request, "EXAMPLEKEZ"),
          "the secret leaked into the output");
    free(ref);
}

static void keys_are_encoded_per_segment_without_normalisation(void)
{
    char out[256];
    sigv4_uri_encode("/b/step-1/a b/../ü", strlen("/b/step-1/a b/../ü"), 1, out, sizeof out);
    CHECK(strcmp(out, "/b/step-1/a%20b/../%C3%BC") == 0, "%s", out);
    sigv4_uri_encode("a/b=c", 5, 0, out, sizeof out);
    CHECK(strcmp(out, "a%2Fb%3Dc") == 0, "%s", out);
}

CHECK_MAIN(TEST(aws_suite_cases_valid_for_s3_match), TEST(s3_reference_get_object_example_matches),
           TEST(keys_are_encoded_per_segment_without_normalisation))
