/*
 * kernels_cpu.c - the CPU compute backend's set-up: which kernel table this
 * CPU gets, OpenBLAS's kernel choice and thread count.
 *
 * The kernels themselves are in kernels_cpu_isa.c, compiled once per
 * instruction set (see there). A default x86-64 build carries x86-64 (SSE2),
 * x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512) tables; fsdp_kernels_cpu()
 * returns the widest one the CPU and its OS support, decided once from
 * CPUID, so a binary built on one host of a mixed fleet neither dies with
 * SIGILL on an older one nor runs SSE2 loops on a newer one. -Dnative=true
 * builds one table with -march=native instead (named "native").
 */
#include "../kernels.h"
#include "gemm.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* OpenBLAS extensions (declared in its cblas.h, restated for other BLASes). */
void openblas_set_num_threads(int num_threads);
int openblas_get_parallel(void);
char *openblas_get_config(void);
char *openblas_get_corename(void);

/* OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels from the CPU
 * model when it is loaded. A CPU newer than the library (these VMs report a
 * Sapphire Rapids model that 0.3.21 does not know) falls back to the SSE3
 * "Prescott" kernels: 45 GFLOP/s instead of 180 on a 2048x768x256 sgemm
 * here. OPENBLAS_CORETYPE overrides the choice but is read only at load time,
 * so the program re-executes itself once with it set.
 *
 * The override is not checked by OpenBLAS: a core type forced in the
 * environment (fsdp-super carries OPENBLAS_* to every host) that this CPU
 * cannot run would die with SIGILL in the first matmul, so such a value is
 * replaced, with one line on stderr, by the widest core this CPU runs. */
static const char *widest_blas_core(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    return NULL; /* OpenBLAS's own choice */
}

static int blas_core_runs_here(const char *core)
{
    static const struct {
        const char *core;
        int level; /* 3: AVX2 + FMA; 4: AVX-512 F/BW/DQ/VL; 5: and AVX512_BF16 */
    } needs[] = {{"SkylakeX", 4}, {"Cooperlake", 5}, {"SapphireRapids", 5},
                 {"Haswell", 3},  {"Zen", 3},        {"Excavator", 3}};
    const char *widest = widest_blas_core();
    int have = !widest ? 0 : strcmp(widest, "SkylakeX") == 0 ? 4 : 3;
    if (have == 4 && __builtin_cpu_supports("avx512bf16"))
        have = 5;
    for (size_t i = 0; i < sizeof needs / sizeof needs[0]; i++)
        if (strcasecmp(core, needs[i].core) == 0)
            return have >= needs[i].level;
    if (strcasecmp(core, "Sandybridge") == 0)
        return __builtin_cpu_supports("avx");
    if (strcasecmp(core, "Bulldozer") == 0) /* AMD's FMA4 */
        return __builtin_cpu_supports("avx") && __builtin_cpu_supports("fma4");
    if (strcasecmp(core, "Piledriver") == 0 || strcasecmp(core, "Steamroller") == 0)
        return __builtin_cpu_supports("avx") && __builtin_cpu_supports("fma");
    return 1; /* older cores, or names we do not know: OpenBLAS decides */
}

void fsdp_kernels_cpu_fix_blas_core(char **argv)
{
    static const char *weak[] = {"Prescott",  "Core2",  "Penryn",     "Dunnington",
                                 "Nehalem",   "Atom",   "Katmai",     "Coppermine",
                                 "Northwood", "Banias", "Sandybridge"};
    const char *forced = getenv("OPENBLAS_CORETYPE");
    const char *want = widest_blas_core();
    if (forced) {
        if (blas_core_runs_here(forced))
            return;
        fprintf(stderr,
                "fsdp: OPENBLAS_CORETYPE=%.40s needs instructions this CPU lacks; "
                "using %s\n",
                forced, want ? want : "OpenBLAS's own choice");
        if (want)
            setenv("OPENBLAS_CORETYPE", want, 1);
        else
            unsetenv("OPENBLAS_CORETYPE");
    } else {
        const char *core = openblas_get_corename();
        int is_weak = 0;
        for (size_t i = 0; i < sizeof weak / sizeof weak[0]; i++)
            is_weak |= core && strcasecmp(core, weak[i]) == 0;
        if (!is_weak || !want)
            return;
        setenv("OPENBLAS_CORETYPE", want, 1);
    }
    /* exec the real path, not /proc/self/exe, so the process keeps its name */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return;
    self[n] = 0;
    execv(self, argv);
    /* exec failed: carry on with the kernels OpenBLAS loaded */
}

