"""Seeing where the time goes: stats() windows, the progress bar, Prometheus metrics (scraped
by a real Prometheus server when one is installed) and chute.doctor on pipelines slowed on
purpose at one stage."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import chute
from conftest import (HTTP_DIR, HTTP_URL, SEQ, chute_bin, fault_proxy, free_port, needs_servers,
                      write_tokens)


def test_stats_have_windows_epochs_queue_and_histogram(source100):
    loader = chute.Loader(source100, batch_size=10, num_workers=2, stats_window=5)
    for _ in loader:
        pass
    s = loader.stats()
    assert s["samples"] == 100 and s["batches"] == 10
    assert s["window_secs"] == 5.0
    assert s["window"]["samples"] == 100
    assert s["current_epoch"]["samples"] == 100 and s["last_epoch"]["samples"] == 100
    assert set(s["queue"]) == {"ready", "in_flight", "capacity", "workers"}
    h = s["wait_histogram"]
    assert h["count"] == 10 and h["buckets"][-1][1] <= 10
    assert set(s["remote"]) >= {"bytes_fetched", "requests", "retries", "cache_hits"}
    for _ in loader:
        pass
    s = loader.stats()
    assert s["epoch"] == 1 and s["last_epoch"]["samples"] == 100
    with pytest.raises(chute.ConfigError, match="stats_window"):
        chute.Loader(source100, stats_window=0)


def test_progress_plain_line_without_tqdm(source100, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    loader = chute.Loader(source100, batch_size=10, progress=True)
    assert len(loader) == 10
    assert sum(1 for _ in loader) == 10
    err = capsys.readouterr().err
    assert "epoch 0: 10/10 batches (100%)" in err, err
    assert "samples/s, waited" in err


def test_progress_uses_tqdm_when_installed(source100, capsys):
    pytest.importorskip("tqdm")
    loader = chute.Loader(source100, batch_size=10, progress=True)
    assert sum(1 for _ in loader) == 10
    err = capsys.readouterr().err
    assert "epoch 0" in err and "10/10" in err, err
    assert "samples/s" in err


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _series(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no series {prefix} in\n{text}")


def test_serve_metrics_exposes_every_loader_by_rank(source100):
    port = chute.serve_metrics(0)
    assert chute.serve_metrics(port) == port
    loaders = [
        chute.Loader(source100, batch_size=10, rank=r, world_size=2, name="metrics-test")
        for r in (0, 1)
    ]
    for loader in loaders:
        for _ in loader:
            pass
    text = _get(f"http://127.0.0.1:{port}/metrics")
    for r, loader in enumerate(loaders):
        labels = f'rank="{r}",loader="metrics-test"'
        s = loader.stats()
        assert _series(text, f'chute_samples_total{{{labels},stage="delivered"}}') == s["samples"]
        assert _series(text, f"chute_wait_seconds_total{{{labels}}}") == pytest.approx(
            s["wait_secs"], rel=1e-6, abs=1e-9
        )
        assert _series(text, f"chute_batch_wait_seconds_count{{{labels}}}") == s["batches"]
    with pytest.raises(chute.ConfigError, match="address"):
        chute.serve_metrics(0, "localhost:80")


def _query(prom: str, q: str):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    out = json.loads(_get(url))
    assert out["status"] == "success", out
    return out["data"]["result"]


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed "
                    "(.ci/run installs the Debian package)")
def test_a_real_prometheus_scrapes_rank_labelled_series_that_match_stats(tmp_path):
    """Two ranks' loaders serve their metrics; Prometheus scrapes them every 0.5 s during a
    run, and its HTTP API returns each rank's totals as stats() has them."""
    path = write_tokens(tmp_path / "t.bin", 400)
    source = chute.tokens(path, seq_len=SEQ, dtype="uint32")
    port = chute.serve_metrics(0)
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 500ms\n  evaluation_interval: 500ms\n"
        "scrape_configs:\n  - job_name: chute\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n"
    )
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{web}"
    try:
        # Prometheus up and scraping chute's endpoint before the run starts.
        deadline = time.monotonic() + 60
        while True:
            try:
                if [float(r["value"][1]) for r in _query(base, 'up{job="chute"}')] == [1.0]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus did not start scraping"
            time.sleep(0.2)
        loaders = [
            chute.Loader(source, batch_size=8, num_workers=1, rank=r, world_size=2, name="prom")
            for r in (0, 1)
        ]
        # A slow training loop (2 s), so that scrapes land during the run.
        for batches in zip(*loaders):
            time.sleep(0.08)
        stats = [loader.stats() for loader in loaders]
        deadline = time.monotonic() + 60
        while True:
            try:
                got = {
                    r["metric"]["rank"]: float(r["value"][1])
                    for r in _query(base, 'chute_samples_total{loader="prom",stage="delivered"}')
                }
            except OSError:
                got = {}
            if got == {"0": stats[0]["samples"], "1": stats[1]["samples"]}:
                break
            assert time.monotonic() < deadline, f"Prometheus has {got}, stats() {stats}"
            time.sleep(0.5)
        assert stats[0]["samples"] == 200
        # The other series: the wait counter, the histogram, and a rate over the run.
        waits = {r["metric"]["rank"]: float(r["value"][1])
                 for r in _query(base, 'chute_wait_seconds_total{loader="prom"}')}
        for r in (0, 1):
            assert waits[str(r)] == pytest.approx(stats[r]["wait_secs"], rel=1e-6, abs=1e-9)
        counts = _query(base, 'chute_batch_wait_seconds_count{loader="prom"}')
        assert sorted(float(c["value"][1]) for c in counts) == [25.0, 25.0]
        # Scrapes landed during the run: the series rose over several of them.
        rate = _query(base, 'rate(chute_samples_total{loader="prom",stage="delivered"}[1m])')
        assert len(rate) == 2 and all(float(r["value"][1]) > 0 for r in rate), rate
        seen = _query(base, 'min_over_time(chute_samples_total{loader="prom",'
                            'stage="delivered"}[1m])')
        assert all(float(r["value"][1]) < 200 for r in seen), seen
        assert {r["metric"]["job"] for r in rate} == {"chute"}
    finally:
        prom.terminate()
        prom.wait(timeout=30)


