/*
 * train_opts.c - parsing and checking fsdp-train's flags.
 *
 * Model shape: --model picks a preset; --layers/--dim/--heads/--seq/--vocab
 * override single fields, in any order relative to --model.
 */
#include "train_opts.h"

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void train_opts_usage(void)
{
    printf("usage: fsdp-train --data FILE [options]\n"
           "       mpirun -np N fsdp-train --data FILE [options]\n"
           "\n"
           "data and model:\n"
           "  --data FILE            training tokens (llm.c format; fsdp-data prepare)\n"
           "  --val-data FILE        validation tokens\n"
           "  --model NAME           tiny | small | gpt2-124m (default tiny)\n"
           "  --layers N --dim N --heads N --seq N --vocab N   override the preset\n"
           "\n"
           "training:\n"
           "  --global-batch G       sequences per step over all ranks (default 8)\n"
           "  --micro-batch B        sequences per rank per forward (default G/ranks)\n"
           "  --steps N              optimizer steps (default 200); the learning-rate\n"
           "                         schedule spans them however the run is cut\n"
           "  --stop-at-step N       stop after step N with a checkpoint (rerun to go on)\n"
           "  --time-limit D         stop with a checkpoint before D has passed since the\n"
           "                         start (90s, 45m, 1.5h, 2d), or before Slurm's\n"
           "                         SLURM_JOB_END_TIME, whichever comes first\n"
           "  --lr X                 peak learning rate (default 3e-3)\n"
           "  --min-lr-frac F        cosine floor as a fraction of --lr (default 0.1)\n"
           "  --warmup N             linear warmup steps (default steps/20)\n"
           "  --weight-decay X       AdamW decoupled decay on matrices (default 0.1)\n"
           "  --beta1 X --beta2 X --eps X   AdamW (default 0.9, 0.95, 1e-8)\n"
           "  --grad-clip X          global gradient norm limit, 0 = off (default 1.0)\n"
           "  --seed S               initialisation and data order (default 1337)\n"
           "  --shard full|grad-op|none   FSDP strategy (default full)\n"
           "  --precision fp32|bf16  bf16: mixed precision, as FSDP's MixedPrecision with\n"
           "                         param_dtype bf16: bf16 all-gathers and matmuls, fp32\n"
           "                         master state, optimizer and checkpoints (default fp32;\n"
           "                         fp32 where the CPU lacks AVX512_BF16, said in the banner)\n"
           "  --reduce-dtype fp32|bf16  the gradients' type in their reduce-scatter\n"
           "                         (all-reduce for --shard none), as MixedPrecision's\n"
           "                         reduce_dtype: bf16 moves half the bytes; the shard\n"
           "                         accumulates in fp32 either way (default fp32)\n"
           "  --prefetch on|off      overlap communication with compute: the next unit's\n"
           "                         all-gather and the last unit's reduce-scatter run\n"
           "                         while a unit computes (forward and backward prefetch;\n"
           "                         the same bits either way; default on)\n"
           "  --unit-blocks K        K consecutive blocks form one FSDP unit (the auto-wrap\n"
           "                         policy): gathered, freed and reduce-scattered as one;\n"
           "                         --shard full and grad-op; checkpoints do not depend\n"
           "                         on it (default 1)\n"
           "  --bucket-mib X         gradient reduction in buckets of about X MiB: --shard\n"
           "                         none all-reduces each bucket as the last backward\n"
           "                         finishes it (default 25, 0: one all-reduce after the\n"
           "                         backward); grad-op reduce-scatters units of about X MiB\n"
           "                         (sets --unit-blocks); the same bits either way\n"
           "  --activation-checkpointing none|blocks|every-N\n"
           "                         recompute blocks' activations in the backward instead\n"
           "                         of keeping them: every block, or blocks 0, N, 2N, ...\n"
           "                         (default none; the losses are the same bits)\n"
           "  --device cpu|cuda      where each rank computes: cuda runs one rank per GPU\n"
           "                         (device = rank on its host), NCCL collectives, the\n"
           "                         same checkpoints (default cpu)\n"
           "  --threads N            compute threads per rank (default cores / local ranks)\n"
           "  --cpu-kernels ISA      auto | x86-64 | x86-64-v3 | x86-64-v4: the CPU kernels'\n"
           "                         instruction set (default auto: the widest this CPU\n"
           "                         runs; name one to get the same bits on every host)\n"
           "  --matmul LIB           auto | onednn | openblas: the library for the model's\n"
           "                         matmuls (default auto: oneDNN when the build has it)\n"
           "\n"
           "checkpoints:\n"
           "  --ckpt URI             where checkpoints live: a path, file://PATH or\n"
           "                         s3://BUCKET/PREFIX (AWS_* settings, see README)\n"
           "  --s3-endpoint URL      S3 endpoint (else AWS_ENDPOINT_URL)\n"
           "  --ckpt-every N         checkpoint every N steps, and always after the last\n"
           "  --keep K               committed checkpoints to keep (default 3)\n"
           "  --resume auto|none     auto: continue from the newest committed checkpoint\n"
           "                         that verifies (default); none: start fresh\n"
           "  --compress C           none | zstd[:LEVEL] | zstd+shuffle[:LEVEL]\n"
           "                         (default zstd+shuffle:1)\n"
           "  --ckpt-chunk-kib N     raw bytes per chunk (default 4096)\n"
           "  --ckpt-hash H          xxh3 | sha256: the chunks' digest (default xxh3:\n"
           "                         XXH3-128, ten times faster to verify; sha256 when\n"
           "                         the digests must be cryptographic)\n"
           "  --ckpt-async           write checkpoints in the background (training goes on)\n"
           "  --verify-load on       after loading, check the state's digest against the\n"
           "                         checkpoint's (proves a reshard; reads it twice)\n"
           "\n"
           "output:\n"
           "  --log FILE             one JSON object per step\n"
           "  --log-every K          progress line every K steps (default 1)\n"
           "  --log-samples on       add each step's global sample indices to the log\n"
           "  --val-every N          validation loss every N steps (default: at the end)\n"
           "  --val-samples N        validation sequences (default 64)\n"
           "  --sample N             print N generated tokens at the end\n"
           "  --temperature X        sampling temperature (default 0.8)\n"
           "  --help                 this text\n");
}

