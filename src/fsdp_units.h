/*
 * fsdp_units.h - inside the FSDP engine: what its passes (fsdp_pass.c)
 * ask of its units (fsdp.c: gather, free, gradient reduction), and the
 * activation plan fsdp_init (fsdp.c) asks of the passes. Other code uses
 * fsdp.h only.
 */
#ifndef FSDP_UNITS_H
#define FSDP_UNITS_H

#include "fsdp.h"

#include <stddef.h>

/* Shards (and activations) start on 64-byte boundaries inside each
 * allocation. */
#define ALIGN_FLOATS 16

static inline size_t fsdp_round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/* fsdp.c. fsdp_unit_gather makes unit u's full parameters valid (in bf16
 * mode their bf16 copy, which the matmuls read, and the fp32 copy of the
 * tensors not twin_only), with the rest of its group; fsdp_unit_prefetch starts the gather of the
 * group computed next
 * (--prefetch; u < 0: none); fsdp_unit_reshard drops a group's gathered
 * parameters after its last use (FULL_SHARD). */
int fsdp_unit_gather(struct fsdp_engine *e, int u, char *err);
int fsdp_unit_prefetch(struct fsdp_engine *e, int u, char *err);
void fsdp_unit_reshard(struct fsdp_engine *e, int u);
/* Around unit u's backward: its full gradient zeroed first; after its
 * group's last unit, the group's reduce-scatter started (or, --shard none,
 * the bucket it completes all-reduced). fsdp_rs_finish waits for the
 * reduce-scatter in flight and adds this rank's part to the gradient
 * shard. */
void fsdp_unit_grad_begin(struct fsdp_engine *e, int u);
int fsdp_unit_grad_end(struct fsdp_engine *e, int u, char *err);
int fsdp_rs_finish(struct fsdp_engine *e, char *err);
/* Lets the collectives in flight advance; called between kernels. */
void fsdp_poke(struct fsdp_engine *e);

/* fsdp_pass.c: the activations' slots and one allocation for them. */
int fsdp_alloc_acts(struct fsdp_engine *e, char *err);

#endif
