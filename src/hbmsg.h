/*
 * hbmsg.h - the trainer <-> supervisor datagrams, defined once: the ranks
 * format them (heartbeat.c), fsdp-super parses them (recovery/link.c),
 * and the other way round for the supervisor's answers.
 *
 * Three bodies, plain ASCII, single spaces:
 *
 *   fsdp-hb GEN RANK PID STEP PHASE PROGRESS     a heartbeat (every 250 ms)
 *   fsdp-ev GEN RANK NAME [KEY=VALUE]...         an event for the log
 *   fsdp-ctl GEN RANK ACTION ECHO                the supervisor's answer
 *
 * GEN is the launch's generation (FSDP_GENERATION), PHASE one of the names
 * of enum hb_phase, PROGRESS a counter the rank bumps at every unit of
 * work. An event's NAME and KEYs are [a-z_]+, its VALUEs [A-Za-z0-9._-]+,
 * at most HBMSG_MAX_KV pairs, e.g.
 * "fsdp-ev 3 0 resumed step=120 world=2". ACTION is one of enum hb_ctl
 * (ack, preempt, stop, kill) and ECHO the SEQ of the rank's datagram it
 * answers (so a rank knows how fresh an answer is; see heartbeat.c).
 *
 * On the wire every body travels sealed in an envelope:
 *
 *   fsdp1 MAC HOST SEQ BODY
 *
 * HOST is the sender's host name ([A-Za-z0-9._-], 1..64 bytes), SEQ a
 * per-process counter from 1 (replays are refused with hbmsg_window), MAC
 * 64 lowercase hex digits of HMAC-SHA256 over everything after "MAC "
 * (HOST SEQ BODY), keyed by the launch's secret (32 random bytes made by
 * fsdp-super for each launch, handed to the ranks as FSDP_SUPER_TOKEN in
 * the launch's environment). An HMAC rather than the token itself in each
 * datagram: UDP crosses the network in the clear, and a token that rode in
 * every datagram would be learned from one of them and forge the rest; a
 * MAC gives nothing away, covers every field (no step or phase can be
 * altered) and, with SEQ, makes a captured datagram useless to replay.
 *
 * The parsers take (buffer, length), never trust a terminator, and accept
 * nothing but the exact grammar: decimal numbers are digits only and in
 * range, the phase is a known name, nothing trails. The MAC is checked
 * before anything else is read. Whatever they accept is safe to print and
 * to put in a JSON string; a fuzz target can call them on raw bytes.
 */
#ifndef FSDP_HBMSG_H
#define FSDP_HBMSG_H

#include <stddef.h>
#include <stdint.h>

/* HB_HOLD: stopped at a step by the test hook (testhook.h), alive and
 * beating, waiting for the fault the supervisor is about to inject. */
/* HB_STOPPED: stopped before --steps with a checkpoint (a time limit,
 * --stop-at-step); resumable, like HB_PREEMPTED, but nothing to relaunch */
enum hb_phase {
    HB_START,
    HB_TRAIN,
    HB_SAVE,
    HB_LOAD,
    HB_DONE,
    HB_PREEMPTED,
    HB_HOLD,
    HB_STOPPED,
    HB_NPHASES
};

enum hbmsg_kind { HBMSG_BEAT, HBMSG_EVENT, HBMSG_CTL };

/* What the supervisor asks of a rank in its answer: nothing (ack: I hear
 * you), an emergency checkpoint (SIGUSR1's meaning), or to raise SIGSTOP or
 * SIGKILL on itself (chaos faults on a rank of another host). */
enum hb_ctl { HBCTL_ACK, HBCTL_PREEMPT, HBCTL_STOP, HBCTL_KILL, HBCTL_N };

#define HBMSG_MAX_LEN  512 /* longest body either side sends or accepts */
#define HBMSG_MAX_KV   8
#define HBMSG_NAME_LEN 32
#define HBMSG_VAL_LEN  64
#define HBMSG_HOST_LEN 65 /* a host name of 1..64 bytes and its NUL */
#define HBMSG_KEY_LEN  32 /* the launch's secret, in bytes */
#define HBMSG_KEY_HEX  (2 * HBMSG_KEY_LEN)
/* "fsdp1 " MAC " " HOST " " SEQ " " around a body */
#define HBMSG_DGRAM_MAX (HBMSG_MAX_LEN + 6 + 64 + 1 + 64 + 1 + 20 + 1)

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
    /* HBMSG_CTL */
    enum hb_ctl action;
    uint64_t echo;
    /* the envelope (hbmsg_open only) */
    char host[HBMSG_HOST_LEN];
    uint64_t seq;
};

/* The launch's secret. */
struct hbmsg_key {
    unsigned char k[HBMSG_KEY_LEN];
};

/* The SEQs seen from one sender: the highest and the 63 below it. */
struct hbmsg_window {
    uint64_t top, seen;
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

/* A control message: "fsdp-ctl GEN RANK ACTION ECHO". */
int hbmsg_format_ctl(char *buf, size_t cap, uint64_t gen, int rank, enum hb_ctl action,
                     uint64_t echo);
/* "ack", "preempt", ...; NULL outside the enum. */
const char *hbmsg_ctl_name(enum hb_ctl a);

/* Parses one body of len bytes; 0 and m filled, or -1 when it is not
 * exactly one of the three forms above. */
int hbmsg_parse(const char *buf, size_t len, struct hbmsg *m);

/* ---- the envelope ---- */

/* A fresh secret from getrandom; -1 if the kernel gives none. */
int hbmsg_key_new(struct hbmsg_key *k);
/* The secret as 64 lowercase hex digits (hex: HBMSG_KEY_HEX + 1 bytes). */
void hbmsg_key_hex(const struct hbmsg_key *k, char *hex);
/* FSDP_SUPER_TOKEN's value: exactly 64 lowercase hex digits; 0 or -1. */
int hbmsg_key_parse(const char *s, struct hbmsg_key *k);

/* Seals body (blen bytes, a formatted body) for host and seq into buf
 * (cap bytes, NUL-terminated); returns the datagram's length, or -1 if the
 * host name breaks the grammar, seq is 0 or it does not fit. */
int hbmsg_seal(char *buf, size_t cap, const struct hbmsg_key *k, const char *host, uint64_t seq,
               const char *body, size_t blen);

#define HBMSG_EAUTH -1 /* not sealed with this key: no envelope, a wrong MAC */
#define HBMSG_EBAD  -2 /* sealed with this key, yet not the grammar */
/* Opens one datagram of len bytes: 0 with m filled (host and seq too),
 * HBMSG_EAUTH or HBMSG_EBAD (m zeroed). */
int hbmsg_open(const char *buf, size_t len, const struct hbmsg_key *k, struct hbmsg *m);

/* 1 if seq is new from this sender (and now remembered), 0 for a replay or
 * one more than 63 below the highest seen. */
int hbmsg_window_accept(struct hbmsg_window *w, uint64_t seq);

/* An address of FSDP_SUPER_ADDR or --listen: "HOST:PORT", "[V6]:PORT",
 * and where the port is optional also "HOST", "[V6]", a bare V6 address
 * (two colons or more) and ":PORT" (HOST empty: every interface). HOST is
 * a name or an address of [A-Za-z0-9._:%-] shorter than hn; PORT 0..65535
 * (*port -1 when absent). 0 or -1. */
int hbmsg_parse_addr(const char *s, int port_optional, char *host, size_t hn, int *port);

/* This machine's host name in the envelope's grammar (bytes outside it
 * become '_', cut to 64), as both sides compare it. */
void hbmsg_host_name(char *out, size_t n);

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
