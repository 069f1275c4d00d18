/*
 * fuzz_manifest_sealed.c - JSON text, sealed the way a manifest is, into
 * ckpt_manifest_parse.
 *
 * A manifest carries "digest": the SHA-256 (lowercase hex) of the canonical
 * dump of the whole object without its "digest" member - jansson's compact
 * form with keys sorted and reals at 17 significant digits (canonical_digest
 * in ckpt/manifest.c). A mutated manifest almost never matches its own
 * digest, and the parser stops there. This target computes the digest of
 * whatever object the input holds, reimplementing that rule here with
 * jansson and OpenSSL (not with the code under test), so that the checks
 * behind the digest - counts, offsets, chunk tables and sections (format
 * 1), the chunk indexes' places (format 2), units against world size,
 * shard names - see every mutation. An accepted manifest
 * must also survive ckpt_manifest_dump and a second parse.
 */
#include "fuzz_manifest.h"

#include <jansson.h>
#include <openssl/evp.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    return 0;
}

/* Sets j's "digest" to the SHA-256 hex of its canonical form; -1 if the
 * object cannot be dumped. */
static int seal(json_t *j)
{
    json_object_del(j, "digest");
    char *doc = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    if (!doc)
        return -1;
    unsigned char sha[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    int ok = EVP_Digest(doc, strlen(doc), sha, &n, EVP_sha256(), NULL) == 1 && n == 32;
    free(doc);
    if (!ok)
        return -1;
    char hex[65];
    for (unsigned int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", sha[i]);
    return json_object_set_new(j, "digest", json_string(hex));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(j) || seal(j) != 0) {
        json_decref(j);
        return 0;
    }
    char *sealed = json_dumps(j, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
    json_decref(j);
    if (!sealed)
        return 0;
    struct ckpt_manifest m;
    char err[FSDP_ERR_LEN];
    err[0] = 0;
    if (ckpt_manifest_parse(sealed, strlen(sealed), &m, err) == 0) {
        fuzz_manifest_accepted(&m);
        ckpt_manifest_free(&m);
    } else {
        fuzz_manifest_refused(err);
        /* whatever stopped it, it was not the seal (the message is
         * compared whole: names from the input are quoted in others) */
        FUZZ_CHECK(strcmp(err, "manifest: its own digest does not match: the manifest is "
                               "damaged") != 0);
    }
    free(sealed);
    return 0;
}
