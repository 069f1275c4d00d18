/*
 * cuda_load.c - cuda.h for the programs: loads libfsdp-cuda.so on the
 * first fsdp_cuda_init and forwards to it (module.h says why it is a
 * module). Nothing here links CUDA.
 */
#include "cuda.h"
#include "module.h"

#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FSDP_CUDA_MODULE_DIR
#define FSDP_CUDA_MODULE_DIR "/usr/local/lib/fsdp-ckpt"
#endif
#define MODULE_NAME "libfsdp-cuda.so"

static const struct fsdp_cuda_module *mod;

/* Tries one path; on failure appends why to why[]. */
static void *try_open(const char *path, char *why, size_t len)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        size_t used = strlen(why);
        const char *e = dlerror();
        snprintf(why + used, len - used, "%s%s", used ? "; " : "", e ? e : path);
    }
    return h;
}

static int load(char *err, size_t len)
{
    if (mod)
        return 0;
    char why[768] = "", path[4096];
    void *h = NULL;
    const char *env = getenv("FSDP_CUDA_MODULE");
    if (env && env[0]) {
        h = try_open(env, why, sizeof why);
    } else {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = 0;
            snprintf(path, sizeof path, "%s/" MODULE_NAME, dirname(self));
            if (access(path, F_OK) == 0)
                h = try_open(path, why, sizeof why);
        }
        if (!h)
            h = try_open(FSDP_CUDA_MODULE_DIR "/" MODULE_NAME, why, sizeof why);
    }
    if (!h) {
        snprintf(err, len,
                 "--device cuda: cannot load the CUDA backend (%s): this build or "
                 "host has no CUDA (build with nvcc, cuBLAS and NCCL installed: meson "
                 "-Dcuda=enabled)",
                 why);
        return -1;
    }
    const struct fsdp_cuda_module *(*get)(void) =
        (const struct fsdp_cuda_module *(*)(void))dlsym(h, "fsdp_cuda_module");
    const struct fsdp_cuda_module *m = get ? get() : NULL;
    if (!m || m->abi != FSDP_CUDA_MODULE_ABI) {
        snprintf(err, len, "--device cuda: %s is not this build's CUDA backend",
                 env && env[0] ? env : MODULE_NAME);
        dlclose(h);
        return -1;
    }
    mod = m; /* kept loaded for the life of the process */
    return 0;
}

int fsdp_cuda_init(int local_rank, char *err, size_t len)
{
    return load(err, len) ? -1 : mod->init(local_rank, err, len);
}

const struct fsdp_kernels *fsdp_kernels_cuda(void) { return mod ? mod->kernels() : NULL; }

int fsdp_cuda_bf16(char *why, size_t len)
{
    if (mod)
        return mod->bf16(why, len);
    snprintf(why, len, "the CUDA backend is not loaded");
    return 0;
}

void fsdp_cuda_allow_tf32(int on)
{
    if (mod)
        mod->allow_tf32(on);
}

size_t fsdp_cuda_peak_bytes(void) { return mod ? mod->peak_bytes() : 0; }

int fsdp_comm_nccl_init(struct fsdp_comm *c, char *err)
{
    if (!mod)
        return snprintf(err, 256, "NCCL: the CUDA backend is not loaded"), -1;
    return mod->comm_nccl_init(c, err);
}
