/*
 * fuzz_manifest.h - the properties both manifest targets check on every
 * manifest ckpt_manifest_parse accepts, and on every one it refuses.
 */
#ifndef FSDP_FUZZ_MANIFEST_H
#define FSDP_FUZZ_MANIFEST_H

#include "ckpt.h"
#include "fuzz_common.h"

static inline int fuzz_one_line(const char *s) { return strchr(s, '\n') == NULL; }

/* A refusal comes with a message: one NUL-terminated line. */
static inline void fuzz_manifest_refused(const char *err)
{
    const char *end = memchr(err, 0, FSDP_ERR_LEN);
    FUZZ_CHECK(end != NULL);
    FUZZ_CHECK(err[0] != 0);
    /* printed as one line by every program (jansson's message quotes input
     * bytes: see corpus/manifest_raw/regress-error-line-break) */
    FUZZ_CHECK_NAMED("error-line", fuzz_one_line(err));
}

/* What an accepted manifest promises its readers (ckpt_manifest_check) and
 * that it survives the round trip: dump, parse again (accepted), dump again
 * (the same bytes). */
static inline void fuzz_manifest_accepted(const struct ckpt_manifest *m)
{
    char err[FSDP_ERR_LEN] = "";
    FUZZ_CHECK(ckpt_manifest_check(m, err) == 0);
    FUZZ_CHECK(m->world >= 1 && m->nshards == m->world && m->nunits >= 1);
    FUZZ_CHECK(m->version == 1 || m->version == CKPT_FORMAT_VERSION);
    uint64_t *off = ckpt_section_offsets(m);
    FUZZ_CHECK(off != NULL);
    for (int r = 0; r < m->nshards; r++) {
        const struct ckpt_shard *s = &m->shards[r];
        FUZZ_CHECK(off[m->nunits * CKPT_NKINDS] == s->raw_size); /* the planner's layout */
        FUZZ_CHECK((m->version == 1) == (s->chunks != NULL));
        if (m->version >= 2)
            FUZZ_CHECK(s->index_off + s->index_len == s->stored_size &&
                       s->index_len == CKPT_INDEX_HEADER + (uint64_t)s->nchunks * CKPT_INDEX_ENTRY);
        for (int i = 0; s->chunks && i < s->nchunks; i++)
            FUZZ_CHECK(s->chunks[i].raw_off + s->chunks[i].raw_len <= s->raw_size &&
                       s->chunks[i].raw_len <= m->chunk_bytes);
    }
    free(off);
    char *a = ckpt_manifest_dump(m);
    FUZZ_CHECK(a != NULL);
    struct ckpt_manifest again;
    err[0] = 0;
    if (ckpt_manifest_parse(a, strlen(a), &again, err) != 0) {
        fprintf(fuzz_stderr(), "round trip refused: %s\n", err);
        FUZZ_CHECK(!"a dumped manifest parses");
    }
    char *b = ckpt_manifest_dump(&again);
    FUZZ_CHECK(b != NULL);
    FUZZ_CHECK(strcmp(a, b) == 0);
    free(a);
    free(b);
    ckpt_manifest_free(&again);
}

#endif
