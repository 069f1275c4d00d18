/*
 * data_h5.c - token datasets in HDF5 files (issue 36): reading one into a
 * token_file, writing one (fsdp-data prepare --format hdf5).
 *
 * A token dataset is a 1-D integer dataset (any integer type HDF5 knows,
 * chunked and compressed or not) whose name --h5-dataset gives ("tokens"
 * by default). It is read in blocks, every token checked against the
 * vocabulary, into memory of the narrowest width that holds the
 * vocabulary (uint16 up to 65,536 tokens, else uint32): a chunked or
 * compressed dataset cannot be mapped as a token file is, so each rank
 * holds its own copy (2 or 4 bytes a token). From there the sample stream
 * is the same as a token file's: the same seeded order, the same cursor.
 *
 * The file is opened as token files are (fsdp_open_regular: a FIFO or a
 * device never hangs the trainer), and HDF5 then opens that descriptor
 * through /proc/self/fd, so the file it parses is the one that was checked.
 * HDF5's own error stack is silenced: a bad file is one line naming the
 * file, the dataset and what is wrong with it.
 */
#include "data.h"

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FSDP_HAVE_HDF5
#include <hdf5.h>

#define BLOCK ((hsize_t)1 << 20) /* tokens read at a time */

int token_file_is_hdf5(const unsigned char *head, size_t n)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    return n >= sizeof sig && memcmp(head, sig, sizeof sig) == 0;
}

/* Reads [0, n) of the 1-D dataset d, checked against vocab, into f. */
static int read_tokens(struct token_file *f, hid_t d, hsize_t n, int vocab, const char *path,
                       const char *name, char *err)
{
    const int width = vocab > 65536 ? 4 : 2;
    void *tokens = malloc(n ? (size_t)n * (size_t)width : 1);
    int64_t *block = malloc((size_t)(n < BLOCK ? (n ? n : 1) : BLOCK) * sizeof *block);
    hid_t file_space = H5Dget_space(d);
    int rc = !tokens || !block
                 ? fsdp_err(err, "%s: out of memory for %llu tokens", path, (unsigned long long)n)
             : file_space < 0
                 ? fsdp_err(err, "%s: dataset '%s': its extent cannot be read", path, name)
                 : 0;
    for (hsize_t at = 0; !rc && at < n; at += BLOCK) {
        hsize_t count = n - at < BLOCK ? n - at : BLOCK;
        hid_t mem = H5Screate_simple(1, &count, NULL);
        if (mem < 0 ||
            H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &at, NULL, &count, NULL) < 0 ||
            H5Dread(d, H5T_NATIVE_INT64, mem, file_space, H5P_DEFAULT, block) < 0)
            rc = fsdp_err(err,
                          "%s: dataset '%s': tokens %llu..%llu cannot be read (a damaged "
                          "chunk, or a filter this HDF5 lacks)",
                          path, name, (unsigned long long)at, (unsigned long long)(at + count));
        if (mem >= 0)
            H5Sclose(mem);
        for (hsize_t i = 0; !rc && i < count; i++) {
            int64_t t = block[i];
            if (t < 0 || t >= vocab)
                rc =
                    fsdp_err(err,
                             "%s: dataset '%s': token %lld at index %llu is outside the model's "
                             "vocabulary of %d (use --vocab or a model whose vocabulary covers it)",
                             path, name, (long long)t, (unsigned long long)(at + i), vocab);
            else if (width == 4)
                ((uint32_t *)tokens)[at + i] = (uint32_t)t;
            else
                ((uint16_t *)tokens)[at + i] = (uint16_t)t;
        }
    }
    if (file_space >= 0)
        H5Sclose(file_space);
    free(block);
    if (rc) {
        free(tokens);
        return -1;
    }
    f->tokens = tokens;
    f->width = width;
    f->ntokens = (size_t)n;
    f->map = tokens; /* what the data's identity digests (train_ckpt.c): the tokens */
    f->map_len = (size_t)n * (size_t)width;
    f->heap = 1;
    return 0;
}

