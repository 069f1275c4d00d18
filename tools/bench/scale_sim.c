/*
 * scale_sim.c - the checkpoint metadata of a real model layout at a world
 * size no machine here has, built and read by the real code (ckpt/), with
 * no tensor data: one process plays rank 0 at commit, or one rank at load.
 * tools/bench/scale.py runs it over models, world sizes and both formats
 * (each run a process of its own, so its peak memory is its own).
 *
 *   fsdp-scale-sim --model M --world N --format 1|2 --phase commit|load
 *                  --dir DIR [--chunk-mib C]
 *
 * commit: the N records rank 0 gathers (format 2: ckpt_shard_to_json, a
 *   fixed-size record; format 1: the shard's sections and chunk table, as
 *   the previous release gathered them) are turned into the manifest as
 *   the trainer does: each record parsed, the manifest checked and
 *   serialised. Reports the manifest's bytes, a rank's record and the time.
 * load: a rank of the new world (N, N/2 and 2N) receives the manifest's
 *   bytes (parses them), plans its reads (ckpt_plan_load) and, format 2,
 *   fetches and decodes the chunk index of every old shard the plan reads:
 *   real ranged reads of shard objects in DIR, sparse files holding only
 *   their index (all chunks raw zeros, so every shard has the same index).
 *   Reports the time and the metadata bytes the rank read from storage.
 * Format 1 manifests over 256 MB are not built (the reader refuses any over
 * 64 MiB: such a step could never be loaded): their size is the exact size
 * of the last shard's entry times N plus the rest, flagged "estimated".
 *
 * Output: one JSON object on stdout.
 */
#include "ckpt.h"
#include "model_ckpt.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define TAG "g1-0123456789abcdef"

static void fail(const char *what, const char *err)
{
    fprintf(stderr, "fsdp-scale-sim: %s: %s\n", what, err);
    exit(1);
}

/* GPT-2 shaped layouts: the 124M model, and at 7B, 70B and 120B the block
 * counts and widths of the published models of those sizes. */
static int model_by_name(const char *name, struct model_config *c)
{
    static const struct {
        const char *name;
        int layers, dim, heads;
    } big[] = {{"7b", 32, 4096, 32}, {"70b", 80, 8192, 64}, {"120b", 96, 10240, 80}};
    if (model_preset(name, c) == 0)
        return 0;
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        if (strcmp(name, big[i].name) == 0) {
            *c = (struct model_config){.layers = big[i].layers,
                                       .dim = big[i].dim,
                                       .heads = big[i].heads,
                                       .seq = 2048,
                                       .vocab = 50257,
                                       .vocab_pad = 50304};
            return 0;
        }
    return -1;
}

/* The manifest of step 1 for world ranks, every shard what a writer with
 * chunk_bytes chunks of raw zeros produces (format 1: cut at sections; the
 * shards share one chunk table, *shared, which unshare() detaches before
 * the manifest is freed). */
static void build(const struct model_layout *ml, int world, int version, uint64_t chunk_bytes,
                  struct ckpt_manifest *m, struct ckpt_chunk **shared)
{
    *shared = NULL;
    char err[FSDP_ERR_LEN];
    memset(m, 0, sizeof *m);
    m->version = version;
    m->step = 1;
    m->generation = 1;
    m->world = world;
    m->chunk_bytes = chunk_bytes;
    snprintf(m->sharding, sizeof m->sharding, "full");
    m->model = model_ckpt_config(&ml->cfg);
    m->trainer = json_pack("{s:i, s:i}", "step", 1, "data_cursor", 8);
    if (model_ckpt_units(ml, world, m))
        fail("units", "out of memory");
    m->shards = calloc((size_t)world, sizeof *m->shards);
    if (!m->shards)
        fail("shards", "out of memory");
    m->nshards = world;
    uint64_t raw = 0;
    for (int u = 0; u < m->nunits; u++)
        raw += m->units[u].padded / (uint64_t)world * 4 * CKPT_NKINDS;
    struct ckpt_chunk *tab = NULL;
    int n = 0;
    if (version == 1) { /* chunks cut at chunk_bytes and at every section */
        size_t cap = 0;
        for (int u = 0; u < m->nunits; u++)
            cap += (m->units[u].padded / (uint64_t)world * 4 / chunk_bytes + 1) * CKPT_NKINDS;
        tab = calloc(cap, sizeof *tab);
        uint64_t ro = 0;
        for (int u = 0; tab && u < m->nunits; u++)
            for (int k = 0; k < CKPT_NKINDS; k++)
                for (uint64_t left = m->units[u].padded / (uint64_t)world * 4; left;) {
                    uint64_t len = left < chunk_bytes ? left : chunk_bytes;
                    tab[n] = (struct ckpt_chunk){ro, len, ro, len, CKPT_CODEC_RAW, {0}};
                    memset(tab[n].digest, 0xab, 32);
                    n++;
                    ro += len;
                    left -= len;
                }
    } else {
        n = (int)((raw + chunk_bytes - 1) / chunk_bytes);
    }
    for (int r = 0; r < world; r++) {
        struct ckpt_shard *s = &m->shards[r];
        ckpt_shard_file(r, world, TAG, s->file, sizeof s->file);
        s->rank = r;
        s->raw_size = raw;
        s->nchunks = n;
        memset(s->digest, 0xcd, 32); /* format 2: the load phase puts the index's */
        if (version == 1) {
            if (!tab)
                fail("chunk tables", "out of memory");
            s->stored_size = raw;
            s->chunks = tab;
        } else {
            s->index_off = raw;
            s->index_len = CKPT_INDEX_HEADER + (uint64_t)n * CKPT_INDEX_ENTRY;
            s->stored_size = raw + s->index_len;
        }
    }
    *shared = tab;
    if (ckpt_manifest_check(m, err))
        fail("the built manifest", err);
}

