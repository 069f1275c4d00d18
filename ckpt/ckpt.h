/*
 * ckpt.h - the checkpoint format and the policy that needs no collective:
 * manifest (manifest.c), chunk index (index.c), shard writer (writer.c)
 * and verified reader (reader.c, parallel.c: a load plan on several
 * threads), resharding (reshard.c), step listing (steps.c), generations
 * and fences (fence.c), and cleanup.c: a step's commit (ckpt_commit_step)
 * and the one place that decides what may be deleted (ckpt_clean:
 * retention, incomplete steps, fenced garbage). The trainer's collective
 * protocol on top of it is src/checkpoint.h; fsdp-ckpt uses it directly.
 * Errors follow util.h: 0 or a negative enum fsdp_status, with a line in
 * err (FSDP_ERR_LEN).
 *
 * Layout in a store (storage.h):
 *   step-00001000/shard-00000-of-00004   one per rank, written in parallel
 *   step-00001000/MANIFEST.json          written last, with put-if-absent:
 *                                        its presence means "committed"
 *
 * A shard's raw bytes are the rank's sections back to back: for each unit
 * and each state kind (param, exp_avg, exp_avg_sq) the elements
 * [r * n/W, (r+1) * n/W) of that unit's flat float32 buffer. The raw stream
 * is cut into chunks of the writer's chunk size (the last one shorter),
 * each stored on its own: raw, or zstd (with its frame checksum),
 * optionally after a byte-plane shuffle of the floats. Each stored chunk
 * has a digest (SHA-256 or XXH3-128); so has the shard. Any raw byte range
 * is read by fetching and verifying only the chunks it covers, so loading
 * on another world size is a plan of ranged reads.
 *
 * Format 2 (written): the shard object ends with its chunk index (index.c:
 * each chunk's stored length, codec and digest), the shard's digest is the
 * index's SHA-256, and the manifest keeps per shard only its sizes, digest,
 * chunk count and where its index lies. The manifest is O(world size +
 * tensors) bytes, the commit gathers a fixed-size record per rank, and a
 * loading rank fetches only the indexes of the shards it reads. Format 1
 * (read, and rewritten as 2 by `fsdp-ckpt cp`) kept every chunk table and
 * section list in the manifest, cut a chunk at every section boundary, and
 * digested the whole shard object.
 *
 * ckpt knows units, tensors (names, shapes, dtypes) and kinds, nothing of
 * the model beyond that: the model configuration and the trainer state are
 * JSON objects it stores and compares but does not interpret.
 */
#ifndef FSDP_CKPT_H
#define FSDP_CKPT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "storage.h"

#define CKPT_FORMAT_VERSION     2 /* written; 1 is still read */
#define CKPT_MANIFEST           "MANIFEST.json"
#define CKPT_MAX_MANIFEST_BYTES (64u << 20)
#define CKPT_MAX_CHUNK_BYTES    (256u << 20)
#define CKPT_MAX_CHUNKS         (1 << 24) /* per shard: a larger shard needs larger chunks */

enum ckpt_kind { CKPT_PARAM, CKPT_EXP_AVG, CKPT_EXP_AVG_SQ, CKPT_NKINDS };
const char *ckpt_kind_name(int kind);

enum ckpt_codec_id { CKPT_CODEC_RAW, CKPT_CODEC_ZSTD, CKPT_CODEC_ZSTD_SHUFFLE4 };
const char *ckpt_codec_name(int codec);

/* How chunks are digested (the manifest's chunk_hash): SHA-256 (format 1,
 * and the default), or XXH3-128 - not cryptographic but ten times faster
 * (15 against 1.6 GB/s a core here), which is what makes a load run at the
 * speed of memory; stored as its 16 canonical bytes then 16 zeros. The
 * manifest's own digest and each shard's (of its chunk index) stay
 * SHA-256. */
