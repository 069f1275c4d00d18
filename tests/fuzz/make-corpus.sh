#!/bin/sh
# Regenerates the seed corpora of tests/fuzz/corpus from real files: what
# the project's own programs write (manifests, safetensors headers, token
# files, the ranks' heartbeat datagrams), the host files and spot notices
# the tests feed fsdp-super, and the XML a real S3 server (Ceph RADOS
# Gateway, started here with tests/s3/ceph-s3.sh) answers. The committed
# seeds came from this script; rerun it after a format change.
#
#   tests/fuzz/make-corpus.sh BUILD_DIR [--no-s3]
#
# BUILD_DIR is a default (gcc) build with fsdp-train, fsdp-data and
# fsdp-ckpt. Without --no-s3 it needs radosgw and curl, and replaces
# corpus/s3_xml; with --no-s3 that corpus is left as it is.
set -eu
if [ $# -lt 1 ]; then
    echo "usage: $0 BUILD_DIR [--no-s3]" >&2
    exit 2
fi
B=$(cd "$1" && pwd)
S3=1
[ "${2:-}" = --no-s3 ] && S3=0
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
C=$here/corpus
work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-corpus.XXXXXX")
cleanup() {
    if [ -n "${ceph_dir:-}" ]; then
        TMPDIR=$work "$root/tests/s3/ceph-s3.sh" stop "$ceph_dir" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1
train() {
    "$B/src/fsdp-train" --threads 1 --log-every 1000 "$@" >train.log 2>&1 ||
        { cat train.log >&2; return 1; }
}
put() { # TARGET NAME: stdin to corpus/TARGET/NAME
    mkdir -p "$C/$1"
    cat >"$C/$1/$2"
}
fresh() { # regression inputs (regress-*, minimised crashes) stay
    mkdir -p "$C/$1"
    find "$C/$1" -type f ! -name 'regress-*' -delete
}
for t in manifest_raw manifest_sealed chunk_index safetensors_header token_header hbmsg hosts \
    notice; do
    fresh "$t"
done
cd "$work"

# ---- token files: fsdp-data prepare on text in tree ----------------------
printf 'One short document about checkpoints.\nIt has two lines.\n' >short.txt
"$B/src/fsdp-data" prepare --out train.bin --val-out val.bin --val-fraction 0.5 \
    "$root/README.md" short.txt 2>/dev/null
printf 'x\n' >letter.txt
"$B/src/fsdp-data" prepare --out letter.bin letter.txt 2>/dev/null
put token_header val-split.bin <val.bin
put token_header one-letter.bin <letter.bin

# ---- manifests: a small model, then resharded and re-encoded -------------
# (word-split on purpose)
small="--model tiny --layers 1 --dim 16 --heads 2 --seq 16 --global-batch 2"
# shellcheck disable=SC2086
train --data train.bin $small --steps 2 --ckpt ck1 --ckpt-every 1 \
    --compress zstd+shuffle:1 --ckpt-chunk-kib 4
"$B/tools/fsdp-ckpt" reshard ck1@2 ck2 --world-size 2 --compress none --chunk-kib 8 >/dev/null
"$B/tools/fsdp-ckpt" reshard ck1@2 ck3 --world-size 3 --compress zstd:3 --chunk-kib 16 >/dev/null
# shellcheck disable=SC2086
train --data train.bin $small --shard grad-op --steps 1 --ckpt ckg --compress none
for m in ck1/step-00000001 ck1/step-00000002 ck2/step-00000002 ck3/step-00000002 \
    ckg/step-00000001; do
    name=$(echo "$m" | tr / -).json
    put manifest_raw "$name" <"$m/MANIFEST.json"
done
# chunk indexes, as fuzz_chunk_index.c reads them: the shard entry's raw
# size, index offset and the chunk size (u64 each), then the index bytes
for m in ck1/step-00000002 ck2/step-00000002 ck3/step-00000002 ckg/step-00000001; do
    /usr/bin/python3 - "$m" <<'PY' | put chunk_index "$(echo "$m" | tr / -).idx"
import json, struct, sys
d = sys.argv[1]
man = json.load(open(d + "/MANIFEST.json"))
s = man["shards"][-1]
with open(d + "/" + s["file"], "rb") as f:
    f.seek(s["index"]["offset"])
    index = f.read(s["index"]["length"])
sys.stdout.buffer.write(struct.pack("<QQQ", s["raw_size"] << 1, s["index"]["offset"] << 1,
                                    man["chunk_bytes"] - 1) + index)
PY
done
# the same manifest in jansson's compact form (still sealed: the digest is
# over the canonical form, whatever the layout of the text)
/usr/bin/python3 -c 'import json,sys; json.dump(json.load(sys.stdin), sys.stdout, separators=(",",":"))' \
    <ck3/step-00000002/MANIFEST.json | put manifest_raw ck3-step-00000002-compact.json

# ---- safetensors headers: exports of the tiny preset ---------------------
train --data train.bin --model tiny --global-batch 1 --steps 1 --ckpt tiny --compress none
"$B/tools/fsdp-ckpt" export tiny out.safetensors >/dev/null
"$B/tools/fsdp-ckpt" export tiny all.safetensors --all >/dev/null
"$B/tools/fsdp-ckpt" export ck1 small.safetensors >/dev/null
# import of the export: one more real manifest (step 0, fresh optimizer)
"$B/tools/fsdp-ckpt" import out.safetensors imported --model tiny --world-size 2 >/dev/null
put manifest_raw imported-w2.json <imported/step-00000000/MANIFEST.json
for f in "$C"/manifest_raw/*; do
    case ${f##*/} in regress-*) ;; *) cp "$f" "$C/manifest_sealed/" ;; esac
