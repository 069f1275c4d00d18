/*
 * train_ckpt.c - fsdp-train's checkpoints: the trainer's state in them,
 * resume, and the saves, now or in the background (train.h; the protocol
 * itself is checkpoint.c's).
 */
#include "train.h"

#include "heartbeat.h"
#include "util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The training data's identity: its size and the SHA-256 of its header and
 * blocks spread over it (token_file_identity_parts): a few hundred KiB read
 * whatever its size, and no two token files a user would mix up agree on
 * all of it. Data in a store has it from its open (data_store.c, the same
 * bytes over its objects back to back: one object's is its file's). */
static json_t *data_identity(const struct token_file *f)
{
    char hex[65];
    uint64_t len;
    if (f->remote) {
        snprintf(hex, sizeof hex, "%s", token_file_store_identity(f, &len));
    } else {
        uint64_t at[TOKEN_ID_BLOCKS + 1];
        size_t n[TOKEN_ID_BLOCKS + 1], total = 0;
        const int parts = token_file_identity_parts(f->map_len, at, n);
        len = f->map_len;
        for (int i = 0; i < parts; i++)
            total += n[i];
        unsigned char *buf = malloc(total ? total : 1);
        if (!buf)
            return NULL;
        for (size_t i = 0, k = 0; i < (size_t)parts; k += n[i], i++)
            memcpy(buf + k, (const unsigned char *)f->map + at[i], n[i]);
        int rc = fsdp_sha256_hex(buf, total, hex);
        free(buf);
        if (rc)
            return NULL;
    }
    return json_pack("{s:I, s:I, s:s}", "bytes", (json_int_t)len, "tokens", (json_int_t)f->ntokens,
                     "sample_sha256", hex);
}

static json_t *trainer_state(const struct trainer *t, long long step)
{
    const struct train_opts *o = &t->o;
    char rng[24];
    snprintf(rng, sizeof rng, "%016llx", (unsigned long long)t->sample_rng);
    json_t *data = data_identity(&t->train_file);
    if (!data)
        return NULL;
    json_t *state = json_pack(
        "{s:I, s:I, s:I, s:I, s:s, s:I, s:i, s:o, s:{s:f, s:f, s:I, s:I}, "
        "s:{s:s, s:f, s:f, s:f, s:f, s:f, s:I}, s:I}",
        "step", (json_int_t)step, "tokens_seen", (json_int_t)(t->cursor * (uint64_t)o->cfg.seq),
        "data_cursor", (json_int_t)t->cursor, "seed", (json_int_t)o->seed, "rng_state", rng,
        "global_batch", (json_int_t)o->global_batch, "seq", o->cfg.seq, "data", data, "schedule",
        "lr", o->lr, "min_lr_frac", o->min_lr_frac, "warmup", (json_int_t)o->warmup, "total_steps",
        (json_int_t)o->steps, "optimizer", "name", "adamw", "beta1", o->beta1, "beta2", o->beta2,
        "eps", o->eps, "weight_decay", o->weight_decay, "grad_clip", o->grad_clip, "t",
        (json_int_t)(step - t->skipped), "ckpt_generation", (json_int_t)t->ck.generation);
    if (state && t->fp16)
        json_object_set_new(state, "grad_scaler", train_scaler_state(t));
    if (state && t->ck_claim[0]) /* which launch of the store a snapshot belongs to */
        json_object_set_new(state, "ckpt_claim", json_string(t->ck_claim));
    return state;
}

/* One value of the checkpoint's trainer state against this run's: 0 when
 * equal or not recorded (an imported checkpoint, an older format). */
struct recorded {
    const char *path; /* "seed", "schedule.lr" */
    const char *flag; /* what the user sets it with */
    unsigned allow;   /* the --allow-changed word that lets it differ */
    double now;
    long long inow; /* integers compared as integers (a seed may pass 2^53) */
    int is_int;
};

