/*
 * fsdp_ckpt.c - fsdp-ckpt: look at and check checkpoints without MPI.
 *
 * The commands, their arguments and what each does: the table `commands`
 * below, which `fsdp-ckpt --help` and `fsdp-ckpt COMMAND --help` print;
 * the flags of reshard, export, import and cp: option tables (opts.h).
 *
 * URI is a path, file://PATH or s3://BUCKET/PREFIX; without @STEP the
 * newest committed step (cp: every committed step).
 * Exit status: 0 ok, 1 a check failed or the store could not be read,
 * 2 bad usage.
 */
#include "ckpt.h"
#include "hf.h"
#include "llmc.h"
#include "model.h"
#include "opts.h"
#include "progress.h"
#include "safetensors.h"
#include "storage.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every command: its synopsis and what it does (fsdp-ckpt CMD --help). */
static const struct command {
    const char *name, *synopsis, *what;
} commands[] = {
    {"ls", "URI", "every step: committed or incomplete, world size, bytes stored, ratio"},
    {"inspect", "URI[@STEP] [--json]", "a step's manifest: model, units, shards, trainer state"},
    {"verify", "URI[@STEP] [--threads N]",
     "re-hash (and decode) every chunk of every shard on N threads (default: the CPUs, up\n"
     "to 16); each problem is one line starting BAD, exit 1 if any"},
    {"digest", "URI[@STEP]", "NAME KIND SHA256 per tensor and kind, of the logical bytes"},
    {"reshard", "SRC[@STEP] DST --world-size M [--compress C] [--chunk-kib N] [--hash H]",
     "write the step again for M ranks, streaming (a few chunks of memory)"},
    {"export",
     "SRC[@STEP] OUT [--all | --layout hf [--dtype D] [--max-shard-size S] | --layout llmc "
     "[--dtype D]]",
     "the parameters (--all: and both AdamW moments) as one safetensors file OUT; with\n"
     "--layout hf, the directory OUT that GPT2LMHeadModel.from_pretrained(OUT) loads:\n"
     "config.json and model.safetensors (transformer. names, Conv1D weights stored\n"
     "(in, out), the real vocabulary's rows), in shards of at most S (default 5GB)\n"
     "listed by model.safetensors.index.json; D: f32 (default), bf16 or f16; with\n"
     "--layout llmc, llm.c's model file OUT (gpt2_124M.bin's format: version 3, f32, or 5,\n"
     "bf16)"},
    {"import",
     "IN DST (--model PRESET [SIZES] | SIZES | --layout hf | --layout llmc) --world-size M "
     "[--compress C] [--hash H]",
     "a safetensors file IN as a committed step for M ranks (every name and shape checked)\n"
     "for the preset, changed by SIZES as fsdp-train takes them (--layers N --dim N\n"
     "--heads N --seq N --vocab N; the preset tiny without --model);\n"
     "with --layout hf, the Hugging Face GPT-2 directory IN (what export --layout hf\n"
     "writes, or GPT2LMHeadModel.save_pretrained): its config.json gives the model,\n"
     "F32, BF16 and F16 tensors are widened, Conv1D weights transposed by name; with\n"
     "--layout llmc, llm.c's model file IN (its header gives the model)"},
    {"cp", "SRC[@STEP] DST [--compress C] [--chunk-kib N] [--hash H]",
     "committed steps (or one) to another store, fs <-> s3, stored bytes as they are; a\n"
     "format-1 step is rewritten as format 2 (with --compress, --chunk-kib and --hash)"},
    {"convert", "SRC[@STEP] DST [the options of the verb it picks]",
     "the one verb for format changes: IN.safetensors (or an hf directory with --layout\n"
     "hf) -> checkpoint is import, checkpoint -> OUT.safetensors (or --layout hf) is\n"
     "export, checkpoint -> checkpoint is reshard with --world-size, else cp"},
    {"diff", "A[@STEP] B[@STEP]", "the tensors whose digests differ; exit 1 if any"},
    {"prune", "URI --keep K", "delete all but the newest K committed steps (K >= 1)"},
};

static const char *const usage_notes =
    "URI: a path, file://PATH or s3://BUCKET/PREFIX (S3 settings: AWS_ENDPOINT_URL,\n"
    "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,\n"
    "AWS_PROFILE, AWS_CA_BUNDLE); @STEP picks a step (default: newest committed)\n"
    "H: xxh3 | sha256 (default xxh3: XXH3-128, ten times faster to verify;\n"
    "sha256 when the chunks' digests must be cryptographic)\n"
    "C: none | zstd[:LEVEL] | zstd+shuffle[:LEVEL] (default zstd+shuffle:1)\n"
    "Exit status: 0 ok, 1 a check failed or a store could not be read, 2 bad usage\n";

