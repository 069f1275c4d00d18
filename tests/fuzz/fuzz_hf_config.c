/*
 * fuzz_hf_config.c - what `fsdp-ckpt import --layout hf` reads before any
 * tensor: config.json (hf_read_config: GPT-2, Llama, Qwen2 and Mistral
 * configurations) and model.safetensors.index.json (hf_to_native's list of
 * files and where each tensor is), on real files in a directory of its own
 * under /dev/shm.
 *
 * The input is config.json, then optionally a NUL byte and the index. An
 * accepted configuration must pass model_config_check and lay out; the
 * layout is then imported from the directory, whose only files are the two
 * written here (an index may name either as a weights file: both are then
 * parsed as safetensors). Every refusal leaves a message. The properties
 * are that nothing crashes, leaks or reads out of bounds, and that an
 * import of a directory with no tensor data never succeeds.
 */
#include "fuzz_common.h"
#include "hf.h"
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];
static int out_fd = -1;

static void put(const char *name, const uint8_t *data, size_t size);

static void clean_up(void)
{
    put("config.json", NULL, 0);
    put("model.safetensors.index.json", NULL, 0);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_stderr();
    snprintf(dir, sizeof dir, "/dev/shm/fuzz-hf-%d", (int)getpid());
    if (mkdir(dir, 0700) && errno != EEXIST) {
        perror(dir);
        abort();
    }
    atexit(clean_up);
    out_fd = fuzz_memfd("native.safetensors");
    return 0;
}

static void put(const char *name, const uint8_t *data, size_t size)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!data) {
        unlink(path);
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size)) {
        perror(path);
        abort();
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t clen = nul ? (size_t)(nul - data) : size;
    put("config.json", data, clen);
    put("model.safetensors.index.json", nul ? nul + 1 : NULL, nul ? size - clen - 1 : 0);
    struct model_config cfg;
    char err[FSDP_ERR_LEN];
    err[0] = 0;
    if (hf_read_config(dir, 0, &cfg, err) != 0) {
        FUZZ_CHECK(err[0] != 0 && memchr(err, 0, sizeof err) != NULL);
        return 0;
    }
    FUZZ_CHECK(model_config_check(&cfg, err) == 0);
    struct model_layout m;
    if (model_layout_init(&m, &cfg, err) != 0) {
        FUZZ_CHECK(err[0] != 0);
        return 0;
    }
    if (ftruncate(out_fd, 0) || lseek(out_fd, 0, SEEK_SET))
        abort();
    err[0] = 0;
    /* no file here holds a tensor's bytes: importing must fail, saying why */
    FUZZ_CHECK(hf_to_native(dir, &m, out_fd, err) != 0 && err[0] != 0);
    model_layout_free(&m);
    return 0;
}