static int compare_one(const json_t *j, const struct recorded *r, double *was)
{
    char obj[32] = "";
    const char *key = r->path, *dot = strchr(r->path, '.');
    if (dot) {
        snprintf(obj, sizeof obj, "%.*s", (int)(dot - r->path), r->path);
        j = json_object_get(j, obj);
        key = dot + 1;
    }
    const json_t *v = j ? json_object_get(j, key) : NULL;
    if (!v || !json_is_number(v))
        return 0;
    *was = json_number_value(v);
    if (r->is_int)
        return !json_is_integer(v) || json_integer_value(v) != r->inow;
    return *was != r->now;
}

/* the shortest form that reads back as x */
static const char *num(char *buf, size_t n, double x)
{
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    return buf;
}

static const char *change_word(unsigned bit)
{
    return bit == TRAIN_CHANGE_DATA           ? "data"
           : bit == TRAIN_CHANGE_SEED         ? "seed"
           : bit == TRAIN_CHANGE_GLOBAL_BATCH ? "global-batch"
           : bit == TRAIN_CHANGE_LR           ? "lr"
                                              : "optimizer";
}

/* fsdp_err's message with a resume's refusal (exit status 2) */
static int refused(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refused(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, FSDP_ERR_LEN, fmt, ap);
    va_end(ap);
    return TCKPT_REFUSED;
}

/* What would make the resumed run another run: refused, naming both
 * values, unless --allow-changed says the user means it. Called by the
 * resume before a byte of the step's shards is read. */
static int check_unchanged(void *ctx, json_t *j, uint64_t step, char *err)
{
    struct trainer *t = ctx;
    const struct train_opts *o = &t->o;
    const char *uri = t->ck.st->uri;
    if ((uint64_t)o->steps < step)
        return refused(err,
                       "checkpoint step %llu in %s is past --steps %lld: nothing to train "
                       "(raise --steps to go on, or use another --ckpt)",
                       (unsigned long long)step, uri, o->steps);
    const struct recorded rs[] = {
        {"seed", "--seed", TRAIN_CHANGE_SEED, (double)o->seed, (long long)o->seed, 1},
        {"global_batch", "--global-batch", TRAIN_CHANGE_GLOBAL_BATCH, (double)o->global_batch,
         o->global_batch, 1},
        {"schedule.lr", "--lr", TRAIN_CHANGE_LR, o->lr, 0, 0},
        {"schedule.min_lr_frac", "--min-lr-frac", TRAIN_CHANGE_LR, o->min_lr_frac, 0, 0},
        {"schedule.warmup", "--warmup", TRAIN_CHANGE_LR, (double)o->warmup, o->warmup, 1},
        {"optimizer.beta1", "--beta1", TRAIN_CHANGE_OPTIMIZER, o->beta1, 0, 0},
        {"optimizer.beta2", "--beta2", TRAIN_CHANGE_OPTIMIZER, o->beta2, 0, 0},
        {"optimizer.eps", "--eps", TRAIN_CHANGE_OPTIMIZER, o->eps, 0, 0},
        {"optimizer.weight_decay", "--weight-decay", TRAIN_CHANGE_OPTIMIZER, o->weight_decay, 0, 0},
        {"optimizer.grad_clip", "--grad-clip", TRAIN_CHANGE_OPTIMIZER, o->grad_clip, 0, 0},
    };
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        double was;
        char a[32], b[32];
        if (!compare_one(j, &rs[i], &was) || (o->allow_changed & rs[i].allow))
            continue;
        return refused(err,
                       "checkpoint step %llu in %s was trained with %s %s, this run has %s %s: "
                       "refusing to resume (the run would not continue its own history; "
                       "--allow-changed %s if you mean it)",
                       (unsigned long long)step, uri, rs[i].flag, num(a, sizeof a, was), rs[i].flag,
                       rs[i].is_int ? (snprintf(b, sizeof b, "%lld", rs[i].inow), b)
                                    : num(b, sizeof b, rs[i].now),
                       change_word(rs[i].allow));
    }
    char why[FSDP_ERR_LEN];
    if (train_scaler_check(j, step, why))
        return refused(err, "checkpoint step %llu in %s: %s", (unsigned long long)step, uri, why);
    json_t *was = json_object_get(j, "data");
    if (was && !(o->allow_changed & TRAIN_CHANGE_DATA)) {
        json_t *now = data_identity(&t->train_file);
        if (!now)
            return refused(err, "--data %s: cannot compute its identity", o->data);
        int same = json_equal(was, now);
        json_int_t wb = -1, wt = -1, nb = -1, nt = -1;
        json_unpack(was, "{s?I, s?I}", "bytes", &wb, "tokens", &wt);
        json_unpack(now, "{s:I, s:I}", "bytes", &nb, "tokens", &nt);
        json_decref(now);
        if (!same)
            return refused(err,
                           "checkpoint step %llu in %s was trained on other data (%lld tokens, "
                           "%lld bytes) than --data %s (%lld tokens, %lld bytes%s): refusing to "
                           "resume (--allow-changed data if you mean it)",
                           (unsigned long long)step, uri, (long long)wt, (long long)wb, o->data,
                           (long long)nt, (long long)nb,
                           wb == nb ? ", the same size, other contents" : "");
    }
    json_int_t total = -1;
    json_unpack(j, "{s?{s?I}}", "schedule", "total_steps", &total);
    if (total > 0 && total != o->steps && t->comm.rank == 0)
        fprintf(stderr,
                "fsdp-train: --steps %lld, the checkpoint's run was to take %lld: the "
                "learning-rate schedule is stretched to the new length from step %llu on\n",
                o->steps, (long long)total, (unsigned long long)step);
    return 0;
}