static const struct command *command_named(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

/* cmd NULL: every command's synopsis; else that command's with what it does. */
static void usage(FILE *f, const struct command *cmd)
{
    if (cmd) {
        fprintf(f, "usage: fsdp-ckpt %s %s\n%s\n\n%s", cmd->name, cmd->synopsis, cmd->what,
                usage_notes);
        return;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "%s fsdp-ckpt %s %s\n", i ? "      " : "usage:", commands[i].name,
                commands[i].synopsis);
    fprintf(f, "fsdp-ckpt COMMAND --help: what COMMAND does\n%s", usage_notes);
}

/* Prints a failure (the store, a check) and gives its exit status, 1. */
static int report_failure(const char *msg)
{
    fprintf(stderr, "fsdp-ckpt: %s\n", msg);
    return 1;
}

/* Splits "URI@STEP"; step stays 0 (newest) without a well-formed suffix. */
static void split_uri(const char *arg, char *uri, size_t n, uint64_t *step, int *has_step)
{
    snprintf(uri, n, "%s", arg);
    *step = 0;
    *has_step = 0;
    char *at = strrchr(uri, '@');
    if (!at || !at[1])
        return;
    char *end;
    unsigned long long v = strtoull(at + 1, &end, 10);
    if (*end == 0 && !strchr(at + 1, '-')) {
        *at = 0;
        *step = v;
        *has_step = 1;
    }
}

static int open_store(const char *uri, struct storage **st, char *err)
{
    return storage_open(uri, st, err) ? -1 : 0;
}

/* Loads the newest committed step that is live (a fenced writer's late
 * commit is passed over, as the trainer passes over it); any other failure
 * of the newest is the answer. */
static int load_newest(struct storage *st, struct ckpt_manifest *m, char *err)
{
    struct ckpt_step_info *steps;
    int n;
    if (ckpt_list_steps(st, &steps, &n, err))
        return -1;
    int rc = -1, found = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (!steps[i].committed)
            continue;
        found = 1;
        rc = ckpt_load_manifest(st, steps[i].step, m, err);
        if (rc != CKPT_NOT_LIVE)
            break;
    }
    free(steps);
    if (!found)
        fsdp_err(err, "%s: no committed checkpoint", st->uri);
    return rc ? -1 : 0;
}

/* Opens URI[@STEP] and loads the manifest. */
static int load(const char *arg, struct storage **st, struct ckpt_manifest *m, char *err)
{
    char uri[1024];
    uint64_t step;
    int has_step;
    split_uri(arg, uri, sizeof uri, &step, &has_step);
    if (open_store(uri, st, err))
        return -1;
    if (has_step ? ckpt_load_manifest(*st, step, m, err) : load_newest(*st, m, err)) {
        storage_close(*st);
        *st = NULL;
        return -1;
    }
    return 0;
}

/* Opens URI[@STEP], loads its manifest and a reader of it, runs fn on the
 * reader, then frees them all: fn's status, or -1 with err when the step
 * cannot be opened. */
static int with_reader(const char *arg, int (*fn)(struct ckpt_reader *r, void *ctx, char *err),
                       void *ctx, char *err)
{
    struct storage *st;
    struct ckpt_manifest m;
    if (load(arg, &st, &m, err))
        return -1;
    struct ckpt_reader r;
    int rc = ckpt_reader_init(&r, st, &m, err);
    if (!rc) {
        rc = fn(&r, ctx, err);
        ckpt_reader_free(&r);
    }
    ckpt_manifest_free(&m);
    storage_close(st);
    return rc;
}

static double mib(uint64_t b) { return (double)b / 1048576.0; }

static int cmd_ls(const char *uri)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    if (open_store(uri, &st, err))
        return report_failure(err);
    struct ckpt_step_info *steps;
    int n;
    if (ckpt_list_steps(st, &steps, &n, err)) {
        storage_close(st);
        return report_failure(err);
    }
    printf("%-14s %-11s %5s %12s %12s %6s\n", "STEP", "STATE", "WORLD", "STORED_MIB", "RAW_MIB",
           "RATIO");
    for (int i = 0; i < n; i++) {
        char dir[32];
        ckpt_step_dir(steps[i].step, dir, sizeof dir);
        if (!steps[i].committed) {
            printf("%-14s %-11s %5s %12.2f %12s %6s\n", dir, "incomplete", "-",
                   mib(steps[i].stored_bytes), "-", "-");
            continue;
        }
        struct ckpt_manifest m;
        int lr = ckpt_load_manifest(st, steps[i].step, &m, err);
        if (lr) {
            printf("%-14s %-11s %5s %12.2f %12s %6s  (%s)\n", dir,
                   lr == CKPT_NOT_LIVE       ? "fenced"
                   : lr == CKPT_CANNOT_JUDGE ? "unknown"
                                             : "damaged",
                   "-", mib(steps[i].stored_bytes), "-", "-", err);
            continue;
        }
        uint64_t raw = 0, stored = 0;
        for (int s = 0; s < m.nshards; s++) {
            raw += m.shards[s].raw_size;
            stored += m.shards[s].stored_size;
        }
        printf("%-14s %-11s %5d %12.2f %12.2f %6.2f\n", dir, "committed", m.world,
               mib(steps[i].stored_bytes), mib(raw), stored ? (double)raw / (double)stored : 0);
        ckpt_manifest_free(&m);
    }
    free(steps);
    storage_close(st);
    return 0;
}

