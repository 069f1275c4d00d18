"""Sharding changes where the numbers live, not what they are.

The same seed and global batch on 1, 2 and 4 real Open MPI ranks
(oversubscribed) gives per-step losses within 1e-4 relative for 20 steps, for
every strategy (full, grad-op, none) and with gradient accumulation; two runs
at the same world size give bit-identical losses, and so do an embedding's
gradient reduced whole and in slices; per-rank state shrinks as 1/N."""

import os
import re

from harness import TRAIN, main, mpirun, prepare_corpus, read_log

STEPS = 20
TOL = 1e-4


def losses(tmp, train, np, shard, extra=(), tag=""):
    log = f"{tmp}/np{np}-{shard}{tag}.jsonl"
    if os.path.exists(log):  # fsdp-train appends (one log across restarts)
        os.remove(log)
    p = mpirun(np, [TRAIN, "--data", train, "--model", "tiny", "--global-batch", "8",
                    "--steps", str(STEPS), "--shard", shard, "--log", log,
                    "--log-every", "100"] + list(extra))
    steps = read_log(log)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    return [s["loss"] for s in steps], p.stderr


def worst_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def losses_agree_across_world_sizes_and_strategies(tmp):
    train, _ = prepare_corpus(tmp)
    ref, _ = losses(tmp, train, 1, "full")
    assert ref[-1] < ref[0] - 1.0, "the reference run did not learn"
    for np in (1, 2, 4):
        for shard in ("full", "grad-op", "none"):
            got, _ = losses(tmp, train, np, shard)
            rel = worst_rel(got, ref)
            print(f"  {np} rank(s), {shard:7s}: worst relative difference {rel:.2e}")
            assert rel <= TOL, f"{np} ranks, {shard}: {rel:.2e} > {TOL}"


def gradient_accumulation_matches_one_big_batch(tmp):
    train, _ = prepare_corpus(tmp)
    ref, _ = losses(tmp, train, 1, "full")
    for np, micro in ((1, 2), (2, 1), (2, 2)):
        got, _ = losses(tmp, train, np, "full", ["--micro-batch", str(micro)], f"-mb{micro}")
        rel = worst_rel(got, ref)
        print(f"  {np} rank(s), micro-batch {micro}: worst relative difference {rel:.2e}")
        assert rel <= TOL


def same_world_size_is_bit_identical(tmp):
    train, _ = prepare_corpus(tmp)
    for shard in ("full", "none"):
        a, _ = losses(tmp, train, 2, shard, tag="-a")
        b, _ = losses(tmp, train, 2, shard, tag="-b")
        assert a == b, f"{shard}: two 2-rank runs differ: {a} vs {b}"


def a_wide_embeddings_gradient_reduced_in_slices_is_bit_identical(tmp):
    """A vocabulary 16x the model width makes the embedding outgrow the
    reduce-scatter's landing place (sized for one block), so its gradient
    goes in slices; two blocks per unit make the landing place big enough.
    Both give the same bits (the same sums in the same order)."""
    train, _ = prepare_corpus(tmp)
    for np, extra in ((2, ["--vocab", "2048"]), (4, ["--vocab", "2048", "--micro-batch", "1"]),
                      (2, ["--vocab", "4096", "--precision", "bf16", "--reduce-dtype", "bf16"])):
        # (bf16 parts are half the bytes: twice the vocabulary to outgrow it)
        sliced, err1 = losses(tmp, train, np, "full", extra + ["--unit-blocks", "1"], "-k1")
        whole, err2 = losses(tmp, train, np, "full", extra + ["--unit-blocks", "2"], "-k2")
        assert re.search(r"embedding's gradient reduced in \d+ slices", err1), err1
        assert "slices" not in err2, err2
        print(f"  {np} ranks {' '.join(extra)}: sliced and whole reduce-scatters "
              f"agree over {STEPS} steps")
        assert sliced == whole, f"{np} ranks {extra}: {sliced} vs {whole}"


def per_rank_state_shrinks_with_world_size(tmp):
    train, _ = prepare_corpus(tmp)
    mib = {}
    for np in (1, 2, 4):
        _, err = losses(tmp, train, np, "full")
        m = re.search(r"params ([\d.]+) MiB, grads ([\d.]+) MiB, optimizer ([\d.]+) MiB", err)
        assert m, f"no memory line in:\n{err}"
        mib[np] = [float(x) for x in m.groups()]
        print(f"  {np} rank(s): params {mib[np][0]} MiB, grads {mib[np][1]} MiB, "
              f"optimizer {mib[np][2]} MiB per rank")
    for np in (2, 4):
        for i, kind in enumerate(("params", "grads", "optimizer")):
            ratio = mib[np][i] / mib[1][i]
            assert abs(ratio - 1 / np) < 0.02, f"{kind} on {np} ranks: {ratio:.3f} of 1 rank"


if __name__ == "__main__":
    main([losses_agree_across_world_sizes_and_strategies,
          gradient_accumulation_matches_one_big_batch,
          same_world_size_is_bit_identical,
          a_wide_embeddings_gradient_reduced_in_slices_is_bit_identical,
          per_rank_state_shrinks_with_world_size])