enum ckpt_hash_id { CKPT_HASH_SHA256, CKPT_HASH_XXH3 };
const char *ckpt_hash_name(int hash);
int ckpt_parse_hash(const char *s, int *hash); /* "sha256" | "xxh3" */
void ckpt_digest_bytes(int hash, const void *p, size_t n, unsigned char out[32]);

struct ckpt_tensor {
    char name[64];
    int ndim;
    uint64_t shape[4];
    uint64_t offset, numel; /* elements, within the unit */
};

struct ckpt_unit {
    char name[64];
    uint64_t numel, padded; /* padded: a multiple of the world size */
    int ntensors;
    struct ckpt_tensor *tensors;
};

struct ckpt_chunk {
    uint64_t raw_off, raw_len, stored_off, stored_len;
    int codec;
    unsigned char digest[32]; /* of the stored bytes (the manifest's chunk_hash) */
};

/* Elements [lo, lo + n) of (unit, kind) live at raw byte raw_off (a
 * writer's input; in a shard the layout follows from the units and the
 * world size: ckpt_section_offsets). */
struct ckpt_section {
    int unit, kind;
    uint64_t lo, n, raw_off;
};

struct ckpt_shard {
    char file[64];
    int rank;
    uint64_t raw_size, stored_size; /* stored: the whole object, index included */
    /* SHA-256: format 1 of the whole stored object; format 2 of its chunk
     * index, which holds every chunk's digest (a hash tree of two levels:
     * writing and verifying a shard hash each byte once, not twice) */
    unsigned char digest[32];
    int nchunks;
    /* format 2: the chunk index, the object's last index_len bytes */
    uint64_t index_off, index_len;
    /* the chunk table: format 1 manifests and writers have it in memory;
     * a format-2 manifest does not (ckpt_shard_chunks fetches it) */
    struct ckpt_chunk *chunks;
};

struct ckpt_manifest {
    int version;
    uint64_t step, generation;
    uint64_t chunk_bytes; /* raw bytes per chunk (format 1: the longest chunk) */
    int chunk_hash;       /* CKPT_HASH_* of chunks and shards (format 1: SHA-256) */
    int world;
    char sharding[16];
    json_t *model;   /* configuration, compared on resume */
    json_t *trainer; /* step, data cursor, RNG, schedule ... */
    int nunits, nshards;
    struct ckpt_unit *units;
    struct ckpt_shard *shards;
};

void ckpt_manifest_free(struct ckpt_manifest *m);
/* Serialises (one JSON document, keys in a fixed order) in m->version's
 * form. */
char *ckpt_manifest_dump(const struct ckpt_manifest *m);
/* Parses either version and validates everything that later sizes an
 * allocation or an index: counts, offsets, sizes, the chunk tables'
 * contiguity (format 1), the sections' agreement with the units and the
 * world size (format 1). */
int ckpt_manifest_parse(const char *buf, size_t len, struct ckpt_manifest *m, char *err);
/* A format-2 shard entry (a fixed-size record: what a rank sends to the
 * committer). */
json_t *ckpt_shard_to_json(const struct ckpt_shard *s);
int ckpt_shard_from_json(json_t *j, struct ckpt_shard *s, char *err);
void ckpt_shard_free(struct ckpt_shard *s);
/* Units, world size, chunk size and shard entries agree (for checks before
 * use). */
int ckpt_manifest_check(const struct ckpt_manifest *m, char *err);
/* Each (unit, kind) section's raw byte offset within every shard (the same
 * for all ranks: rank r holds padded/W elements of each): off[u * NKINDS +
 * k]. Returns a malloc'd array of nunits * CKPT_NKINDS, NULL when out of
 * memory. */
uint64_t *ckpt_section_offsets(const struct ckpt_manifest *m);

/* ---- the chunk index (index.c) -------------------------------------------- */

/* "FSDPCIX1", u32 version, u32 chunk count, then per chunk (little-endian)
 * u64 stored length, u32 raw length, u32 codec, 32 bytes SHA-256. */
