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
int st_export(struct ckpt_reader *r, const char *path, int all, char *err);

/* A new committed checkpoint (step 0, fresh optimizer state) for world
 * ranks from a safetensors file whose tensors must match the layout; every
 * mismatch is printed to stderr as its own line before failing. */
int st_import(const char *path, const struct model_layout *m, const char *model_name,
              struct storage *dst, int world, const struct ckpt_write_opts *o, char *err);

/* import's header check on its own (tests, tests/fuzz): fd holds a
 * safetensors file of fsize bytes (path names it in messages); fills
 * offsets[m->ntensors] with each model tensor's absolute file offset. Every
 * problem is printed to stderr as its own line; -1 with err if any. */
int st_read_header(const char *path, int fd, uint64_t fsize, const struct model_layout *m,
                   const char *model_name, uint64_t *offsets, char *err);

#endif
