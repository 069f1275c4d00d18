/*
 * fuzz_manifest_raw.c - raw bytes into ckpt_manifest_parse, the parser of
 * MANIFEST.json, the one file that says how to read every shard.
 *
 * Almost every mutation breaks the manifest's self-digest, so this target
 * mostly exercises the JSON reader and the first checks; fuzz_manifest_sealed
 * reseals its inputs to reach the deep checks.
 */
#include "fuzz_manifest.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ckpt_manifest m;
    char err[FSDP_ERR_LEN];
    err[0] = 0;
    if (ckpt_manifest_parse((const char *)data, size, &m, err) == 0) {
        fuzz_manifest_accepted(&m);
        ckpt_manifest_free(&m);
    } else {
        fuzz_manifest_refused(err);
    }
    return 0;
}
