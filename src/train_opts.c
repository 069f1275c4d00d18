/*
 * train_opts.c - parsing and checking fsdp-train's flags.
 *
 * Every flag is a row of train_flags below (opts.h: its kind, bounds and
 * field); --help prints that table. What the table cannot say is checked
 * after it: the model, and flags that only make sense together.
 *
 * Model shape: --model picks a preset (its family with it); --arch alone
 * picks that family's smallest preset; --layers/--dim/--heads/--seq/--vocab
 * and the llama family's --kv-heads/--ffn-dim/--rope-theta/--norm-eps/
 * --tie-embeddings/--attn-bias override single fields, in any order
 * relative to --model.
 */
#include "train_opts.h"

#include "opts.h"
#include "util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the flags give, before it becomes struct train_opts. */
struct given {
    struct train_opts o;
    long long layers, dim, heads, seq, vocab, seed, chunk_kib; /* 0: not given (but seed) */
    long long kv_heads, ffn_dim;                               /* 0: not given */
    double rope_theta, norm_eps;                               /* 0: not given */
    int arch, tie_embeddings, attn_bias;                       /* -1: not given */
    double rope_scaling[4]; /* --rope-scaling llama3:...; [0] -1: none, 0: not given */
    const char *s3_endpoint;
};

#define AT(field) offsetof(struct given, field)

static int parse_shard(void *field, const char *v, char *err)
{
    (void)err;
    return fsdp_shard_parse(v, field);
}

int train_change_parse(const char *v, unsigned *bits)
{
    static const struct {
        const char *word;
        unsigned bit;
    } w[] = {{"data", TRAIN_CHANGE_DATA},
             {"seed", TRAIN_CHANGE_SEED},
             {"global-batch", TRAIN_CHANGE_GLOBAL_BATCH},
             {"lr", TRAIN_CHANGE_LR},
             {"optimizer", TRAIN_CHANGE_OPTIMIZER},
             {"all", TRAIN_CHANGE_ALL}};
    *bits = 0;
    for (const char *p = v; *p;) {
        size_t n = strcspn(p, ",");
        size_t i = 0;
        while (i < sizeof w / sizeof w[0] && (strlen(w[i].word) != n || strncmp(w[i].word, p, n)))
            i++;
        if (i == sizeof w / sizeof w[0])
            return -1;
        *bits |= w[i].bit;
        p += n + (p[n] == ',');
    }
    return *v ? 0 : -1;
}

static int parse_allow(void *field, const char *v, char *err)
{
    (void)err;
    return train_change_parse(v, field);
}

static int parse_recompute(void *field, const char *v, char *err)
{
    (void)err;
    return fsdp_recompute_parse(v, field);
}

/* none, or llama3:FACTOR,LOW_FREQ_FACTOR,HIGH_FREQ_FACTOR,ORIGINAL_CONTEXT
 * (the four numbers of config.json's rope_scaling); model_config_check
 * bounds them */
static int parse_rope_scaling(void *field, const char *v, char *err)
{
    double *r = field;
    (void)err;
    if (strcmp(v, "none") == 0) {
        r[0] = -1;
        return 0;
    }
    int n = -1;
    if (sscanf(v, "llama3:%lf,%lf,%lf,%lf%n", &r[0], &r[1], &r[2], &r[3], &n) != 4 ||
        n != (int)strlen(v) || !(r[0] > 0) || r[3] != (double)(int)r[3])
        return -1;
    return 0;
}

static int parse_hash(void *field, const char *v, char *err)
{
    (void)err;
    return ckpt_parse_hash(v, field);
}

static int parse_compress(void *field, const char *v, char *err)
{
    return ckpt_parse_compress(v, field, err);
}