static int restore_state(struct trainer *t, json_t *j, uint64_t step, char *err)
{
    json_int_t s = -1, cursor = -1;
    const char *rng = NULL;
    char *end = NULL;
    if (json_unpack(j, "{s:I, s:I, s:s}", "step", &s, "data_cursor", &cursor, "rng_state", &rng) ||
        s < 0 || cursor < 0 || (uint64_t)s != step)
        return fsdp_err(err,
                        "checkpoint step %llu: trainer state lacks step, data_cursor or "
                        "rng_state",
                        (unsigned long long)step);
    unsigned long long r = strtoull(rng, &end, 16);
    if (!*rng || *end)
        return fsdp_err(err, "checkpoint step %llu: rng_state '%s' is not hexadecimal",
                        (unsigned long long)step, rng);
    t->start_step = s;
    t->cursor = (uint64_t)cursor;
    t->sample_rng = (uint64_t)r;
    return train_scaler_restore(t, j, step, err);
}

int train_save(struct trainer *t, long long step, char *err)
{
    json_t *state = trainer_state(t, step);
    if (!state)
        return fsdp_err(err, "checkpoint: out of memory");
    double t0 = fsdp_now();
    int rc = tckpt_save(&t->ck, (uint64_t)step, state, err);
    json_decref(state);
    if (rc) {
        t->agreed_error = 1;
        char msg[FSDP_ERR_LEN];
        snprintf(msg, sizeof msg, "%s", err);
        if (t->ck.newest_committed == (uint64_t)step) /* the commit held; retention failed */
            return fsdp_err(err,
                            "checkpoint step %lld is committed, but removing older "
                            "checkpoints (--keep) failed: %s",
                            step, msg);
        if (t->ck.newest_committed)
            return fsdp_err(err,
                            "checkpoint of step %lld failed: %s (the newest committed "
                            "checkpoint is step %llu)",
                            step, msg, (unsigned long long)t->ck.newest_committed);
        return fsdp_err(err, "checkpoint of step %lld failed: %s", step, msg);
    }
    t->ckpt_s += fsdp_now() - t0;
    if (fsdp_now() - t0 > t->save_max)
        t->save_max = fsdp_now() - t0;
    if (t->comm.rank == 0 && !t->ck.skipped)
        fprintf(stderr, "fsdp-train: checkpoint step %lld committed in %.2f s\n", step,
                fsdp_now() - t0);
    return 0;
}