class SlowDataset:
    """A map-style dataset whose items are cheap; the slowness is in the transform."""

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return {"x": np.full(4, i, dtype=np.int64)}


def _slow_transform(sample):
    time.sleep(0.002)  # releases the GIL, as I/O or a C extension would
    return sample


def test_doctor_names_a_slow_python_transform_and_more_workers_help():
    d = chute.doctor(
        SlowDataset(), batch_size=8, num_workers=1, transforms=[_slow_transform],
        target_samples_per_s=1200, seconds=0.4, try_workers=[1, 2, 6],
    )
    assert isinstance(d, chute.Diagnosis)
    assert d["bottleneck"] == "transform", str(d)
    assert d["recommended_workers"] == 6, str(d)
    one = next(t for t in d["trials"] if t["workers"] == 1)
    assert d["expected_samples_per_sec"] > 2 * one["samples_per_sec"], str(d)
    assert "workers" in d.rules
    assert [s["stage"] for s in d["stages"]] == ["read", "transform", "collate", "consumer"]
    assert "bottleneck: transform" in str(d)
    assert "recommended: num_workers=6" in str(d)


def test_doctor_on_a_loader_leaves_it_where_it_was(source100):
    loader = chute.Loader(source100, batch_size=10, num_workers=2)
    next(iter(loader))
    d = loader.doctor(seconds=0.1, try_workers=[1], step_ms=1)
    assert d["required_samples_per_sec"] == pytest.approx(10_000)
    assert loader.state_dict()["delivered"] == 10
    with pytest.raises(chute.ConfigError, match="seconds"):
        loader.doctor(seconds=0)


