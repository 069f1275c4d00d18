/*
 * model_ckpt.h - how the model describes itself in a checkpoint: its
 * configuration as the manifest's "model" object (compared on resume and
 * import) and its flat units as ckpt units padded for a world size. The one
 * place the trainer, fsdp-ckpt import and the scale simulation take them
 * from, so they cannot disagree.
 */
#ifndef FSDP_MODEL_CKPT_H
#define FSDP_MODEL_CKPT_H

#include "ckpt.h"
#include "model.h"

json_t *model_ckpt_config(const struct model_config *c);
/* Fills man->units (nunits of them; padded for world ranks). -1: out of
 * memory (what was allocated is freed with the manifest). */
int model_ckpt_units(const struct model_layout *m, int world, struct ckpt_manifest *man);

#endif
