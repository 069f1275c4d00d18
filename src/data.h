/*
 * data.h - token files (llm.c's format) and the sample stream.
 *
 * A token file is a 256 x int32 little-endian header (header[2] = token
 * count) followed by that many tokens: llm.c's GPT-2 files (magic 20240520,
 * version 1) hold uint16 tokens, its Llama 3 files (magic 20240801,
 * version 7) uint32 tokens, for vocabularies over 65,536.
 * A sample is T+1 consecutive tokens starting at a multiple of T: inputs are
 * the first T, targets the last T. The order of samples is a seeded
 * permutation per epoch of the global sample indices, the same for any world
 * size; the loader's whole state is one cursor (samples consumed so far), so
 * it reshards trivially.
 *
 * The same tokens may come from an HDF5 file instead (data_h5.c): a 1-D
 * integer dataset, read into memory at open.
 */
#ifndef FSDP_DATA_H
#define FSDP_DATA_H

#include <stddef.h>
#include <stdint.h>

#define DATA_MAGIC       20240520 /* uint16 tokens */
#define DATA_VERSION     1
#define DATA_MAGIC_U32   20240801 /* uint32 tokens */
#define DATA_VERSION_U32 7
#define DATA_HEADER_INTS 256
#define DATA_EOT         0        /* byte-level end-of-text token (NUL never occurs in text) */
#define DATA_H5_DATASET  "tokens" /* an HDF5 file's token dataset unless named */

struct token_file {
    const void *tokens; /* ntokens of width bytes each, little-endian */
    int width;          /* 2 (uint16) or 4 (uint32) */
    size_t ntokens;
    void *map; /* the file's bytes (mapped), or heap: the tokens (an HDF5 file's) */
    size_t map_len;
    int heap;
    struct data_remote *remote; /* data in a store (data_store.c): tokens and map NULL */
};

/* Maps and validates a token file: header, exact length, every token below
 * vocab. Errors name the file and the problem. */
int token_file_open(struct token_file *f, const char *path, int vocab, char *err);
/* The same, naming an HDF5 file's dataset (NULL: DATA_H5_DATASET); a token
 * file is told from an HDF5 file by its first bytes. */
int token_file_open_ds(struct token_file *f, const char *path, const char *dataset, int vocab,
                       char *err);
void token_file_close(struct token_file *f);

/* data_store.c. Whether path is a store's URI (s3://, file://): token data
 * read with ranged GETs as training goes, never whole. */
int token_file_is_store(const char *path);
/* Lists the token files of the store whose names start with the URI's last
 * part (every one when it ends in '/'; the one it names exactly), checks
 * each header against its size, and reads the data's identity. Samples are
 * of T + 1 tokens; ahead is how many the read-ahead holds at once. */
int token_file_open_store(struct token_file *f, const char *uri, int vocab, int T, int ahead,
                          char *err);
void token_file_close_store(struct token_file *f);
/* The read-ahead: sample's tokens will be wanted soon (returns at once; a
 * full read-ahead or a store read on one thread ignores it). */
void token_file_prefetch(const struct token_file *f, uint64_t sample);
/* Sample's T + 1 tokens, from the read-ahead (waiting for it) or read now;
 * every token checked against the vocabulary. */
int token_file_sample(const struct token_file *f, uint64_t sample, uint32_t *tok, char *err);
/* At the end: stops the read-ahead, then gives the samples taken from it
 * and read when asked, the seconds token_file_sample took (what the
 * read-ahead did not hide), the store's GETs and bytes. */
void token_file_store_stats(const struct token_file *f, uint64_t *ahead, uint64_t *on_demand,
                            double *wait_s, uint64_t *gets, uint64_t *bytes);
/* The identity's digest (token_file_identity), read at open; *bytes: the
 * objects' bytes. */
const char *token_file_store_identity(const struct token_file *f, uint64_t *bytes);

/* A data file's identity reads its 1 KiB header and TOKEN_ID_BLOCKS blocks
 * of 4 KiB spread evenly over its len bytes (the whole file when smaller):
 * a few hundred KiB whatever the size. Fills the parts' offsets and
 * lengths; returns how many. */
#define TOKEN_ID_BLOCKS 64
int token_file_identity_parts(uint64_t len, uint64_t at[TOKEN_ID_BLOCKS + 1],
                              size_t n[TOKEN_ID_BLOCKS + 1]);

/* Token i of an open file (not of a store's). */
static inline uint32_t token_file_at(const struct token_file *f, size_t i)
{
    return f->width == 4 ? ((const uint32_t *)f->tokens)[i] : ((const uint16_t *)f->tokens)[i];
}

/* Writes tokens to path atomically (temporary file, fsync, rename) as
 * uint16 (width 2) or uint32 (width 4) tokens; path must be absent or a
 * regular file (token_file_check_output). */
int token_file_write(const char *path, const uint16_t *tokens, size_t n, int width, char *err);
/* 0 when path is absent or a regular file; an error naming it when it is
 * anything else (device node, FIFO, directory, symbolic link), which a
 * write would replace. */
int token_file_check_output(const char *path, char *err);

/* data_h5.c. Whether the bytes begin an HDF5 file (its signature at 0). */
int token_file_is_hdf5(const unsigned char *head, size_t n);
/* Reads dataset of the HDF5 file open as fd (regular, checked) into f. */
int token_file_open_hdf5(struct token_file *f, int fd, const char *path, const char *dataset,
                         int vocab, char *err);
/* Writes tokens as an HDF5 file (dataset of uint16 or uint32, chunked), as
 * token_file_write writes a token file: a temporary, renamed into place. */
int token_file_write_hdf5(const char *path, const char *dataset, const uint16_t *tokens, size_t n,
                          int width, char *err);

struct sample_stream {
    const struct token_file *file;
    int T;
    uint64_t nsamples;
    uint64_t seed;
    uint64_t epoch; /* epoch whose permutation is in perm */
    uint64_t *perm;
};

int sample_stream_init(struct sample_stream *s, const struct token_file *f, int T, uint64_t seed,
                       char *err);
void sample_stream_free(struct sample_stream *s);
/* The sample index at global stream position k. */
uint64_t sample_stream_index(struct sample_stream *s, uint64_t k);
/* Copies T inputs and T targets of sample index i as int32. Fails only
 * for data in a store (a read, a token outside the vocabulary). */
int sample_stream_fetch(const struct sample_stream *s, uint64_t i, int32_t *inputs,
                        int32_t *targets, char *err);

#endif
