/*
 * ckpt_cmds.c - what fsdp-ckpt's commands do (ckpt_cmds.h; fsdp_ckpt.c
 * reads the command line and calls them).
 */
#include "ckpt_cmds.h"

#include "ckpt.h"
#include "hf.h"
#include "llmc.h"
#include "model.h"
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

/* Prints a failure (the store, a check) and gives its exit status, 1. */
static int report_failure(const char *msg)
{
    fprintf(stderr, "fsdp-ckpt: %s\n", msg);
    return 1;
}

#define MAX_STEP (1LL << 40) /* fsdp-train's bound on --steps */

/* Splits "URI@STEP"; step stays 0 (newest) without a suffix of digits (a
 * path may hold an '@'). A suffix that is a number but no step (out of
 * range, negative) is refused: -1 with err set. */
static int split_uri(const char *arg, char *uri, size_t n, uint64_t *step, int *has_step, char *err)
{
    snprintf(uri, n, "%s", arg);
    *step = 0;
    *has_step = 0;
    char *at = strrchr(uri, '@');
    if (!at || !at[1])
        return 0;
    const char *d = at[1] == '-' ? at + 2 : at + 1;
    if (!*d || strspn(d, "0123456789") != strlen(d))
        return 0;
    long long v;
    if (at[1] == '-' || fsdp_parse_i64(at + 1, 0, MAX_STEP, &v))
        return fsdp_err(err, "%s: '%s' is not a step number (0 to %lld)", arg, at + 1,
                        (long long)MAX_STEP);
    *at = 0;
    *step = (uint64_t)v;
    *has_step = 1;
    return 0;
}

static int open_store(const char *uri, struct storage **st, char *err)
{
    return storage_open(uri, st, err) ? -1 : 0;
}

static int any_key(void *arg, const char *key, uint64_t size)
{
    (void)arg, (void)key, (void)size;
    return 1;
}

/* ls and prune of a store that is not there say so and fail, as ls(1) and
 * aws s3 ls do: a directory that does not exist, a prefix with no object.
 * An existing empty directory is an empty store. A link or FIFO counts as
 * something stored: whether it is refused is for the verb to judge (ls
 * lists its step as damaged), not for this question, whose answer would
 * otherwise depend on which name the directory happens to list first. */
static int open_existing_store(const char *uri, struct storage **st, char *err)
{
    if (open_store(uri, st, err))
        return -1;
    int rc = storage_list_special(*st, "", any_key, NULL, err);
    if (rc == 1)
        return 0;
    struct stat sb;
    const char *path = strncmp(uri, "file://", 7) == 0 ? uri + 7 : uri;
    if (rc == 0 && !strstr(uri, "://") && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return 0;
    if (rc == 0 && strstr(uri, "://") && strncmp(uri, "file://", 7) != 0)
        fsdp_err(err, "%s: nothing is stored under this prefix (no checkpoint store)", uri);
    else if (rc == 0)
        fsdp_err(err, "%s: no such checkpoint store: %s", uri,
                 stat(path, &sb) ? strerror(errno) : "not a directory");
    storage_close(*st);
    *st = NULL;
    return -1;
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
    *st = NULL;
    if (split_uri(arg, uri, sizeof uri, &step, &has_step, err) || open_store(uri, st, err))
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

int cmd_ls(const char *uri)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    if (open_existing_store(uri, &st, err))
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

int cmd_inspect(const char *arg, int as_json)
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

int cmd_verify(const char *arg, int threads)
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

int cmd_digest(const char *arg)
{
    char err[FSDP_ERR_LEN];
    return with_reader(arg, print_digests, NULL, err) ? report_failure(err) : 0;
}

int cmd_reshard(const char *src_arg, const char *dst_uri, int world,
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
        rc = llmc_export(r, job->out, x->dtype == HF_BF16, x->force, err);
    else
        rc = st_export(r, job->out, x->all, x->force, err);
    progress_stop(&p);
    return rc;
}

int cmd_export(const char *src_arg, const char *out, const struct export_opts *x)
{
    char err[FSDP_ERR_LEN];
    struct export_job job = {out, x};
    /* the output is judged before a byte of the checkpoint is read */
    if (x->layout != LAYOUT_HF && fsdp_outfile_check(out, x->force, err))
        return report_failure(err);
    return with_reader(src_arg, export_step, &job, err) ? report_failure(err) : 0;
}

/* layout hf or llmc: the model is IN's (preset NULL), converted to a
 * temporary file in this trainer's layout, then imported as always; dims:
 * --layers --dim --heads --seq --vocab, as fsdp-train takes them (0: not given) */

int cmd_import(const char *in, const char *dst_uri, const char *preset, const int *dims, int layout,
               int world, const struct ckpt_write_opts *o)
{
    char err[FSDP_ERR_LEN], tmp[4096] = "", desc[256];
    struct model_config cfg;
    struct model_layout m;
    if (layout == LAYOUT_HF && hf_read_config(in, dims[3], &cfg, err))
        return report_failure(err);
    if (layout == LAYOUT_LLMC && llmc_read_config(in, &cfg, err))
        return report_failure(err);
    int custom = layout != LAYOUT_HF && (dims[0] || dims[1] || dims[2] || dims[3] || dims[4]);
    if (layout == LAYOUT_NATIVE && model_preset(preset ? preset : "tiny", &cfg)) {
        fprintf(stderr, "fsdp-ckpt: --model '%s' is not one of %s (see fsdp-ckpt --help)\n", preset,
                model_preset_names());
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
            printf("%s -> %s: step 0 for %d ranks, model %s (%s), fresh optimizer state\n", in,
                   dst->uri, world, name, model_config_describe(&cfg, desc, sizeof desc));
        storage_close(dst);
    }
    if (fd >= 0)
        close(fd);
    model_layout_free(&m);
    return rc ? report_failure(err) : 0;
}

int cmd_cp(const char *src_arg, const char *dst_uri, const struct ckpt_write_opts *o,
           int rewrite_opts)
{
    char err[FSDP_ERR_LEN], uri[1024];
    uint64_t step;
    int has_step;
    struct storage *st, *dst;
    if (split_uri(src_arg, uri, sizeof uri, &step, &has_step, err) || open_store(uri, &st, err))
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

int cmd_diff(const char *a, const char *b)
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

int cmd_prune(const char *uri, long long keep)
{
    char err[FSDP_ERR_LEN];
    struct storage *st;
    if (open_existing_store(uri, &st, err))
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
