"""Files that are not regular files where a file belongs: fsdp-train
refuses a FIFO as --data or --val-data at once (never blocks in open());
fsdp-data and fsdp-ckpt export never replace a device node, FIFO, directory
or symbolic link named as their output (export replaces an existing regular
file only with --force), and leave no temporary beside it. Each refusal is
one line on stderr naming the path, with a non-zero exit, and the node is
left as it was. A MANIFEST.json that is a FIFO or a link makes its step
damaged: listed, passed over at resume, left for verify."""

import json
import os
import stat
import subprocess

from harness import CKPT, DATA, TRAIN, committed_steps, main, prepare_corpus, run

TINY = ["--layers", "1", "--dim", "32", "--heads", "2", "--seq", "32", "--steps", "1",
        "--global-batch", "4"]


def one_line_naming(p, path, *needles):
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0, f"exit {p.returncode}"
    assert len(lines) == 1, f"expected one line, got:\n{p.stderr}"
    for n in (path,) + needles:
        assert n in lines[0], f"'{n}' not in: {lines[0]}"


def trainer_refuses_a_fifo_as_data_without_blocking(tmp):
    fifo = f"{tmp}/data.fifo"
    os.mkfifo(fifo)
    p = run([TRAIN, "--data", fifo] + TINY, check=False, timeout=60)
    one_line_naming(p, fifo, "is a FIFO, not a regular file")


def trainer_refuses_a_fifo_as_val_data_without_blocking(tmp):
    train, _ = prepare_corpus(tmp)
    fifo = f"{tmp}/val.fifo"
    os.mkfifo(fifo)
    p = run([TRAIN, "--data", train, "--val-data", fifo] + TINY, check=False, timeout=60)
    one_line_naming(p, fifo, "is a FIFO, not a regular file")


def trainer_refuses_a_directory_as_data(tmp):
    os.mkdir(f"{tmp}/dir.bin")
    p = run([TRAIN, "--data", f"{tmp}/dir.bin"] + TINY, check=False, timeout=60)
    one_line_naming(p, f"{tmp}/dir.bin", "is a directory, not a regular file")


