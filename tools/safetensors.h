/*
 * safetensors.h - export a checkpoint's tensors to the safetensors format
 * and import a safetensors file as a new checkpoint.
 *
 * Format (huggingface/safetensors): an 8-byte little-endian header length
 * N, N bytes of JSON ({"__metadata__": {...}, NAME: {"dtype", "shape",
 * "data_offsets": [begin, end]}, ...}, padded with spaces to a multiple of
 * 8), then the tensors' bytes back to back, little-endian, offsets relative
 * to the end of the header.
 */
#ifndef FSDP_SAFETENSORS_H
#define FSDP_SAFETENSORS_H

#include "ckpt.h"
#include "model.h"

/* Parameters under their own names; with all, also "optim.exp_avg.NAME"
 * and "optim.exp_avg_sq.NAME". Written atomically. */
int st_export(struct ckpt_reader *r, const char *path, int all, int replace, char *err);

/* A new committed checkpoint (step 0, fresh optimizer state) for world
 * ranks from a safetensors file whose tensors must match the layout; every
 * mismatch is printed to stderr as its own line before failing. source is
 * what the manifest records as imported_from (path, or what path was made
 * from). */
int st_import(const char *path, const char *source, const struct model_layout *m,
              const char *model_name, struct storage *dst, int world,
              const struct ckpt_write_opts *o, char *err);

/* The header of a file in this trainer's layout for m (every parameter,
 * F32, in layout order, back to back), written to fd: what import reads
 * after another layout was converted. */
int st_write_native_header(int fd, const struct model_layout *m, char *err);

/* The 8-byte length, the JSON of h and its padding: a header to write. */
char *st_header_bytes(json_t *h, size_t *len);

/* A header, parsed and checked for structure only: every entry well formed
 * (dtype, shape of at most 4 dimensions, data_offsets inside the data), the
 * data exactly the entries back to back. */
struct st_entry {
    const char *name, *dtype; /* point into doc */
    int ndim;
    uint64_t shape[4];
    uint64_t begin, end; /* absolute file offsets */
};
struct st_header {
    json_t *doc;
    struct st_entry *e; /* the well-formed entries, in header order */
    int n;
};
/* -1 with err when the file cannot be a safetensors file at all; else 0,
 * with each malformed entry, gap, overlap or trailing byte printed to
 * stderr as its own line and counted in *problems. */
int st_header_parse(const char *path, int fd, uint64_t fsize, struct st_header *h, int *problems,
                    char *err);
void st_header_free(struct st_header *h);

enum { ST_F32 = 1, ST_BF16 = 2, ST_F16 = 4 };
/* Checks an entry against what a model wants (name for messages, shape,
 * the dtypes allowed); prints a line per problem and returns their number. */
int st_check_entry(const char *path, const struct st_entry *e, const char *want_name, int ndim,
                   const uint64_t *shape, int dtypes, const char *model_name);

/* import's header check on its own (tests, tests/fuzz): fd holds a
 * safetensors file of fsize bytes (path names it in messages); fills
 * offsets[m->ntensors] with each model tensor's absolute file offset. Every
 * problem is printed to stderr as its own line; -1 with err if any. */
int st_read_header(const char *path, int fd, uint64_t fsize, const struct model_layout *m,
                   const char *model_name, uint64_t *offsets, char *err);

#endif
