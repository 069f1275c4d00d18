/*
 * fsdp_ckpt.c - fsdp-ckpt: look at and check checkpoints without MPI. This
 * file reads the command line; ckpt_cmds.c does the commands.
 *
 * The commands, their arguments and what each does: the table `commands`
 * below, which `fsdp-ckpt --help` and `fsdp-ckpt COMMAND --help` print;
 * every command's flags: option tables (opts.h), taken anywhere after it.
 *
 * URI is a path, file://PATH or s3://BUCKET/PREFIX; without @STEP the
 * newest committed step (cp: every committed step).
 * Exit status: 0 ok, 1 a check failed or the store could not be read,
 * 2 bad usage.
 */
#include "ckpt.h"
#include "ckpt_cmds.h"
#include "hf.h"
#include "opts.h"
#include "util.h"

#include <errno.h>
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
     "SRC[@STEP] OUT [--force] [--all | --layout hf [--dtype D] [--max-shard-size S] | "
     "--layout llmc [--dtype D]]",
     "the parameters (--all: and both AdamW moments) as one safetensors file OUT (an\n"
     "existing regular file is replaced only with --force); with\n"
     "--layout hf, the directory OUT that GPT2LMHeadModel (a llama checkpoint:\n"
     "LlamaForCausalLM, Qwen2ForCausalLM with q/k/v biases) .from_pretrained(OUT)\n"
     "loads: config.json and model.safetensors (HF's names; GPT-2's Conv1D weights\n"
     "stored (in, out); the real vocabulary's rows), in shards of at most S (default 5GB)\n"
     "listed by model.safetensors.index.json; D: f32 (default), bf16 or f16; with\n"
     "--layout llmc, llm.c's model file OUT (gpt2_124M.bin's format: version 3, f32, or 5,\n"
     "bf16)"},
    {"import",
     "IN DST (--model PRESET [SIZES] | SIZES | --layout hf [--seq N] | --layout llmc) "
     "--world-size M "
     "[--compress C] [--hash H]",
     "a safetensors file IN as a committed step for M ranks (every name and shape checked)\n"
     "for the preset, changed by SIZES as fsdp-train takes them (--layers N --dim N\n"
     "--heads N --seq N --vocab N; the preset tiny without --model);\n"
     "with --layout hf, the Hugging Face directory IN (gpt2, llama, qwen2 or mistral;\n"
     "what export --layout hf writes, or save_pretrained): its config.json gives the\n"
     "model (--seq N: a llama model's training length in place of its\n"
     "max_position_embeddings), F32, BF16 and F16 tensors are widened, GPT-2's Conv1D\n"
     "weights transposed by name; with\n"
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
    {"--force", OPT_SWITCH, CV(x.force), .arg = NULL},
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
    int sizes = dims[0] || dims[1] || dims[2] || dims[4] || (dims[3] && a->x.layout != LAYOUT_HF);
    if ((a->model || sizes) && a->x.layout != LAYOUT_NATIVE)
        return bad_usage("--model and the model's sizes: with --layout hf or llmc the model is "
                         "the one IN describes (--layout hf takes --seq: a llama model's "
                         "training length)");
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