static int cmd_inspect(const char *arg, int as_json)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    struct ckpt_manifest m;
    if (load(arg, &st, &m, err))
        return report_failure(err);
    if (as_json) {
        char *doc = ckpt_manifest_dump(&m);
        printf("%s\n", doc ? doc : "{}");
        free(doc);
    } else {
        char *model = json_dumps(m.model, JSON_COMPACT);
        char *trainer = json_dumps(m.trainer, JSON_COMPACT);
        printf("step %" PRIu64 ", world size %d, generation %" PRIu64 ", sharding %s, format %d\n",
               m.step, m.world, m.generation, m.sharding, m.version);
        printf("model   %s\ntrainer %s\n", model ? model : "?", trainer ? trainer : "?");
        free(model);
        free(trainer);
        printf("\n%-6s %-28s %-8s %-16s %12s %12s\n", "UNIT", "TENSOR", "DTYPE", "SHAPE", "OFFSET",
               "NUMEL");
        for (int u = 0; u < m.nunits; u++) {
            const struct ckpt_unit *U = &m.units[u];
            printf("%-6d %-28s %-8s %-16s %12s %12" PRIu64 "  (padded %" PRIu64 ")\n", u, U->name,
                   "", "", "", U->numel, U->padded);
            for (int t = 0; t < U->ntensors; t++) {
                const struct ckpt_tensor *ct = &U->tensors[t];
                char shape[64] = "";
                for (int d = 0; d < ct->ndim; d++)
                    snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%" PRIu64,
                             d ? "x" : "", ct->shape[d]);
                printf("%-6s %-28s %-8s %-16s %12" PRIu64 " %12" PRIu64 "\n", "", ct->name,
                       "float32", shape, ct->offset, ct->numel);
            }
        }
        printf("\n%-22s %12s %12s %7s  %s\n", "SHARD", "RAW", "STORED", "CHUNKS", "SHA256");
        for (int s = 0; s < m.nshards; s++) {
            char hex[65];
            ckpt_hex(m.shards[s].digest, hex);
            printf("%-22s %12" PRIu64 " %12" PRIu64 " %7d  %s\n", m.shards[s].file,
                   m.shards[s].raw_size, m.shards[s].stored_size, m.shards[s].nchunks, hex);
        }
    }
    ckpt_manifest_free(&m);
    storage_close(st);
    return 0;
}

struct verify_out {
    int bad;
    struct progress *p;
};

static void report_bad(void *arg, const char *msg)
{
    struct verify_out *v = arg;
    v->bad++;
    progress_clear(v->p); /* a problem line never lands on the bar's line */
    printf("BAD %s\n", msg);
    fflush(stdout);
}

static uint64_t stored_bytes(const struct ckpt_manifest *m)
{
    uint64_t n = 0;
    for (int s = 0; s < m->nshards; s++)
        n += m->shards[s].stored_size;
    return n;
}

struct verify_job {
    int threads, bad;
};

static int verify_step(struct ckpt_reader *r, void *ctx, char *err)
{
    struct verify_job *job = ctx;
    const struct ckpt_manifest *m = r->m;
    char dir[32];
    (void)err;
    r->threads = job->threads;
    int chunks = 0;
    struct progress p;
    progress_start(&p, "verify", &r->st->bytes_read, stored_bytes(m));
    struct verify_out v = {0, &p};
    for (int s = 0; s < m->nshards; s++) {
        ckpt_verify_shard(r, s, report_bad, &v);
        chunks += m->shards[s].nchunks;
    }
    progress_stop(&p);
    int bad = v.bad;
    ckpt_step_dir(m->step, dir, sizeof dir);
    if (bad)
        fprintf(stderr, "fsdp-ckpt: %s/%s: %d problem%s in %d shards, %d chunks\n", r->st->uri, dir,
                bad, bad > 1 ? "s" : "", m->nshards, chunks);
    else
        printf("%s/%s: OK (%d shards, %d chunks, every chunk and shard digest verified)\n",
               r->st->uri, dir, m->nshards, chunks);
    job->bad = bad;
    return 0;
}

static int cmd_verify(const char *arg, int threads)
{
    char err[FSDP_ERR_LEN];
    struct verify_job job = {threads, 0};
    if (with_reader(arg, verify_step, &job, err))
        return report_failure(err);
    return job.bad ? 1 : 0;
}

static int print_digest(void *arg, const char *tensor, const char *kind, const char *hex)
{
    (void)arg;
    printf("%s %s %s\n", tensor, kind, hex);
    return 0;
}

static int print_digests(struct ckpt_reader *r, void *ctx, char *err)
{
    return ckpt_digest(r, print_digest, ctx, err);
}

static int cmd_digest(const char *arg)
{
    char err[FSDP_ERR_LEN];
    return with_reader(arg, print_digests, NULL, err) ? report_failure(err) : 0;
}

