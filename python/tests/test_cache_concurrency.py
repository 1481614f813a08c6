"""The node cache under concurrent processes (issue 14): four `chute bench` processes stream the
same remote shards, through the fault proxy (503, 429, bodies cut mid-way, resets, a stall),
into one `--cache-dir` whose limit holds a third of them, so entries are evicted while other
processes read. Every process's digest equals a clean local run; a watcher sampling the
directory throughout never sees an entry with other bytes than its shard's, nor more than the
limit plus one shard per writing process (entries are stored, then the writer evicts); when
they are done the cache is within its limit and holds no temporary file. A writer killed
mid-write leaves only a temporary file, removed by the next process's eviction pass once
older than the grace period (an hour; aged here by hand).

Needs the servers scripts/test.sh starts (CHUTE_TEST_SERVERS=1, as .ci/run sets)."""

import io
import json
import os
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import numpy as np

from conftest import HTTP_DIR, PROXY_URL, chute_bin, needs_servers

pytestmark = needs_servers("HTTP_DIR", "PROXY_URL")

SHARDS, PER_SHARD, PROCESSES = 12, 30, 4


def _shards(folder: Path) -> dict:
    """SHARDS indexed WebDataset shards of 150-250 KB; shard name -> its bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    for s in range(SHARDS):
        with tarfile.open(folder / f"c-{s:02d}.tar", "w") as tar:
            for i in range(PER_SHARD):
                body = rng.integers(0, 256, int(rng.integers(4_000, 8_000)), np.uint8).tobytes()
                info = tarfile.TarInfo(f"{s * PER_SHARD + i:05d}.bin")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    out = subprocess.run([chute_bin(), "index", str(folder / f"c-{{00..{SHARDS - 1}}}.tar")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {p.name: p.read_bytes() for p in folder.glob("c-*.tar")}


def _bench(data: str, extra: list) -> list:
    return [chute_bin(), "bench", data, "--shuffle", "block:2", "--epochs", "2",
            "--batch-size", "4", "--workers", "2", "--json", "--digest", "--quiet", *extra]


class Watcher(threading.Thread):
    """Samples the cache directory every few milliseconds: the bytes of complete entries,
    and every entry's contents against its shard's."""

    def __init__(self, cache: Path, shards: dict):
        super().__init__(daemon=True)
        self.cache, self.shards = cache, shards
        self.stop, self.peak, self.samples, self.bad = threading.Event(), 0, 0, []

    def run(self) -> None:
        while not self.stop.is_set():
            total = 0
            for p in list(self.cache.glob("*")) if self.cache.is_dir() else []:
                if p.name.endswith(".part"):
                    continue
                try:
                    data = p.read_bytes()
                except FileNotFoundError:
                    continue  # evicted meanwhile
                total += len(data)
                shard = p.name.split("-", 1)[1]
                if data != self.shards.get(shard):
                    self.bad.append(p.name)
            self.peak, self.samples = max(self.peak, total), self.samples + 1
            time.sleep(0.005)


def test_four_processes_share_one_cache_through_faults(tmp_path):
    name = "py_cache_conc"
    shards = _shards(Path(HTTP_DIR) / name)
    biggest = max(len(b) for b in shards.values())
    limit = sum(len(b) for b in shards.values()) // 3
    local = subprocess.run(_bench(str(Path(HTTP_DIR) / name / "manifest.json"), []),
                           capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    want = json.loads(local.stdout)["digest"]
    cache = tmp_path / "cache"
    watcher = Watcher(cache, shards)
    watcher.start()
    url = f"{PROXY_URL}/{name}/manifest.json"
    args = ["--cache-dir", str(cache), "--cache-limit", str(limit), "--timeout", "2"]
    procs = [subprocess.Popen(_bench(url, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(PROCESSES)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    watcher.stop.set()
    watcher.join()
    assert watcher.samples > 10 and not watcher.bad, watcher.bad
    for r in results:
        assert r["digest"] == want, "every process reads what a local run reads"
    remote = [r["remote"] for r in results]
    assert sum(r["retries"] for r in remote) > 0, "the proxy's faults were met"
    assert sum(r["shards_fetched"] for r in remote) > SHARDS, "evictions forced downloads"
    assert watcher.peak <= limit + PROCESSES * biggest, (watcher.peak, limit)
    print({"limit": limit, "peak": watcher.peak, "samples": watcher.samples,
           "retries": sum(r["retries"] for r in remote),
           "shards_fetched": sum(r["shards_fetched"] for r in remote),
           "cache_hits": sum(r["cache_hits"] for r in remote)})
    entries = [p for p in cache.iterdir()]
    assert not [p for p in entries if p.name.endswith(".part")], "no temporary file left"
    assert sum(p.stat().st_size for p in entries) <= limit


def test_a_writer_killed_mid_write_leaves_only_a_temporary_file(tmp_path):
    name = "py_cache_kill"
    shards = _shards(Path(HTTP_DIR) / name)
    cache = tmp_path / "cache"
    url = f"{PROXY_URL}/{name}/manifest.json"
    args = ["--cache-dir", str(cache), "--timeout", "2"]
    # Killed at random moments, again and again: an entry is whole or absent.
    rng = np.random.default_rng(1)
    for _ in range(6):
        p = subprocess.Popen(_bench(url, args), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(float(rng.uniform(0.05, 0.6)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        for e in cache.glob("*") if cache.is_dir() else []:
            if not e.name.endswith(".part"):
                assert e.read_bytes() == shards[e.name.split("-", 1)[1]], e.name
    # A temporary file as a killed writer leaves it, aged past the grace period, goes at the
    # next eviction pass; a young one (a live writer's, maybe) stays.
    cache.mkdir(exist_ok=True)
    old, young = cache / "0-c-00.tar.999999.0.part", cache / "0-c-01.tar.999998.0.part"
    old.write_bytes(b"half")
    young.write_bytes(b"half")
    hour_ago = time.time() - 3700
    os.utime(old, (hour_ago, hour_ago))
    for e in cache.glob("*"):
        if not e.name.endswith(".part"):
            e.unlink()  # so the next run stores (and evicts) again
    r = subprocess.run(_bench(url, args), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not old.exists() and young.exists()