/* Every flag; the usage text is this table in this order. */
static const struct opt train_flags[] = {
    {.kind = OPT_SECTION, .help = "data and model:"},
    {"--data", OPT_STR, AT(o.data), .arg = "FILE|URI",
     .help = "training tokens (llm.c format, or an HDF5 file;\n"
             "fsdp-data prepare); s3://BUCKET/PREFIX or\n"
             "file://DIR/PREFIX: the token files there, read\n"
             "with ranged GETs ahead of the step"},
    {"--val-data", OPT_STR, AT(o.val_data), .arg = "FILE", .help = "validation tokens"},
    {"--h5-dataset", OPT_STR, AT(o.h5_dataset), .arg = "NAME",
     .help = "in an HDF5 --data or --val-data: the 1-D integer\n"
             "dataset of the tokens (default tokens)"},
    {"--model", OPT_STR, AT(o.model_name), .arg = "NAME", /* checked after the loop */
     .help = "a preset: tiny | small | gpt2-124m (gpt2);\n"
             "llama-tiny | smollm-135m | llama-1b (llama; shapes of\n"
             "SmolLM-135M and Llama 3.2 1B) (default tiny)"},
    {"--arch", OPT_WORD, AT(arch), .words = {"gpt2", "llama"}, .arg = "gpt2|llama",
     .help = "the model family: gpt2 (LayerNorm, GELU MLP, learned\n"
             "positions, tied head) or llama (RMSNorm, RoPE, SwiGLU,\n"
             "grouped-query attention); alone it picks tiny or\n"
             "llama-tiny (default: the preset's family)"},
    {"--layers", OPT_LLONG, AT(layers), .min = 1, .max = 256,
     .arg = "N --dim N --heads N --seq N --vocab N", .help = "override the preset"},
    {"--dim", OPT_LLONG, AT(dim), .min = 1, .max = 16384},
    {"--heads", OPT_LLONG, AT(heads), .min = 1, .max = 1024},
    {"--seq", OPT_LLONG, AT(seq), .min = 1, .max = 65536},
    {"--vocab", OPT_LLONG, AT(vocab), .min = 2, .max = 1 << 24},
    {"--kv-heads", OPT_LLONG, AT(kv_heads), .min = 1, .max = 1024, .arg = "N",
     .help = "llama: heads of K and V, dividing --heads (grouped-query\n"
             "attention; --heads N is multi-head attention)"},
    {"--ffn-dim", OPT_LLONG, AT(ffn_dim), .min = 1, .max = 1 << 18, .arg = "N",
     .help = "llama: the SwiGLU MLP's hidden width"},
    {"--rope-theta", OPT_NUM, AT(rope_theta), .lo = 1, .hi = 1e12, .arg = "X",
     .help = "llama: RoPE's base (llama-tiny 10000, llama-1b 500000)"},
    {"--norm-eps", OPT_NUM, AT(norm_eps), .lo = 0, .hi = 0.1, .open = 1, .arg = "X",
     .help = "llama: RMSNorm's epsilon (default 1e-5)"},
    {"--tie-embeddings", OPT_WORD, AT(tie_embeddings), .words = {"off", "on"}, .arg = "on|off",
     .help = "llama: the output head is the token embedding"},
    {"--rope-scaling", OPT_PARSE, AT(rope_scaling), .parse = parse_rope_scaling,
     .expect = "none or llama3:FACTOR,LOW,HIGH,ORIGINAL_CONTEXT", .arg = "S",
     .help = "llama: none, or Llama 3.1's frequency scaling\n"
             "llama3:FACTOR,LOW,HIGH,ORIGINAL_CONTEXT (config.json's\n"
             "factor, low_freq_factor, high_freq_factor and\n"
             "original_max_position_embeddings; llama-1b: 32,1,4,8192)"},
    {"--attn-bias", OPT_WORD, AT(attn_bias), .words = {"off", "on"}, .arg = "on|off",
     .help = "llama: biases on the q, k and v projections (Qwen2)"},

    {.kind = OPT_SECTION, .help = "training:"},
    {"--global-batch", OPT_LLONG, AT(o.global_batch), .min = 1, .max = 1 << 20, .arg = "G",
     .help = "sequences per step over all ranks (default 8)"},
    {"--micro-batch", OPT_LLONG, AT(o.micro_batch), .min = 1, .max = 1 << 20, .arg = "B",
     .help = "sequences per rank per forward (default G/ranks)"},
    {"--steps", OPT_LLONG, AT(o.steps), .min = 1, .max = 1LL << 40, .arg = "N",
     .help = "optimizer steps (default 200); the learning-rate\n"
             "schedule spans them however the run is cut"},
    {"--stop-at-step", OPT_LLONG, AT(o.stop_at_step), .min = 1, .max = 1LL << 40, .arg = "N",
     .help = "stop after step N with a checkpoint (rerun to go on)"},
    {"--time-limit", OPT_DURATION, AT(o.time_limit), .arg = "D",
     .help = "stop with a checkpoint before D has passed since the\n"
             "start (90s, 45m, 1.5h, 2d), or before Slurm's\n"
             "SLURM_JOB_END_TIME, whichever comes first"},
    {"--lr", OPT_NUM, AT(o.lr), .lo = 0, .hi = 10, .arg = "X",
     .help = "peak learning rate (default 3e-3)"},
    {"--min-lr-frac", OPT_NUM, AT(o.min_lr_frac), .lo = 0, .hi = 1, .arg = "F",
     .help = "cosine floor as a fraction of --lr (default 0.1)"},
    {"--warmup", OPT_LLONG, AT(o.warmup), .min = 0, .max = 1LL << 40, .arg = "N",
     .help = "linear warmup steps (default steps/20)"},
    {"--weight-decay", OPT_NUM, AT(o.weight_decay), .lo = 0, .hi = 10, .arg = "X",
     .help = "AdamW decoupled decay on matrices (default 0.1)"},
    {"--beta1", OPT_NUM, AT(o.beta1), .lo = 0, .hi = 0.999999, .arg = "X --beta2 X --eps X",
     .help = "AdamW (default 0.9, 0.95, 1e-8)"},
    {"--beta2", OPT_NUM, AT(o.beta2), .lo = 0, .hi = 0.999999},
    {"--eps", OPT_NUM, AT(o.eps), .lo = 1e-30, .hi = 1},
    {"--grad-clip", OPT_NUM, AT(o.grad_clip), .lo = 0, .hi = 1e30, .arg = "X",
     .help = "global gradient norm limit, 0 = off (default 1.0)"},
    {"--seed", OPT_LLONG, AT(seed), .min = 0, .max = INT64_MAX, .arg = "S",
     .help = "initialisation and data order (default 1337)"},
    {"--shard", OPT_PARSE, AT(o.shard), .parse = parse_shard,
     .expect = "one of full, grad-op, none", .arg = "full|grad-op|none",
     .help = "FSDP strategy (default full)"},
    {"--precision", OPT_WORD, AT(o.precision), .words = {"fp32", "bf16", "fp16"},
     .arg = "fp32|bf16|fp16",
     .help = "bf16: mixed precision, as FSDP's MixedPrecision with\n"
             "param_dtype bf16: bf16 all-gathers and matmuls, fp32\n"
             "master state, optimizer and checkpoints (default fp32;\n"
             "fp32 where the CPU lacks AVX512_BF16, said in the banner).\n"
             "fp16: fp16 all-gathers and gradients with dynamic loss\n"
             "scaling (ShardedGradScaler's: a step whose gradients\n"
             "overflow is skipped on every rank and the scale halved);\n"
             "the matmuls run in fp32 on the fp16 values"},
    {"--loss-scale", OPT_NUM, AT(o.loss_scale), .lo = TRAIN_SCALE_MIN, .hi = TRAIN_SCALE_MAX,
     .arg = "S", .help = "fp16: the first loss scale (default 65536)"},
    {"--loss-scale-window", OPT_LLONG, AT(o.scale_window), .min = 1, .max = INT32_MAX, .arg = "N",
     .help = "fp16: the scale doubles after N steps in a row\n"
             "without overflow (default 2000)"},
    {"--reduce-dtype", OPT_WORD, AT(o.reduce_bf16), .words = {"fp32", "bf16"}, .arg = "fp32|bf16",
     .help = "the gradients' type in their reduce-scatter\n"
             "(all-reduce for --shard none), as MixedPrecision's\n"
             "reduce_dtype: bf16 moves half the bytes; the shard\n"
             "accumulates in fp32 either way (default fp32)"},
    {"--prefetch", OPT_WORD, AT(o.prefetch), .words = {"off", "on"}, .arg = "on|off",
     .help = "overlap communication with compute: the next unit's\n"
             "all-gather and the last unit's reduce-scatter run\n"
             "while a unit computes (forward and backward prefetch;\n"
             "the same bits either way; default on)"},
    {"--unit-blocks", OPT_INT, AT(o.unit_blocks), .min = 1, .max = 1 << 20, .arg = "K",
     .help = "K consecutive blocks form one FSDP unit (the auto-wrap\n"
             "policy): gathered, freed and reduce-scattered as one;\n"
             "--shard full and grad-op; checkpoints do not depend\n"
             "on it (default 1)"},
    {"--bucket-mib", OPT_NUM, AT(o.bucket_mib), .lo = 0, .hi = 1 << 20, .arg = "X",
     .help = "gradient reduction in buckets of about X MiB: --shard\n"
             "none all-reduces each bucket as the last backward\n"
             "finishes it (default 25, 0: one all-reduce after the\n"
             "backward); grad-op reduce-scatters units of about X MiB\n"
             "(sets --unit-blocks); the same bits either way"},
    {"--activation-checkpointing", OPT_PARSE, AT(o.recompute_every), .parse = parse_recompute,
     .expect = "none, blocks or every-N (N in 1..256)", .arg = "none|blocks|every-N",
     .help = "recompute blocks' activations in the backward instead\n"
             "of keeping them: every block, or blocks 0, N, 2N, ...\n"
             "(default none; the losses are the same bits)"},
    {"--device", OPT_WORD, AT(o.cuda), .words = {"cpu", "cuda"}, .arg = "cpu|cuda",
     .help = "where each rank computes: cuda runs one rank per GPU\n"
             "(device = rank on its host), NCCL collectives, the\n"
             "same checkpoints (default cpu)"},
    {"--threads", OPT_LLONG, AT(o.threads), .min = 1, .max = 1024, .arg = "N",
     .help = "compute threads per rank (default cores / local ranks)"},
    {"--cpu-kernels", OPT_STR, AT(o.cpu_kernels), .arg = "ISA", /* checked against the CPU */
     .help = "auto | x86-64 | x86-64-v3 | x86-64-v4: the CPU kernels'\n"
             "instruction set (default auto: the widest this CPU\n"
             "runs; name one to get the same bits on every host)"},
    {"--matmul", OPT_STR, AT(o.matmul), .arg = "LIB", /* checked against the build in main */
     .help = "auto | onednn | openblas: the library for the model's\n"
             "matmuls (default auto: oneDNN when the build has it)"},

    {.kind = OPT_SECTION, .help = "checkpoints:"},
    {"--ckpt", OPT_STR, AT(o.ckpt.uri), .arg = "URI",
     .help = "where checkpoints live: a path, file://PATH or\n"
             "s3://BUCKET/PREFIX (AWS_* settings, see README)"},
    {"--s3-endpoint", OPT_STR, AT(s3_endpoint), .arg = "URL",
     .help = "S3 endpoint (else AWS_ENDPOINT_URL)"},
    {"--ckpt-every", OPT_LLONG, AT(o.ckpt.every), .min = 1, .max = 1LL << 40, .arg = "N",
     .help = "checkpoint every N steps, and always after the last"},
    {"--keep", OPT_LLONG, AT(o.ckpt.keep), .min = 1, .max = 1 << 20, .arg = "K",
     .help = "committed checkpoints to keep (default 3)"},
    {"--resume", OPT_WORD, AT(o.ckpt.resume), .words = {"none", "auto"}, .expect = "auto or none",
     .arg = "auto|none",
     .help = "auto: continue from the newest committed checkpoint\n"
             "that verifies (default); none: start fresh"},
    {"--compress", OPT_PARSE, AT(o.ckpt.write), .parse = parse_compress, .arg = "C",
     .help = "none | zstd[:LEVEL] | zstd+shuffle[:LEVEL]\n(default zstd+shuffle:1)"},
    {"--ckpt-chunk-kib", OPT_LLONG, AT(chunk_kib), .min = 1, .max = 256 * 1024, .arg = "N",
     .help = "raw bytes per chunk (default 4096)"},
    {"--ckpt-hash", OPT_PARSE, AT(o.ckpt.write.hash), .parse = parse_hash,
     .expect = "sha256 or xxh3", .arg = "H",
     .help = "xxh3 | sha256: the chunks' digest (default xxh3:\n"
             "XXH3-128, ten times faster to verify; sha256 when\n"
             "the digests must be cryptographic)"},
    {"--ckpt-async", OPT_SWITCH, AT(o.ckpt.async),
     .help = "write checkpoints in the background (training goes on)"},
    {"--mem-snapshot-every", OPT_LLONG, AT(o.snap_every), .min = 1, .max = 1LL << 40, .arg = "K",
     .help = "also snapshot the state every K steps into RAM (a\n"
             "store on tmpfs, --mem-snapshot-dir): a relaunch on\n"
             "this host resumes from it, no shard read from --ckpt;\n"
             "costs up to 2x the rank's shard in RAM"},
    {"--mem-snapshot-dir", OPT_STR, AT(o.snap_dir), .arg = "DIR",
     .help = "where (default /dev/shm/fsdp-snap-<digest of --ckpt>)"},
    {"--verify-load", OPT_WORD, AT(o.ckpt.verify_load), .words = {"off", "on"}, .arg = "on",
     .help = "after loading, check the state's digest against the\n"
             "checkpoint's (proves a reshard; reads it twice)"},

    {.kind = OPT_SECTION, .help = "output:"},
    {"--allow-changed", OPT_PARSE, AT(o.allow_changed), .parse = parse_allow,
     .expect = "a comma list of data, seed, global-batch, lr, optimizer, all", .arg = "LIST",
     .help = "resume although these differ from the checkpoint's\n"
             "(data, seed, global-batch, lr: --lr --min-lr-frac\n"
             "--warmup, optimizer: betas, eps, weight decay, clipping,\n"
             "or all); without it a difference is refused"},
    {"--log", OPT_STR, AT(o.log_path), .arg = "FILE", .help = "one JSON object per step"},
    {"--log-every", OPT_LLONG, AT(o.log_every), .min = 1, .max = 1LL << 40, .arg = "K",
     .help = "progress line every K steps (default 1)"},
    {"--log-samples", OPT_WORD, AT(o.log_samples), .words = {"off", "on"}, .arg = "on",
     .help = "add each step's global sample indices to the log"},
    {"--val-every", OPT_LLONG, AT(o.val_every), .min = 0, .max = 1LL << 40, .arg = "N",
     .help = "validation loss every N steps (default: at the end)"},
    {"--val-samples", OPT_LLONG, AT(o.val_samples), .min = 1, .max = 1 << 24, .arg = "N",
     .help = "validation sequences (default 64)"},
    {"--sample", OPT_LLONG, AT(o.sample_len), .min = 0, .max = 1 << 20, .arg = "N",
     .help = "print N generated tokens at the end"},
    {"--temperature", OPT_NUM, AT(o.temperature), .lo = 1e-3, .hi = 100, .arg = "X",
     .help = "sampling temperature (default 0.8)"},
    {"--help", OPT_HELP, .help = "this text"},
    {"-h", OPT_HELP, .help = NULL}, /* not listed */
};

