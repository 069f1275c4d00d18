/*
 * fuzz_safetensors_header.c - the header reader of `fsdp-ckpt import`
 * (st_read_header, tools/safetensors.c) against the `tiny` preset's
 * layout, on a file in memory.
 *
 * The input is the start of the file: the 8-byte header length, the JSON
 * header, and anything after it. The file the reader sees is that, followed
 * by a hole of zeros as long as the tiny model's parameters (4 bytes each),
 * or three times as long when the input names an optimizer tensor
 * ("optim.", what `fsdp-ckpt export --all` adds: parameters and both AdamW
 * moments): a real export of the tiny model cut after its header is
 * therefore a valid input, and a seed, without carrying megabytes of tensor
 * data. The reader never reads tensor
 * bytes; import reads them later through the offsets it returns, so those
 * are checked here.
 */
#include "fuzz_common.h"
#include "model.h"
#include "safetensors.h"

static struct model_layout layout;
static uint64_t *offsets;
static size_t param_bytes;
static int fd = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    struct model_config cfg;
    char err[512];
    if (model_preset("tiny", &cfg) || model_layout_init(&layout, &cfg, err)) {
        fprintf(fuzz_stderr(), "tiny preset: %s\n", err);
        abort();
    }
    offsets = calloc((size_t)layout.ntensors, sizeof *offsets);
    if (!offsets)
        abort();
    param_bytes = layout.numel * 4;
    fd = fuzz_memfd("fuzz.safetensors");
    return 0;
}

static void read_as(const uint8_t *data, size_t size, uint64_t fsize)
{
    fuzz_memfd_fill(fd, data, size, (size_t)fsize);
    memset(offsets, 0xff, (size_t)layout.ntensors * sizeof *offsets);
    char err[FSDP_ERR_LEN];
    err[0] = 0;
    if (st_read_header("fuzz.safetensors", fd, fsize, &layout, "tiny", offsets, err) != 0) {
        FUZZ_CHECK(err[0] != 0 && memchr(err, 0, sizeof err) != NULL);
        return;
    }
    /* accepted: every tensor of the model lies inside the file, after the
     * header, and no two overlap (import preads numel * 4 bytes at each) */
    uint64_t n = 0;
    for (size_t i = 8; i-- > 0;)
        n = n << 8 | (i < size ? data[i] : 0); /* the hole reads as zeros */
    uint64_t total = 0;
    for (int t = 0; t < layout.ntensors; t++) {
        uint64_t bytes = (uint64_t)layout.tensors[t].numel * 4;
        FUZZ_CHECK(offsets[t] >= 8 + n);
        FUZZ_CHECK(offsets[t] <= fsize && bytes <= fsize - offsets[t]);
        for (int u = 0; u < t; u++) {
            uint64_t ub = (uint64_t)layout.tensors[u].numel * 4;
            FUZZ_CHECK(offsets[u] + ub <= offsets[t] || offsets[t] + bytes <= offsets[u]);
        }
        total += bytes;
    }
    FUZZ_CHECK(total <= fsize - 8 - n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int all = memmem(data, size, "\"optim.", 7) != NULL;
    read_as(data, size, (uint64_t)size + (all ? 3 : 1) * (uint64_t)param_bytes);
    return 0;
}
