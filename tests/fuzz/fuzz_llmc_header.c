/*
 * fuzz_llmc_header.c - what `fsdp-ckpt import --layout llmc` reads: llm.c's
 * model file, its 256-int header (magic, version, maxT, V, L, NH, C, Vp)
 * checked against the file's length, then the tensors in llm.c's order
 * converted into this trainer's layout.
 *
 * The input is the whole file, written to a memfd read through its
 * /proc/self/fd path (a regular file, as the importer demands). An accepted
 * header must give a configuration that passes model_config_check and lays
 * out, and the file must then import (its length is what the header
 * describes); every refusal leaves a message. Nothing may crash, leak or
 * read out of bounds.
 */
#include "fuzz_common.h"
#include "llmc.h"
#include "model.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int in_fd = -1, out_fd = -1;
static char in_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    in_fd = fuzz_memfd("model.bin");
    out_fd = fuzz_memfd("native.safetensors");
    snprintf(in_path, sizeof in_path, "/proc/self/fd/%d", in_fd);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_memfd_fill(in_fd, data, size, size);
    struct model_config cfg;
    char err[FSDP_ERR_LEN];
    err[0] = 0;
    if (llmc_read_config(in_path, &cfg, err) != 0) {
        FUZZ_CHECK(err[0] != 0 && memchr(err, 0, sizeof err) != NULL);
        return 0;
    }
    FUZZ_CHECK(model_config_check(&cfg, err) == 0);
    struct model_layout m;
    if (model_layout_init(&m, &cfg, err) != 0) {
        FUZZ_CHECK(err[0] != 0);
        return 0;
    }
    if (ftruncate(out_fd, 0) || lseek(out_fd, 0, SEEK_SET))
        abort();
    err[0] = 0;
    int rc = llmc_to_native(in_path, &m, out_fd, err);
    FUZZ_CHECK(rc == 0); /* a header that fits the length imports */
    model_layout_free(&m);
    return 0;
}
