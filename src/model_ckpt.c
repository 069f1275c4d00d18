/*
 * model_ckpt.c - the model's configuration and units as the checkpoint
 * format holds them (model_ckpt.h).
 */
#include "model_ckpt.h"

#include <stdio.h>
#include <stdlib.h>

json_t *model_ckpt_config(const struct model_config *c)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i}", "layers", c->layers, "dim", c->dim, "heads",
                     c->heads, "seq", c->seq, "vocab", c->vocab, "vocab_pad", c->vocab_pad);
}

int model_ckpt_units(const struct model_layout *m, int world, struct ckpt_manifest *man)
{
    man->units = calloc((size_t)m->nunits, sizeof *man->units);
    if (!man->units)
        return -1;
    man->nunits = m->nunits;
    for (int u = 0; u < m->nunits; u++) {
        const struct model_unit *mu = &m->units[u];
        struct ckpt_unit *U = &man->units[u];
        snprintf(U->name, sizeof U->name, "%s", mu->name);
        U->numel = mu->numel;
        U->padded = (mu->numel + (size_t)world - 1) / (size_t)world * (size_t)world;
        U->tensors = calloc((size_t)mu->ntensors, sizeof *U->tensors);
        if (!U->tensors)
            return -1;
        U->ntensors = mu->ntensors;
        for (int i = 0; i < mu->ntensors; i++) {
            const struct model_tensor *t = &m->tensors[mu->first_tensor + i];
            struct ckpt_tensor *ct = &U->tensors[i];
            snprintf(ct->name, sizeof ct->name, "%s", t->name);
            ct->ndim = t->ndim;
            ct->shape[0] = t->shape[0];
            ct->shape[1] = t->shape[1];
            ct->offset = t->offset;
            ct->numel = t->numel;
        }
    }
    return 0;
}