#define CKPT_INDEX_HEADER 16u
#define CKPT_INDEX_ENTRY  48u
/* Encodes chunks[0..n) (malloc'd, *len bytes). */
unsigned char *ckpt_index_encode(const struct ckpt_chunk *chunks, int n, size_t *len);
/* Decodes and checks an index against its shard entry and the manifest's
 * chunk size: count, every raw length (chunk_bytes, the last one shorter),
 * codecs, stored lengths within bounds and adding up to index_off. Fills
 * a malloc'd table with offsets. */
int ckpt_index_decode(const unsigned char *buf, size_t len, const struct ckpt_shard *s,
                      uint64_t chunk_bytes, struct ckpt_chunk **out, char *err);

/* ---- names --------------------------------------------------------------- */

void ckpt_step_dir(uint64_t step, char *out, size_t n);

/* Every writer of a step (a launch of the trainer, one run of a tool)
 * draws a tag, "g<generation>-<16 random hex digits>", and names each shard
 * object it creates "shard-RRRRR-of-WWWWW.<tag>"; the manifest records the
 * names. Two writers of the same step - a second run on the same store, a
 * zombie of an older launch, two copies racing - therefore never share an
 * object name: none can replace another's shard, and each can remove what
 * it wrote and nothing else. Shards written before tags existed have no
 * suffix (generation 0) and still load. */
#define CKPT_TAG_LEN 48
int ckpt_writer_tag(uint64_t generation, char *out, size_t n);
void ckpt_shard_file(int rank, int world, const char *tag, char *out, size_t n);
/* 0 if name is a shard object's name; its generation is 0 when untagged. */
int ckpt_parse_shard_name(const char *name, int *rank, int *world, uint64_t *gen);
/* 0 if tag is a writer tag; its generation (what the writer's manifest
 * records: fencing judges a commit by it). */
int ckpt_tag_generation(const char *tag, uint64_t *gen);

/* ---- writing ------------------------------------------------------------- */

struct ckpt_write_opts {
    int codec; /* CKPT_CODEC_* */
    int level; /* zstd level */
    size_t chunk_bytes;
    int hash; /* CKPT_HASH_* */
};

/* What the trainer and fsdp-ckpt write unless told otherwise: zstd+shuffle
 * level 1, 4 MiB chunks, XXH3-128 chunk digests (the index and manifest
 * digests are SHA-256 whatever this says; see README "Checkpoint format"). */
#define CKPT_WRITE_DEFAULTS                                                                        \
    ((struct ckpt_write_opts){CKPT_CODEC_ZSTD_SHUFFLE4, 1, 4u << 20, CKPT_HASH_XXH3})

/* Parses "none", "zstd", "zstd:LEVEL", and with shuffle: "zstd+shuffle[:LEVEL]". */
int ckpt_parse_compress(const char *s, struct ckpt_write_opts *o, char *err);

struct ckpt_src {
    int unit, kind;
    uint64_t lo, n;
    const float *data; /* host memory */
};

/* Reusable buffers and codec contexts: create once, use for every shard. */
struct ckpt_codec;
struct ckpt_codec *ckpt_codec_new(size_t chunk_bytes);
void ckpt_codec_free(struct ckpt_codec *c);

/* A streaming shard writer: sections declared up front (their raw_off is
 * computed), their bytes appended in order in pieces of any size, one
 * chunk of memory. finish makes the shard durable and fills out; on any
 * failure nothing is left under the key. hook, if set, runs after each
 * chunk is written (tests stop a writer mid-shard with it). */
struct ckpt_shard_writer;
int ckpt_writer_begin(struct storage *st, const char *key, const char *file,
                      const struct ckpt_write_opts *o, struct ckpt_codec *codec, int rank,
                      const struct ckpt_section *secs, int nsec, void (*hook)(int chunk),
                      struct ckpt_shard_writer **w, char *err);