/* Collective: waits for this rank's background write, then commits. */
int train_finish_async(struct trainer *t, const char *why, char *err)
{
    double t0 = fsdp_now();
    uint64_t step = tckpt_async_step(&t->ck);
    int rc = tckpt_async_finish(&t->ck, err);
    t->async_pending = 0;
    if (rc) {
        t->agreed_error = 1;
        char msg[FSDP_ERR_LEN];
        snprintf(msg, sizeof msg, "%s", err);
        if (!t->ck.newest_committed)
            return fsdp_err(err,
                            "background checkpoint of step %llu failed: %s (no checkpoint "
                            "is committed yet)",
                            (unsigned long long)step, msg);
        return fsdp_err(err,
                        "background checkpoint of step %llu failed: %s (the newest "
                        "committed checkpoint is step %llu)",
                        (unsigned long long)step, msg, (unsigned long long)t->ck.newest_committed);
    }
    t->ckpt_s += fsdp_now() - t0;
    if (fsdp_now() - t->async_t0 > t->save_max) /* a whole save, had it been waited for */
        t->save_max = fsdp_now() - t->async_t0;
    if (t->comm.rank == 0 && !t->ck.skipped) {
        if (why)
            fprintf(stderr, "fsdp-train: %s: waited %.2f s for checkpoint step %llu\n", why,
                    fsdp_now() - t0, (unsigned long long)step);
        fprintf(stderr,
                "fsdp-train: checkpoint step %llu committed (async, %.2f s after its "
                "step boundary)\n",
                (unsigned long long)step, fsdp_now() - t->async_t0);
    }
    return 0;
}

int train_save_async(struct trainer *t, long long step, char *err)
{
    if (t->async_pending && train_finish_async(t, "a checkpoint is due", err))
        return -1;
    json_t *state = trainer_state(t, step);
    if (!state)
        return fsdp_err(err, "checkpoint: out of memory");
    double t0 = fsdp_now();
    int rc = tckpt_save_async(&t->ck, (uint64_t)step, state, err);
    json_decref(state);
    if (rc)
        return -1;
    t->async_pending = 1;
    t->async_t0 = fsdp_now();
    t->ckpt_s += t->async_t0 - t0;
    if (t->comm.rank == 0)
        fprintf(stderr,
                "fsdp-train: checkpoint step %lld: snapshot and write in the "
                "background\n",
                step);
    return 0;
}

/* ---- snapshots in memory (--mem-snapshot-every) ------------------------------------- */

/* A snapshot is of this run only if the launch that wrote it is one of
 * the checkpoint store's: the claim of its ckpt_generation there is the
 * one it recorded (ckpt_claim, a digest of the claim's body). A store
 * removed and started again (or another run's leftovers under the same
 * directory) never resumes from RAM. Then the usual checks. */
/* The SHA-256 of the checkpoint store's claim of generation gen (its body
 * holds a random nonce, so no other store's claim has it): 0, or -1 when
 * there is no such claim. */
static int claim_digest(struct storage *st, uint64_t gen, char hex[65])
{
    char key[64], sub[FSDP_ERR_LEN];
    snprintf(key, sizeof key, "generations/%020llu", (unsigned long long)gen);
    void *buf;
    size_t len;
    if (storage_get_all(st, key, 4096, &buf, &len, sub))
        return -1;
    int rc = fsdp_sha256_hex(buf, len, hex);
    free(buf);
    return rc;
}

static int check_snapshot(void *ctx, json_t *j, uint64_t step, char *err)
{
    struct trainer *t = ctx;
    json_int_t gen = 0;
    const char *claim = "";
    json_unpack(j, "{s?I, s?s}", "ckpt_generation", &gen, "ckpt_claim", &claim);
    char hex[65];
    if (gen <= 0 || (uint64_t)gen >= t->ck.generation ||
        claim_digest(t->ck.st, (uint64_t)gen, hex) || strcmp(hex, claim) != 0)
        return fsdp_err(err,
                        "snapshot step %llu was written by generation %lld, which %s never "
                        "claimed (its claim there is not the snapshot's): another run's",
                        (unsigned long long)step, (long long)gen, t->ck.st->uri);
    return check_unchanged(ctx, j, step, err);
}

/* The default directory: under /dev/shm (tmpfs: RAM, and gone at a
 * reboot), named by a digest of where the checkpoints are, so that every
 * launch of the run finds it and two runs never share it. */