done
header() { # FILE: the 8-byte length and the header, without the tensors
    n=$(od -An -t u8 -N 8 "$1" | tr -d ' ')
    head -c $((8 + n)) "$1"
}
header out.safetensors | put safetensors_header tiny-params.st
header all.safetensors | put safetensors_header tiny-all.st
header small.safetensors | put safetensors_header other-model.st
# a whole export of a model unlike tiny (every entry a mismatch, data included)
put safetensors_header other-model-whole.st <small.safetensors

# ---- heartbeat datagrams: what a supervised rank sends -------------------
/usr/bin/python3 - "$B" "$work" <<'PY'
import os, socket, subprocess, sys
build, work = sys.argv[1:]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", 0))
sock.settimeout(0.5)
# the launch's secret: the fixed key of fuzz_hbmsg.c (byte i = 7 i + 1), so
# that the captured datagrams open there; no supervisor answers, so the
# ranks are told not to mind its silence
key = bytes((7 * i + 1) & 0xff for i in range(32)).hex()
env = dict(os.environ, FSDP_SUPER_ADDR="127.0.0.1:%d" % sock.getsockname()[1],
           FSDP_GENERATION="7", FSDP_SUPER_TOKEN=key, FSDP_SUPER_SILENCE_S="1000000")
seen = {}
# a run long enough to beat while training and saving, then its resumption
for steps in ("30", "34"):
    p = subprocess.Popen([f"{build}/src/fsdp-train", "--data", f"{work}/train.bin",
                          "--model", "tiny", "--global-batch", "1", "--steps", steps,
                          "--ckpt", f"{work}/ckhb", "--ckpt-every", "10", "--threads", "1"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            d = sock.recv(4096)
        except socket.timeout:
            if p.poll() is not None:
                break
            continue
        body = d.split(b" ", 4)[-1] if d.startswith(b"fsdp1 ") else d  # the envelope
        f = body.split(b" ")
        kind = f[3] if body.startswith(b"fsdp-ev") else f[5] if len(f) > 5 else b"?"
        seen.setdefault((f[0], kind), d)  # one of each phase and event name
for (k, what), d in sorted(seen.items()):
    name = "%s-%s" % (k.decode(), what.decode("ascii", "replace"))
    with open(os.path.join(work, "hb-" + name), "wb") as out:
        out.write(d)
PY
for f in hb-*; do put hbmsg "${f#hb-}" <"$f"; done

# ---- host files and spot notices, as the tests write them ----------------
printf '# the fleet\nnode-1 4\n  node-2\tslots=2   # two\r\n\nnode-3\nnode-4 0\n10.0.0.5 4096' |
    put hosts fleet
printf 'localhost 2\n' | put hosts localhost
printf 'localhost slots=4\n' | put hosts slots
printf 'a 2147483647\nb 2147483647\n' | put hosts int-overflow
/usr/bin/python3 - "$C/notice" <<'PY'
import json, sys
out = sys.argv[1]
for name, body in [("terminate", {"action": "terminate", "time": "2017-09-18T08:22:00Z"}),
                   ("stop", {"action": "stop", "time": "2017-09-18T08:22:00Z"}),
                   ("hibernate", {"action": "hibernate", "time": "2017-09-18T08:22:00Z"}),
                   ("hostile-time", {"action": "terminate", "time": "\u001b[31mred\u001b[0m\n2"}),
                   ("other-action", {"action": "reboot"})]:
    with open(f"{out}/{name}.json", "wb") as f:
        f.write(json.dumps(body).encode())
PY

# ---- S3 answers from a real server ----------------------------------------
if [ "$S3" = 1 ]; then
    fresh s3_xml
    # in-tree error bodies (tests/s3/fault_proxy.py, tests/s3/test_s3.py)
    printf '<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>' |
        put s3_xml proxy-slowdown.xml
    printf '<?xml version="1.0"?><Error><Code>NoSuchUpload</Code><Message></Message></Error>' |
        put s3_xml proxy-nosuchupload.xml
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    mon=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    ceph_dir=$work/ceph
    # TMPDIR: ceph-s3.sh remembers its last cluster under it; keep that ours
    TMPDIR=$work CEPH_S3_PORT=$port CEPH_MON_PORT=$mon CEPH_S3_STORE=memstore \
        CEPH_S3_STORE_GB=1 "$root/tests/s3/ceph-s3.sh" start "$ceph_dir" >ceph.env 2>ceph.log ||
        { cat ceph.log >&2; exit 1; }
    # shellcheck disable=SC1091
    . ./ceph.env
    s3() { # NAME METHOD PATH [curl args]: the answer's body into corpus/s3_xml/NAME.xml
        name=$1 method=$2 path=$3
        shift 3
        curl -s -X "$method" --aws-sigv4 "aws:amz:us-east-1:s3" \
            --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
            -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$@" "$S3_ENDPOINT$path" |
            put s3_xml "$name.xml"
    }
    s3 create-bucket PUT /fuzz
    s3 create-bucket-again PUT /fuzz
    for k in step-00000001/MANIFEST.json step-00000001/shard-00000-of-00001.g1-0123456789abcdef \
        'odd/a%26b%3Cc%3Ed%22e%27f' 'odd/tab%09lf%0Acr%0D' 'odd/%C3%A4%E2%82%AC%F0%9F%98%80'; do
        curl -s -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" \
            --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
            -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --data-binary 'x' \
            "$S3_ENDPOINT/fuzz/$k" >/dev/null
    done
    s3 list-objects-v2 GET '/fuzz?list-type=2'
    s3 list-objects-v2-truncated GET '/fuzz?list-type=2&max-keys=2'
    # (query parameters sorted: curl's SigV4 signs them in the order given)
    s3 list-objects-v2-delimiter GET '/fuzz?delimiter=%2F&list-type=2&prefix=odd%2F'
    s3 list-objects-v2-common-prefixes GET '/fuzz?delimiter=%2F&list-type=2'
    s3 list-objects-v2-no-bucket GET '/nofuzz?list-type=2'
    s3 get-no-such-key GET /fuzz/nothing-here
    s3 create-multipart-upload POST '/fuzz/big?uploads='
    id=$(sed -n 's:.*<UploadId>\(.*\)</UploadId>.*:\1:p' "$C/s3_xml/create-multipart-upload.xml")
    etag=$(curl -s -D - -o /dev/null -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" \
        --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --data-binary 'part one' \
        "$S3_ENDPOINT/fuzz/big?partNumber=1&uploadId=$id" | sed -n 's/^[Ee][Tt]ag: *\([^\r]*\).*/\1/p')
    s3 complete-multipart-upload-invalid-part POST "/fuzz/big?uploadId=$id" \
        --data-binary "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"00000000000000000000000000000000\"</ETag></Part><Part><PartNumber>2</PartNumber><ETag>x</ETag></Part></CompleteMultipartUpload>"
    s3 complete-multipart-upload POST "/fuzz/big?uploadId=$id" \
        --data-binary "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>$etag</ETag></Part></CompleteMultipartUpload>"
    s3 complete-multipart-upload-repeated POST "/fuzz/big?uploadId=$id" \
        --data-binary "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>$etag</ETag></Part></CompleteMultipartUpload>"
    md5() { printf '%s' "$1" | openssl md5 -binary | base64; }
    body='<Delete><Object><Key>odd/a&amp;b&lt;c&gt;d"e'"'"'f</Key></Object><Object><Key>nothing</Key></Object></Delete>'
    s3 delete-objects POST '/fuzz?delete=' -H "Content-MD5: $(md5 "$body")" --data-binary "$body"
    s3 delete-objects-malformed POST '/fuzz?delete=' -H "Content-MD5: $(md5 '<Delete>')" \
        --data-binary '<Delete>'
    curl -s -X GET --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:wrong-secret" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$S3_ENDPOINT/fuzz?list-type=2" |
        put s3_xml signature-does-not-match.xml
    curl -s "$S3_ENDPOINT/fuzz?list-type=2" | put s3_xml anonymous-access-denied.xml
    find "$C/s3_xml" -type f -size 0 -delete
fi
echo "corpus in $C:"
for d in "$C"/*/; do
    echo "  $(basename "$d"): $(find "$d" -type f | wc -l) files, $(du -sk "$d" | cut -f1) KiB"
done
