"""--precision fp16 with dynamic loss scaling (issue 36): 200 steps of tiny
stay within a stated tolerance of fp32; an overflow on one rank skips that
step on every rank (the same checkpoint whichever rank overflowed, on a
strategy whose norm is summed over ranks and on one whose norm is not),
halves the scale and leaves AdamW's count a step behind; the scale, its
growth tracker and AdamW's count resume with the checkpoint (the same bits
and the same scales as an uninterrupted run) and on another world size;
checkpoints move between fp32, bf16 and fp16 runs."""

import hashlib
import json
import os
import re

from harness import (BUILD, CKPT, DATA, TRAIN, digest, fortune_files, main, mpirun, read_log,
                     run, slow)

SUPER = os.path.join(BUILD, "recovery", "fsdp-super")

SMALL = ["--layers", "2", "--dim", "64", "--heads", "2", "--seq", "64", "--global-batch", "4",
         "--threads", "1"]


def data(tmp):
    path = f"{tmp}/train.bin"
    run([DATA, "prepare", "--doc-sep", "%", "--out", path] + fortune_files())
    return path


def log_of(path):
    return [r for r in read_log(path) if "loss" in r]


def mean(xs):
    return sum(xs) / len(xs)


def trainer_state(uri, step):
    with open(f"{uri}/step-{step:08d}/MANIFEST.json") as f:
        return json.load(f)["trainer"]


def jansson_compact(o):
    """json_dumps(JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)):
    the text a manifest's seal is the SHA-256 of (ckpt/manifest.c)."""
    if isinstance(o, bool):
        return "true" if o else "false"
    if o is None:
        return "null"
    if isinstance(o, int):
        return str(o)
    if isinstance(o, float):
        s = "%.17g" % o
        s += ".0" if "." not in s and "e" not in s else ""
        return re.sub(r"e\+?(-?)0*(\d)", r"e\1\2", s)
    if isinstance(o, str):
        return json.dumps(o, ensure_ascii=False)
    if isinstance(o, list):
        return "[" + ",".join(jansson_compact(x) for x in o) + "]"
    return "{" + ",".join(json.dumps(k) + ":" + jansson_compact(o[k]) for k in sorted(o)) + "}"


def edit_trainer(uri, step, edit):
    """Changes a committed manifest's trainer state and seals it again, as
    a careless tool (or an attacker with the store) could."""
    path = f"{uri}/step-{step:08d}/MANIFEST.json"
    with open(path) as f:
        m = json.load(f)
    was = m.pop("digest")
    assert hashlib.sha256(jansson_compact(m).encode()).hexdigest() == was, "the seal's text"
    edit(m["trainer"])
    m["digest"] = hashlib.sha256(jansson_compact(m).encode()).hexdigest()
    with open(path, "w") as f:
        json.dump(m, f)


@slow
def two_hundred_steps_stay_near_fp32(tmp):
    d = data(tmp)
    runs = {}
    for tag, extra in (("fp32", ["--precision", "fp32"]), ("fp16", ["--precision", "fp16"]),
                       ("fp16-1024", ["--precision", "fp16", "--loss-scale", "1024"])):
        log = f"{tmp}/{tag}.jsonl"
        p = mpirun(2, [TRAIN, "--model", "tiny", "--data", d, "--steps", "200", "--threads", "1",
                       "--log", log, "--log-every", "50"] + extra)
        runs[tag] = (log_of(log), p.stderr)
    ref = mean([r["loss"] for r in runs["fp32"][0][-50:]])
    for tag, tol in (("fp16", 0.05), ("fp16-1024", 0.01)):
        rows, err = runs[tag]
        assert len(rows) == 200, (tag, len(rows))
        got = mean([r["loss"] for r in rows[-50:]])
        assert abs(got - ref) <= tol * ref, (tag, got, ref)
        skipped = [r["step"] for r in rows if r["skipped"]]
        assert all(r["grad_norm"] is None for r in rows if r["skipped"]), tag
        assert f"; {len(skipped)} step{'' if len(skipped) == 1 else 's'} skipped" in err, err[-800:]
        assert "precision fp16 (gathers and gradients, dynamic loss scale" in err, err[:1500]
        # every skip halves the scale; the text log names each skipped step
        scales = [r["loss_scale"] for r in rows]
        for r, s in zip(rows[1:], scales):
            assert r["loss_scale"] == (s / 2 if r["skipped"] else s), (tag, r)
        for s in skipped:
            assert f"step {s:6d}/200" in err and "skipped: the gradients overflow" in err, s
        print(f"  {tag}: mean loss of the last 50 steps {got:.4f} against fp32's {ref:.4f} "
              f"({100 * (got - ref) / ref:+.2f}%, tolerance {100 * tol:.0f}%); skipped {skipped}, "
              f"final scale {scales[-1]:g}")


