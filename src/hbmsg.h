/*
 * hbmsg.h - the trainer <-> supervisor datagrams, defined once: the ranks
 * format them (heartbeat.c), fsdp-super parses them (recovery/super.c).
 *
 * Two kinds, one UDP datagram each, plain ASCII, single spaces:
 *
 *   fsdp-hb GEN RANK PID STEP PHASE PROGRESS     a heartbeat (every 250 ms)
 *   fsdp-ev GEN RANK NAME [KEY=VALUE]...         an event for the log
 *
 * GEN is the launch's generation (FSDP_GENERATION), PHASE one of the names
 * of enum hb_phase, PROGRESS a counter the rank bumps at every unit of
 * work. An event's NAME and KEYs are [a-z_]+, its VALUEs [A-Za-z0-9._-]+,
 * at most HBMSG_MAX_KV pairs, e.g.
 * "fsdp-ev 3 0 resumed step=120 world=2".
 *
 * The parser takes (buffer, length), never trusts a terminator, and
 * accepts nothing but the exact grammar: decimal numbers are digits only
 * and in range, the phase is a known name, nothing trails. Whatever it
 * accepts is safe to print and to put in a JSON string; a fuzz target can
 * call it on raw bytes.
 */
#ifndef FSDP_HBMSG_H
#define FSDP_HBMSG_H

#include <stddef.h>
#include <stdint.h>

/* HB_HOLD: stopped at a step by the test hook (testhook.h), alive and
 * beating, waiting for the fault the supervisor is about to inject. */
enum hb_phase { HB_START, HB_TRAIN, HB_SAVE, HB_LOAD, HB_DONE, HB_PREEMPTED, HB_HOLD, HB_NPHASES };

enum hbmsg_kind { HBMSG_BEAT, HBMSG_EVENT };

#define HBMSG_MAX_LEN  512 /* longest datagram either side sends or accepts */
#define HBMSG_MAX_KV   8
#define HBMSG_NAME_LEN 32
#define HBMSG_VAL_LEN  64

/* Generations are claimed as numbers below 2^63 (they travel as JSON
 * integers and as signed 64-bit values in manifests). */
#define HBMSG_MAX_GENERATION ((UINT64_C(1) << 63) - 1)

struct hbmsg {
    enum hbmsg_kind kind;
    uint64_t generation;
    int rank;
    /* HBMSG_BEAT */
    int pid;
    uint64_t step, progress;
    enum hb_phase phase;
    /* HBMSG_EVENT */
    char name[HBMSG_NAME_LEN];
    int nkv;
    char key[HBMSG_MAX_KV][HBMSG_NAME_LEN];
    char val[HBMSG_MAX_KV][HBMSG_VAL_LEN];
};

/* "train", "hold", ...; NULL for a value outside the enum. */
const char *hbmsg_phase_name(enum hb_phase p);

/* A heartbeat into buf (cap bytes, NUL-terminated); returns its length, or
 * -1 if it does not fit. */
int hbmsg_format_beat(char *buf, size_t cap, uint64_t gen, int rank, int pid, uint64_t step,
                      enum hb_phase phase, uint64_t progress);
/* An event: "fsdp-ev GEN RANK " followed by text (NAME KEY=VALUE...), as
 * the caller wrote it; returns the length or -1 if it does not fit. The
 * supervisor drops an event whose text breaks the grammar. */
int hbmsg_format_event(char *buf, size_t cap, uint64_t gen, int rank, const char *text);

/* Parses one datagram of len bytes; 0 and m filled, or -1 when it is not
 * exactly one of the two forms above. */
int hbmsg_parse(const char *buf, size_t len, struct hbmsg *m);

/* An event's value for key as a number; -1 if absent or not a number. */
int hbmsg_event_u64(const struct hbmsg *m, const char *key, uint64_t *out);
/* An event's value for key as a string; NULL if absent. */
const char *hbmsg_event_str(const struct hbmsg *m, const char *key);

/* The one strict decimal parser of the protocol and of the values the
 * supervisor hands its ranks (FSDP_GENERATION, FSDP_TEST_HOLD_AT): len
 * bytes of digits only (no sign, no space, no empty string), no overflow,
 * at most max. 0 and *out set, or -1. */
int hbmsg_parse_uint(const char *s, size_t len, uint64_t max, uint64_t *out);
/* FSDP_GENERATION's value: a generation in 1..HBMSG_MAX_GENERATION. */
int hbmsg_parse_generation(const char *s, uint64_t *gen);

#endif
