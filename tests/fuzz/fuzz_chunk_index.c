/*
 * fuzz_chunk_index.c - bytes into ckpt_index_decode, the reader of the
 * chunk index at the end of every format-2 shard.
 *
 * Input: the shard entry's numbers the decoder checks against (u64 raw
 * size, u64 index offset, u64 chunk bytes, little-endian), then the index
 * bytes. The chunk count is taken from the index's own header, so that
 * mutations reach the entries. An accepted table must be what every reader
 * indexes without further checks: contiguous, within the shard's raw and
 * stored bytes, each chunk the manifest's chunk size (the last shorter),
 * every codec known.
 */
#include "fuzz_common.h"

#include "ckpt.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    return 0;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 24)
        return 0;
    struct ckpt_shard s = {.file = "shard-00000-of-00001"};
    s.raw_size = le64(data) >> 1;
    s.index_off = le64(data + 8) >> 1;
    uint64_t chunk_bytes = le64(data + 16) % CKPT_MAX_CHUNK_BYTES + 1;
    const uint8_t *index = data + 24;
    size_t len = size - 24;
    if (len >= CKPT_INDEX_HEADER)
        s.nchunks = (int)((uint32_t)index[12] | (uint32_t)index[13] << 8 |
                          (uint32_t)index[14] << 16 | (uint32_t)(index[15] & 0x7f) << 24);
    struct ckpt_chunk *t = NULL;
    char err[FSDP_ERR_LEN];
    err[0] = 0;
    if (ckpt_index_decode(index, len, &s, chunk_bytes, &t, err) == 0) {
        uint64_t raw = 0, stored = 0;
        for (int i = 0; i < s.nchunks; i++) {
            FUZZ_CHECK(t[i].raw_off == raw && t[i].stored_off == stored);
            FUZZ_CHECK(t[i].raw_len > 0 && t[i].raw_len <= chunk_bytes);
            FUZZ_CHECK(t[i].raw_len == chunk_bytes || i == s.nchunks - 1);
            FUZZ_CHECK(t[i].codec >= CKPT_CODEC_RAW && t[i].codec <= CKPT_CODEC_ZSTD_SHUFFLE4);
            FUZZ_CHECK(t[i].stored_len > 0 && t[i].stored_len <= 2ULL * CKPT_MAX_CHUNK_BYTES);
            raw += t[i].raw_len;
            stored += t[i].stored_len;
        }
        FUZZ_CHECK(raw == s.raw_size && stored == s.index_off);
        free(t);
    } else {
        FUZZ_CHECK(t == NULL && err[0] != 0 && strchr(err, '\n') == NULL);
    }
    return 0;
}