def an_overflow_on_one_rank_skips_the_step_on_every_rank(tmp):
    d = data(tmp)
    common = SMALL + ["--data", d, "--precision", "fp16", "--loss-scale", "1024", "--steps", "30"]
    for shard in ("full", "none"):
        digests, logs = {}, {}
        for who in (None, 0, 1):
            tag = f"{shard}-{who}"
            ck, log = f"{tmp}/{tag}", f"{tmp}/{tag}.jsonl"
            env = {"FSDP_TEST_OVERFLOW_AT": f"20:{who}"} if who is not None else None
            mpirun(2, [TRAIN] + common + ["--shard", shard, "--ckpt", ck, "--log", log], env=env)
            digests[who], logs[who] = digest(ck), log_of(log)
        clean, hit = logs[None], logs[1]
        assert not any(r["skipped"] for r in clean), shard
        assert [r["step"] for r in hit if r["skipped"]] == [20], shard
        assert [r["loss"] for r in hit[:20]] == [r["loss"] for r in clean[:20]], shard
        assert hit[20]["loss"] != clean[20]["loss"], "the skipped step changed nothing"
        assert hit[19]["loss_scale"] == 512 and hit[-1]["loss_scale"] == 512, hit[19]
        # whichever rank overflowed, every rank skipped: the same state
        assert digests[0] == digests[1], f"{shard}: rank 0's overflow and rank 1's differ"
        assert digests[1] != digests[None], shard
        st = trainer_state(f"{tmp}/{shard}-1", 30)
        assert st["optimizer"]["t"] == 29 and st["grad_scaler"]["scale"] == 512, st
        assert trainer_state(f"{tmp}/{shard}-None", 30)["optimizer"]["t"] == 30
    print("  an infinity on rank 0 or on rank 1 at step 20 (shard full and none): step 20 "
          "skipped, the scale 1024 -> 512, the same checkpoint either way, AdamW's t 29 of 30")


def the_scaler_resumes_with_the_checkpoint(tmp):
    d = data(tmp)
    common = SMALL + ["--data", d, "--precision", "fp16", "--loss-scale", "256",
                      "--loss-scale-window", "4", "--steps", "24", "--ckpt-every", "6"]
    env = {"FSDP_TEST_OVERFLOW_AT": "3:0"}
    whole, split = f"{tmp}/whole", f"{tmp}/split"
    mpirun(2, [TRAIN] + common + ["--ckpt", whole, "--log", f"{tmp}/whole.jsonl"], env=env)
    mpirun(2, [TRAIN] + common + ["--ckpt", split, "--stop-at-step", "13", "--log",
                                  f"{tmp}/split.jsonl"], env=env)
    st = trainer_state(split, 13)
    # step 3 skipped (256 -> 128), then 4 clean steps double it: 7, 11
    assert st["grad_scaler"] == {"scale": 512.0, "growth_tracker": 2, "growth_interval": 4}, st
    assert st["optimizer"]["t"] == 12, st
    p = mpirun(2, [TRAIN] + common + ["--ckpt", split, "--log", f"{tmp}/split.jsonl"])
    assert "loss scale 512 from the checkpoint (2 clean steps, 1 steps skipped so far)" in p.stderr
    assert digest(whole) == digest(split), "a resume changed the bits"
    w = [(r["step"], r["loss_scale"]) for r in log_of(f"{tmp}/whole.jsonl")]
    s = [(r["step"], r["loss_scale"]) for r in log_of(f"{tmp}/split.jsonl")]
    assert w == s, (w, s)
    # on one rank: the same scale and count go on
    p = run([TRAIN] + common[:-4] + ["--steps", "26", "--ckpt", whole, "--log",
                                     f"{tmp}/one.jsonl"])
    assert "loss scale 4096 from the checkpoint (1 clean steps" in p.stderr, p.stderr[-1500:]
    assert trainer_state(whole, 26)["optimizer"]["t"] == 25
    print(f"  stopped at 13 (scale 512, 2 clean steps, t 12) and resumed: the uninterrupted "
          f"run's digest and scales {sorted(set(x for _, x in w))}; then on 1 rank from 4096")


