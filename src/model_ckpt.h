/*
 * model_ckpt.h - how the model describes itself in a checkpoint: its
 * configuration as the manifest's "model" object (compared on resume and
 * import) and its flat units as ckpt units padded for a world size. The one
 * place the trainer, fsdp-ckpt and the scale simulation take them from, so
 * they cannot disagree.
 *
 * The "model" object is {"arch": FAMILY, FIELD: VALUE, ...}: the common
 * fields (layers, dim, heads, seq, vocab, vocab_pad) and the family's own
 * (model.h's struct model_family). Checkpoints written before families
 * existed have no "arch": they are GPT-2's.
 */
#ifndef FSDP_MODEL_CKPT_H
#define FSDP_MODEL_CKPT_H

#include "ckpt.h"
#include "model.h"

json_t *model_ckpt_config(const struct model_config *c);
/* The configuration a manifest's "model" object describes, checked as
 * model_config_check checks flags; -1 with err naming the field. */
int model_ckpt_parse(const json_t *model, struct model_config *c, char *err);
/* Fills man->units (nunits of them; padded for world ranks). -1: out of
 * memory (what was allocated is freed with the manifest). */
int model_ckpt_units(const struct model_layout *m, int world, struct ckpt_manifest *man);

#endif
