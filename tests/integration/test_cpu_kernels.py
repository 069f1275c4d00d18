"""A mixed fleet: the binaries the README builds run on any x86-64 CPU and
pick their kernels at start (src/cpu/kernels_cpu.c).

Older CPUs are real CPU models emulated by qemu-x86_64 (qemu-user): Westmere
has no AVX at all, Haswell has AVX2 and FMA (x86-64-v3). A binary compiled
with -march=native on this machine dies there with SIGILL; ours trains,
writes a checkpoint and verifies it, each with the kernels the emulated CPU
supports. A forced OpenBLAS core type the CPU cannot run (fsdp-super
carries OPENBLAS_CORETYPE to every host) is replaced at start, not obeyed
into SIGILL. The other runs leave OPENBLAS_CORETYPE unset."""

import os
import shutil
import subprocess

from harness import CKPT, DATA, TRAIN, fortune_files, main, read_log, run

QEMU = shutil.which("qemu-x86_64")
SHAPE = ["--layers", "1", "--dim", "32", "--heads", "2", "--seq", "32", "--global-batch", "2",
         "--threads", "1", "--steps", "3"]


def on(cpu, args, check=True, blas_core=None):
    """Runs args on an emulated CPU model (None: this machine's CPU)."""
    assert QEMU, "qemu-x86_64 is missing (tools/setup.sh installs qemu-user)"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if blas_core:
        env["OPENBLAS_CORETYPE"] = blas_core
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    cmd = ([QEMU, "-cpu", cpu] if cpu else []) + args
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace")
    if check and p.returncode != 0:
        raise AssertionError(f"{cpu or 'host'}: {' '.join(args[:2])} exited {p.returncode}:\n"
                             f"{p.stderr[-2000:]}")
    return p