static int cmd_reshard(const char *src_arg, const char *dst_uri, int world,
                       const struct ckpt_write_opts *o)
{
    char err[FSDP_ERR_LEN];
    struct storage *st, *dst;
    struct ckpt_manifest m;
    if (load(src_arg, &st, &m, err))
        return report_failure(err);
    int rc = open_store(dst_uri, &dst, err);
    if (!rc) {
        struct progress p;
        progress_start(&p, "reshard", &st->bytes_read, stored_bytes(&m));
        rc = ckpt_reshard(st, &m, dst, world, o, err);
        progress_stop(&p);
        if (!rc)
            printf("%s -> %s: step %llu resharded from %d to %d ranks\n", st->uri, dst->uri,
                   (unsigned long long)m.step, m.world, world);
        storage_close(dst);
    }
    ckpt_manifest_free(&m);
    storage_close(st);
    return rc ? report_failure(err) : 0;
}

enum layout { LAYOUT_NATIVE, LAYOUT_HF, LAYOUT_LLMC }; /* --layout native|hf|llmc */

struct export_opts {
    int all, layout, dtype;
    uint64_t max_shard;
};

struct export_job {
    const char *out;
    const struct export_opts *x;
};

static int export_step(struct ckpt_reader *r, void *ctx, char *err)
{
    const struct export_job *job = ctx;
    const struct export_opts *x = job->x;
    /* the parameters are a third of the state (all three kinds with --all) */
    struct progress p;
    progress_start(&p, "export", &r->st->bytes_read, stored_bytes(r->m) / (x->all ? 1 : 3));
    int rc;
    if (x->layout == LAYOUT_HF)
        rc = hf_export(r, job->out, x->dtype, x->max_shard, err);
    else if (x->layout == LAYOUT_LLMC)
        rc = llmc_export(r, job->out, x->dtype == HF_BF16, err);
    else
        rc = st_export(r, job->out, x->all, err);
    progress_stop(&p);
    return rc;
}

static int cmd_export(const char *src_arg, const char *out, const struct export_opts *x)
{
    char err[FSDP_ERR_LEN];
    struct export_job job = {out, x};
    return with_reader(src_arg, export_step, &job, err) ? report_failure(err) : 0;
}

/* layout hf or llmc: the model is IN's (preset NULL), converted to a
 * temporary file in this trainer's layout, then imported as always; dims:
 * --layers --dim --heads --seq --vocab, as fsdp-train takes them (0: not given) */

static int cmd_import(const char *in, const char *dst_uri, const char *preset, const int *dims,
                      int layout, int world, const struct ckpt_write_opts *o)
{
    char err[FSDP_ERR_LEN], tmp[4096] = "";
    struct model_config cfg;
    struct model_layout m;
    if (layout == LAYOUT_HF && hf_read_config(in, &cfg, err))
        return report_failure(err);
    if (layout == LAYOUT_LLMC && llmc_read_config(in, &cfg, err))
        return report_failure(err);
    int custom = dims[0] || dims[1] || dims[2] || dims[3] || dims[4];
    if (layout == LAYOUT_NATIVE && model_preset(preset ? preset : "tiny", &cfg)) {
        fprintf(stderr,
                "fsdp-ckpt: --model '%s' is not one of tiny, small, gpt2-124m "
                "(see fsdp-ckpt --help)\n",
                preset);
        return 2;
    }
    if (custom) { /* fsdp-train's overrides of a preset */
        int *field[5] = {&cfg.layers, &cfg.dim, &cfg.heads, &cfg.seq, &cfg.vocab};
        for (int i = 0; i < 5; i++)
            *field[i] = dims[i] ? dims[i] : *field[i];
        cfg.vocab_pad = dims[4] ? model_vocab_pad(dims[4]) : cfg.vocab_pad;
    }
    if (model_layout_init(&m, &cfg, err))
        return report_failure(err);
    const char *name = custom                ? "custom"
                       : preset              ? preset
                       : layout == LAYOUT_HF ? "config.json"
                                             : "llm.c header";
    const char *path = in;
    int rc = 0, fd = -1;
    err[0] = 0;
    if (layout != LAYOUT_NATIVE) {
        const char *t = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/fsdp-ckpt-import-XXXXXX", t && *t ? t : "/tmp");
        fd = mkstemp(tmp);
        if (fd < 0)
            rc = -1, fsdp_err(err, "%s: cannot create: %s", tmp, strerror(errno));
        else if (unlink(tmp) || /* nothing to leave behind, whatever happens next */
                 (rc = layout == LAYOUT_HF ? hf_to_native(in, &m, fd, err)
                                           : llmc_to_native(in, &m, fd, err)) != 0)
            rc = -1, snprintf(err + strlen(err), FSDP_ERR_LEN - strlen(err), "%s",
                              *err ? "" : "cannot unlink the temporary file");
        snprintf(tmp, sizeof tmp, "/proc/self/fd/%d", fd); /* st_import opens it by path */
        path = tmp;
    }
    struct storage *dst;
    if (!rc)
        rc = open_store(dst_uri, &dst, err);
    if (!rc) {
        struct progress p;
        progress_start(&p, "import", &dst->bytes_written, 0);
        rc = st_import(path, in, &m, name, dst, world, o, err);
        progress_stop(&p);
        if (!rc)
            printf("%s -> %s: step 0 for %d ranks, model %s (%d layers, dim %d, %d heads, seq "
                   "%d, vocab %d), fresh optimizer state\n",
                   in, dst->uri, world, name, cfg.layers, cfg.dim, cfg.heads, cfg.seq, cfg.vocab);
        storage_close(dst);
    }
    if (fd >= 0)
        close(fd);
    model_layout_free(&m);
    return rc ? report_failure(err) : 0;
}