/* The names a snapshots' store puts at its top (checkpoint.c, ckpt/fence.c):
 * nothing else is ever deleted there. */
static int store_name(const char *n)
{
    return strcmp(n, "generations") == 0 || strcmp(n, "fences") == 0 ||
           strncmp(n, "step-", 5) == 0 || strncmp(n, "probe-", 6) == 0;
}

/* The directory (made 0700 if missing) must be this user's, closed to
 * others, not a link, and hold nothing but a snapshots' store: what it
 * holds is loaded as this run's state, and the run's end removes it. */
static int snapshot_dir_private(const char *dir, char *err)
{
    if (mkdir(dir, 0700) && errno != EEXIST)
        return fsdp_err(err, "--mem-snapshot-dir %s: %s", dir, strerror(errno));
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return fsdp_err(err, "--mem-snapshot-dir %s: %s", dir,
                        e == ELOOP || e == ENOTDIR
                            ? "not a directory (a link or a file is never followed: what it "
                              "holds is loaded as this run's state)"
                            : strerror(e));
    }
    if (sb.st_uid != geteuid() || (sb.st_mode & 077)) {
        close(fd);
        return fsdp_err(err,
                        "--mem-snapshot-dir %s: owned by uid %u with mode %03o; it must be this "
                        "user's (uid %u) and closed to others (chmod 700): what it holds is "
                        "loaded as this run's state",
                        dir, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 0777),
                        (unsigned)geteuid());
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return fsdp_err(err, "--mem-snapshot-dir %s: %s", dir, strerror(errno));
    }
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && !store_name(e->d_name)) {
            char shown[65];
            size_t i = 0;
            for (; e->d_name[i] && i < sizeof shown - 1; i++)
                shown[i] = isprint((unsigned char)e->d_name[i]) ? e->d_name[i] : '?';
            shown[i] = 0;
            rc = fsdp_err(err,
                          "--mem-snapshot-dir %s holds '%s', which is not a snapshots' store's: "
                          "name a directory of its own (the run's end removes the store)",
                          dir, shown);
        }
    closedir(d);
    return rc;
}

static int snapshot_dir(struct trainer *t, char *err)
{
    const struct train_opts *o = &t->o;
    if (o->snap_dir) {
        snprintf(t->snap_dir, sizeof t->snap_dir, "%s", o->snap_dir);
        return snapshot_dir_private(t->snap_dir, err);
    }
    char where[PATH_MAX + 512];
    const char *uri = o->ckpt.uri;
    if (strncmp(uri, "s3://", 5) == 0) {
        const char *ep = getenv("AWS_ENDPOINT_URL");
        snprintf(where, sizeof where, "%s %s", uri, ep ? ep : "");
    } else {
        const char *path = strncmp(uri, "file://", 7) == 0 ? uri + 7 : uri;
        if (!realpath(path, where)) /* opened a moment ago: it exists */
            return fsdp_err(err, "--ckpt %s: %s", uri, strerror(errno));
    }
    char hex[65];
    if (fsdp_sha256_hex(where, strlen(where), hex))
        return fsdp_err(err, "checkpoint: cannot digest the store's address");
    snprintf(t->snap_dir, sizeof t->snap_dir, "/dev/shm/fsdp-snap-%.16s", hex);
    return snapshot_dir_private(t->snap_dir, err);
}

/* Collective: 1 when every rank runs on this rank 0's host (a store in
 * this host's RAM holds every shard), 0 when not, -1 on a failed
 * collective. */
static int one_host(struct trainer *t, char *err)
{
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    char hex[65];
    fsdp_sha256_hex(name, strlen(name), hex);
    char root[65];
    memcpy(root, hex, sizeof root);
    if (t->comm.bcast_bytes(&t->comm, root, sizeof root, 0, err))
        return -1;
    double other = strcmp(root, hex) != 0;
    if (t->comm.allreduce_sum_f64(&t->comm, &other, 1, err))
        return -1;
    return other == 0;
}

