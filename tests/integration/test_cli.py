"""Every program: --help exits 0; a bad flag or value gives exactly one line
on stderr that names it and points at --help, and a non-zero exit."""

import os
import re

from harness import BUILD, CKPT, DATA, TRAIN, digest, main, prepare_corpus, run, mpirun

SUPER = os.path.join(BUILD, "recovery", "fsdp-super")


def help_exits_zero(tmp):
    for prog in (TRAIN, DATA, CKPT):
        p = run([prog, "--help"])
        assert "usage:" in p.stdout, p.stdout
    # every fsdp-ckpt command has its own, wherever --help stands
    cmds = [m.group(1) for m in (re.match(r"(?:usage:)? *fsdp-ckpt ([a-z]+) ", l)
                                 for l in run([CKPT, "--help"]).stdout.splitlines()) if m]
    assert len(cmds) == 11 and "convert" in cmds, cmds
    for cmd in cmds:
        for argv in ([cmd, "--help"], [cmd, "x", "y", "-h"]):
            p = run([CKPT] + argv)
            assert p.stdout.startswith(f"usage: fsdp-ckpt {cmd} "), (argv, p.stdout)
            assert p.stdout.splitlines()[1].strip(), (argv, p.stdout)  # what it does


def long_work_shows_progress_on_a_terminal(tmp):
    """fsdp-ckpt verify on a terminal (script(1) gives it one) draws a bar
    ending at 100%; without a terminal, quick work prints nothing extra."""
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run([TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8", "--steps", "1",
         "--ckpt", ck, "--log-every", "100"])
    cmd = f"{CKPT} verify {ck} --threads 1"
    p = run(["script", "-qec", cmd, "/dev/null"], env={"FSDP_PROGRESS_AFTER": "0"})
    bar = [l for l in p.stdout.replace("\r", "\n").splitlines() if l.startswith("verify [")]
    assert bar and "[" + "#" * 30 + "] 100%" in bar[-1], p.stdout
    p = run([CKPT, "verify", ck])
    assert p.stderr == "" and "OK" in p.stdout, p.stderr
    # a problem line never lands on the bar's line
    shard = [f for f in os.listdir(f"{ck}/step-00000001") if f.startswith("shard")][0]
    with open(f"{ck}/step-00000001/{shard}", "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    p = run(["script", "-qec", cmd, "/dev/null"], env={"FSDP_PROGRESS_AFTER": "0"}, check=False)
    lines = p.stdout.replace("\r", "\n").splitlines()
    bad = [l for l in lines if "BAD " in l]
    assert bad and not [l for l in bad if "verify [" in l], lines


def convert_picks_the_verb_its_paths_call_for(tmp):
    """fsdp-ckpt convert: import, export, reshard or cp by its paths, with the
    same result as the verb itself."""
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run([TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8", "--steps", "2",
         "--ckpt", ck, "--log-every", "100"])
    run([CKPT, "export", ck, f"{tmp}/a.safetensors"])
    run([CKPT, "convert", ck, f"{tmp}/b.safetensors"])
    assert open(f"{tmp}/a.safetensors", "rb").read() == open(f"{tmp}/b.safetensors", "rb").read()
    run([CKPT, "convert", f"{tmp}/b.safetensors", f"{tmp}/imp", "--model", "tiny",
         "--world-size", "2"])
    run([CKPT, "convert", ck, f"{tmp}/re", "--world-size", "3"])
    run([CKPT, "convert", ck, f"{tmp}/copy"])
    run([CKPT, "convert", ck, f"{tmp}/re2", "--layout", "native", "--world-size", "2"])
    assert "world size 2" in run([CKPT, "inspect", f"{tmp}/re2"]).stdout
    want = digest(ck)
    assert digest(f"{tmp}/re") == want and digest(f"{tmp}/copy") == want
    imported = digest(f"{tmp}/imp")
    assert all(imported[k] == want[k] for k in want if k[1] == "param")
    assert "world size 3" in run([CKPT, "inspect", f"{tmp}/re"]).stdout
    p = run([CKPT, "convert", f"{tmp}/b.safetensors", f"{tmp}/imp2"], check=False)
    assert p.returncode == 2 and "--world-size" in p.stderr, p.stderr


def ckpt_flags_go_before_or_after_the_uri(tmp):
    """inspect --json, verify --threads and prune --keep take their flag on
    either side of the URI (as aws s3 does), with the same result; a missing
    operand or value, or one too many, is one line that says which."""
    train, _ = prepare_corpus(tmp)
    ck = f"{tmp}/ck"
    run([TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8", "--steps", "3",
         "--ckpt", ck, "--ckpt-every", "1", "--log-every", "100"])
    after = run([CKPT, "inspect", ck, "--json"]).stdout
    assert run([CKPT, "inspect", "--json", ck]).stdout == after and after.startswith("{"), after
    for argv in (["verify", ck, "--threads", "2"], ["verify", "--threads", "2", ck]):
        p = run([CKPT] + argv)
        assert p.stdout.startswith(f"{ck}/step-00000003: OK"), (argv, p.stdout)
    run([CKPT, "cp", ck, f"{tmp}/a"])
    run([CKPT, "cp", ck, f"{tmp}/b"])
    run([CKPT, "prune", f"{tmp}/a", "--keep", "1"])
    run([CKPT, "prune", "--keep", "1", f"{tmp}/b"])
    steps = [sorted(d for d in os.listdir(f"{tmp}/{x}") if d.startswith("step-")) for x in "ab"]
    assert steps[0] == steps[1] == ["step-00000003"], steps
    for argv, want in ((["prune", ck], "prune needs --keep K"),
                       (["inspect", ck, ck], "unexpected argument"),
                       (["verify", "--threads", ck], "--threads"),
                       (["diff", ck], "diff needs two URIs")):
        p = run([CKPT] + argv, check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and want in lines[0], (argv, p.stderr)


def bad_flags_give_one_line_and_the_usage_hint(tmp):
    train, _ = prepare_corpus(tmp)
    cases = [
        ([TRAIN, "--data", train, "--bogus", "1"], "unknown option '--bogus'"),
        ([TRAIN, "--data", train, "--steps", "ten"], "--steps 'ten'"),
        ([TRAIN, "--data", train, "--shard", "half"], "--shard 'half'"),
        ([TRAIN, "--data", train, "--model", "huge"], "--model 'huge'"),
        ([TRAIN, "--data", train, "--dim", "100", "--heads", "3"], "--heads 3 must divide"),
        ([TRAIN, "--steps", "3"], "--data FILE is required"),
        ([TRAIN, "--data"], "--data needs a value"),
        ([DATA, "prepare", "--out"], "--out needs a value"),
        ([DATA, "prepare", "--frob", "x", "in.txt"], "unknown option '--frob'"),
        ([DATA, "tokenize"], "expected the command 'prepare'"),
        ([CKPT, "frobnicate", "x"], "bad arguments for 'frobnicate'"),
        ([CKPT], "expected a command"),
        ([TRAIN, "--data", train, "--compress", "lz4"], "--compress 'lz4'"),
        ([TRAIN, "--data", train, "--resume", "maybe"], "--resume 'maybe'"),
        ([TRAIN, "--data", train, "--ckpt-every", "5"], "--ckpt-every needs --ckpt"),
        ([TRAIN, "--data", train, "--cpu-kernels", "avx9"], "--cpu-kernels 'avx9'"),
        ([TRAIN, "--data", train, "--matmul", "mkl"], "--matmul 'mkl'"),
        ([TRAIN, "--data", train, "--precision", "fp8"], "--precision 'fp8'"),
        ([TRAIN, "--data", train, "--device", "tpu"], "--device 'tpu'"),
        ([TRAIN, "--data", train, "--reduce-dtype", "fp16"], "--reduce-dtype 'fp16'"),
        ([TRAIN, "--data", train, "--prefetch", "maybe"], "--prefetch 'maybe'"),
        ([TRAIN, "--data", train, "--unit-blocks", "0"], "--unit-blocks"),
        ([TRAIN, "--data", train, "--unit-blocks", "5"], "exceeds the model's 4 blocks"),
        ([TRAIN, "--data", train, "--unit-blocks", "2", "--shard", "none"],
         "--shard none gathers nothing"),
        ([TRAIN, "--data", train, "--bucket-mib", "-1"], "--bucket-mib '-1'"),
        ([TRAIN, "--data", train, "--bucket-mib", "4"], "--shard full reduce-scatters each unit"),
        ([TRAIN, "--data", train, "--shard", "grad-op", "--bucket-mib", "4", "--unit-blocks", "2"],
         "give one"),
        ([TRAIN, "--data", train, "--activation-checkpointing", "every-0"],
         "--activation-checkpointing 'every-0'"),
        # a count is a whole number (fsdp-super took 2.5 as 2 and 1e1 as 10)
        ([SUPER, "--np", "2.5", "--", TRAIN], "--np '2.5'"),
        ([SUPER, "--min-np", "1e1", "--np", "2", "--", TRAIN], "--min-np '1e1'"),
        ([SUPER, "--max-restarts", "0.5", "--np", "2", "--", TRAIN], "--max-restarts '0.5'"),
        ([SUPER, "--np", "0", "--", TRAIN], "--np '0'"),
    ]
    for args, needle in cases:
        p = run(args, check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2, f"{args}: exit {p.returncode}"
        assert len(lines) == 1 and needle in lines[0] and "--help" in lines[0], \
            f"{args}: {p.stderr!r}"


def ckpt_tool_errors_are_one_line(tmp):
    os.makedirs(f"{tmp}/empty-dir")
    for args, needle in (([CKPT, "ls", f"{tmp}/empty-dir"], None),
                         ([CKPT, "ls", f"{tmp}/nothing/here"], "no such checkpoint store"),
                         ([CKPT, "verify", f"{tmp}/empty"], "no committed checkpoint"),
                         ([CKPT, "digest", f"{tmp}/empty@42"], "not found"),
                         ([CKPT, "inspect", "s4://bucket/x"], "unsupported scheme")):
        p = run(args, check=False)
        if needle is None:  # an empty directory is an empty store: nothing, and success
            assert p.returncode == 0 and len(p.stdout.splitlines()) == 1, p.stdout
            continue
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1 and needle in lines[0], (args, p.stderr)


def batch_that_does_not_divide_is_refused_once(tmp):
    train, _ = prepare_corpus(tmp)
    p = mpirun(3, [TRAIN, "--data", train, "--global-batch", "8", "--steps", "1"], check=False)
    lines = [l for l in p.stderr.strip().splitlines() if l.startswith("fsdp-train")]
    assert p.returncode != 0
    assert lines == ["fsdp-train: --global-batch 8 is not a multiple of the 3 ranks"], p.stderr
    p = mpirun(2, [TRAIN, "--data", train, "--global-batch", "8", "--micro-batch", "3",
                   "--steps", "1"], check=False)
    assert p.returncode != 0 and "--micro-batch 3 does not divide the 4" in p.stderr, p.stderr


def device_cuda_without_a_gpu_is_refused_once(tmp):
    """Where there is no GPU (or no CUDA module), --device cuda is one line
    from rank 0 and exit 1, on one rank and on two."""
    train, _ = prepare_corpus(tmp)
    args = [TRAIN, "--data", train, "--device", "cuda", "--steps", "1"]
    p = run(args, check=False)
    if p.returncode == 0:
        print("  skipped: this machine has a GPU", flush=True)
        return
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith(
        "fsdp-train: --device cuda: "), p.stderr
    p = mpirun(2, args, check=False)
    lines = [l for l in p.stderr.strip().splitlines() if l.startswith("fsdp-train")]
    assert p.returncode != 0 and len(lines) == 1 and "--device cuda: " in lines[0], p.stderr


if __name__ == "__main__":
    main([help_exits_zero, convert_picks_the_verb_its_paths_call_for,
          ckpt_flags_go_before_or_after_the_uri,
          long_work_shows_progress_on_a_terminal,
          bad_flags_give_one_line_and_the_usage_hint,
          ckpt_tool_errors_are_one_line,
          batch_that_does_not_divide_is_refused_once,
          device_cuda_without_a_gpu_is_refused_once])