static int cmd_cp(const char *src_arg, const char *dst_uri, const struct ckpt_write_opts *o,
                  int rewrite_opts)
{
    char err[FSDP_ERR_LEN], uri[1024];
    uint64_t step;
    int has_step;
    split_uri(src_arg, uri, sizeof uri, &step, &has_step);
    struct storage *st, *dst;
    if (open_store(uri, &st, err))
        return report_failure(err);
    if (open_store(dst_uri, &dst, err)) {
        storage_close(st);
        return report_failure(err);
    }
    struct ckpt_step_info *steps = NULL;
    int n = 0, rc = 0, copied = 0;
    if (has_step) {
        if (!(steps = calloc(1, sizeof *steps)))
            rc = (snprintf(err, sizeof err, "out of memory"), -1);
        else
            steps[0] = (struct ckpt_step_info){.step = step, .committed = 1};
        n = steps ? 1 : 0;
    } else {
        rc = ckpt_list_steps(st, &steps, &n, err);
    }
    for (int i = 0; !rc && i < n; i++) {
        if (!steps[i].committed)
            continue;
        struct ckpt_manifest m;
        if ((rc = ckpt_load_manifest(st, steps[i].step, &m, err)) == CKPT_NOT_LIVE && !has_step) {
            printf("%s: step %llu skipped: %s\n", st->uri, (unsigned long long)steps[i].step, err);
            rc = 0;
            continue;
        }
        if (rc)
            break;
        int version = m.version;
        if (rewrite_opts && version >= CKPT_FORMAT_VERSION)
            fprintf(stderr,
                    "fsdp-ckpt: step %llu is format %d: copied as it is (--compress, "
                    "--chunk-kib and --hash apply when rewriting format 1; reshard rewrites "
                    "any step)\n",
                    (unsigned long long)steps[i].step, version);
        struct progress p;
        progress_start(&p, "cp", &st->bytes_read, stored_bytes(&m));
        rc = ckpt_copy_step(st, &m, dst, o, err);
        progress_stop(&p);
        ckpt_manifest_free(&m);
        if (!rc) {
            printf("%s -> %s: step %llu %s\n", st->uri, dst->uri, (unsigned long long)steps[i].step,
                   version < CKPT_FORMAT_VERSION ? "rewritten from format 1 as format 2"
                                                 : "copied");
            copied++;
        }
    }
    if (!rc && !copied)
        rc = (snprintf(err, sizeof err, "%s: no committed checkpoint", st->uri), -1);
    free(steps);
    storage_close(st);
    storage_close(dst);
    return rc ? report_failure(err) : 0;
}

struct digests {
    int n, cap;
    char (*lines)[200];
};

static int append_digest_line(void *arg, const char *tensor, const char *kind, const char *hex)
{
    struct digests *d = arg;
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 256;
        void *v = realloc(d->lines, (size_t)cap * sizeof *d->lines);
        if (!v)
            return -1;
        d->lines = v;
        d->cap = cap;
    }
    snprintf(d->lines[d->n++], sizeof d->lines[0], "%s %s %s", tensor, kind, hex);
    return 0;
}

static int collect_digests(struct ckpt_reader *r, void *ctx, char *err)
{
    return ckpt_digest(r, append_digest_line, ctx, err);
}

static int cmd_diff(const char *a, const char *b)
{
    char err[FSDP_ERR_LEN];
    struct digests da = {0}, db = {0};
    if (with_reader(a, collect_digests, &da, err) || with_reader(b, collect_digests, &db, err)) {
        free(da.lines);
        free(db.lines);
        return report_failure(err);
    }
    int differ = 0;
    for (int i = 0; i < da.n || i < db.n; i++) {
        const char *x = i < da.n ? da.lines[i] : "(none)", *y = i < db.n ? db.lines[i] : "(none)";
        if (strcmp(x, y) != 0) {
            printf("- %s\n+ %s\n", x, y);
            differ++;
        }
    }
    printf("%d of %d tensor states differ\n", differ, da.n > db.n ? da.n : db.n);
    free(da.lines);
    free(db.lines);
    return differ ? 1 : 0;
}

