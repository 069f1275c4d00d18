/*
 * test_s3_requests.c - what the S3 backend puts on the wire, checked
 * against a tiny HTTP server on 127.0.0.1 in a thread, one per test (it
 * records each request and answers 200): XML bodies carry any key
 * byte-exact however many & < > " ' it holds, with the Content-MD5 of what
 * was sent; keys and bucket prefixes with "." or ".." parts are refused
 * before any request; paths go out exactly as signed (curl removes no dot
 * segments); and when libcurl's or OpenSSL's allocations fail (their
 * allocators are replaced here by ones that fail on demand), every call
 * either fails with a message or does exactly what it does without
 * failures: no request goes out unsigned or with half its headers, no
 * signature is computed from garbage; requests from four threads at once
 * each get their own answer (loads read S3 from several threads). Run
 * under ASan/UBSan and TSan too: a
 * miscounted body overflows there, a mishandled failure leaks or crashes.
 */
#include "check.h"

#include "s3_internal.h"
#include "sigv4.h"
#include "storage.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- the server ---------------------------------------------------------- */

static struct {
    int listen_fd, port, stop;
    pthread_t thread;
    pthread_mutex_t mu;
    int requests;
    int signed_fully; /* the last request had every header we sign */
    char line[4096];  /* request line of the last request */
    char md5[64];     /* its Content-MD5 header */
    char *body;       /* its body */
    size_t body_len;
} srv = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void serve_one(int c)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    char *end = NULL;
    while (buf && !end) { /* the head */
        if (n + 1 >= cap && !(buf = realloc(buf, cap *= 2)))
            break;
        ssize_t r = read(c, buf + n, cap - n - 1);
        if (r <= 0)
            break;
        n += (size_t)r;
        buf[n] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end) {
        free(buf);
        return;
    }
    size_t head = (size_t)(end - buf) + 4, want = 0;
    for (char *h = strstr(buf, "\r\n"); h && h < end; h = strstr(h + 2, "\r\n"))
        if (strncasecmp(h + 2, "content-length:", 15) == 0)
            want = strtoull(h + 17, NULL, 10);
    while (buf && n < head + want) { /* the body */
        if (n + 1 >= cap && !(buf = realloc(buf, cap *= 2)))
            break;
        ssize_t r = read(c, buf + n, cap - n - 1);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    if (!buf)
        return;
    pthread_mutex_lock(&srv.mu);
    srv.requests++;
    snprintf(srv.line, sizeof srv.line, "%.*s", (int)strcspn(buf, "\r\n"), buf);
    srv.md5[0] = 0;
    int have = 0;
    for (char *h = strstr(buf, "\r\n"); h && h < buf + head; h = strstr(h + 2, "\r\n")) {
        if (strncasecmp(h + 2, "content-md5:", 12) == 0)
            snprintf(srv.md5, sizeof srv.md5, "%.*s", (int)strcspn(h + 15, "\r\n"), h + 15);
        have |= (strncasecmp(h + 2, "authorization: AWS4-HMAC-SHA256 ", 32) == 0) |
                (strncasecmp(h + 2, "x-amz-date:", 11) == 0) << 1 |
                (strncasecmp(h + 2, "x-amz-content-sha256:", 21) == 0) << 2 |
                (strncasecmp(h + 2, "host:", 5) == 0) << 3;
    }
    srv.signed_fully = have == 15;
    free(srv.body);
    srv.body_len = n > head ? n - head : 0;
    srv.body = malloc(srv.body_len + 1);
    if (srv.body) {
        memcpy(srv.body, buf + head, srv.body_len);
        srv.body[srv.body_len] = 0;
    }
    pthread_mutex_unlock(&srv.mu);
    free(buf);
    const char *answer = "<DeleteResult></DeleteResult>";
    char reply[256];
    int len = snprintf(reply, sizeof reply,
                       "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                       strlen(answer), answer);
    if (write(c, reply, (size_t)len) < 0)
        return;
}

static void *server_main(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&srv.stop, __ATOMIC_ACQUIRE)) {
        int c = accept(srv.listen_fd, NULL, NULL);
        if (c < 0)
            continue;
        serve_one(c);
        close(c);
    }
    return NULL;
}

/* ---- allocators that fail on demand ---------------------------------------- */