def _jpeg_tar(path: Path, n: int) -> str:
    from PIL import Image

    rng = np.random.default_rng(0)
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            img = Image.fromarray(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8))
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            for ext, data in (("jpg", buf.getvalue()), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_doctor_advises_a_reduced_size_decode_for_a_pil_decode(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    shard = _jpeg_tar(tmp_path / "images.tar", 32)

    def decode(sample):
        img = Image.open(io.BytesIO(sample["jpg"])).convert("RGB").resize((32, 32))
        return {"image": np.asarray(img), "cls": int(sample["cls"])}

    d = chute.doctor(chute.webdataset(shard), batch_size=4, transforms=[decode],
                     seconds=0.3, try_workers=[1, 2])
    assert d["bottleneck"] == "transform", str(d)
    assert "reduced-decode" in d.rules and "not-indexed" in d.rules, str(d)


def test_doctor_sees_page_cache_misses(tmp_path):
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this platform")
    path = tmp_path / "cold.bin"
    write_tokens(path, 1 << 19)  # 32 MiB
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    d = chute.doctor(chute.tokens(str(path), seq_len=SEQ, dtype="uint32"), batch_size=64,
                     seconds=0.1, try_workers=[1])
    assert "page-cache" in d.rules, str(d)
    # Read again now that it is cached: no advice.
    path.read_bytes()
    d = chute.doctor(chute.tokens(str(path), seq_len=SEQ, dtype="uint32"), batch_size=64,
                     seconds=0.1, try_workers=[1])
    assert "page-cache" not in d.rules, str(d)


@needs_servers("HTTP_DIR", "HTTP_URL")
def test_doctor_names_reads_from_a_throttled_server(tmp_path):
    """Shards behind the fault proxy delaying every request by 60 ms: reading binds, and the
    doctor says to raise the read-ahead (block shuffle) or to use block shuffle (global)."""
    d = Path(HTTP_DIR) / "doctor"
    d.mkdir(parents=True, exist_ok=True)
    shards = []
    for k in range(12):
        shards.append(d / f"shard-{k:02d}.tar")
        with tarfile.open(shards[-1], "w") as tar:
            for i in range(32):
                data = bytes([i]) * 2048
                info = tarfile.TarInfo(f"{k:02d}{i:04d}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    subprocess.run([chute_bin(), "index", *map(str, shards)], check=True, capture_output=True)
    with fault_proxy(urllib.parse.urlparse(HTTP_URL).netloc, "--delay-ms", "60") as proxy:
        base = f"{proxy}/doctor"
        source = chute.webdataset([f"{base}/shard-{k:02d}.tar" for k in range(12)])
        block = chute.doctor(source, batch_size=8, shuffle="block", num_workers=1,
                             seconds=0.5, try_workers=[1, 2])
        assert block["bottleneck"] == "read", str(block)
        assert "remote-read-ahead" in block.rules, str(block)
        glob = chute.doctor(source, batch_size=8, shuffle="global", seconds=0.3,
                            try_workers=[1])
        assert "streaming-shuffle" in glob.rules, str(glob)
        # The remote figures in stats() and in the metrics.
        loader = chute.Loader(source, batch_size=8, shuffle="block", num_workers=2,
                              name="remote-metrics")
        assert sum(len(b["__key__"]) for b in loader) == 12 * 32
        s = loader.stats()
        assert s["remote"]["bytes_fetched"] > 0 and s["remote"]["requests"] > 0, s["remote"]
        assert s["window"]["remote_bytes_per_sec"] > 0
        text = _get(f"http://127.0.0.1:{chute.serve_metrics(0)}/metrics")
        labels = 'rank="0",loader="remote-metrics"'
        assert _series(text, f"chute_remote_bytes_total{{{labels}}}") >= s["remote"]["bytes_fetched"]
        assert _series(text, f"chute_remote_requests_total{{{labels}}}") >= s["remote"]["requests"]