def checkpoints_move_between_precisions(tmp):
    d = data(tmp)
    ck = f"{tmp}/ck"
    base = SMALL + ["--data", d, "--ckpt", ck]
    steps = 0
    env = None
    for prec in ("fp32", "fp16", "bf16", "fp16", "fp32"):
        steps += 5
        extra = ["--loss-scale", "1024"] if prec == "fp16" else []
        if prec == "fp16" and steps == 10:
            env = {"FSDP_TEST_OVERFLOW_AT": "7:1"}
        stop = ["--stop-at-step", str(steps)] if steps < 25 else []
        p = mpirun(2, [TRAIN] + base + ["--precision", prec, "--steps", "25"] + stop + extra,
                   env=env)
        env = None
        if steps > 5:
            assert f"resumed from checkpoint step {steps - 5}" in p.stderr, p.stderr[-1500:]
        st = trainer_state(ck, steps)
        assert ("grad_scaler" in st) == (prec == "fp16"), (prec, st)
        # the fp16 run's skipped step stays out of AdamW's count from then on
        assert st["optimizer"]["t"] == (steps if steps < 10 else steps - 1), (prec, st)
        if prec == "fp16" and steps == 20:  # bf16 between: the scale starts again
            assert "from the checkpoint (" not in p.stderr, p.stderr[-1500:]
    v = run([CKPT, "verify", ck])
    assert v.returncode == 0, v.stderr
    print("  fp32 -> fp16 (a step skipped) -> bf16 -> fp16 -> fp32, 5 steps each: every resume "
          "loads; AdamW's count keeps the skipped step out; the scaler only in fp16's")


def a_bad_scaler_in_a_checkpoint_is_refused_before_its_shards(tmp):
    d = data(tmp)
    common = SMALL + ["--data", d, "--precision", "fp16", "--steps", "8"]
    mpirun(2, [TRAIN] + common + ["--ckpt", f"{tmp}/good"])
    bad = (("scale -1", lambda t: t["grad_scaler"].update(scale=-1.0), "grad_scaler"),
           ("scale 1e300", lambda t: t["grad_scaler"].update(scale=1e300), "grad_scaler"),
           ("tracker 2^40", lambda t: t["grad_scaler"].update(growth_tracker=1 << 40),
            "grad_scaler"),
           ("a string scale", lambda t: t["grad_scaler"].update(scale="big"), "grad_scaler"),
           ("t past the step", lambda t: t["optimizer"].update(t=9), "optimizer.t"),
           ("t negative", lambda t: t["optimizer"].update(t=-1), "optimizer.t"))
    for i, (what, edit, word) in enumerate(bad):
        ck = f"{tmp}/bad{i}"
        run(["cp", "-a", f"{tmp}/good", ck])
        edit_trainer(ck, 8, edit)
        before = open(f"{ck}/step-00000008/MANIFEST.json").read()
        p = mpirun(2, [TRAIN] + common[:-1] + ["12", "--ckpt", ck], check=False)
        lines = [l for l in p.stderr.splitlines() if word in l]
        assert p.returncode != 0 and lines and ck in lines[0], (what, p.returncode, p.stderr[-1500:])
        assert "loading step" not in p.stderr, f"{what}: shards were read first"
        assert open(f"{ck}/step-00000008/MANIFEST.json").read() == before, what
        assert not os.path.exists(f"{ck}/step-00000012"), what
    print(f"  {len(bad)} resealed manifests with a bad scaler or AdamW count: each refused in one "
          f"line naming it and the store, before a shard is read; nothing written")


def a_supervisor_reports_each_skipped_step(tmp):
    """A scale of 1e9 overflows a fresh model's gradient at once (an element
    past 65504/1e9 = 6.6e-5); each skip is an event with the new scale."""
    d = data(tmp)
    ev = f"{tmp}/events.jsonl"
    run([SUPER, "--np", "2", "--max-restarts", "0", "--events", ev, "--", TRAIN] + SMALL +
        ["--data", d, "--precision", "fp16", "--loss-scale", "1e9", "--steps", "30"])
    skips = [json.loads(line) for line in open(ev) if '"loss_scale_skip"' in line]
    assert skips and skips[0]["step"] == 1 and skips[0]["scale"] == 5e8, skips[:2]
    steps = [e["step"] for e in skips]
    assert steps == list(range(1, len(steps) + 1)), steps  # until the scale fits
    print(f"  --loss-scale 1e9: steps 1..{len(steps)} skipped, one loss_scale_skip event each, "
          f"the scale down to {skips[-1]['scale']:g}")


if __name__ == "__main__":
    main([two_hundred_steps_stay_near_fp32,
          an_overflow_on_one_rank_skips_the_step_on_every_rank,
          the_scaler_resumes_with_the_checkpoint,
          checkpoints_move_between_precisions,
          a_bad_scaler_in_a_checkpoint_is_refused_before_its_shards,
          a_supervisor_reports_each_skipped_step])