static long alloc_left = -1; /* allocations that still succeed; -1: all do; -2: one failed */
static int alloc_sticky;     /* after the first failure, all fail (else only that one) */

static int alloc_fails(void)
{
    long n = __atomic_load_n(&alloc_left, __ATOMIC_SEQ_CST);
    while (n > 0 && !__atomic_compare_exchange_n(&alloc_left, &n, n - 1, 0, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST))
        ;
    if (n == 0 && !alloc_sticky)
        __atomic_compare_exchange_n(&alloc_left, &n, -2, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return n == 0;
}

static void *t_malloc(size_t n) { return alloc_fails() ? NULL : malloc(n); }
static void *t_calloc(size_t n, size_t m) { return alloc_fails() ? NULL : calloc(n, m); }
static void *t_realloc(void *p, size_t n) { return alloc_fails() ? NULL : realloc(p, n); }
static char *t_strdup(const char *s) { return alloc_fails() ? NULL : strdup(s); }
static void *o_malloc(size_t n, const char *f, int l)
{
    (void)f, (void)l;
    return t_malloc(n);
}
static void *o_realloc(void *p, size_t n, const char *f, int l)
{
    (void)f, (void)l;
    return t_realloc(p, n);
}
static void o_free(void *p, const char *f, int l)
{
    (void)f, (void)l;
    free(p);
}

/* Runs op with the first n allocations of libcurl and OpenSSL succeeding
 * and the next one failing (sticky: and all after it); returns whether an
 * allocation failed. */
static int with_failures(long n, int sticky, void (*op)(void *), void *arg)
{
    alloc_sticky = sticky;
    __atomic_store_n(&alloc_left, n, __ATOMIC_SEQ_CST);
    op(arg);
    long left = __atomic_exchange_n(&alloc_left, -1, __ATOMIC_SEQ_CST);
    return left == 0 || left == -2;
}

/* ---- each test's world ------------------------------------------------------- */

/* The allocators above, installed before anything of OpenSSL's or
 * libcurl's is allocated: by the first test to run (every test comes
 * here first); 0, or -1 with a failed check. */
static int install_allocators(void)
{
    static int installed; /* 1: installed; -1: refused */
    if (!installed) {
        int ssl = CRYPTO_set_mem_functions(o_malloc, o_realloc, o_free) == 1;
        CHECK(ssl, "OpenSSL's allocator");
        int curl = ssl && curl_global_init_mem(CURL_GLOBAL_DEFAULT, t_malloc, free, t_realloc,
                                               t_strdup, t_calloc) == CURLE_OK;
        CHECK(!ssl || curl, "libcurl's allocator");
        installed = curl ? 1 : -1;
    }
    return installed == 1 ? 0 : -1;
}

/* A server of this test's own on 127.0.0.1 and the environment pointing
 * the S3 backend at it; 0, or -1 with nothing left running. */
static int server_start(void)
{
    srv.stop = 0;
    srv.requests = 0;
    srv.signed_fully = 0;
    srv.line[0] = srv.md5[0] = 0;
    srv.body = NULL;
    srv.body_len = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    srv.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (srv.listen_fd < 0)
        return -1;
    if (bind(srv.listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(srv.listen_fd, 16) != 0 ||
        getsockname(srv.listen_fd, (struct sockaddr *)&a, &al) != 0 ||
        pthread_create(&srv.thread, NULL, server_main, NULL) != 0) {
        close(srv.listen_fd);
        return -1;
    }
    srv.port = ntohs(a.sin_port);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", srv.port);
    setenv("AWS_ENDPOINT_URL", ep, 1);
    setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", 1);
    setenv("AWS_REGION", "us-east-1", 1);
    setenv("FSDP_S3_MAX_ATTEMPTS", "1", 1);
    unsetenv("AWS_ENDPOINT_URL_S3");
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_PROFILE");
    return 0;
}

static void server_stop(void)
{
    __atomic_store_n(&srv.stop, 1, __ATOMIC_RELEASE);
    int c = socket(AF_INET, SOCK_STREAM, 0); /* wake accept() */
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)srv.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (c >= 0) {
        if (connect(c, (struct sockaddr *)&a, sizeof a))
            fprintf(stderr, "  cannot wake the server\n");
        close(c);
    }
    pthread_join(srv.thread, NULL);
    close(srv.listen_fd);
    free(srv.body);
    srv.body = NULL;
    unsetenv("AWS_ENDPOINT_URL"); /* nothing after this test talks to its port */
}

/* A test that sends nothing: the allocators only. */
static void with_allocators(void (*body)(void))
{
    REQUIRE(install_allocators() == 0, "the allocators that fail on demand");
    body();
}

/* A test that sends requests: the allocators and its own server, stopped
 * after the test however it ended. */
static void with_server(void (*body)(void))
{
    REQUIRE(install_allocators() == 0, "the allocators that fail on demand");
    REQUIRE(server_start() == 0, "the server: %s", strerror(errno));
    body();
    server_stop();
}

static int requests(void)
{
    pthread_mutex_lock(&srv.mu);
    int n = srv.requests;
    pthread_mutex_unlock(&srv.mu);
    return n;
}

/* ---- the tests ------------------------------------------------------------ */

/* key i: len bytes cycling through the characters XML must escape */
static char *hostile_key(int i, size_t len)
{
    static const char ch[] = "&<>\"'";
    char *k = malloc(len + 1);
    if (!k)
        return NULL;
    for (size_t j = 0; j < len; j++)
        k[j] = ch[(i + j) % 5];
    k[len] = 0;
    return k;
}

/* The Key elements of a DeleteObjects body, unescaped, must be exactly
 * prefix/keys[i] in order. */
static int body_names_exactly(const char *body, size_t len, const char *prefix, char *const *keys,
                              int n)
{
    struct s3_xml x;
    if (s3_xml_parse(body, len, &x))
        return fprintf(stderr, "  the body is not XML\n"), 0;
    int k = 0, ok = 1, quiet = 0;
    for (int i = 0; i < x.n; i++) {
        if (strcmp(x.v[i].name, "Quiet") == 0)
            quiet = strcmp(x.v[i].text, "true") == 0;
        if (strcmp(x.v[i].name, "Key") != 0)
            continue;
        char want[2048];
        snprintf(want, sizeof want, "%s%s%s", prefix, *prefix ? "/" : "", k < n ? keys[k] : "");
        if (k >= n || strcmp(x.v[i].text, want) != 0) {
            fprintf(stderr, "  key %d: got '%.60s...'\n", k, x.v[i].text);
            ok = 0;
        }
        k++;
    }
    s3_xml_free(&x);
    if (k != n || !quiet)
        fprintf(stderr, "  %d keys of %d, quiet %d\n", k, n, quiet);
    return ok && k == n && quiet;
}

static void delete_objects_bodies_carry_keys_full_of_xml_specials_body(void)
{
    enum { N = 1000 };
    char *keys[N];
    int built = 0;
    for (int i = 0; i < N; i++)
        built += (keys[i] = hostile_key(i, i % 2 ? 1000 : 37)) != NULL;
    REQUIRE(built == N, "out of memory");
    struct s3_buf b = {0};
    const char *prefix = "runs/a&b<c>";
    REQUIRE(s3_delete_body(prefix, (const char *const *)keys, N, &b) == 0, "the body builder");
    CHECK(body_names_exactly(b.p, b.len, prefix, keys, N), "the keys did not round-trip");
    s3_buf_free(&b);
    REQUIRE(s3_delete_body("", (const char *const *)keys, 3, &b) == 0, "no prefix");
    CHECK(body_names_exactly(b.p, b.len, "", keys, 3), "the keys without a prefix");
    s3_buf_free(&b);
    const char *ctl[] = {"a\001b"};
    CHECK(s3_delete_body("", ctl, 1, &b) == -1 && b.p == NULL,
          "a control character XML cannot carry was accepted");
    for (int i = 0; i < N; i++)
        free(keys[i]);
}

static void delete_objects_bodies_carry_keys_full_of_xml_specials(void)
{
    with_allocators(delete_objects_bodies_carry_keys_full_of_xml_specials_body);
}

static void complete_multipart_bodies_carry_any_etag_body(void)
{
    static char etags[3][128] = {"\"0123456789abcdef0123456789abcdef\"", "\"a&b<c>'d'\"", ""};
    struct s3_buf b = {0};
    REQUIRE(s3_complete_body((const char(*)[128])etags, 3, &b) == 0, "the body builder");
    struct s3_xml x;
    REQUIRE(s3_xml_parse(b.p, b.len, &x) == 0, "not XML: %s", b.p);
    int tags = 0, parts = 0;
    for (int i = 0; i < x.n; i++) {
        if (strcmp(x.v[i].name, "ETag") == 0) {
            CHECK(tags < 3 && strcmp(x.v[i].text, etags[tags]) == 0, "etag %d: %s", tags,
                  x.v[i].text);
            tags++;
        } else if (strcmp(x.v[i].name, "PartNumber") == 0) {
            CHECK(atoi(x.v[i].text) == ++parts, "part number %s", x.v[i].text);
        }
    }
    CHECK(tags == 3 && parts == 3, "%d etags, %d parts", tags, parts);
    s3_xml_free(&x);
    s3_buf_free(&b);
}

static void complete_multipart_bodies_carry_any_etag(void)
{
    with_allocators(complete_multipart_bodies_carry_any_etag_body);
}

static void delete_many_sends_hostile_keys_byte_exact_with_their_md5_body(void)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    REQUIRE(storage_open("s3://bucket/pre&fix", &st, err) == 0, "%s", err);
    enum { N = 10 };
    char *keys[N];
    for (int i = 0; i < N; i++)
        keys[i] = hostile_key(i, 400);
    int before = requests();
    CHECK(storage_delete_many(st, (const char *const *)keys, N, err) == 0, "%s", err);
    CHECK(requests() == before + 1, "%d requests", requests() - before);
    pthread_mutex_lock(&srv.mu);
    CHECK(strncmp(srv.line, "POST /bucket?delete", 19) == 0, "request line: %s", srv.line);
    CHECK(srv.body && body_names_exactly(srv.body, srv.body_len, "pre&fix", keys, N),
          "what was sent");
    unsigned char md5[16];
    unsigned int ml = 0;
    char b64[32] = "";
    if (srv.body && EVP_Digest(srv.body, srv.body_len, md5, &ml, EVP_md5(), NULL))
        EVP_EncodeBlock((unsigned char *)b64, md5, 16);
    CHECK(strcmp(srv.md5, b64) == 0, "Content-MD5 '%s' is not that of the body ('%s')", srv.md5,
          b64);
    pthread_mutex_unlock(&srv.mu);
    for (int i = 0; i < N; i++)
        free(keys[i]);
    storage_close(st);
}