static void unshare(struct ckpt_manifest *m, struct ckpt_chunk *shared)
{
    for (int r = 0; shared && r < m->nshards; r++)
        if (m->shards[r].chunks == shared)
            m->shards[r].chunks = NULL;
    free(shared);
}

/* ---- commit --------------------------------------------------------------- */

static void commit_phase(const struct model_layout *ml, int world, int version, uint64_t cb)
{
    struct ckpt_manifest m;
    struct ckpt_chunk *shared;
    build(ml, world, version, cb, &m, &shared);
    /* what each rank sends (format 1: its entry of the old manifest) */
    size_t total = 0, record = 0;
    char **rec = calloc((size_t)world, sizeof *rec);
    json_t *old = NULL;
    if (version == 1) {
        char *doc = ckpt_manifest_dump(&m);
        json_error_t je;
        old = doc ? json_loads(doc, 0, &je) : NULL;
        free(doc);
    }
    for (int r = 0; rec && r < world; r++) {
        json_t *j = version == 1 ? json_incref(json_array_get(json_object_get(old, "shards"), r))
                                 : ckpt_shard_to_json(&m.shards[r]);
        rec[r] = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!rec[r])
            fail("records", "out of memory");
        total += strlen(rec[r]);
        record = strlen(rec[r]) > record ? strlen(rec[r]) : record;
    }
    json_decref(old);
    unshare(&m, shared);
    for (int r = 0; r < world; r++)
        ckpt_shard_free(&m.shards[r]);
    /* rank 0: the records into the manifest, checked, serialised */
    char err[FSDP_ERR_LEN];
    double t0 = fsdp_now();
    for (int r = 0; r < world; r++) {
        json_error_t je;
        json_t *j = json_loads(rec[r], 0, &je);
        if (!j)
            fail("a record", je.text);
        if (version == 1) { /* the previous release read the table into memory */
            json_t *ch = json_object_get(j, "chunks");
            m.shards[r].chunks = calloc(json_array_size(ch) + 1, sizeof(struct ckpt_chunk));
            m.shards[r].nchunks = (int)json_array_size(ch);
            for (size_t i = 0; i < json_array_size(ch); i++) {
                json_t *c = json_array_get(ch, i);
                struct ckpt_chunk *d = &m.shards[r].chunks[i];
                d->raw_off = (uint64_t)json_integer_value(json_object_get(c, "raw_offset"));
                d->raw_len = (uint64_t)json_integer_value(json_object_get(c, "raw_length"));
                d->stored_off = (uint64_t)json_integer_value(json_object_get(c, "stored_offset"));
                d->stored_len = (uint64_t)json_integer_value(json_object_get(c, "stored_length"));
            }
            m.shards[r].raw_size = (uint64_t)json_integer_value(json_object_get(j, "raw_size"));
            m.shards[r].stored_size =
                (uint64_t)json_integer_value(json_object_get(j, "stored_size"));
            snprintf(m.shards[r].file, sizeof m.shards[r].file, "%s",
                     json_string_value(json_object_get(j, "file")));
            m.shards[r].rank = r;
        } else if (ckpt_shard_from_json(j, &m.shards[r], err)) {
            fail("a record", err);
        }
        json_decref(j);
        free(rec[r]);
    }
    free(rec);
    if (ckpt_manifest_check(&m, err))
        fail("check", err);
    char *doc = ckpt_manifest_dump(&m);
    if (!doc)
        fail("dump", "out of memory");
    double secs = fsdp_now() - t0;
    printf("{\"phase\": \"commit\", \"format\": %d, \"world\": %d, \"manifest_bytes\": %zu, "
           "\"record_bytes\": %zu, \"gathered_bytes\": %zu, \"commit_s\": %.6f}\n",
           version, world, strlen(doc), record, total, secs);
    free(doc);
    ckpt_manifest_free(&m);
}