void train_opts_usage(void)
{
    printf("usage: fsdp-train --data FILE [options]\n"
           "       mpirun -np N fsdp-train --data FILE [options]\n");
    opts_usage(stdout, train_flags, OPTS_LEN(train_flags), 22);
}

static void set_defaults(struct given *g)
{
    struct train_opts *o = &g->o;
    memset(g, 0, sizeof *g);
    g->arch = g->tie_embeddings = g->attn_bias = -1;
    o->cpu_kernels = "auto";
    o->matmul = "auto";
    o->global_batch = 8;
    o->steps = 200;
    o->warmup = -1;
    o->val_samples = 64;
    o->log_every = 1;
    o->lr = 3e-3;
    o->temperature = 0.8;
    o->min_lr_frac = 0.1;
    o->weight_decay = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->grad_clip = 1.0;
    o->loss_scale = 65536.0;
    o->scale_window = 2000;
    o->shard = FSDP_SHARD_FULL;
    o->prefetch = 1;
    o->bucket_mib = -1;
    o->ckpt.keep = 3;
    o->ckpt.resume = 1;
    o->ckpt.write = CKPT_WRITE_DEFAULTS;
    g->chunk_kib = 4096;
    g->seed = 1337;
}

/* --model, --arch and the overrides: the model config and its label */
static int set_model(struct given *g, char *err)
{
    struct train_opts *o = &g->o;
    if (!o->model_name)
        o->model_name = g->arch == MODEL_LLAMA ? "llama-tiny" : "tiny";
    if (model_preset(o->model_name, &o->cfg))
        return fsdp_err(err, "--model '%s' is not one of %s", o->model_name, model_preset_names());
    if (g->arch >= 0 && g->arch != o->cfg.arch)
        return fsdp_err(err, "--arch %s and --model %s (a %s preset) disagree: give one",
                        model_arch_name(g->arch), o->model_name, model_arch_name(o->cfg.arch));
    const char *llama_flag = g->kv_heads              ? "--kv-heads"
                             : g->ffn_dim             ? "--ffn-dim"
                             : g->rope_theta          ? "--rope-theta"
                             : g->norm_eps            ? "--norm-eps"
                             : g->tie_embeddings >= 0 ? "--tie-embeddings"
                             : g->attn_bias >= 0      ? "--attn-bias"
                             : g->rope_scaling[0]     ? "--rope-scaling"
                                                      : NULL;
    if (llama_flag && o->cfg.arch != MODEL_LLAMA)
        return fsdp_err(err, "%s is the llama family's; --model %s is %s (use --arch llama)",
                        llama_flag, o->model_name, model_arch_name(o->cfg.arch));
    struct model_config *c = &o->cfg;
    c->layers = g->layers ? (int)g->layers : c->layers;
    c->dim = g->dim ? (int)g->dim : c->dim;
    c->heads = g->heads ? (int)g->heads : c->heads;
    c->seq = g->seq ? (int)g->seq : c->seq;
    if (g->vocab) {
        c->vocab = (int)g->vocab;
        c->vocab_pad = model_vocab_pad((int)g->vocab);
    }
    c->kv_heads = g->kv_heads ? (int)g->kv_heads : c->kv_heads;
    c->ffn_dim = g->ffn_dim ? (int)g->ffn_dim : c->ffn_dim;
    c->rope_theta = g->rope_theta ? g->rope_theta : c->rope_theta;
    c->norm_eps = g->norm_eps ? g->norm_eps : c->norm_eps;
    c->tie_embeddings = g->tie_embeddings >= 0 ? g->tie_embeddings : c->tie_embeddings;
    c->attn_bias = g->attn_bias >= 0 ? g->attn_bias : c->attn_bias;
    if (g->rope_scaling[0]) {
        const int on = g->rope_scaling[0] > 0;
        c->rope_factor = on ? g->rope_scaling[0] : 0;
        c->rope_low_freq = on ? g->rope_scaling[1] : 0;
        c->rope_high_freq = on ? g->rope_scaling[2] : 0;
        c->rope_orig_ctx = on && g->rope_scaling[3] < (1 << 25) ? (int)g->rope_scaling[3] : 0;
        if (on && !c->rope_orig_ctx)
            return fsdp_err(err, "--rope-scaling: the original context must be 1..2^24");
    }
    int custom = g->layers || g->dim || g->heads || g->seq || g->vocab || llama_flag;
    snprintf(o->model_label, sizeof o->model_label, "%s", custom ? "custom" : o->model_name);
    return 0;
}