def make_nodes(tmp):
    """(path, type) of a FIFO, a directory, a symbolic link and, where we
    may make one, a character device (a copy of /dev/null in tmp: the real
    one is never put at risk)."""
    nodes = [(f"{tmp}/out.fifo", stat.S_IFIFO), (f"{tmp}/out.dir", stat.S_IFDIR),
             (f"{tmp}/out.link", stat.S_IFLNK)]
    os.mkfifo(nodes[0][0])
    os.mkdir(nodes[1][0])
    os.symlink(f"{tmp}/link-target.bin", nodes[2][0])
    try:
        os.mknod(f"{tmp}/out.null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        nodes.append((f"{tmp}/out.null", stat.S_IFCHR))
    except PermissionError:
        pass
    return nodes


def prepare_never_replaces_what_is_not_a_regular_file(tmp):
    text = f"{tmp}/in.txt"
    with open(text, "w") as f:
        f.write("one document\n%\nanother document\n%\na third\n")
    good = f"{tmp}/good.bin"
    for path, kind in make_nodes(tmp):
        for args in (["--out", path], ["--out", good, "--val-out", path, "--val-fraction", "0.5"]):
            p = run([DATA, "prepare"] + args + ["--doc-sep", "%", text], check=False, timeout=60)
            one_line_naming(p, path, "not a regular file; refusing to replace it")
            assert stat.S_IFMT(os.lstat(path).st_mode) == kind, f"{path} was replaced"
    assert not os.path.exists(f"{tmp}/link-target.bin"), "a write went through the link"
    assert not [n for n in os.listdir(tmp) if ".tmp." in n], "a temporary was left behind"


def prepare_refuses_dev_null_as_out(tmp):
    """The real /dev/null: refused before anything is written next to it."""
    text = f"{tmp}/in.txt"
    with open(text, "w") as f:
        f.write("a document")
    before = os.lstat("/dev/null")
    p = run([DATA, "prepare", "--out", "/dev/null", text], check=False, timeout=60)
    one_line_naming(p, "/dev/null", "is a character device")
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev, "/dev/null changed"


def small_checkpoint(tmp, ck, steps=4):
    train, _ = prepare_corpus(tmp)
    run([TRAIN, "--data", train, "--layers", "1", "--dim", "32", "--heads", "2", "--seq", "32",
         "--global-batch", "4", "--steps", str(steps), "--ckpt", ck, "--ckpt-every", "2"])
    return train


def export_never_replaces_what_is_not_a_regular_file(tmp):
    ck = f"{tmp}/ck"
    small_checkpoint(tmp, ck)
    for path, kind in make_nodes(tmp):
        for layout in ([], ["--layout", "llmc"]):
            p = run([CKPT, "export", ck, path] + layout, check=False, timeout=60)
            one_line_naming(p, path, "not a regular file; refusing to replace it")
            assert stat.S_IFMT(os.lstat(path).st_mode) == kind, f"{path} was replaced"
    assert not os.path.exists(f"{tmp}/link-target.bin"), "a write went through the link"
    assert not [n for n in os.listdir(tmp) if ".tmp." in n], "a temporary was left behind"


def export_replaces_a_regular_file_only_with_force(tmp):
    ck = f"{tmp}/ck"
    small_checkpoint(tmp, ck)
    out = f"{tmp}/w.safetensors"
    open(out, "w").write("precious\n")
    p = run([CKPT, "export", ck, out], check=False, timeout=60)
    one_line_naming(p, out, "exists; refusing to replace it", "--force")
    assert open(out).read() == "precious\n"
    run([CKPT, "export", ck, out, "--force"])
    head = open(out, "rb").read(8)
    assert int.from_bytes(head, "little") < os.path.getsize(out), "not a safetensors file"
    assert not [n for n in os.listdir(tmp) if ".tmp." in n], "a temporary was left behind"


def manifest_that_is_a_fifo_or_link_makes_a_damaged_step(tmp):
    for kind in ("fifo", "link"):
        ck = f"{tmp}/ck-{kind}"
        train = small_checkpoint(tmp, ck)
        man = f"{ck}/step-00000004/MANIFEST.json"
        os.unlink(man)
        if kind == "fifo":
            os.mkfifo(man)
        else:
            outside = f"{tmp}/outside-manifest.json"  # a valid manifest outside the store
            open(outside, "w").write(open(f"{ck}/step-00000002/MANIFEST.json").read())
            os.symlink(outside, man)
        p = run([CKPT, "ls", ck], timeout=60)
        assert "step-00000004  damaged" in p.stdout and "step-00000002  committed" in p.stdout, \
            p.stdout
        p = run([CKPT, "verify", f"{ck}@4"], check=False, timeout=60)
        assert p.returncode != 0 and man in p.stderr, p.stderr
        gens = sorted(os.listdir(f"{ck}/generations"))
        p = run([TRAIN, "--data", train, "--layers", "1", "--dim", "32", "--heads", "2",
                 "--seq", "32", "--global-batch", "4", "--steps", "6", "--ckpt", ck,
                 "--ckpt-every", "2"], timeout=120)
        assert "resumed from checkpoint step 2" in p.stderr, p.stderr
        assert committed_steps(ck)[-1] == 6, committed_steps(ck)
        # the launch claimed one generation and sealed it: no claim is left unsealed
        now = sorted(os.listdir(f"{ck}/generations"))
        assert len(now) == len(gens) + 1, (gens, now)
        assert set(now) <= set(os.listdir(f"{ck}/fences")), "a claimed generation is unsealed"
        run([CKPT, "prune", ck, "--keep", "1"], timeout=60)
        assert stat.S_IFMT(os.lstat(man).st_mode) == (stat.S_IFIFO if kind == "fifo"
                                                      else stat.S_IFLNK), "the node was touched"
        if kind == "link":
            assert os.path.exists(f"{tmp}/outside-manifest.json"), "the link's target went"
        # a store whose first listed name is the node: still a store, its
        # step damaged (whether ls listed the node first was chance before)
        only = f"{tmp}/only-{kind}"
        os.makedirs(f"{only}/step-00000002")
        node = f"{only}/step-00000002/MANIFEST.json"
        os.mkfifo(node) if kind == "fifo" else os.symlink(f"{tmp}/outside-manifest.json", node)
        p = run([CKPT, "ls", only], timeout=60)
        assert "step-00000002  damaged" in p.stdout, p.stdout


def a_full_disk_under_the_log_stops_the_run_with_a_checkpoint(tmp):
    """--log on a 64 KiB tmpfs of our own: the write that does not fit is
    taken back out (every line left is whole JSON), the run checkpoints the
    next step and exits non-zero saying which file failed and why."""
    disk = f"{tmp}/small-disk"
    os.mkdir(disk)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", disk],
                      capture_output=True).returncode != 0:
        print("  (cannot mount a tmpfs here: skipped)")
        return
    try:
        train, _ = prepare_corpus(tmp)
        log, ck = f"{disk}/log.jsonl", f"{tmp}/ck"
        p = run([TRAIN, "--data", train, "--layers", "1", "--dim", "32", "--heads", "2",
                 "--seq", "32", "--global-batch", "4", "--steps", "5000", "--log-every", "5000",
                 "--log", log, "--ckpt", ck, "--ckpt-every", "5000"], check=False, timeout=300)
        assert p.returncode == 1, p.stderr
        last = p.stderr.strip().splitlines()[-1]
        assert log in last and "No space left on device" in last, last
        lines = open(log).read().splitlines()
        steps = [json.loads(l)["step"] for l in lines]  # raises on a part-line
        assert steps == list(range(1, len(steps) + 1)), steps[-3:]
        assert f"stopped at step {steps[-1] + 2} after a checkpoint of it" in last, last
        assert committed_steps(ck) == [steps[-1] + 2], committed_steps(ck)
    finally:
        subprocess.run(["umount", disk])


if __name__ == "__main__":
    main([trainer_refuses_a_fifo_as_data_without_blocking,
          trainer_refuses_a_fifo_as_val_data_without_blocking,
          trainer_refuses_a_directory_as_data,
          prepare_never_replaces_what_is_not_a_regular_file,
          prepare_refuses_dev_null_as_out,
          export_never_replaces_what_is_not_a_regular_file,
          export_replaces_a_regular_file_only_with_force,
          manifest_that_is_a_fifo_or_link_makes_a_damaged_step,
          a_full_disk_under_the_log_stops_the_run_with_a_checkpoint])