/* Collective: whether the snapshots' store can be one in each host's RAM
 * (checkpoint_buddy.c): every host holds as many ranks, each rank writes
 * a shard, and the library lets the writer thread copy. 1 yes, 0 no (rank
 * 0 said why), -1 on a failed collective. */
static int per_host_ok(struct trainer *t, char *err)
{
    double size = t->comm.local_size;
    if (t->comm.bcast_bytes(&t->comm, &size, sizeof size, 0, err))
        return -1;
    double bad[2] = {size != t->comm.local_size, !t->comm.side_sendrecv};
    if (t->comm.allreduce_sum_f64(&t->comm, bad, 2, err))
        return -1;
    const char *why = bad[0] > 0   ? "the hosts hold different numbers of ranks"
                      : bad[1] > 0 ? "this MPI library runs no threads beside its calls "
                                     "(MPI_THREAD_MULTIPLE)"
                      : t->eng.shard == FSDP_SHARD_NONE ? "--shard none keeps one shard"
                                                        : NULL;
    if (why && t->comm.rank == 0)
        fprintf(stderr,
                "fsdp-train: --mem-snapshot-every: off, the ranks are on %d hosts and %s; "
                "healing reads --ckpt\n",
                t->comm.hosts, why);
    return !why;
}

/* Collective: opens the snapshots' store when --mem-snapshot-every is
 * given: in this host's RAM, or with ranks on several hosts in each
 * host's, every shard also in the next host's. */
static int open_snapshots(struct trainer *t, char *err)
{
    const struct train_opts *o = &t->o;
    if (!o->snap_every)
        return 0;
    int on = one_host(t, err), per_host = 0;
    if (on < 0)
        return -1;
    if (!on && (per_host = per_host_ok(t, err)) <= 0)
        return per_host;
    int lead = t->comm.rank == 0 || (per_host && t->comm.local_rank == 0);
    double failed = t->comm.rank == 0 && snapshot_dir(t, err) != 0;
    if (t->comm.rank == 0 && !failed && claim_digest(t->ck.st, t->ck.generation, t->ck_claim))
        failed = fsdp_err(err, "%s: generation %llu's claim cannot be read", t->ck.st->uri,
                          (unsigned long long)t->ck.generation) != 0;
    if (t->comm.allreduce_sum_f64(&t->comm, &failed, 1, err))
        return -1;
    if (failed > 0)
        return t->comm.rank == 0 ? -1
                                 : fsdp_err(err, "rank 0 could not name the snapshots' directory");
    if (t->comm.bcast_bytes(&t->comm, t->snap_dir, sizeof t->snap_dir, 0, err) ||
        t->comm.bcast_bytes(&t->comm, t->ck_claim, sizeof t->ck_claim, 0, err))
        return -1;
    /* every host's leader makes (or checks) its own */
    double bad = lead && t->comm.rank != 0 && snapshot_dir_private(t->snap_dir, err) != 0;
    int mine = bad > 0;
    if (t->comm.allreduce_sum_f64(&t->comm, &bad, 1, err))
        return -1;
    if (bad > 0)
        return mine ? -1 : fsdp_err(err, "another host could not make %s", t->snap_dir);
    struct tckpt_opts so = o->ckpt;
    so.uri = t->snap_dir;
    so.every = o->snap_every;
    so.keep = 1;
    so.async = 1; /* written while the next step computes; finished before its optimizer */
    so.memory = 1;
    so.per_host = per_host;
    so.fallback = "no older snapshot: the checkpoint store decides";
    so.check_trainer = check_snapshot;
    so.check_ctx = t;
    so.write.codec = CKPT_CODEC_RAW; /* RAM is cheaper than the codec's time here */
    if (tckpt_open(&t->snap, &so, &t->eng, &t->comm, &t->model, err))
        return -1;
    t->have_snap = 1;
    if (tckpt_async_start(&t->snap, err))
        return -1;
    /* a device's state comes down to a staging copy first (checkpoint_async.c) */
    const int copies = t->eng.k->on_device ? 3 : 2;
    const double mib = (double)CKPT_NKINDS * (double)t->eng.shard_total * sizeof(float) / 1048576.0;
    if (t->comm.rank == 0 && per_host)
        fprintf(stderr,
                "fsdp-train: in-memory snapshots every %lld step%s in %s on each of %d hosts, "
                "written in the background, each rank's shard also to a buddy rank on the next "
                "host (RAM: %s of each rank's shard of the state and up to two of its ward's, "
                "%.1f MiB a rank)\n",
                o->snap_every, o->snap_every == 1 ? "" : "s", t->snap_dir, t->comm.hosts,
                copies == 3 ? "a staging copy and up to two snapshots" : "up to two snapshots",
                (copies + 2) * mib);
    else if (t->comm.rank == 0)
        fprintf(stderr,
                "fsdp-train: in-memory snapshots every %lld step%s in %s, written in the "
                "background (RAM: %s of each rank's shard of the state, "
                "%.1f MiB a rank)\n",
                o->snap_every, o->snap_every == 1 ? "" : "s", t->snap_dir,
                copies == 3 ? "a staging copy and up to two snapshots" : "up to two snapshots",
                copies * mib);
    return 0;
}