/* What the flags mean together. */
static int check_combinations(const struct train_opts *o, char *err)
{
    if ((o->snap_every || o->snap_dir) && !o->ckpt.uri)
        return fsdp_err(err,
                        "%s needs --ckpt URI: a snapshot in memory stands beside the "
                        "checkpoints, not instead of them",
                        o->snap_every ? "--mem-snapshot-every" : "--mem-snapshot-dir");
    if (o->snap_dir && !o->snap_every)
        return fsdp_err(err, "--mem-snapshot-dir needs --mem-snapshot-every K");
    if (o->snap_dir && strncmp(o->snap_dir, "s3://", 5) == 0)
        return fsdp_err(err, "--mem-snapshot-dir %s: a directory on this host (tmpfs), not S3",
                        o->snap_dir);
    if ((o->ckpt.every || o->ckpt.async) && !o->ckpt.uri)
        return fsdp_err(err, "%s needs --ckpt URI",
                        o->ckpt.async ? "--ckpt-async" : "--ckpt-every");
    if (o->unit_blocks && o->shard == FSDP_SHARD_NONE)
        return fsdp_err(err, "--unit-blocks groups what --shard full and grad-op gather; "
                             "--shard none gathers nothing");
    if (o->bucket_mib >= 0 && o->shard == FSDP_SHARD_FULL)
        return fsdp_err(err, "--bucket-mib: --shard full reduce-scatters each unit as its "
                             "backward ends (--unit-blocks sets a unit's size)");
    if (o->bucket_mib >= 0 && o->unit_blocks)
        return fsdp_err(err, "--bucket-mib and --unit-blocks both size grad-op's units: give one");
    if (o->unit_blocks > o->cfg.layers)
        return fsdp_err(err, "--unit-blocks %d exceeds the model's %d blocks", o->unit_blocks,
                        o->cfg.layers);
    return model_config_check(&o->cfg, err);
}