def host_levels():
    """The x86-64 levels this machine's CPU runs, widest first."""
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    levels = ["x86-64"]
    if {"avx", "avx2", "fma", "bmi1", "bmi2", "movbe", "f16c"} <= flags:
        levels.insert(0, "x86-64-v3")
        if {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags:
            levels.insert(0, "x86-64-v4")
    return levels


def kernels_of(banner):
    for word in ("x86-64-v4", "x86-64-v3", "x86-64", "native"):
        if f"cpu {word} kernels" in banner:
            return word
    raise AssertionError(f"no kernel name in the banner: {banner[:400]}")


def losses(path):
    return [r["loss"] for r in read_log(path) if "loss" in r and "step" in r]


def the_programs_run_on_a_cpu_without_avx(tmp):
    train, val = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    on("Westmere", [DATA, "prepare", "--out", train, "--val-out", val, "--doc-sep", "%"]
       + fortune_files()[:2])
    ck = os.path.join(tmp, "ck")
    p = on("Westmere", [TRAIN, "--data", train, "--ckpt", ck, "--ckpt-every", "3"] + SHAPE)
    assert kernels_of(p.stderr) == "x86-64", p.stderr[:600]
    on("Westmere", [CKPT, "verify", ck])
    # and the checkpoint written there resumes here, on the widest kernels
    p = on(None, [TRAIN, "--data", train, "--ckpt", ck, "--ckpt-every", "3"]
           + SHAPE[:-1] + ["5"])
    assert "resumed from checkpoint step 3" in p.stderr and \
        kernels_of(p.stderr) == host_levels()[0], p.stderr[:800]


def a_blas_core_the_cpu_lacks_is_replaced(tmp):
    """The replacement takes effect by re-executing the program, which
    qemu-user does not follow (the new program runs on the real CPU): so
    the first run shows the decision, and the second runs what it decided
    on the emulated CPU, start to end."""
    train = os.path.join(tmp, "train.bin")
    run([DATA, "prepare", "--out", train, "--doc-sep", "%"] + fortune_files()[:1])
    for core, cpu, instead in (("Haswell", "Westmere", "OpenBLAS's own choice"),
                               ("SkylakeX", "Westmere", "OpenBLAS's own choice"),
                               ("SkylakeX", "Haswell", "Haswell")):
        p = on(cpu, [TRAIN, "--data", train] + SHAPE, blas_core=core)
        assert f"OPENBLAS_CORETYPE={core} needs instructions this CPU lacks; using {instead}" \
            in p.stderr, f"{core} on {cpu}: {p.stderr[:600]}"
        then = None if instead.startswith("OpenBLAS") else instead
        p = on(cpu, [TRAIN, "--data", train] + SHAPE, blas_core=then)
        assert "needs instructions" not in p.stderr and "step      3/3" in p.stdout + p.stderr, \
            f"{then} on {cpu}: {p.stderr[-600:]}"
        assert kernels_of(p.stderr) == {"Westmere": "x86-64", "Haswell": "x86-64-v3"}[cpu], \
            p.stderr[:400]


def each_cpu_gets_the_widest_kernels_it_runs(tmp):
    train, _ = os.path.join(tmp, "train.bin"), None
    run([DATA, "prepare", "--out", train, "--doc-sep", "%"] + fortune_files()[:1])
    for cpu, want in (("Westmere", "x86-64"), ("Haswell", "x86-64-v3"),
                      (None, host_levels()[0])):
        p = on(cpu, [TRAIN, "--data", train] + SHAPE[:-1] + ["1"])
        assert kernels_of(p.stderr) == want, f"{cpu or 'host'}: {p.stderr[:400]}"


def every_kernel_set_trains_alike(tmp):
    """The same job on each instruction set this CPU runs, and on the
    emulated Westmere: the losses agree to rounding (FMA and vector width
    change the last bits, nothing more)."""
    train, _ = os.path.join(tmp, "train.bin"), None
    run([DATA, "prepare", "--out", train, "--doc-sep", "%"] + fortune_files()[:1])
    runs = {}
    for isa in host_levels():
        log = os.path.join(tmp, f"{isa}.jsonl")
        p = on(None, [TRAIN, "--data", train, "--log", log, "--cpu-kernels", isa] + SHAPE)
        assert kernels_of(p.stderr) == isa, p.stderr[:400]
        runs[isa] = losses(log)
    log = os.path.join(tmp, "westmere.jsonl")
    on("Westmere", [TRAIN, "--data", train, "--log", log] + SHAPE)
    runs["Westmere"] = losses(log)
    base = runs["x86-64"]
    assert len(base) == 3, base
    for name, ls in runs.items():
        assert len(ls) == len(base), (name, ls)
        for a, b in zip(base, ls):
            assert abs(a - b) <= 1e-5 * abs(a), f"{name}: {ls} vs x86-64 {base}"


def kernels_the_cpu_lacks_are_refused(tmp):
    train = os.path.join(tmp, "train.bin")
    run([DATA, "prepare", "--out", train, "--doc-sep", "%"] + fortune_files()[:1])
    p = on("Westmere", [TRAIN, "--data", train, "--cpu-kernels", "x86-64-v3"] + SHAPE,
           check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
    assert "--cpu-kernels x86-64-v3" in lines[0] and "lacks" in lines[0] and \
        "it runs: x86-64" in lines[0], lines[0]


if __name__ == "__main__":
    probe = subprocess.run([TRAIN, "--data", "/nonexistent", "--cpu-kernels", "x86-64"],
                           capture_output=True, text=True)
    if "this build's: native" in probe.stderr:
        print("skip: this build directory was configured with -Dnative=true (one table for this "
              "CPU); the fleet build is the default (meson configure BUILD -Dnative=false)")
        raise SystemExit(77)
    main([the_programs_run_on_a_cpu_without_avx, a_blas_core_the_cpu_lacks_is_replaced,
          each_cpu_gets_the_widest_kernels_it_runs,
          every_kernel_set_trains_alike, kernels_the_cpu_lacks_are_refused])