int ckpt_writer_append(struct ckpt_shard_writer *w, const void *data, size_t bytes, char *err);
int ckpt_writer_finish(struct ckpt_shard_writer *w, struct ckpt_shard *out, char *err);
void ckpt_writer_abort(struct ckpt_shard_writer *w);

/* Writes one shard from memory (begin, append every source, finish). */
int ckpt_shard_write(struct storage *st, const char *key, const char *file,
                     const struct ckpt_write_opts *o, struct ckpt_codec *codec,
                     const struct ckpt_src *src, int nsrc, int rank, struct ckpt_shard *out,
                     void (*hook)(int chunk), char *err);

/* Writes MANIFEST.json with put-if-absent. STORAGE_EXISTS if the step was
 * already committed. */
int ckpt_commit(struct storage *st, const struct ckpt_manifest *m, char *err);
/* For tools writing a new step into a store (reshard, cp, import): refuses
 * a step the store already has committed, and draws the writer's tag. */
int ckpt_new_step_in(struct storage *st, uint64_t step, char *tag, size_t n, char *err);

/* ---- reading ------------------------------------------------------------- */

#define CKPT_READER_CACHE 4

struct ckpt_reader {
    struct storage *st;
    const struct ckpt_manifest *m;
    char dir[32];
    struct ckpt_codec *codec;
    struct {
        int shard, chunk;
        uint64_t used;
        unsigned char *raw;
    } cache[CKPT_READER_CACHE]; /* decoded chunks, least recently used goes */
    uint64_t tick;
    uint64_t bytes_fetched, chunks_fetched; /* stored bytes read from storage */
    uint64_t index_bytes_fetched;           /* of which chunk indexes (format 2) */
    void (*on_chunk)(void);                 /* after each chunk fetched (heartbeats) */
    int threads;                /* ckpt_plan_run's threads where the store allows (default 1) */
    uint64_t *sec_off;          /* ckpt_section_offsets */
    struct ckpt_chunk **tables; /* per shard, fetched when first needed */
};

int ckpt_reader_init(struct ckpt_reader *r, struct storage *st, const struct ckpt_manifest *m,
                     char *err);
void ckpt_reader_free(struct ckpt_reader *r);
/* Raw bytes [off, off + len) of a shard, every chunk verified. */
int ckpt_read_shard(struct ckpt_reader *r, int shard, uint64_t off, uint64_t len, void *dst,
                    char *err);
/* Elements [lo, lo + n) of a unit's flat buffer for one kind, from whichever
 * shards hold them (any world size); padding beyond the unit's numel reads
 * as zeros. */
int ckpt_read_unit(struct ckpt_reader *r, int unit, int kind, uint64_t lo, uint64_t n, float *dst,
                   char *err);
/* The reshard planner: fills every wanted range of (unit, kind) elements
 * from whichever old shards hold it. FSDP shards are contiguous ranges of
 * each flat unit, so each want maps onto at most a few (old shard, byte
 * range) pieces by interval arithmetic; the pieces are read sorted by shard
 * and offset, so every chunk is fetched and verified once. Elements past a
 * unit's numel (padding for the new world size) are zeros. */
struct ckpt_want {
    int unit, kind;
    uint64_t lo, n;
    float *dst;
};
int ckpt_load(struct ckpt_reader *r, const struct ckpt_want *w, int nw, char *err);
/* ckpt_load in its steps. A plan is the wants as pieces sorted by old
 * shard and raw offset (shard -1: padding, zero-filled); planning reads and
 * writes nothing. ckpt_plan_indexes fetches the chunk index of each shard
 * the plan reads (format 2; the rest of a rank's metadata reads). */
struct ckpt_piece {
    int shard;
    uint64_t off, len; /* raw bytes in the old shard */
    float *dst;
};
struct ckpt_plan {
    int npieces;
    struct ckpt_piece *pieces;
};
int ckpt_plan_load(const struct ckpt_reader *r, const struct ckpt_want *w, int nw,
                   struct ckpt_plan *p, char *err);