static int cmd_prune(const char *uri, long long keep)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    if (open_store(uri, &st, err))
        return report_failure(err);
    /* not fenced (generation 0): a tool does not take the store from a
     * running job; garbage is judged against the store's generation */
    struct ckpt_clean_policy p = {.generation = 0, .keep = keep, .upto = UINT64_MAX};
    struct ckpt_clean_report rep;
    int rc = ckpt_clean(st, &p, &rep, err);
    if (!rc) {
        printf("%s: removed %d committed step%s and %d incomplete; kept %d committed\n", st->uri,
               rep.steps_removed, rep.steps_removed == 1 ? "" : "s", rep.incomplete_removed,
               rep.steps_kept);
        if (rep.incomplete_left)
            printf("%s: left %d incomplete step%s: their writers may still be running (a newer "
                   "launch of the job removes them)\n",
                   st->uri, rep.incomplete_left, rep.incomplete_left == 1 ? "" : "s");
    }
    storage_close(st);
    return rc ? report_failure(err) : 0;
}

static int bad_usage(const char *what)
{
    fprintf(stderr, "fsdp-ckpt: %s (see fsdp-ckpt --help)\n", what);
    return 2;
}

/* "5GB" (10^9, Hugging Face's convention), "500MiB" (2^20), "1000000": bytes. */
static int parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
                 {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    for (size_t i = 0; !errno && end != s && v > 0 && i < sizeof units / sizeof *units; i++)
        if (strcmp(end, units[i].unit) == 0 && v * units[i].scale >= 1 &&
            v * units[i].scale <= 1e15) {
            *out = (uint64_t)(v * units[i].scale);
            return 0;
        }
    return -1;
}

/* reshard / export / import / cp: what their flags and paths give */
struct rewrite {
    struct ckpt_write_opts o;
    int given; /* --compress or --hash */
};

struct convert_args {
    const char *pos[2], *model;
    int dims[5];                /* --layers --dim --heads --seq --vocab; 0: not given */
    long long world, chunk_kib; /* 0: not given */
    struct export_opts x;       /* x.dtype -1, x.max_shard 0: not given */
    struct rewrite w;
};

static int parse_dtype(void *field, const char *v, char *err)
{
    (void)err;
    return hf_parse_dtype(v, field);
}

static int parse_shard_size(void *field, const char *v, char *err)
{
    (void)err;
    return parse_size(v, field);
}

static int parse_compress(void *field, const char *v, char *err)
{
    struct rewrite *w = field;
    w->given = 1;
    return ckpt_parse_compress(v, &w->o, err);
}

static int parse_hash(void *field, const char *v, char *err)
{
    struct rewrite *w = field;
    (void)err;
    w->given = 1;
    return ckpt_parse_hash(v, &w->o.hash);
}

#define CV(field) offsetof(struct convert_args, field)
#define LAYOUT_FLAG                                                                                \
    {                                                                                              \
        "--layout", OPT_WORD, CV(x.layout), .words = { "native", "hf", "llmc" }                    \
    }
#define WORLD_FLAG                                                                                 \
    {                                                                                              \
        "--world-size", OPT_LLONG, CV(world), .min = 1, .max = 65536                               \
    }
#define REWRITE_FLAGS                                                                              \
    {"--compress", OPT_PARSE, CV(w), .parse = parse_compress},                                     \
        {"--hash", OPT_PARSE, CV(w), .parse = parse_hash, .expect = "sha256 or xxh3"},             \
    {                                                                                              \
        "--chunk-kib", OPT_LLONG, CV(chunk_kib), .min = 1, .max = 256 * 1024                       \
    }
#define DIM_FLAG(name, i)                                                                          \
    {                                                                                              \
        name, OPT_INT, CV(dims[i]), .min = 1, .max = 65536                                         \
    }

/* Each verb's flags (what they mean: `commands` above) */
static const struct opt export_flags[] = {
    LAYOUT_FLAG,
    {"--all", OPT_SWITCH, CV(x.all), .arg = NULL},
    {"--dtype", OPT_PARSE, CV(x.dtype), .parse = parse_dtype, .expect = "f32, bf16 or f16"},
    {"--max-shard-size", OPT_PARSE, CV(x.max_shard), .parse = parse_shard_size,
     .expect = "a size such as 5GB, 500MiB or a byte count"},
};
static const struct opt import_flags[] = {
    LAYOUT_FLAG,
    WORLD_FLAG,
    REWRITE_FLAGS,
    {"--model", OPT_STR, CV(model), .arg = "PRESET"},
    DIM_FLAG("--layers", 0),
    DIM_FLAG("--dim", 1),
    DIM_FLAG("--heads", 2),
    DIM_FLAG("--seq", 3),
    DIM_FLAG("--vocab", 4),
};
static const struct opt reshard_flags[] = {LAYOUT_FLAG, WORLD_FLAG, REWRITE_FLAGS};
static const struct opt cp_flags[] = {LAYOUT_FLAG, REWRITE_FLAGS};

static const struct verb_flags {
    const char *verb;
    const struct opt *t;
    size_t n;
} verb_flags[] = {
    {"export", export_flags, OPTS_LEN(export_flags)},
    {"import", import_flags, OPTS_LEN(import_flags)},
    {"reshard", reshard_flags, OPTS_LEN(reshard_flags)},
    {"cp", cp_flags, OPTS_LEN(cp_flags)},
};

