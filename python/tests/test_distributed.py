"""Real multi-process training under torchrun (CPU, gloo): DistributedDataParallel on chute
batches with 2, 3 and 4 processes, on a dataset that does not split evenly, and checkpoints
through torch.distributed.checkpoint and torch.save. Every rank must
take the same steps (a rank with a batch more would hang the all-reduce: the process group's
120 s timeout and the test's own end such a run), and the global sample ids the ranks
consumed, gathered with all_gather_object, must partition the epoch exactly."""

import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import torchrun, write_tokens

torch = pytest.importorskip(
    "torch", reason="torch not installed: the PyPI wheel pulls ~3 GB of CUDA libraries; see README"
)


def train(n: int, kind: str, data: str, out: Path) -> dict:
    """dist_train.py's job on n processes; what rank 0 wrote."""
    torchrun("dist_train.py", kind, data, out, nproc=n)
    return json.loads(out.read_text())


def check_partition(result: dict, total: int, world: int, batch: int) -> None:
    keep = result["keep_last"]
    # The same steps and batches on every rank.
    assert len({r["steps"] for r in keep}) == 1 and keep[0]["steps"] == keep[0]["len"]
    per = -(-total // world)
    ids = [i for r in keep for i in r["ids"]]
    assert all(len(r["ids"]) == per for r in keep)
    assert set(ids) == set(range(total)), "every sample, on some rank"
    repeated = Counter(ids)
    assert sum(c - 1 for c in repeated.values()) == per * world - total < world
    drop = result["drop_last"]
    assert len({r["steps"] for r in drop}) == 1
    per = total // world // batch * batch
    ids = [i for r in drop for i in r["ids"]]
    assert all(len(r["ids"]) == per for r in drop)
    assert len(ids) == len(set(ids)) == per * world, "disjoint, none repeated"
    assert set(ids) <= set(range(total))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ddp_on_token_windows_partitions_the_epoch(tmp_path, world):
    total = 1003  # not a multiple of 2, 3, 4 or the batch
    path = write_tokens(tmp_path / "train.bin", total)
    result = train(world, "tokens", path, tmp_path / "out.json")
    check_partition(result, total, world, batch=8)


def test_ddp_on_images_partitions_the_epoch(tmp_path):
    from PIL import Image

    total, rng = 50, np.random.default_rng(0)
    shard = tmp_path / "images.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(total):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(buf, "PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"img{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    result = train(3, "images", str(shard), tmp_path / "out.json")
    check_partition(result, total, 3, batch=4)


@pytest.mark.parametrize("style", ["dcp", "torch_save"])
def test_checkpoint_and_continue_equals_an_uninterrupted_run(tmp_path, style):
    """The loader's state saved beside the model and optimizer after 7 steps (DCP, or
    torch.save per rank), a new job restored from it: the two parts are, rank by rank and
    sample for sample, the uninterrupted run."""
    path = write_tokens(tmp_path / "train.bin", 501)
    ckpt = str(tmp_path / "ckpt")

    def run(mode: str, out: str):
        torchrun("dist_ckpt.py", mode, style, path, ckpt, tmp_path / out, nproc=3)
        return json.loads((tmp_path / out).read_text())

    full = run("full", "full.json")
    first = run("first:7", "first.json")
    rest = run("resume", "rest.json")
    for r in range(3):
        assert len(first[r]) == 7 * 8
        assert first[r] + rest[r] == full[r], f"rank {r}"


def _elastic(tmp_path, n, shuffle, drop_last, ckpt_in, ckpt_out, steps, files):
    out = tmp_path / f"elastic-{n}.json"
    torchrun("dist_elastic.py", shuffle, str(drop_last).lower(), ckpt_in, ckpt_out, steps, out,
             *files, nproc=n)
    ranks = json.loads(out.read_text())
    assert len(ranks) == n and len({r["steps"] for r in ranks}) == 1, "equal steps on all ranks"
    return [i for r in ranks for i in r["ids"]]


@pytest.mark.parametrize("shuffle,drop_last", [("global", True), ("block:2", True),
                                               ("block:2", False), ("mix", True)])
def test_elastic_four_to_three_to_two_reads_every_sample_once(tmp_path, shuffle, drop_last):
    """A job of 4 processes checkpoints (DCP: model, optimizer, loader) after 5 steps; a
    job of 3 resumes from it and checkpoints after 4 more; a job of 2 finishes the epoch.
    The global batch stays 24 (6, 8, then 12 per rank). Over the three jobs every sample is
    read once: with drop_last, none twice and only a remainder under a global batch unread;
    without, every one and repeats only as the last job's padding. A mixture keeps its
    per-rank batch, and the three jobs read exactly what one process reads of it."""
    sizes = [211, 187, 250, 163, 190]  # 1001 windows in 5 shards
    files, first = [], 0
    for k, n in enumerate(sizes):
        files.append(write_tokens(tmp_path / f"part{k}.bin", n, first=first * 16))
        first += n
    a, b = str(tmp_path / "ckpt-a"), str(tmp_path / "ckpt-b")
    got = _elastic(tmp_path, 4, shuffle, drop_last, "-", a, 5, files)
    got += _elastic(tmp_path, 3, shuffle, drop_last, a, b, 4, files)
    got += _elastic(tmp_path, 2, shuffle, drop_last, b, "-", "all", files)
    if shuffle == "mix":
        import chute

        mix = chute.mix({"a": chute.tokens(files[:2], seq_len=15, dtype="uint32"),
                         "b": chute.tokens(files[2:], seq_len=15, dtype="uint32")},
                        weights={"a": 2, "b": 1}, samples_per_epoch=600, seed=4)
        one = chute.Loader(mix, batch_size=6)
        want = [i for batch in one for i in (np.asarray(batch["tokens"])[:, 0] // 16).tolist()]
        assert sorted(got) == sorted(want), "the mixture's stream, exactly"
        return
    total = sum(sizes)
    if drop_last:
        assert len(got) == len(set(got)), "no sample twice"
        assert set(got) <= set(range(total)) and total - len(got) < 24
    else:
        assert set(got) == set(range(total)), "every sample"
        assert len(got) - total < 2, "repeats only as padding"


def test_a_killed_rank_restarts_from_the_checkpoint_losing_and_repeating_nothing(tmp_path):
    """Rank 1 SIGKILLs itself at step 13 (checkpoints every 5 steps); torchrun restarts every
    rank, which resumes from step 10: each rank's steps up to the checkpoint plus its steps
    after the restart are exactly what an uninterrupted run's rank reads."""
    import chute

    world, total = 3, 600
    path = write_tokens(tmp_path / "train.bin", total)
    torchrun("dist_crash.py", "kill", path, tmp_path, nproc=world, restarts=1)
    checkpoint = json.loads((tmp_path / "complete.json").read_text())["step"]
    assert checkpoint >= 10
    everyone = []
    for r in range(world):
        def steps(attempt):
            lines = (tmp_path / f"ids-{r}-{attempt}.jsonl").read_text().splitlines()
            return [json.loads(line) for line in lines]

        first = [s for s in steps(0) if s["step"] <= 10]
        assert len(first) == 10, "the first attempt got past the checkpoint"
        after = steps(1)
        assert after[0]["step"] == 11
        got = [i for s in first + after for i in s["ids"]]
        loader = chute.Loader(chute.tokens(path, seq_len=15, dtype="uint32"), batch_size=8,
                              shuffle=True, seed=5, drop_last=True, rank=r, world_size=world)
        want = [i for b in loader for i in (np.asarray(b["tokens"])[:, 0] // 16).tolist()]
        assert got == want, f"rank {r}"
        everyone += got
    assert len(everyone) == len(set(everyone)) == world * (total // world // 8 * 8)


def test_a_source_failing_on_one_rank_ends_the_job_with_the_error_named(tmp_path):
    proc = torchrun("dist_crash.py", "fail", "-", tmp_path, nproc=2, restarts=0, timeout=300,
                    check=False)
    assert proc.returncode != 0
    assert "sample 37 is broken on purpose" in proc.stdout + proc.stderr


def test_ranks_with_worker_processes_partition_checkpoint_and_exit_cleanly(tmp_path):
    """Two ranks, each with two worker processes: the epoch partitioned, a mid-epoch state
    resumed by new worker processes, and a clean exit (torchrun's own check) with no worker
    left."""
    import os
    import subprocess

    total, out = 101, tmp_path / "out.json"
    before = set(subprocess.run(["pgrep", "-f", "chute-worker|multiprocessing.spawn"],
                                capture_output=True, text=True).stdout.split())
    torchrun("dist_process.py", total, out, nproc=2)
    ranks = json.loads(out.read_text())
    ids = [i for r in ranks for i in r["epoch0"]]
    assert set(ids) == set(range(total)) and len(ids) == 2 * -(-total // 2)
    for r in ranks:
        assert r["epoch1"] == r["reference"]
    after = set(subprocess.run(["pgrep", "-f", "chute-worker|multiprocessing.spawn"],
                               capture_output=True, text=True).stdout.split())
    assert after <= before, "worker processes outlived the job"