static int need_int(const char *flag, const char *v, long long lo, long long hi, long long *out,
                    char *err)
{
    if (fsdp_parse_i64(v, lo, hi, out))
        return fsdp_err(err, "%s '%s' is not an integer in %lld..%lld", flag, v, lo, hi);
    return 0;
}

static int need_num(const char *flag, const char *v, double lo, double hi, double *out, char *err)
{
    if (fsdp_parse_f64(v, out) || *out < lo || *out > hi)
        return fsdp_err(err, "%s '%s' is not a number in %g..%g", flag, v, lo, hi);
    return 0;
}

/* v is one of two words: *out = 0 for the first, 1 for the second */
static int need_word(const char *flag, const char *v, const char *w0, const char *w1, int *out,
                     char *err)
{
    if (strcmp(v, w0) != 0 && strcmp(v, w1) != 0)
        return fsdp_err(err, "%s '%s' is not %s or %s", flag, v, w0, w1);
    *out = strcmp(v, w1) == 0;
    return 0;
}

int train_opts_parse(struct train_opts *o, int argc, char **argv, char *err)
{
    memset(o, 0, sizeof *o);
    o->model_name = "tiny";
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
    o->seed = 1337;
    o->shard = FSDP_SHARD_FULL;
    o->prefetch = 1;
    o->bucket_mib = -1;
    o->ckpt.keep = 3;
    o->ckpt.resume = 1;
    o->ckpt.write = CKPT_WRITE_DEFAULTS;
    long long chunk_kib = 4096;
    long long layers = 0, dim = 0, heads = 0, seq = 0, vocab = 0, seed = 1337;

    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0)
            return 1;
        if (strncmp(f, "--", 2) != 0)
            return fsdp_err(err, "unexpected argument '%s'", f);
        if (strcmp(f, "--ckpt-async") == 0) { /* the one flag without a value */
            o->ckpt.async = 1;
            continue;
        }
        if (i + 1 >= argc)
            return fsdp_err(err, "%s needs a value", f);
        const char *v = argv[++i];
        int rc = 0;
        if (strcmp(f, "--data") == 0)
            o->data = v;
        else if (strcmp(f, "--val-data") == 0)
            o->val_data = v;
        else if (strcmp(f, "--log") == 0)
            o->log_path = v;
        else if (strcmp(f, "--verify-load") == 0)
            rc = need_word(f, v, "off", "on", &o->ckpt.verify_load, err);
        else if (strcmp(f, "--log-samples") == 0)
            rc = need_word(f, v, "off", "on", &o->log_samples, err);
        else if (strcmp(f, "--model") == 0)
            o->model_name = v;
        else if (strcmp(f, "--cpu-kernels") == 0)
            o->cpu_kernels = v; /* checked against the CPU in main */
        else if (strcmp(f, "--matmul") == 0)
            o->matmul = v; /* checked against the build in main */
        else if (strcmp(f, "--device") == 0) {
            if (strcmp(v, "cpu") == 0 || strcmp(v, "cuda") == 0)
                o->cuda = v[1] == 'u';
            else
                rc = fsdp_err(err, "--device '%s' is not cpu or cuda", v);
        }
        else if (strcmp(f, "--layers") == 0)
            rc = need_int(f, v, 1, 256, &layers, err);
        else if (strcmp(f, "--dim") == 0)
            rc = need_int(f, v, 1, 16384, &dim, err);
        else if (strcmp(f, "--heads") == 0)
            rc = need_int(f, v, 1, 1024, &heads, err);
        else if (strcmp(f, "--seq") == 0)
            rc = need_int(f, v, 1, 65536, &seq, err);
        else if (strcmp(f, "--vocab") == 0)
            rc = need_int(f, v, 2, 65536, &vocab, err);
        else if (strcmp(f, "--global-batch") == 0)
            rc = need_int(f, v, 1, 1 << 20, &o->global_batch, err);
        else if (strcmp(f, "--micro-batch") == 0)
            rc = need_int(f, v, 1, 1 << 20, &o->micro_batch, err);
        else if (strcmp(f, "--steps") == 0)
            rc = need_int(f, v, 1, 1LL << 40, &o->steps, err);
        else if (strcmp(f, "--stop-at-step") == 0)
            rc = need_int(f, v, 1, 1LL << 40, &o->stop_at_step, err);
        else if (strcmp(f, "--time-limit") == 0) {
            if (fsdp_parse_duration(v, &o->time_limit))
                rc = fsdp_err(err, "--time-limit '%s' is not a duration (90, 90s, 45m, 1.5h, "
                                   "2d)", v);
        }
        else if (strcmp(f, "--warmup") == 0)
            rc = need_int(f, v, 0, 1LL << 40, &o->warmup, err);
        else if (strcmp(f, "--val-every") == 0)
            rc = need_int(f, v, 0, 1LL << 40, &o->val_every, err);
        else if (strcmp(f, "--val-samples") == 0)
            rc = need_int(f, v, 1, 1 << 24, &o->val_samples, err);
        else if (strcmp(f, "--log-every") == 0)
            rc = need_int(f, v, 1, 1LL << 40, &o->log_every, err);
        else if (strcmp(f, "--sample") == 0)
            rc = need_int(f, v, 0, 1 << 20, &o->sample_len, err);
        else if (strcmp(f, "--threads") == 0)
            rc = need_int(f, v, 1, 1024, &o->threads, err);
        else if (strcmp(f, "--seed") == 0)
            rc = need_int(f, v, 0, INT64_MAX, &seed, err);
        else if (strcmp(f, "--temperature") == 0)
            rc = need_num(f, v, 1e-3, 100, &o->temperature, err);
        else if (strcmp(f, "--lr") == 0)
            rc = need_num(f, v, 0, 10, &o->lr, err);
        else if (strcmp(f, "--min-lr-frac") == 0)
            rc = need_num(f, v, 0, 1, &o->min_lr_frac, err);
        else if (strcmp(f, "--weight-decay") == 0)
            rc = need_num(f, v, 0, 10, &o->weight_decay, err);
        else if (strcmp(f, "--beta1") == 0)
            rc = need_num(f, v, 0, 0.999999, &o->beta1, err);
        else if (strcmp(f, "--beta2") == 0)
            rc = need_num(f, v, 0, 0.999999, &o->beta2, err);
        else if (strcmp(f, "--eps") == 0)
            rc = need_num(f, v, 1e-30, 1, &o->eps, err);
        else if (strcmp(f, "--grad-clip") == 0)
            rc = need_num(f, v, 0, 1e30, &o->grad_clip, err);
        else if (strcmp(f, "--ckpt") == 0)
            o->ckpt.uri = v;
        else if (strcmp(f, "--s3-endpoint") == 0)
            setenv("AWS_ENDPOINT_URL", v, 1); /* read by the S3 backend */
        else if (strcmp(f, "--ckpt-every") == 0)
            rc = need_int(f, v, 1, 1LL << 40, &o->ckpt.every, err);
        else if (strcmp(f, "--keep") == 0)
            rc = need_int(f, v, 1, 1 << 20, &o->ckpt.keep, err);
        else if (strcmp(f, "--ckpt-chunk-kib") == 0)
            rc = need_int(f, v, 1, 256 * 1024, &chunk_kib, err);
        else if (strcmp(f, "--ckpt-hash") == 0) {
            if (ckpt_parse_hash(v, &o->ckpt.write.hash))
                rc = fsdp_err(err, "--ckpt-hash: '%s' is not sha256 or xxh3", v);
        } else if (strcmp(f, "--compress") == 0) {
            char sub[FSDP_ERR_LEN];
            if (ckpt_parse_compress(v, &o->ckpt.write, sub))
                rc = fsdp_err(err, "%s", sub);
        } else if (strcmp(f, "--resume") == 0) {
            if (strcmp(v, "auto") == 0 || strcmp(v, "none") == 0)
                o->ckpt.resume = strcmp(v, "auto") == 0;
            else
                rc = fsdp_err(err, "--resume '%s' is not auto or none", v);
        } else if (strcmp(f, "--unit-blocks") == 0) {
            long long k = 0;
            rc = need_int(f, v, 1, 1 << 20, &k, err);
            o->unit_blocks = (int)k;
        } else if (strcmp(f, "--bucket-mib") == 0) {
            rc = need_num(f, v, 0, 1 << 20, &o->bucket_mib, err);
        } else if (strcmp(f, "--prefetch") == 0) {
            rc = need_word(f, v, "off", "on", &o->prefetch, err);
        } else if (strcmp(f, "--reduce-dtype") == 0) {
            rc = need_word(f, v, "fp32", "bf16", &o->reduce_bf16, err);
        } else if (strcmp(f, "--precision") == 0) {
            rc = need_word(f, v, "fp32", "bf16", &o->bf16, err);
        } else if (strcmp(f, "--activation-checkpointing") == 0) {
            if (fsdp_recompute_parse(v, &o->recompute_every))
                rc = fsdp_err(err, "--activation-checkpointing '%s' is not none, blocks or "
                                   "every-N (N in 1..256)", v);
        } else if (strcmp(f, "--shard") == 0) {
            if (fsdp_shard_parse(v, &o->shard))
                rc = fsdp_err(err, "--shard '%s' is not one of full, grad-op, none", v);
        } else
            return fsdp_err(err, "unknown option '%s'", f);
        if (rc)
            return rc;
    }
    if (!o->data)
        return fsdp_err(err, "--data FILE is required");
    const char *end = getenv("SLURM_JOB_END_TIME"); /* Slurm's: when the job is killed */
    long long end_s;
    if (end && *end) {
        if (fsdp_parse_i64(end, 1, INT64_MAX / 2, &end_s))
            return fsdp_err(err, "SLURM_JOB_END_TIME '%.40s' is not a Unix time in seconds", end);
        o->slurm_end = (double)end_s;
    }
    if (model_preset(o->model_name, &o->cfg))
        return fsdp_err(err, "--model '%s' is not one of tiny, small, gpt2-124m", o->model_name);
    if (layers)
        o->cfg.layers = (int)layers;
    if (dim)
        o->cfg.dim = (int)dim;
    if (heads)
        o->cfg.heads = (int)heads;
    if (seq)
        o->cfg.seq = (int)seq;
    if (vocab) {
        o->cfg.vocab = (int)vocab;
        o->cfg.vocab_pad = model_vocab_pad((int)vocab);
    }
    snprintf(o->model_label, sizeof o->model_label, "%s",
             layers || dim || heads || seq || vocab ? "custom" : o->model_name);
    o->seed = (uint64_t)seed;
    o->ckpt.write.chunk_bytes = (size_t)chunk_kib * 1024;
    if ((o->ckpt.every || o->ckpt.async) && !o->ckpt.uri)
        return fsdp_err(err, "%s needs --ckpt URI", o->ckpt.async ? "--ckpt-async" : "--ckpt-every");
    if (o->warmup < 0)
        o->warmup = o->steps / 20;
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
