"""A crash mid-write loses nothing (issue 14): `chute convert` (to WebDataset with indexes, to
Parquet, to TFRecord), `chute index` and `chute tokenize` are killed with SIGKILL at random
moments, again and again. After every kill, each file under a final name is byte for byte
what an uninterrupted run writes (a partial shard, index or manifest only ever exists under
its temporary name, `<name>.tmp`); rerunning the same command (`--overwrite` for convert
and tokenize, which refuse to replace outputs otherwise) completes the job, leaves no temporary file, and
writes exactly the uninterrupted run's files. (`chute index` rewrites its outputs as it is.) A training process killed with SIGKILL and
resumed from its last `state_dict` is tested in test_distributed.py (under torchrun) and
test_behaviour.py."""

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import pytest

from conftest import chute_bin


def _files(folder: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _jsonl(path: Path, rows: int) -> None:
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for i in range(rows):
            words = " ".join(f"w{int(x)}" for x in rng.integers(0, 500, int(rng.integers(5, 60))))
            f.write(json.dumps({"text": words, "label": i % 10, "x": float(i) / 7}) + "\n")


def _tokenizer(path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {**{f"w{i}": i for i in range(500)}, "[UNK]": 500}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(path))


def _run(cmd: List[str]) -> float:
    started = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{cmd}: {r.stderr[-2000:]}"
    return time.perf_counter() - started


def _kill_again_and_again(cmd: Callable[[Path], List[str]], out: Path, ref: Dict[str, bytes],
                          seconds: float, rerun: List[str], prepare=None) -> None:
    rng = np.random.default_rng(7)
    kills = 0
    for k in range(10):
        if prepare is not None:
            prepare(out)
        p = subprocess.Popen(cmd(out) + (rerun if k else []), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(float(rng.uniform(0.0, seconds)))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait()
        for name, data in _files(out).items():
            if name.endswith(".tmp"):
                continue
            assert name in ref, f"after a kill: {name} is not a file of the job"
            assert data == ref[name], f"after a kill: {name} is visible but not whole"
    assert kills >= 5, "the job ran too fast to be killed mid-way"
    if prepare is not None:
        prepare(out)
    _run(cmd(out) + rerun)
    assert _files(out) == ref, "the rerun completes the job exactly"


@pytest.mark.parametrize("to", ["webdataset", "parquet", "tfrecord"])
def test_convert_killed_mid_write(tmp_path, to):
    src = tmp_path / "rows.jsonl"
    _jsonl(src, 30_000)
    extra = ["--index"] if to == "webdataset" else []

    def cmd(out: Path) -> List[str]:
        return [chute_bin(), "convert", str(src), "--to", to, "-o", str(out), "--shard-size",
                "1500", "--workers", "2", *extra]

    seconds = _run(cmd(tmp_path / "ref"))
    ref = _files(tmp_path / "ref")
    _run(cmd(tmp_path / "ref2") + ["--overwrite"])
    assert _files(tmp_path / "ref2") == ref, "convert is deterministic"
    assert len(ref) >= 20
    _kill_again_and_again(cmd, tmp_path / "out", ref, seconds, ["--overwrite"])


def test_index_killed_mid_write(tmp_path):
    src = tmp_path / "rows.jsonl"
    _jsonl(src, 30_000)
    shards = tmp_path / "shards"
    _run([chute_bin(), "convert", str(src), "--to", "webdataset", "-o", str(shards),
          "--shard-size", "500"])
    tars = {p.name: p.read_bytes() for p in shards.glob("*.tar")}

    def prepare(out: Path) -> None:
        out.mkdir(exist_ok=True)
        for name, data in tars.items():
            if not (out / name).exists():
                (out / name).write_bytes(data)

    def cmd(out: Path) -> List[str]:
        return [chute_bin(), "index", str(out)]

    prepare(tmp_path / "ref")
    seconds = _run(cmd(tmp_path / "ref"))
    ref = _files(tmp_path / "ref")
    assert "manifest.json" in ref and len(ref) > 2 * len(tars)
    _kill_again_and_again(cmd, tmp_path / "out", ref, seconds, [], prepare)


def test_tokenize_killed_mid_write(tmp_path):
    src = tmp_path / "docs.jsonl"
    _jsonl(src, 60_000)
    tok = tmp_path / "tokenizer.json"
    _tokenizer(tok)

    def cmd(out: Path) -> List[str]:
        out.mkdir(exist_ok=True)
        return [chute_bin(), "tokenize", str(src), "--tokenizer", str(tok), "-o",
                str(out / "train"), "--workers", "2"]

    seconds = _run(cmd(tmp_path / "ref"))
    ref = _files(tmp_path / "ref")
    assert set(ref) == {"train.bin", "train.idx"}
    _kill_again_and_again(cmd, tmp_path / "out", ref, seconds, ["--overwrite"])
    shutil.rmtree(tmp_path / "out")
