/*
 * model_ckpt.c - the model's configuration and units as the checkpoint
 * format holds them (model_ckpt.h).
 */
#include "model_ckpt.h"

#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int put_field(json_t *j, const struct model_config *c, const struct model_field *f)
{
    const char *p = (const char *)c + f->offset;
    json_t *v = f->real ? json_real(*(const double *)(const void *)p)
                        : json_integer(*(const int *)(const void *)p);
    return json_object_set_new(j, f->key, v);
}

json_t *model_ckpt_config(const struct model_config *c)
{
    const struct model_family *fam = model_family_of(c->arch);
    json_t *j = json_object();
    int bad = !fam || !j || json_object_set_new(j, "arch", json_string(fam->name));
    for (int i = 0; !bad && i < model_ncommon_fields; i++)
        bad = put_field(j, c, &model_common_fields[i]);
    for (int i = 0; !bad && i < fam->nfields; i++)
        bad = put_field(j, c, &fam->fields[i]);
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static int get_field(const json_t *model, struct model_config *c, const struct model_field *f,
                     char *err)
{
    json_t *v = json_object_get(model, f->key);
    char *p = (char *)c + f->offset;
    if (f->real) {
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return fsdp_err(err, "the model's \"%s\" is missing or not a finite number", f->key);
        *(double *)(void *)p = json_number_value(v);
    } else {
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN ||
            json_integer_value(v) > INT32_MAX)
            return fsdp_err(err, "the model's \"%s\" is missing or not a 32-bit integer", f->key);
        *(int *)(void *)p = (int)json_integer_value(v);
    }
    return 0;
}

int model_ckpt_parse(const json_t *model, struct model_config *c, char *err)
{
    memset(c, 0, sizeof *c);
    if (!json_is_object(model))
        return fsdp_err(err, "the manifest's model is not an object");
    json_t *arch = json_object_get(model, "arch");
    if (arch && !json_is_string(arch))
        return fsdp_err(err, "the model's \"arch\" is not a string");
    c->arch = arch ? model_arch_parse(json_string_value(arch)) : MODEL_GPT2;
    const struct model_family *fam = model_family_of(c->arch);
    if (!fam)
        return fsdp_err(err, "the model's family '%.40s' is not one this build knows",
                        json_string_value(arch));
    for (int i = 0; i < model_ncommon_fields; i++)
        if (get_field(model, c, &model_common_fields[i], err))
            return -1;
    for (int i = 0; i < fam->nfields; i++)
        if (get_field(model, c, &fam->fields[i], err))
            return -1;
    return model_config_check(c, err);
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