/* Format 1 where it is not built: at least world times shard 0's entry
 * (later entries have longer numbers) plus the rest of the manifest. */
static void size_only(const struct model_layout *ml, int world, uint64_t cb)
{
    struct ckpt_manifest m;
    struct ckpt_chunk *shared;
    build(ml, world, 1, cb, &m, &shared);
    int all = m.nshards;
    m.nshards = 1; /* the dump does not check; entry 0 is written as for world ranks */
    char *doc = ckpt_manifest_dump(&m);
    m.nshards = all;
    json_error_t je;
    json_t *j = doc ? json_loads(doc, 0, &je) : NULL;
    char *entry =
        j ? json_dumps(json_array_get(json_object_get(j, "shards"), 0), JSON_INDENT(1)) : NULL;
    if (!doc || !entry)
        fail("format 1 size", "out of memory");
    /* each further entry: its text indented two levels deeper, ",\n" */
    size_t lines = 0;
    for (const char *c = entry; *c; c++)
        lines += *c == '\n';
    size_t each = strlen(entry) + 2 * (lines + 1) + 2;
    printf("{\"phase\": \"size\", \"format\": 1, \"world\": %d, \"manifest_bytes\": %zu, "
           "\"estimated\": true}\n",
           world, strlen(doc) + (size_t)(world - 1) * each);
    free(doc);
    free(entry);
    json_decref(j);
    unshare(&m, shared);
    ckpt_manifest_free(&m);
}

/* ---- load ----------------------------------------------------------------- */

/* The chunk index every shard of m has when all its chunks are raw zeros. */
static unsigned char *zero_index(const struct ckpt_manifest *m, size_t *len)
{
    struct ckpt_chunk *tab = calloc((size_t)m->shards[0].nchunks + 1, sizeof *tab);
    unsigned char *zero = calloc(1, (size_t)m->chunk_bytes);
    if (!tab || !zero)
        fail("index", "out of memory");
    uint64_t raw = m->shards[0].raw_size, cb = m->chunk_bytes;
    unsigned char full[32]; /* every whole chunk's digest: the same zeros */
    ckpt_sha256(zero, (size_t)cb, full);
    for (int i = 0; i < m->shards[0].nchunks; i++) {
        uint64_t off = (uint64_t)i * cb, n = raw - off < cb ? raw - off : cb;
        tab[i] = (struct ckpt_chunk){off, n, off, n, CKPT_CODEC_RAW, {0}};
        if (n == cb)
            memcpy(tab[i].digest, full, 32);
        else
            ckpt_sha256(zero, (size_t)n, tab[i].digest);
    }
    unsigned char *index = ckpt_index_encode(tab, m->shards[0].nchunks, len);
    if (!index)
        fail("index", "out of memory");
    free(tab);
    free(zero);
    return index;
}

/* The shard objects a plan reads, as sparse files ending in their index. */
static void make_shards(const struct ckpt_manifest *m, const struct ckpt_plan *p,
                        const unsigned char *index, size_t len, const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/step-00000001", dir);
    mkdir(dir, 0755);
    mkdir(path, 0755);
    for (int i = 0; i < p->npieces; i++) {
        int s = p->pieces[i].shard;
        if (s < 0 || (i > 0 && p->pieces[i - 1].shard == s))
            continue;
        snprintf(path, sizeof path, "%s/step-00000001/%s", dir, m->shards[s].file);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || ftruncate(fd, (off_t)m->shards[s].index_off) ||
            pwrite(fd, index, len, (off_t)m->shards[s].index_off) != (ssize_t)len || close(fd))
            fail(path, "cannot write");
    }
}