static void delete_many_sends_hostile_keys_byte_exact_with_their_md5(void)
{
    with_server(delete_many_sends_hostile_keys_byte_exact_with_their_md5_body);
}

static void bucket_prefixes_with_dot_segments_are_refused_naming_the_uri_body(void)
{
    const char *bad[] = {
        "s3://bucket/../x", "s3://bucket/a/../../x", "s3://bucket/./x", "s3://bucket/a/.",
        "s3://bucket//x",   "s3://bucket/a//b",      "s3://../x",       "s3://.../x",
        "s3://a..b/x",      "s3://.bucket/x",        "s3://bucket-/x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[FSDP_ERR_LEN] = "";
        struct storage *st = NULL;
        int before = requests();
        CHECK(storage_open(bad[i], &st, err) == FSDP_ERROR && strstr(err, bad[i]) &&
                  requests() == before,
              "%s: %s", bad[i], err);
        if (st)
            storage_close(st);
    }
    char err[FSDP_ERR_LEN];
    struct storage *st = NULL;
    CHECK(storage_open("s3://bucket/../x", &st, err) != 0 && strstr(err, "'..' part"), "%s", err);
    if (st)
        storage_close(st);
    REQUIRE(storage_open("s3://my.bucket/a/b/", &st, err) == 0, "a good URI: %s", err);
    CHECK(strcmp(st->uri, "s3://my.bucket/a/b") == 0, "uri %s", st->uri);
    storage_close(st);
}