int ckpt_plan_indexes(struct ckpt_reader *r, const struct ckpt_plan *p, char *err);
/* Runs the plan: every chunk fetched, verified and decoded once, by
 * r->threads threads with reads issued ahead when the store may be read from
 * several (parallel.c) and the plan is larger than two chunks, else by this
 * one through the reader's cache (which the next small read may find). */
int ckpt_plan_run(struct ckpt_reader *r, const struct ckpt_plan *p, char *err);
int ckpt_plan_run_parallel(struct ckpt_reader *r, const struct ckpt_plan *p, int threads,
                           char *err);
/* Fetches, verifies and decodes every chunk of a format-2 shard on threads
 * threads; bad() is called for each failed chunk, in chunk order; returns
 * the number of problems. */
int ckpt_verify_chunks_parallel(struct ckpt_reader *r, int shard, int threads,
                                void (*bad)(void *arg, const char *msg), void *arg);
void ckpt_plan_free(struct ckpt_plan *p);

/* A shard's chunk table: the manifest's (format 1), or its index fetched,
 * checked against the manifest's digest of it and decoded (format 2, once
 * per reader). */
int ckpt_shard_chunks(struct ckpt_reader *r, int shard, const struct ckpt_chunk **tab, char *err);
/* A format-2 shard's index bytes as stored, verified (malloc'd). */
int ckpt_fetch_index(struct ckpt_reader *r, int shard, unsigned char **buf, char *err);

/* Re-hashes (and decodes) one chunk. */
int ckpt_verify_chunk(struct ckpt_reader *r, int shard, int chunk, char *err);
/* Checks a whole shard: its stored size, its index, every chunk (format 2,
 * on r->threads threads where the store allows), the shard digest.
 * bad(arg, message) is called once per problem; returns the number of
 * problems (0: the shard verifies). */
int ckpt_verify_shard(struct ckpt_reader *r, int shard, void (*bad)(void *arg, const char *msg),
                      void *arg);

/* SHA-256 of each tensor's logical little-endian bytes for each kind
 * (ckpt_tensor_digest), tensor-major: fn(arg, tensor, kind, hex) each. */
int ckpt_digest(struct ckpt_reader *r,
                int (*fn)(void *arg, const char *tensor, const char *kind, const char *hex),
                void *arg, char *err);

/* One tensor's logical digest, the one definition ckpt_digest lists and
 * fsdp-train --verify-load compares with: the SHA-256 of its numel fp32
 * values in order, as 64 hex digits. The values come from piece(arg, off,
 * n, err), called in order for at most CKPT_DIGEST_PIECE values from value
 * off on, which returns them (valid until its next call) or NULL with err
 * set. Returns 0, or -1 with err set. */
enum { CKPT_DIGEST_PIECE = 1 << 16 };
int ckpt_tensor_digest(uint64_t numel,
                       const float *(*piece)(void *arg, uint64_t off, uint64_t n, char *err),
                       void *arg, char hex[65], char *err);

/* ---- resharding ---------------------------------------------------------- */

/* Writes step m->step of src again into dst for `world` ranks, streaming
 * (memory: a few chunks). Commits only when every new shard is durable. */
int ckpt_reshard(struct storage *src, const struct ckpt_manifest *m, struct storage *dst, int world,
                 const struct ckpt_write_opts *o, char *err);

/* Copies a committed step to another store as it is (stored bytes and
 * manifest unchanged, every chunk verified on the way); commits last. A
 * format-1 step is rewritten as format 2 instead (ckpt_reshard to the same
 * world size with o: the same logical bytes). */
int ckpt_copy_step(struct storage *src, const struct ckpt_manifest *m, struct storage *dst,
                   const struct ckpt_write_opts *o, char *err);
