/*
 * train_eval.c - fsdp-train's validation loss and its samples from the
 * model (train.h).
 */
#include "train.h"

#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mean validation loss over the first val_samples sequences, split over
 * ranks in contiguous slices. */
int train_validate(struct trainer *t, double *out, char *err)
{
    const int T = t->model.cfg.seq, W = t->comm.world;
    struct sample_stream vs;
    char sub[FSDP_ERR_LEN];
    if (sample_stream_init(&vs, &t->val_file, T, 0, sub))
        return fsdp_err(err, "%s: %s", t->o.val_data, sub);
    uint64_t n =
        (uint64_t)t->o.val_samples < vs.nsamples ? (uint64_t)t->o.val_samples : vs.nsamples;
    uint64_t per = n / (uint64_t)W / (uint64_t)t->micro * (uint64_t)t->micro;
    if (per == 0) {
        sample_stream_free(&vs);
        return fsdp_err(err, "%s: too few validation sequences (%llu) for %d ranks x %d",
                        t->o.val_data, (unsigned long long)n, W, t->micro);
    }
    double sum = 0;
    for (uint64_t s = 0; s < per; s += (uint64_t)t->micro) {
        for (int b = 0; b < t->micro; b++)
            if (sample_stream_fetch(&vs, (uint64_t)t->comm.rank * per + s + (uint64_t)b,
                                    t->in + (size_t)b * T, t->tgt + (size_t)b * T, err))
                goto fail;
        fsdp_set_batch(&t->eng, t->in, t->tgt);
        double l;
        if (fsdp_forward(&t->eng, t->micro, T, &l, err))
            goto fail;
        sum += l;
    }
    fsdp_release(&t->eng);
    if (t->comm.allreduce_sum_f64(&t->comm, &sum, 1, err))
        goto fail;
    sample_stream_free(&vs);
    *out = sum / ((double)per * (double)W * T);
    return 0;
fail:
    sample_stream_free(&vs);
    return -1;
}

/* Autoregressive sampling from the end-of-text token; every rank computes
 * the same tokens (same seed), rank 0 prints them. */
int train_generate(struct trainer *t, char *err)
{
    const int T = t->model.cfg.seq, V = t->model.cfg.vocab, Vp = t->model.cfg.vocab_pad;
    const int n = (int)t->o.sample_len;
    int32_t *ctx = calloc((size_t)n + 1, sizeof *ctx);
    float *row = malloc((size_t)Vp * sizeof *row);
    if (!ctx || !row) {
        free(ctx);
        free(row);
        return fsdp_err(err, "sample: out of memory");
    }
    struct fsdp_rng rng = {t->sample_rng};
    ctx[0] = DATA_EOT;
    int rc = 0;
    if (t->comm.rank == 0)
        printf("--- sample (%d tokens) ---\n", n);
    for (int i = 1; i <= n; i++) {
        int len = i < T ? i : T;
        memset(t->in, 0, (size_t)t->micro * T * sizeof *t->in);
        memcpy(t->in, ctx + i - len, (size_t)len * sizeof *ctx);
        fsdp_set_batch(&t->eng, t->in, NULL);
        if ((rc = fsdp_forward(&t->eng, 1, len, NULL, err)))
            break;
        fsdp_logits_row(&t->eng, len - 1, row);
        float mx = -INFINITY;
        for (int v = 0; v < V; v++)
            mx = fmaxf(mx, row[v]);
        const double inv_temp = 1.0 / t->o.temperature;
        double sum = 0;
        for (int v = 0; v < V; v++)
            sum += exp((double)(row[v] - mx) * inv_temp);
        double u = fsdp_rng_uniform(&rng) * sum, acc = 0;
        int tok = V - 1;
        for (int v = 0; v < V; v++) {
            acc += exp((double)(row[v] - mx) * inv_temp);
            if (u < acc) {
                tok = v;
                break;
            }
        }
        ctx[i] = tok;
        if (t->comm.rank == 0) {
            if (V <= 256)
                putchar(tok == DATA_EOT ? '\n' : tok);
            else
                printf("%d ", tok);
        }
    }
    fsdp_release(&t->eng);
    if (t->comm.rank == 0) {
        printf("\n--- end of sample ---\n");
        fflush(stdout);
    }
    free(ctx);
    free(row);
    return rc;
}
