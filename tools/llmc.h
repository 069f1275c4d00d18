/*
 * llmc.h - a checkpoint as llm.c's model file (gpt2_124M.bin and the files
 * train_gpt2.c / train_gpt2.cu write and read), and back.
 *
 * The file: 256 little-endian int32 (magic 20240326, version 3 for fp32 or
 * 5 for bf16, maxT, V, L, NH, C, Vp; the rest zero), then the parameters
 * back to back in llm.c's order, each group over all layers: wte (Vp, C),
 * wpe (maxT, C), ln1w, ln1b, qkvw (L, 3C, C), qkvb, attprojw (L, C, C),
 * attprojb, ln2w, ln2b, fcw (L, 4C, C), fcb, fcprojw (L, C, 4C), fcprojb,
 * lnfw, lnfb. Matrices are (out, in), as this trainer's: nothing is
 * transposed; wte keeps its padded rows.
 */
#ifndef FSDP_LLMC_H
#define FSDP_LLMC_H

#include "ckpt.h"
#include "model.h"

/* bf16: version 5 (rounded to nearest even), else version 3 (fp32).
 * Written to a temporary name, fsynced, renamed. */
int llmc_export(struct ckpt_reader *r, const char *path, int bf16, int replace, char *err);

/* The model of an llm.c file's header (checked: magic, version, sizes, the
 * file's length). */
int llmc_read_config(const char *path, struct model_config *cfg, char *err);

/* The file's parameters to out_fd as a safetensors file in this trainer's
 * layout (import's input): F32, wte's rows beyond the file's zero. */
int llmc_to_native(const char *path, const struct model_layout *m, int out_fd, char *err);

#endif