/* The stored bytes of the chunk ckpt_verify_chunk last checked. */
const void *ckpt_reader_stored(const struct ckpt_reader *r);

/* ---- steps --------------------------------------------------------------- */

struct ckpt_step_info {
    uint64_t step;
    int committed;
    uint64_t stored_bytes;
    int objects;
    int special; /* objects that are links, FIFOs, devices: the step is damaged */
};

/* All steps in the store, ascending (one listing of the store). */
int ckpt_list_steps(struct storage *st, struct ckpt_step_info **out, int *n, char *err);
/* The same with every object of each step (names within the step's
 * directory, sorted). */
struct ckpt_object {
    char *name;
    uint64_t size;
};
struct ckpt_step_objects {
    struct ckpt_step_info info;
    struct ckpt_object *obj;
    int nobj;
};
int ckpt_list_step_objects(struct storage *st, struct ckpt_step_objects **out, int *n, char *err);
void ckpt_step_objects_free(struct ckpt_step_objects *s, int n);
/* Loads a live manifest (ckpt_manifest_live). Failures: CKPT_NOT_LIVE (a
 * fenced writer's late commit: a "fenced" line), CKPT_DAMAGED (the
 * manifest does not parse, says another step, fails its checks),
 * CKPT_CANNOT_JUDGE (the seals cannot be read: nothing is known about the
 * step), or the storage's code for the GET. */
int ckpt_load_manifest(struct storage *st, uint64_t step, struct ckpt_manifest *m, char *err);
/* The same, also handing back the manifest's bytes as stored (malloc'd):
 * one rank loads, the others parse what it broadcasts. */
int ckpt_load_manifest_doc(struct storage *st, uint64_t step, struct ckpt_manifest *m, char **doc,
                           size_t *len, char *err);
/* *committed = 1 if the step's manifest exists. */
int ckpt_step_committed(struct storage *st, uint64_t step, int *committed, char *err);
/* A fresh writer tag; generation 0 (a tool): the store's current one. */
int ckpt_new_writer_tag(struct storage *st, uint64_t generation, char *tag, size_t n, char *err);

/* ---- deleting: the one place that decides (cleanup.c) --------------------- */

/* A committed step is deleted only by retention (the trainer's --keep after
 * one of its own commits, or `fsdp-ckpt prune --keep K`, K >= 1), never
 * because a read failed, a load was refused or a commit met an existing
 * manifest. An object that no manifest references (an incomplete step, a
 * losing writer's shards, a temporary) is garbage only when its writer can
 * no longer commit it: its tag names a generation older than the store's
 * current one (such writers are fenced). A manifest that is not live
 * (fence.c) is removed by the current generation only. A writer removes its
 * own objects of a step it failed to commit with ckpt_discard_own. Names
 * ckpt does not know are never deleted. */
struct ckpt_clean_policy {
    uint64_t generation; /* the caller's, fence-checked first; 0: a tool, judged
                            against the store's current generation */
    long long keep;      /* committed steps to keep at or below upto; 0: no retention */
    uint64_t upto;       /* retention judges steps <= upto only (newer ones stay) */
};
struct ckpt_clean_report {
    int steps_removed;      /* committed steps dropped by retention */
    int incomplete_removed; /* incomplete steps whose objects were all garbage */
    int incomplete_left;    /* incomplete steps a live writer may still be on */
    int objects_removed;
    int steps_kept; /* committed steps left */
};
int ckpt_clean(struct storage *st, const struct ckpt_clean_policy *p, struct ckpt_clean_report *rep,
               char *err);
/* Removes the shards that the writer with `tag` created for step (world of
 * them; absent ones are fine). Never a manifest, never another tag's. */
int ckpt_discard_own(struct storage *st, uint64_t step, int world, const char *tag, char *err);

