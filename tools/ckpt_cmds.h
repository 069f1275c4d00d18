/*
 * ckpt_cmds.h - fsdp-ckpt's commands, a function each (ckpt_cmds.c), which
 * fsdp_ckpt.c calls once it has read the command line. An ARG is a URI
 * with an optional @STEP (without it, the newest committed step). Each
 * returns the exit status: 0, or 1 after one line on stderr (a check
 * failed, or the store could not be read or written).
 */
#ifndef FSDP_CKPT_CMDS_H
#define FSDP_CKPT_CMDS_H

#include "ckpt.h"

#include <stdint.h>

enum layout { LAYOUT_NATIVE, LAYOUT_HF, LAYOUT_LLMC }; /* --layout native|hf|llmc */

/* export's flags: --all, --layout, --dtype (hf.h's HF_*), --max-shard-size */
struct export_opts {
    int all, layout, dtype, force;
    uint64_t max_shard;
};

int cmd_ls(const char *uri);
int cmd_inspect(const char *arg, int as_json);
int cmd_verify(const char *arg, int threads);
int cmd_digest(const char *arg);
int cmd_diff(const char *a, const char *b);
int cmd_prune(const char *uri, long long keep);
int cmd_reshard(const char *src_arg, const char *dst_uri, int world,
                const struct ckpt_write_opts *o);
int cmd_export(const char *src_arg, const char *out, const struct export_opts *x);
/* dims: --layers --dim --heads --seq --vocab (0: not given); with layout hf
 * or llmc the model is IN's and preset is NULL */
int cmd_import(const char *in, const char *dst_uri, const char *preset, const int *dims, int layout,
               int world, const struct ckpt_write_opts *o);
/* every committed step (or ARG's @STEP); rewrite_opts: the write options
 * were given, so the chunks are written anew with them */
int cmd_cp(const char *src_arg, const char *dst_uri, const struct ckpt_write_opts *o,
           int rewrite_opts);

#endif