int token_file_open_hdf5(struct token_file *f, int fd, const char *path, const char *dataset,
                         int vocab, char *err)
{
    const char *name = dataset && *dataset ? dataset : DATA_H5_DATASET;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char via[64];
    snprintf(via, sizeof via, "/proc/self/fd/%d", fd);
    hid_t file = H5Fopen(via, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0)
        return fsdp_err(err, "%s: not a readable HDF5 file", path);
    int rc = 0;
    hid_t d = -1, type = -1, space = -1;
    htri_t there = H5Lexists(file, name, H5P_DEFAULT);
    if (there <= 0 || (d = H5Dopen2(file, name, H5P_DEFAULT)) < 0)
        rc = fsdp_err(err, "%s: no dataset '%s' (--h5-dataset names it)", path, name);
    if (!rc && ((type = H5Dget_type(d)) < 0 || H5Tget_class(type) != H5T_INTEGER))
        rc = fsdp_err(err, "%s: dataset '%s' does not hold integers (tokens are integers)", path,
                      name);
    int rank = 0;
    hsize_t n = 0;
    if (!rc && ((space = H5Dget_space(d)) < 0 || (rank = H5Sget_simple_extent_ndims(space)) != 1))
        rc = fsdp_err(err, "%s: dataset '%s' has %d dimensions; a token dataset has one", path,
                      name, rank);
    if (!rc && H5Sget_simple_extent_dims(space, &n, NULL) != 1)
        rc = fsdp_err(err, "%s: dataset '%s': its length cannot be read", path, name);
    if (!rc && n > (hsize_t)INT32_MAX * 64)
        rc = fsdp_err(err, "%s: dataset '%s' holds %llu tokens, more than this reader takes", path,
                      name, (unsigned long long)n);
    if (!rc)
        rc = read_tokens(f, d, n, vocab, path, name, err);
    if (space >= 0)
        H5Sclose(space);
    if (type >= 0)
        H5Tclose(type);
    if (d >= 0)
        H5Dclose(d);
    H5Fclose(file);
    return rc;
}

int token_file_write_hdf5(const char *path, const char *dataset, const uint16_t *tokens, size_t n,
                          int width, char *err)
{
    const char *name = dataset && *dataset ? dataset : DATA_H5_DATASET;
    struct fsdp_outfile o; /* the temporary, the checks, the rename (util.h) */
    if (fsdp_outfile_open(&o, path, 1, err))
        return -1;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t file = H5Fcreate(o.tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
        fsdp_outfile_close(&o, 0, err);
        return fsdp_err(err, "%s: cannot create an HDF5 file", o.tmp);
    }
    hsize_t len = n, chunk = n < BLOCK ? (n ? n : 1) : BLOCK;
    hid_t space = H5Screate_simple(1, &len, NULL), plist = H5Pcreate(H5P_DATASET_CREATE), d = -1;
    int rc = space < 0 || plist < 0 || H5Pset_chunk(plist, 1, &chunk) < 0 ||
                     (d = H5Dcreate2(file, name, width == 4 ? H5T_STD_U32LE : H5T_STD_U16LE, space,
                                     H5P_DEFAULT, plist, H5P_DEFAULT)) < 0
                 ? fsdp_err(err, "%s: cannot create dataset '%s'", path, name)
                 : 0;
    /* written from uint16 (the bytes' tokens); HDF5 widens to uint32 */
    if (!rc && n && H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens) < 0)
        rc = fsdp_err(err, "%s: cannot write dataset '%s'", path, name);
    if (d >= 0)
        H5Dclose(d);
    if (plist >= 0)
        H5Pclose(plist);
    if (space >= 0)
        H5Sclose(space);
    if (H5Fclose(file) < 0 && !rc)
        rc = fsdp_err(err, "%s: cannot finish the HDF5 file", o.tmp);
    /* HDF5 wrote the inode through a descriptor of its own; o's fsync
     * reaches the same file */
    return fsdp_outfile_close(&o, !rc, err) || rc ? -1 : 0;
}

#else

int token_file_is_hdf5(const unsigned char *head, size_t n)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    return n >= sizeof sig && memcmp(head, sig, sizeof sig) == 0;
}

int token_file_open_hdf5(struct token_file *f, int fd, const char *path, const char *dataset,
                         int vocab, char *err)
{
    (void)f, (void)fd, (void)dataset, (void)vocab;
    return fsdp_err(err,
                    "%s: an HDF5 file, and this build has no HDF5 (install libhdf5-dev "
                    "and build again)",
                    path);
}

int token_file_write_hdf5(const char *path, const char *dataset, const uint16_t *tokens, size_t n,
                          int width, char *err)
{
    (void)dataset, (void)tokens, (void)n, (void)width;
    return fsdp_err(err, "%s: this build has no HDF5 (install libhdf5-dev and build again)", path);
}

#endif