int train_snapshot(struct trainer *t, long long step, char *err)
{
    if (!t->have_snap || step % t->o.snap_every != 0)
        return 0;
    json_t *state = trainer_state(t, step);
    if (!state)
        return fsdp_err(err, "snapshot: out of memory");
    double t0 = fsdp_now();
    int rc = tckpt_save_async(&t->snap, (uint64_t)step, state, err);
    json_decref(state);
    t->ckpt_s += fsdp_now() - t0;
    if (rc)
        return -1;
    t->snap_pending = 1;
    return 0;
}

int train_finish_snapshot(struct trainer *t, char *err)
{
    double t0 = fsdp_now();
    uint64_t step = tckpt_async_step(&t->snap);
    int rc = tckpt_async_finish(&t->snap, err); /* its verdict is every rank's */
    t->snap_pending = 0;
    t->ckpt_s += fsdp_now() - t0;
    if (rc) { /* a full tmpfs, most likely: training goes on, healing reads --ckpt */
        if (t->comm.rank == 0)
            fprintf(stderr,
                    "fsdp-train: in-memory snapshot of step %llu in %s failed: %s; snapshots "
                    "are off for the rest of this run (healing reads %s)\n",
                    (unsigned long long)step, t->snap_dir, err, t->ck.st->uri);
        tckpt_async_stop(&t->snap);
        tckpt_close(&t->snap);
        t->have_snap = 0;
    }
    return 0;
}

struct keys {
    char **v;
    size_t n, cap;
};

static int collect_key(void *arg, const char *key, uint64_t size)
{
    (void)size;
    struct keys *k = arg;
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 64;
        char **v = realloc(k->v, cap * sizeof *v);
        if (!v)
            return -1;
        k->v = v;
        k->cap = cap;
    }
    return (k->v[k->n] = strdup(key)) ? (k->n++, 0) : -1;
}

/* A leader of the snapshots' store: removes its objects under prefix (a
 * cache of this run's state, never a checkpoint: the one place its
 * contents are deleted besides its own retention). What cannot be removed
 * stays for the next clean-up. */
static void drop_snapshots(struct trainer *t, const char *prefix)
{
    struct keys k = {0};
    char err[FSDP_ERR_LEN];
    storage_list_special(t->snap.st, prefix, collect_key, &k, err);
    for (size_t i = 0; i < k.n; i++) {
        char top[64];
        snprintf(top, sizeof top, "%.*s", (int)strcspn(k.v[i], "/"), k.v[i]);
        if (store_name(top))
            storage_delete(t->snap.st, k.v[i], err);
        free(k.v[i]);
    }
    free(k.v);
}

void train_end_snapshots(struct trainer *t)
{
    if (!t->have_snap)
        return;
    /* the checkpoint store holds the last step: the snapshots are spent */
    tckpt_async_stop(&t->snap); /* after its last retention */
    double spent = t->comm.rank == 0 && t->ck.newest_committed >= t->snap.newest_committed;
    char err[FSDP_ERR_LEN];
    if (t->snap.o.per_host && t->comm.bcast_bytes(&t->comm, &spent, sizeof spent, 0, err))
        spent = 0; /* kept: the next launch's start removes what it does not use */
    if (spent && t->snap.leader) {
        drop_snapshots(t, "");
        rmdir(t->snap_dir);
    }
    tckpt_close(&t->snap);
    t->have_snap = 0;
}

