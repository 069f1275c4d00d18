/*
 * model_passes.c - the families' passes by arch (fsdp_family.h), beside
 * model.c's registry of their layouts. Adding a family: a line here.
 */
#include "fsdp_family.h"
#include "model.h"

#include <stddef.h>

extern const struct fsdp_family_passes gpt2_passes, llama_passes;

static const struct fsdp_family_passes *const passes[MODEL_NARCH] = {
    [MODEL_GPT2] = &gpt2_passes,
    [MODEL_LLAMA] = &llama_passes,
};

const struct fsdp_family_passes *fsdp_family_passes(int arch)
{
    return arch >= 0 && arch < MODEL_NARCH ? passes[arch] : NULL;
}