int train_opts_parse(struct train_opts *out, int argc, char **argv, char *err)
{
    memset(out, 0, sizeof *out);
    struct given g;
    struct train_opts *o = &g.o;
    set_defaults(&g);
    int next = 1;
    int rc = opts_parse(train_flags, OPTS_LEN(train_flags), &g, argc, argv, &next, err);
    if (rc)
        return rc;
    if (next < argc)
        return fsdp_err(err, "unexpected argument '%s'", argv[next]);
    if (g.s3_endpoint)
        setenv("AWS_ENDPOINT_URL", g.s3_endpoint, 1); /* read by the S3 backend */
    if (!o->data)
        return fsdp_err(err, "--data FILE is required");
    const char *end = getenv("SLURM_JOB_END_TIME"); /* Slurm's: when the job is killed */
    long long end_s;
    if (end && *end) {
        if (fsdp_parse_i64(end, 1, INT64_MAX / 2, &end_s))
            return fsdp_err(err, "SLURM_JOB_END_TIME '%.40s' is not a Unix time in seconds", end);
        o->slurm_end = (double)end_s;
    }
    if (set_model(&g, err))
        return -1;
    o->seed = (uint64_t)g.seed;
    o->ckpt.write.chunk_bytes = (size_t)g.chunk_kib * 1024;
    if (o->warmup < 0)
        o->warmup = o->steps / 20;
    if (check_combinations(o, err))
        return -1;
    *out = g.o;
    return 0;
}