static void bucket_prefixes_with_dot_segments_are_refused_naming_the_uri(void)
{
    with_server(bucket_prefixes_with_dot_segments_are_refused_naming_the_uri_body);
}

static void keys_with_dot_segments_are_refused_before_any_request_body(void)
{
    char err[FSDP_ERR_LEN], buf[4];
    struct storage *st;
    REQUIRE(storage_open("s3://bucket/p", &st, err) == 0, "%s", err);
    const char *bad[] = {"../x", "a/../../x", "a/./b", "./a", "a/..",
                         "a//b", "/a",        "a/",    "",    "a\nb"};
    int before = requests();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *k = bad[i];
        uint64_t size;
        struct storage_writer *w = NULL;
#define REFUSED(call) (err[0] = 0, (call) == FSDP_ERROR && strstr(err, "invalid key"))
        CHECK(REFUSED(storage_stat(st, k, &size, err)), "stat '%s': %s", k, err);
        CHECK(REFUSED(storage_get_range(st, k, 0, 4, buf, err)), "get '%s': %s", k, err);
        CHECK(REFUSED(storage_get_range(st, k, 0, 0, buf, err)), "empty get '%s': %s", k, err);
        CHECK(REFUSED(storage_put_begin(st, k, &w, err)) && !w, "put '%s': %s", k, err);
        CHECK(REFUSED(storage_put_if_absent(st, k, "x", 1, err)), "pia '%s': %s", k, err);
        CHECK(REFUSED(storage_delete(st, k, err)), "delete '%s': %s", k, err);
        const char *two[] = {"fine", k};
        CHECK(REFUSED(storage_delete_many(st, two, 2, err)), "delete_many '%s': %s", k, err);
#undef REFUSED
    }
    int n = 0;
    CHECK(storage_list(st, "../", NULL, &n, err) == FSDP_ERROR && strstr(err, "'../'"),
          "list ../: %s", err);
    CHECK(requests() == before, "%d requests were sent", requests() - before);
    storage_close(st);
}