/* A command's flags (table t into dst) and its `want` operands (into pos),
 * in any order after the verb; 0, or the exit status of bad usage, whose
 * line names the verb and says what was wrong (`operands`: what it needs,
 * "a URI", "two paths"). */
static int parse_verb(const char *verb, const struct opt *t, size_t n, void *dst, const char **pos,
                      int want, const char *operands, int argc, char **argv)
{
    char err[FSDP_ERR_LEN], msg[FSDP_ERR_LEN + 64];
    int npos = 0;
    for (int i = 2; i < argc;) {
        if (opts_parse(t, n, dst, argc, argv, &i, err)) {
            snprintf(msg, sizeof msg, "%s: %s", verb, err);
            return bad_usage(msg);
        }
        if (i == argc)
            break;
        if (npos == want || strncmp(argv[i], "--", 2) == 0) {
            snprintf(msg, sizeof msg, "%s: unexpected argument '%s'", verb, argv[i]);
            return bad_usage(msg);
        }
        pos[npos++] = argv[i++];
    }
    if (npos != want) {
        snprintf(msg, sizeof msg, "%s needs %s", verb, operands);
        return bad_usage(msg);
    }
    return 0;
}

static int parse_convert(const struct verb_flags *v, int argc, char **argv, struct convert_args *a)
{
    return parse_verb(v->verb, v->t, v->n, a, a->pos, 2, "two paths", argc, argv);
}

/* ls, inspect, verify, digest, diff and prune: a URI or two and at most a
 * flag, in any order. */
struct plain_args {
    const char *pos[2];
    int json;
    long long threads, keep; /* 0: not given */
};

static int parse_keep(void *field, const char *v, char *err)
{
    if (fsdp_parse_i64(v, 1, LLONG_MAX, field))
        return fsdp_err(err, "--keep needs an integer >= 1 (--keep 0 would delete every "
                             "committed step)");
    return 0;
}

#define PA(field) offsetof(struct plain_args, field)
static const struct opt inspect_flags[] = {{.flag = "--json", .kind = OPT_SWITCH, .off = PA(json)}};
static const struct opt verify_flags[] = {
    {.flag = "--threads", .kind = OPT_LLONG, .off = PA(threads), .min = 1, .max = 256}};
static const struct opt prune_flags[] = {
    {.flag = "--keep", .kind = OPT_PARSE, .off = PA(keep), .parse = parse_keep}};

static const struct plain_verb {
    const char *verb;
    const struct opt *t;
    size_t n;
    int want;
} plain_verbs[] = {
    {"ls", NULL, 0, 1},
    {"inspect", inspect_flags, OPTS_LEN(inspect_flags), 1},
    {"verify", verify_flags, OPTS_LEN(verify_flags), 1},
    {"digest", NULL, 0, 1},
    {"diff", NULL, 0, 2},
    {"prune", prune_flags, OPTS_LEN(prune_flags), 1},
};

static int cmd_plain(const struct plain_verb *v, int argc, char **argv)
{
    struct plain_args a = {{NULL, NULL}, 0, 0, 0};
    int rc = parse_verb(v->verb, v->t, v->n, &a, a.pos, v->want,
                        v->want == 2 ? "two URIs" : "a URI", argc, argv);
    if (rc)
        return rc;
    if (strcmp(v->verb, "ls") == 0)
        return cmd_ls(a.pos[0]);
    if (strcmp(v->verb, "inspect") == 0)
        return cmd_inspect(a.pos[0], a.json);
    if (strcmp(v->verb, "verify") == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        long long threads = a.threads ? a.threads : n < 1 ? 1 : n > 16 ? 16 : n;
        return cmd_verify(a.pos[0], (int)threads);
    }
    if (strcmp(v->verb, "digest") == 0)
        return cmd_digest(a.pos[0]);
    if (strcmp(v->verb, "diff") == 0)
        return cmd_diff(a.pos[0], a.pos[1]);
    if (!a.keep)
        return bad_usage("prune needs --keep K");
    return cmd_prune(a.pos[0], a.keep);
}

static int convert_export(struct convert_args *a)
{
    struct export_opts *x = &a->x;
    if ((x->dtype >= 0 && x->layout == LAYOUT_NATIVE) || (x->max_shard && x->layout != LAYOUT_HF))
        return bad_usage("--dtype goes with --layout hf or llmc, --max-shard-size with "
                         "--layout hf");
    x->dtype = x->dtype >= 0 ? x->dtype : HF_F32;
    x->max_shard = x->max_shard ? x->max_shard : 5000000000ull;
    if (x->layout == LAYOUT_LLMC && x->dtype == HF_F16)
        return bad_usage("--dtype: llm.c's files hold f32 (version 3) or bf16 (version 5)");
    if (x->all && x->layout != LAYOUT_NATIVE)
        return bad_usage("--all: the hf and llmc layouts hold the model's parameters only");
    return cmd_export(a->pos[0], a->pos[1], x);
}