void fsdp_kernels_cpu_threads(int n)
{
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int fsdp_kernels_cpu_matmul(const char *want, char *err, size_t errlen)
{
    return fsdp_gemm_select(want, err, errlen);
}

int fsdp_kernels_cpu_bf16(char *why, size_t len) { return fsdp_gemm_bf16_fast(why, len); }

const char *fsdp_kernels_cpu_blas(void)
{
    static char desc[160];
    int par = openblas_get_parallel();
    snprintf(desc, sizeof desc, "%s matmuls; %s (%s)", fsdp_gemm_name(), openblas_get_config(),
             par == 2   ? "openmp"
             : par == 1 ? "pthreads"
                        : "serial");
    return desc;
}

/* ---- which kernel table ---------------------------------------------------- */

struct cpu_isa {
    const char *name; /* as --cpu-kernels takes it */
    const struct fsdp_kernels *(*table)(void);
};

#ifdef FSDP_KERNELS_X86_DISPATCH
const struct fsdp_kernels *fsdp_kernels_cpu_x86_64_v4(void);
const struct fsdp_kernels *fsdp_kernels_cpu_x86_64_v3(void);
const struct fsdp_kernels *fsdp_kernels_cpu_x86_64(void);
/* widest first: auto takes the first one the CPU supports */
static const struct cpu_isa isas[] = {
    {"x86-64-v4", fsdp_kernels_cpu_x86_64_v4},
    {"x86-64-v3", fsdp_kernels_cpu_x86_64_v3},
    {"x86-64", fsdp_kernels_cpu_x86_64},
};
#else
const struct fsdp_kernels *fsdp_kernels_cpu_native(void);
static const struct cpu_isa isas[] = {{"native", fsdp_kernels_cpu_native}};
#endif
enum { NISAS = sizeof isas / sizeof isas[0] };

/* The features that -march=x86-64-v3 and -v4 let the compiler use, by the
 * names GCC and clang both know (clang 14 has no "x86-64-v3" here); every
 * CPU with AVX2, FMA and BMI2 also has the level's MOVBE, LZCNT and F16C.
 * libgcc and compiler-rt report AVX and AVX-512 only when the OS saves
 * their registers (XCR0). */
static int isa_supported(const struct cpu_isa *isa)
{
#ifdef FSDP_KERNELS_X86_DISPATCH
    __builtin_cpu_init();
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
    if (strcmp(isa->name, "x86-64-v4") == 0)
        return v4;
    if (strcmp(isa->name, "x86-64-v3") == 0)
        return v3;
#endif
    (void)isa;
    return 1;
}

static const struct fsdp_kernels *chosen;

static void isa_list(char *out, size_t len, int supported_only)
{
    out[0] = 0;
    for (int i = 0; i < NISAS; i++)
        if (!supported_only || isa_supported(&isas[i]))
            snprintf(out + strlen(out), len - strlen(out), "%s%s", out[0] ? ", " : "",
                     isas[i].name);
}

int fsdp_kernels_cpu_select(const char *want, char *err, size_t errlen)
{
    int any = strcmp(want, "auto") == 0;
    char list[128];
    for (int i = 0; i < NISAS; i++) {
        if (!any && strcmp(want, isas[i].name) != 0)
            continue;
        if (!isa_supported(&isas[i])) {
            if (any)
                continue;
            isa_list(list, sizeof list, 1);
            snprintf(err, errlen,
                     "--cpu-kernels %s: this CPU lacks instructions they use "
                     "(it runs: %s)",
                     want, list);
            return -1;
        }
        chosen = isas[i].table();
        if (!any) /* the matmul library keeps to the level too */
            fsdp_gemm_max_isa(isas[i].name);
        return 0;
    }
    isa_list(list, sizeof list, 0);
    snprintf(err, errlen, "--cpu-kernels '%s' is not auto or one of this build's: %s", want, list);
    return -1;
}

const struct fsdp_kernels *fsdp_kernels_cpu(void)
{
    if (!chosen) {
        char err[256];
        if (fsdp_kernels_cpu_select("auto", err, sizeof err)) /* the last table fits any CPU */
            abort();
    }
    return chosen;
}
