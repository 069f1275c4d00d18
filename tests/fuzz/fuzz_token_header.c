/*
 * fuzz_token_header.c - the token-file reader of the trainer and fsdp-data
 * (token_file_open, src/data.c) on any bytes, through its public API only:
 * the input is the whole file, held in a memfd and opened by its path
 * /proc/self/fd/N, as the trainer opens --data.
 *
 * An accepted file must be exactly what the reader promises (header, exact
 * length for its token width, uint16 or uint32, every token below the
 * vocabulary), and the sample stream built on
 * it must stay inside the mapping.
 */
#include "data.h"
#include "fuzz_common.h"
#include "util.h"

static int fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    fd = fuzz_memfd("fuzz.tokens");
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return 0;
}

static void use(const struct token_file *f, size_t size, int vocab)
{
    FUZZ_CHECK(f->width == 2 || f->width == 4);
    FUZZ_CHECK(size == DATA_HEADER_INTS * 4 + f->ntokens * (size_t)f->width);
    for (size_t i = 0; i < f->ntokens; i++)
        FUZZ_CHECK(token_file_at(f, i) < (uint32_t)vocab);
    /* a short context, so that small files hold samples */
    struct sample_stream s;
    char err[FSDP_ERR_LEN];
    if (sample_stream_init(&s, f, 4, 1, err) != 0)
        return;
    int32_t in[4], tg[4];
    uint64_t first = sample_stream_index(&s, 0), last = sample_stream_index(&s, s.nsamples - 1);
    uint64_t next = sample_stream_index(&s, s.nsamples); /* the next epoch's first */
    FUZZ_CHECK(first < s.nsamples && last < s.nsamples && next < s.nsamples);
    FUZZ_CHECK(sample_stream_fetch(&s, first, in, tg, err) == 0 &&
               sample_stream_fetch(&s, last, in, tg, err) == 0);
    sample_stream_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_memfd_fill(fd, data, size, size);
    static const int vocabs[] = {256, 50257, 128256};
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        struct token_file f;
        char err[FSDP_ERR_LEN];
        err[0] = 0;
        if (token_file_open(&f, path, vocabs[v], err) == 0) {
            use(&f, size, vocabs[v]);
            token_file_close(&f);
        } else {
            FUZZ_CHECK(err[0] != 0 && memchr(err, 0, sizeof err) != NULL);
            FUZZ_CHECK(strchr(err, '\n') == NULL);
        }
    }
    return 0;
}