/* Commits m, whose shards carry `tag` (ckpt_commit's put-if-absent), and
 * settles every answer that could leave the caller unsure:
 *   CKPT_COMMITTED      our manifest is in place and every shard it names
 *                       exists (returns 0; every other outcome returns -1);
 *   CKPT_NOT_COMMITTED  no manifest of ours counts (none landed; ours was
 *                       withdrawn because a shard it names had been removed;
 *                       or a newer generation's seal leaves it out, err
 *                       says "fenced", and it stays, dead): our shards of
 *                       the step are removed;
 *   CKPT_OTHER          another writer's manifest holds the step (res->other,
 *                       free with ckpt_commit_result_free); ours are removed;
 *   CKPT_OTHER_UNREADABLE  the step is committed but its manifest does not
 *                       load; ours are removed;
 *   CKPT_OTHER_DEAD     a fenced writer's late commit holds the step and
 *                       could not be removed (we are not the current
 *                       generation); ours are removed;
 *   CKPT_UNKNOWN        it cannot be told (the store failed while we looked):
 *                       nothing is removed.
 * A put that failed or met EXISTS may still have been ours (an answer lost
 * after the server acted): the manifest is read back and compared. A
 * fenced writer's late commit in the way is removed (if m's generation is
 * the store's current one) and the put tried once more. Our manifest in
 * place counts only if it is live (fence.c) and no newer generation has
 * claimed the store meanwhile (then: CKPT_UNKNOWN, err says "fenced"). m's
 * generation must be the tag's. */
enum ckpt_commit_outcome {
    CKPT_UNKNOWN,
    CKPT_COMMITTED,
    CKPT_NOT_COMMITTED,
    CKPT_OTHER,
    CKPT_OTHER_UNREADABLE,
    CKPT_OTHER_DEAD,
};
struct ckpt_commit_result {
    enum ckpt_commit_outcome outcome;
    struct ckpt_manifest other;
};
int ckpt_commit_step(struct storage *st, const struct ckpt_manifest *m, const char *tag,
                     struct ckpt_commit_result *res, char *err);
/* The same in a store that holds only some of the step's shards (held[s]
 * = 1; the in-memory snapshots' store of one host among several): only
 * those must be there once the manifest is. NULL: every shard. */
int ckpt_commit_step_held(struct storage *st, const struct ckpt_manifest *m, const char *tag,
                          const unsigned char *held, struct ckpt_commit_result *res, char *err);
void ckpt_commit_result_free(struct ckpt_commit_result *res);

void ckpt_hex(const unsigned char sha[32], char out[65]);
void ckpt_sha256(const void *p, size_t n, unsigned char out[32]);

/* ---- fencing -------------------------------------------------------------- */

/* Every launch claims a new generation in the store (generations/N, made
 * with put-if-absent) and seals it (fences/N: the steps committed at the
 * claim; fence.c). A process whose generation is older than the store's
 * newest may neither commit nor delete: ckpt_fence_check fails with a
 * message saying so. Generation 0 means "not supervised": unfenced. */
int ckpt_fence_current(struct storage *st, uint64_t *gen, char *err);
/* Claims the next generation and seals the store with it; nothing may be
 * launched with the generation before this returns 0. */
int ckpt_fence_claim(struct storage *st, uint64_t *gen, char *err);
/* Claims generation gen itself (one launch's stores on several hosts share
 * their largest claim); 0 too when gen is the store's newest already. */
int ckpt_fence_claim_at(struct storage *st, uint64_t gen, char *err);
int ckpt_fence_check(struct storage *st, uint64_t mine, char *err);
/* The newest sealed generation (0: none). */
int ckpt_fence_sealed_max(struct storage *st, uint64_t *gen, char *err);
/* Whether a manifest is part of the run: 1 yes; 0 no, it landed after
 * generation *by sealed the store (a fenced writer's late commit, or
 * another commit of a step the seal lists); -1 with err when the seals
 * cannot be read (nothing may be concluded then). */
int ckpt_manifest_live(struct storage *st, const struct ckpt_manifest *m, uint64_t *by, char *err);

#endif