/* Collective: opens the checkpoint store and resumes from it (or from a
 * newer snapshot in RAM). */
int train_setup_checkpoints(struct trainer *t, char *err)
{
    if (!t->o.ckpt.uri)
        return 0;
    t->agreed_error = 1; /* everything here is agreed on by all ranks */
    t->o.ckpt.load_threads = t->threads;
    t->o.ckpt.check_trainer = check_unchanged;
    t->o.ckpt.check_ctx = t;
    if (tckpt_open(&t->ck, &t->o.ckpt, &t->eng, &t->comm, &t->model, err))
        return -1;
    t->have_ckpt = 1;
    if (t->o.ckpt.async && tckpt_async_start(&t->ck, err))
        return -1;
    if (open_snapshots(t, err))
        return -1;
    json_t *state = NULL;
    uint64_t step = 0;
    int rc = 0, from_memory = 0;
    if (t->have_snap && t->o.ckpt.resume) {
        rc = tckpt_resume(&t->snap, &state, &step, err);
        if (rc == TCKPT_REFUSED) { /* another model's: the checkpoint store decides */
            if (t->comm.rank == 0)
                fprintf(stderr, "fsdp-train: the snapshots in %s are not used: %s\n", t->snap_dir,
                        err);
            rc = 0;
        }
        if (rc)
            return rc;
        from_memory = state != NULL;
        if (from_memory) /* only a newer checkpoint is read from the store */
            t->ck.o.load_from = step + 1;
    }
    json_t *stored = NULL;
    uint64_t stored_step = 0;
    rc = tckpt_resume(&t->ck, &stored, &stored_step, err);
    if (rc) {
        json_decref(state);
        return rc;
    }
    if (from_memory && !stored && t->ck.tried) {
        /* a newer checkpoint failed to load, part of it over the snapshot's
         * state on some ranks: the snapshot again (it loaded a moment ago) */
        json_decref(state);
        state = NULL;
        uint64_t again = 0;
        if ((rc = tckpt_resume(&t->snap, &state, &again, err)))
            return rc;
        if (!state || again != step) {
            json_decref(state);
            return fsdp_err(err, "the snapshot of step %llu in %s cannot be loaded again",
                            (unsigned long long)step, t->snap_dir);
        }
    }
    if (stored) {
        json_decref(state);
        state = stored;
        step = stored_step;
        from_memory = 0;
    }
    /* snapshots not resumed from are no use to this run (none, refused, or
     * older than the checkpoint): they go, lest retention keep a stale
     * newer step number over this run's */
    if (t->have_snap && !from_memory && t->snap.leader)
        drop_snapshots(t, "step-");
    if (state) {
        rc = restore_state(t, state, step, err);
        json_decref(state);
        if (rc)
            return rc;
        if (t->comm.rank == 0) {
            if (from_memory)
                fprintf(stderr,
                        "fsdp-train: resumed from the in-memory snapshot of step %llu in %s (no "
                        "shard read from %s, whose newest checkpoint is step %llu)\n",
                        (unsigned long long)step, t->snap_dir, t->ck.st->uri,
                        (unsigned long long)t->ck.newest_committed);
            else
                fprintf(stderr, "fsdp-train: resumed from checkpoint step %llu in %s\n",
                        (unsigned long long)step, t->ck.st->uri);
            hb_event("resumed step=%llu world=%d memory=%d", (unsigned long long)step,
                     t->comm.world, from_memory);
        }
        hb_set(step, HB_TRAIN);
    } else {
        fsdp_init_params(&t->eng, t->o.seed); /* a failed attempt may have written */
        if (t->comm.rank == 0)
            hb_event("resumed step=0 world=%d", t->comm.world);
        hb_set(0, HB_TRAIN);
    }
    t->agreed_error = 0;
    return 0;
}
