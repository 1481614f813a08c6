"""Soak (issue 14): 10^5 batches from remote WebDataset shards read through a fault proxy of
the test's own (a 503, a body cut mid-way, a reset and a 429 in every 100 requests), with
one sample in 37 corrupt (its `.npy` member is not an array) and skipped (`on_error="skip"`),
across 400 epoch boundaries (`block:1` shuffle over 6 shards, more than the 4 the reader
keeps in memory, so shards download again every epoch). Sampled every 10,000 batches
from batch 10,125 on (mid-epoch, workers running):

- anonymous resident memory stays within 64 MiB of its level at batch 10,125 (the bound:
  buffers, shards in flight and allocator slack reach their steady state in the first
  epochs);
- threads: the count moves only within the I/O runtime's DNS pool (at most 4 threads, which
  leave after 10 s idle);
- open file descriptors (`/proc/self/fd`) other than sockets stay exactly as they were, and
  sockets (the HTTP client's pooled connections) stay at most 16;
- `stats()["skipped"]` counts every corrupt sample the epochs met, and the proxy's faults were
  retried (`io_stats()["retries"]`).

Needs nginx from the servers scripts/test.sh starts (CHUTE_TEST_SERVERS=1, as .ci/run
sets)."""

import io
import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

import chute
from conftest import HTTP_DIR, HTTP_URL, chute_bin, fault_proxy, needs_servers

pytestmark = needs_servers("HTTP_DIR", "HTTP_URL")

SHARDS, PER_SHARD, BATCH, BATCHES, BAD_EVERY = 6, 166, 4, 100_000, 37


def _fds() -> tuple:
    """Open descriptors: (sockets, everything else)."""
    kinds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:
            pass  # closed meanwhile (the listing's own descriptor among them)
    sockets = sum(k.startswith("socket:") for k in kinds)
    return sockets, len(kinds) - sockets


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _shards(folder: Path) -> int:
    """The shards; how many samples are corrupt."""
    folder.mkdir(parents=True, exist_ok=True)
    bad = 0
    for s in range(SHARDS):
        with tarfile.open(folder / f"soak-{s:02d}.tar", "w") as tar:
            for i in range(PER_SHARD):
                n = s * PER_SHARD + i
                if n % BAD_EVERY == 5:
                    body, bad = b"not an npy array", bad + 1
                else:
                    buf = io.BytesIO()
                    np.save(buf, np.full(16, n, np.int64))
                    body = buf.getvalue()
                info = tarfile.TarInfo(f"{n:06d}.npy")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    r = subprocess.run([chute_bin(), "index", str(folder / f"soak-{{00..{SHARDS - 1}}}.tar")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return bad


@pytest.fixture
def proxy():
    pattern = ",".join(["ok"] * 24 + ["503"] + ["ok"] * 24 + ["cut"] + ["ok"] * 24 + ["reset"]
                       + ["ok"] * 24 + ["429"])
    with fault_proxy(HTTP_URL.split("://", 1)[1], "--pattern", pattern) as url:
        yield url


def test_soak_memory_threads_and_files_stay_flat(proxy):
    bad = _shards(Path(HTTP_DIR) / "py_soak")
    source = chute.webdataset(f"{proxy}/py_soak/soak-{{00..{SHARDS - 1}}}.tar")
    loader = chute.Loader(source, batch_size=BATCH, shuffle="block:1", num_workers=2,
                          on_error="skip", transforms={"npy": [{"op": "npy"}]})
    before = chute.io_stats()
    batches, epochs, marks = 0, 0, {}
    while batches < BATCHES:
        for b in loader:
            x = np.asarray(b["npy"])
            assert x.shape == (BATCH, 16) and (x[:, 0] % BAD_EVERY != 5).all()
            batches += 1
            if batches % 10_000 == 125:  # mid-epoch: its workers are running
                marks[batches] = (_status("RssAnon"), _status("Threads"), *_fds())
            if batches == BATCHES:
                break
        epochs += 1
    assert epochs >= 400
    base = marks[10_125]
    for at, (rss, threads, sockets, files) in marks.items():
        assert rss - base[0] <= 64 << 10, f"RssAnon grew {rss - base[0]} kB by batch {at}"
        assert files == base[3], f"open files {base[3]} -> {files} at batch {at}"
        # Pooled keep-alive connections come and go with the proxy's resets: a few at most.
        assert sockets <= 16, f"{sockets} sockets open at batch {at}"
    # Threads (the process's, whatever other libraries run: torch's pools in a full test
    # run): the count moves only within the I/O runtime's DNS pool (at most 4 threads, idle
    # ones leave after 10 s).
    threads = [t for _, t, _, _ in marks.values()]
    assert max(threads) - min(threads) <= 4, marks
    stats = loader.stats()
    # Every corrupt sample of every whole epoch, plus those of the last one met so far.
    full = (epochs - 1) * bad
    assert full <= stats["skipped"] <= full + bad, (stats["skipped"], epochs, bad)
    assert chute.io_stats()["retries"] - before["retries"] > 20
    print({"epochs": epochs, "skipped": stats["skipped"], "marks": marks,
           "retries": chute.io_stats()["retries"] - before["retries"]})