static void keys_with_dot_segments_are_refused_before_any_request(void)
{
    with_server(keys_with_dot_segments_are_refused_before_any_request_body);
}

static void paths_are_sent_exactly_as_signed_body(void)
{
    char err[FSDP_ERR_LEN];
    struct s3_client c;
    REQUIRE(s3_client_init(&c, err) == 0, "%s", err);
    /* the backend never makes such a key; curl must still not rewrite one */
    struct s3_request r = {.method = "GET", .bucket = "bucket", .key = "a/./../b", .query = ""};
    CHECK(s3_perform(&c, &r, "GetObject", err) == 0 && r.status == 200, "%s", err);
    pthread_mutex_lock(&srv.mu);
    CHECK(strcmp(srv.line, "GET /bucket/a/./../b HTTP/1.1") == 0, "sent: %s", srv.line);
    pthread_mutex_unlock(&srv.mu);
    s3_buf_free(&r.resp);
    s3_client_free(&c);
}

static void paths_are_sent_exactly_as_signed(void)
{
    with_server(paths_are_sent_exactly_as_signed_body);
}

static struct sigv4_output sig_out;

static struct sigv4_input example_request(void)
{
    static const struct sigv4_kv h[] = {{"host", "examplebucket.s3.amazonaws.com"},
                                        {"range", "bytes=0-9"}};
    return (struct sigv4_input){"GET",
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
}

static void sign_once(void *arg)
{
    struct sigv4_input in = example_request();
    *(int *)arg = sigv4_sign(&in, &sig_out);
}

static void openssl_allocation_failures_never_give_a_wrong_signature_body(void)
{
    int rc;
    sign_once(&rc);
    REQUIRE(rc == 0, "signing without failures");
    char want[sizeof sig_out.authorization];
    snprintf(want, sizeof want, "%s", sig_out.authorization);
    /* the S3 API reference's GET Object example */
    CHECK(
        strstr(want, "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
        "%s", want);
    int failures = 0;
    for (int sticky = 0; sticky < 2; sticky++)
        for (long n = 0; n < 10000; n++) {
            memset(&sig_out, 0x5a, sizeof sig_out); /* what a skipped step would leave */
            int failed = with_failures(n, sticky, sign_once, &rc);
            failures += rc != 0;
            CHECK(rc != 0 || strcmp(sig_out.authorization, want) == 0,
                  "allocation %ld failing (sticky %d): success with another signature", n, sticky);
            if (!failed)
                break;
        }
    CHECK(failures > 0, "no allocation failure was ever reported");
}

static void openssl_allocation_failures_never_give_a_wrong_signature(void)
{
    with_allocators(openssl_allocation_failures_never_give_a_wrong_signature_body);
}

struct request_run {
    struct s3_client *c;
    int rc;
    long status;
    char err[FSDP_ERR_LEN];
};

static void get_once(void *arg)
{
    struct request_run *run = arg;
    struct s3_request r = {.method = "GET", .bucket = "bucket", .key = "step-1/x", .query = ""};
    run->err[0] = 0;
    run->rc = s3_perform(run->c, &r, "GetObject", run->err);
    run->status = r.status;
    s3_buf_free(&r.resp);
}

static void curl_allocation_failures_are_errors_never_half_signed_requests_body(void)
{
    char err[FSDP_ERR_LEN];
    struct s3_client c;
    REQUIRE(s3_client_init(&c, err) == 0, "%s", err);
    struct request_run run = {.c = &c};
    int errors = 0;
    for (int sticky = 0; sticky < 2; sticky++)
        for (long n = 0; n < 100000; n++) {
            int before = requests();
            int failed = with_failures(n, sticky, get_once, &run);
            pthread_mutex_lock(&srv.mu);
            int sent = srv.requests != before, full = srv.signed_fully;
            pthread_mutex_unlock(&srv.mu);
            errors += run.rc != 0;
            CHECK(run.rc != 0 || (run.status == 200 && sent && full),
                  "allocation %ld failing (sticky %d): success, status %ld, sent %d, every "
                  "header %d",
                  n, sticky, run.status, sent, full);
            CHECK(!sent || full,
                  "allocation %ld failing (sticky %d): a request went out half signed", n, sticky);
            CHECK(run.rc == 0 || run.err[0],
                  "allocation %ld failing (sticky %d): a failure without a message", n, sticky);
            if (!failed)
                break;
        }
    CHECK(errors > 0, "no allocation failure was ever reported");
    s3_client_free(&c);
}

static void curl_allocation_failures_are_errors_never_half_signed_requests(void)
{
    with_server(curl_allocation_failures_are_errors_never_half_signed_requests_body);
}

struct burst {
    struct s3_client *c;
    int ok;
};

static void *get_many(void *arg)
{
    struct burst *b = arg;
    char err[FSDP_ERR_LEN];
    for (int i = 0; i < 25; i++) {
        struct s3_request r = {.method = "GET", .bucket = "bucket", .key = "step-1/x", .query = ""};
        b->ok += s3_perform(b->c, &r, "GetObject", err) == 0 && r.status == 200;
        s3_buf_free(&r.resp);
    }
    return NULL;
}

/* Loads read a store from several threads (storage_ops.concurrent_reads):
 * each request takes a curl handle of its own and gives it back. */
static void requests_from_four_threads_at_once_each_get_their_answer_body(void)
{
    char err[FSDP_ERR_LEN];
    struct s3_client c;
    REQUIRE(s3_client_init(&c, err) == 0, "%s", err);
    int before = requests();
    struct burst b[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        b[i] = (struct burst){&c, 0};
        REQUIRE(pthread_create(&th[i], NULL, get_many, &b[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(b[i].ok == 25, "thread %d: %d of 25 requests answered", i, b[i].ok);
    }
    CHECK(requests() - before == 100, "the server saw %d requests, not 100", requests() - before);
    CHECK(c.nidle >= 1 && c.nidle <= 4, "%d idle handles kept after 4 threads", c.nidle);
    s3_client_free(&c);
}

static void requests_from_four_threads_at_once_each_get_their_answer(void)
{
    with_server(requests_from_four_threads_at_once_each_get_their_answer_body);
}

static void appends_refuse_to_pass_the_limit_body(void)
{
    struct s3_buf b = {.limit = 16};
    CHECK(s3_buf_append_str(&b, "0123456789") == 0 && b.len == 10, "first append");
    CHECK(s3_buf_append_str(&b, "0123456789") == -1 && b.len == 10 && strlen(b.p) == 10,
          "an append past the limit changed the buffer");
    CHECK(s3_buf_append(&b, "x", SIZE_MAX) == -1 && b.len == 10, "a size that overflows");
    CHECK(s3_buf_append_xml_text(&b, "&&") == -1 && b.len == 10, "escaped text past the limit");
    s3_buf_free(&b);
}

static void appends_refuse_to_pass_the_limit(void)
{
    with_allocators(appends_refuse_to_pass_the_limit_body);
}

/* Answers are parsed within bounds: the item array grows geometrically
 * (20,000 nested elements took 100 s on the sanitizer build when it grew
 * by one), and a document past S3_XML_MAX_ITEMS or S3_XML_MAX_DEPTH is
 * refused as such (-2), not taken in. */
static void xml_answers_are_parsed_within_bounds(void)
{
    struct s3_buf b = {.limit = (size_t)16 << 20};
    struct s3_xml x;
    for (int n = S3_XML_MAX_ITEMS - 1; n <= S3_XML_MAX_ITEMS; n++) { /* the root is one */
        b.len = 0;
        REQUIRE(s3_buf_append_str(&b, "<r>") == 0, "append");
        for (int i = 0; i < n; i++)
            REQUIRE(s3_buf_append_str(&b, "<a/>") == 0, "append");
        REQUIRE(s3_buf_append_str(&b, "</r>") == 0, "append");
        int rc = s3_xml_parse(b.p, b.len, &x);
        CHECK(rc == (n < S3_XML_MAX_ITEMS ? 0 : -2), "%d elements: %d", n + 1, rc);
        CHECK(rc || (x.n == n + 1 && x.cap >= x.n), "%d items kept of %d", x.n, n + 1);
        if (!rc)
            s3_xml_free(&x);
    }
    for (int depth = S3_XML_MAX_DEPTH; depth <= 20000; depth += 20000 - S3_XML_MAX_DEPTH) {
        b.len = 0;
        for (int i = 0; i < depth; i++)
            REQUIRE(s3_buf_append_str(&b, "<a>") == 0, "append");
        for (int i = 0; i < depth; i++)
            REQUIRE(s3_buf_append_str(&b, "</a>") == 0, "append");
        int rc = s3_xml_parse(b.p, b.len, &x);
        CHECK(rc == (depth <= S3_XML_MAX_DEPTH ? 0 : -2), "%d deep: %d", depth, rc);
        if (!rc)
            s3_xml_free(&x);
    }
    CHECK(s3_xml_parse("<a>", 3, &x) == -1 && x.n == 0 && !x.v, "unclosed");
    s3_buf_free(&b);
}

/* Printed URLs never carry a password, however it is written. */
static void urls_are_printed_without_user_information(void)
{
    const char *cases[][2] = {
        {"http://user:pass@127.0.0.1:9000/x", "http://***@127.0.0.1:9000/x"},
        {"https://u:p/a#b@host", "https://***@host"}, /* '/' and '#' unencoded */
        {"http://a@b@host/p", "http://***@host/p"},
        {"http://127.0.0.1:9000/path", "http://127.0.0.1:9000/path"},
        {"not a url @ all", "not a url @ all"},
        {"", ""},
    };
    char out[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(strcmp(fsdp_url_redact(cases[i][0], out, sizeof out), cases[i][1]) == 0,
              "'%s' printed as '%s'", cases[i][0], out);
    CHECK(strcmp(fsdp_url_redact(NULL, out, sizeof out), "") == 0, "NULL");
    CHECK(strlen(fsdp_url_redact("http://h/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                 "aaaaaaaaaaaaaaaaaa",
                                 out, 16)) == 15,
          "cut to the buffer");
}

CHECK_MAIN(TEST(delete_objects_bodies_carry_keys_full_of_xml_specials),
           TEST(complete_multipart_bodies_carry_any_etag),
           TEST(delete_many_sends_hostile_keys_byte_exact_with_their_md5),
           TEST(bucket_prefixes_with_dot_segments_are_refused_naming_the_uri),
           TEST(keys_with_dot_segments_are_refused_before_any_request),
           TEST(paths_are_sent_exactly_as_signed),
           TEST(openssl_allocation_failures_never_give_a_wrong_signature),
           TEST(curl_allocation_failures_are_errors_never_half_signed_requests),
           TEST(requests_from_four_threads_at_once_each_get_their_answer),
           TEST(appends_refuse_to_pass_the_limit), TEST(xml_answers_are_parsed_within_bounds),
           TEST(urls_are_printed_without_user_information))