static void load_phase(const struct model_layout *ml, int world, int version, uint64_t cb,
                       const char *dir)
{
    /* the manifest as rank 0 broadcasts it, with the index digests right */
    struct ckpt_manifest built;
    struct ckpt_chunk *shared;
    build(ml, world, version, cb, &built, &shared);
    unsigned char *index = NULL;
    size_t index_len = 0;
    if (version >= 2) {
        unsigned char sha[32];
        index = zero_index(&built, &index_len);
        ckpt_sha256(index, index_len, sha);
        for (int r = 0; r < world; r++)
            memcpy(built.shards[r].digest, sha, 32);
    }
    char *doc = ckpt_manifest_dump(&built);
    if (!doc)
        fail("dump", "out of memory");
    size_t doc_len = strlen(doc);
    unshare(&built, shared);
    ckpt_manifest_free(&built);
    char err[FSDP_ERR_LEN];
    struct storage *st;
    if (storage_open(dir, &st, err))
        fail(dir, err);
    printf("{\"phase\": \"load\", \"format\": %d, \"world\": %d, \"manifest_bytes\": %zu, "
           "\"to\": [",
           version, world, doc_len);
    const int to[3] = {world, world / 2 > 0 ? world / 2 : 1, world * 2};
    for (int t = 0; t < 3; t++) {
        int nw = to[t], rank = nw / 2;
        double t0 = fsdp_now();
        struct ckpt_manifest m; /* the broadcast bytes, parsed */
        if (ckpt_manifest_parse(doc, doc_len, &m, err))
            fail("parse", err);
        double parse_s = fsdp_now() - t0;
        struct ckpt_reader r; /* its chunk buffers: not planning, not timed */
        if (ckpt_reader_init(&r, st, &m, err))
            fail("reader", err);
        double t1 = fsdp_now();
        int n = m.nunits * CKPT_NKINDS;
        struct ckpt_want *w = calloc((size_t)n, sizeof *w);
        uint64_t bytes = 0;
        for (int u = 0; u < m.nunits; u++)
            bytes += (m.units[u].numel + (uint64_t)nw - 1) / (uint64_t)nw * 4 * CKPT_NKINDS;
        /* where the rank's state would go: reserved, never touched */
        float *base = mmap(NULL, (size_t)bytes + 4096, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (!w || base == MAP_FAILED)
            fail("wants", "out of memory");
        uint64_t at = 0;
        for (int u = 0; u < m.nunits; u++) {
            uint64_t per = (m.units[u].numel + (uint64_t)nw - 1) / (uint64_t)nw;
            for (int k = 0; k < CKPT_NKINDS; k++, at += per)
                w[u * CKPT_NKINDS + k] =
                    (struct ckpt_want){u, k, (uint64_t)rank * per, per, base + at};
        }
        struct ckpt_plan p;
        if (ckpt_plan_load(&r, w, n, &p, err))
            fail("plan", err);
        double t2 = fsdp_now(), t3 = t2, t4 = t2;
        if (version >= 2) {
            make_shards(&m, &p, index, index_len,
                        dir); /* not timed: the objects exist before a load */
            t3 = fsdp_now();
            if (ckpt_plan_indexes(&r, &p, err))
                fail("indexes", err);
            t4 = fsdp_now();
        }
        int shards = 0;
        for (int i = 0; i < p.npieces; i++)
            shards +=
                p.pieces[i].shard >= 0 && (i == 0 || p.pieces[i - 1].shard != p.pieces[i].shard);
        printf("%s{\"world\": %d, \"rank\": %d, \"shards_read\": %d, \"metadata_read_bytes\": "
               "%" PRIu64 ", \"parse_s\": %.6f, \"plan_s\": %.6f, \"index_s\": %.6f}",
               t ? ", " : "", nw, rank, shards,
               version >= 2 ? r.index_bytes_fetched : (uint64_t)doc_len, parse_s, t2 - t1, t4 - t3);
        ckpt_plan_free(&p);
        munmap(base, (size_t)bytes + 4096);
        free(w);
        ckpt_reader_free(&r);
        ckpt_manifest_free(&m);
    }
    printf("]}\n");
    storage_close(st);
    free(index);
    free(doc);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *phase = NULL, *dir = NULL;
    int world = 0, version = 2;
    long chunk_mib = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(argv[i], "--world") == 0)
            world = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--format") == 0)
            version = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--phase") == 0)
            phase = argv[i + 1];
        else if (strcmp(argv[i], "--dir") == 0)
            dir = argv[i + 1];
        else if (strcmp(argv[i], "--chunk-mib") == 0)
            chunk_mib = atol(argv[i + 1]);
        else
            fail("usage", argv[i]);
    }
    struct model_config cfg;
    struct model_layout ml;
    char err[FSDP_ERR_LEN];
    if (!model || !phase || world < 1 || world > 32768 || (version != 1 && version != 2) ||
        chunk_mib < 1 || chunk_mib > 256 || model_by_name(model, &cfg))
        fail("usage", "--model gpt2-124m|7b|70b|120b --world N --format 1|2 --phase "
                      "commit|load|size --dir DIR [--chunk-mib C]");
    if (model_layout_init(&ml, &cfg, err))
        fail(model, err);
    uint64_t cb = (uint64_t)chunk_mib << 20;
    if (strcmp(phase, "commit") == 0)
        commit_phase(&ml, world, version, cb);
    else if (strcmp(phase, "size") == 0)
        size_only(&ml, world, cb);
    else if (strcmp(phase, "load") == 0 && dir)
        load_phase(&ml, world, version, cb, dir);
    else
        fail("usage", "--phase commit|load|size (load needs --dir)");
    model_layout_free(&ml);
    return 0;
}