static int convert_import(const struct convert_args *a)
{
    const int *dims = a->dims;
    int custom = dims[0] || dims[1] || dims[2] || dims[3] || dims[4];
    if (!a->model && !custom && a->x.layout == LAYOUT_NATIVE)
        return bad_usage("--model PRESET (and/or --layers, --dim, --heads, --seq, --vocab) is "
                         "required, or --layout hf or llmc: the model IN describes");
    if ((a->model || custom) && a->x.layout != LAYOUT_NATIVE)
        return bad_usage("--model and the model's sizes: with --layout hf or llmc the model is "
                         "the one IN describes");
    return cmd_import(a->pos[0], a->pos[1], a->model, dims, a->x.layout, (int)a->world, &a->w.o);
}

/* reshard / export / import / cp: positional arguments and flags */
static int cmd_convert(const struct verb_flags *v, int argc, char **argv)
{
    const char *cmd = v->verb;
    struct convert_args a = {.x = {0, LAYOUT_NATIVE, -1, 0}};
    a.w.o = CKPT_WRITE_DEFAULTS;
    int rc = parse_convert(v, argc, argv, &a);
    if (rc)
        return rc;
    if (a.x.layout != LAYOUT_NATIVE && strcmp(cmd, "export") != 0 && strcmp(cmd, "import") != 0)
        return bad_usage("--layout hf and llmc go with export and import");
    a.w.o.chunk_bytes = (size_t)(a.chunk_kib ? a.chunk_kib : 4096) * 1024;
    if (strcmp(cmd, "export") == 0)
        return convert_export(&a);
    if (strcmp(cmd, "cp") == 0)
        return cmd_cp(a.pos[0], a.pos[1], &a.w.o, a.w.given || a.chunk_kib);
    if (!a.world)
        return bad_usage("--world-size M is required");
    if (strcmp(cmd, "reshard") == 0)
        return cmd_reshard(a.pos[0], a.pos[1], (int)a.world, &a.w.o);
    return convert_import(&a);
}

static int is_help(const char *a) { return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0; }

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

/* A flag of some verb's that is followed by its value. */
static int takes_value(const char *flag)
{
    const struct opt *o = opts_find(import_flags, OPTS_LEN(import_flags), flag);
    if (!o)
        o = opts_find(export_flags, OPTS_LEN(export_flags), flag);
    return o && o->kind != OPT_SWITCH;
}

static const struct verb_flags *verb_named(const char *verb)
{
    for (size_t i = 0; i < OPTS_LEN(verb_flags); i++)
        if (strcmp(verb_flags[i].verb, verb) == 0)
            return &verb_flags[i];
    return NULL;
}

/* convert SRC DST ...: the verb its two paths (and --world-size) call for. */
static const char *convert_verb(int argc, char **argv)
{
    const char *pos[2] = {NULL, NULL};
    int npos = 0, world = 0, layout = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--world-size") == 0)
            world = 1;
        if (strcmp(argv[i], "--layout") == 0 && i + 1 < argc && strcmp(argv[i + 1], "native") != 0)
            layout = 1;
        if (takes_value(argv[i]))
            i++; /* its value */
        else if (strncmp(argv[i], "--", 2) != 0 && npos < 2)
            pos[npos++] = argv[i];
    }
    if (npos < 2)
        return "cp"; /* which then names what is missing */
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", pos[0]);
    struct stat sb;
    int src_file = stat(pos[0], &sb) == 0 && S_ISREG(sb.st_mode); /* checkpoints are dirs */
    if (ends_with(pos[0], ".safetensors") || (layout && access(cfg, F_OK) == 0) ||
        (layout && src_file))
        return "import";
    if (ends_with(pos[1], ".safetensors") || layout)
        return "export";
    return world ? "reshard" : "cp";
}

int main(int argc, char **argv)
{
    if (argc >= 2 && is_help(argv[1])) {
        usage(stdout, NULL);
        return 0;
    }
    const struct command *known = argc >= 2 ? command_named(argv[1]) : NULL;
    for (int i = 2; known && i < argc; i++)
        if (is_help(argv[i])) {
            usage(stdout, known);
            return 0;
        }
    if (argc >= 2 && strcmp(argv[1], "convert") == 0)
        argv[1] = (char *)convert_verb(argc, argv);
    const char *cmd = argc >= 2 ? argv[1] : "";
    for (size_t i = 0; i < sizeof plain_verbs / sizeof plain_verbs[0]; i++)
        if (strcmp(cmd, plain_verbs[i].verb) == 0)
            return cmd_plain(&plain_verbs[i], argc, argv);
    if (verb_named(cmd))
        return cmd_convert(verb_named(cmd), argc, argv);
    fprintf(stderr, "fsdp-ckpt: %s%s%s (see fsdp-ckpt --help)\n",
            *cmd ? "bad arguments for '" : "expected a command", cmd, *cmd ? "'" : "");
    return 2;
}
