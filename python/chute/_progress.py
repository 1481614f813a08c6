"""``chute.Loader(..., progress=True)``: a progress bar per epoch with throughput and the
fraction of time the training step waited (tqdm when installed, a plain line otherwise)."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, Iterator, Optional

# How often the figures on the bar are refreshed, in seconds.
_REFRESH = 0.5


def _figures(stats: Callable[[], Dict[str, Any]]) -> str:
    try:
        s = stats()
    except Exception:  # a closed loader: the bar ends without figures
        return ""
    window = s.get("window") or s
    rate = float(window.get("samples_per_sec", 0.0))
    wait = float(window.get("wait_fraction", 0.0))
    figures = f"{rate:,.0f} samples/s, waited {wait * 100:.0f}%"
    tuned = s.get("autotune")
    if tuned:  # num_workers="auto": what the tuner runs now
        figures += f", {tuned['workers']} workers, prefetch {tuned['prefetch']}"
    if int(s.get("world_size", 1)) > 1:
        figures += f", rank {s['rank']}/{s['world_size']}"
    return figures


def bar(
    batches: Iterator[Any],
    total: int,
    epoch: int,
    stats: Callable[[], Dict[str, Any]],
    tqdm: Optional[Any] = None,
) -> Iterator[Any]:
    """Yields ``batches``, showing a bar of ``total`` batches for ``epoch``."""
    if tqdm is None:
        try:
            import tqdm.auto as tqdm_auto  # type: ignore[import-untyped]

            tqdm = tqdm_auto.tqdm
        except ImportError:
            tqdm = None
    if tqdm is not None:
        return _tqdm(batches, total, epoch, stats, tqdm)
    return _plain(batches, total, epoch, stats)


def _tqdm(
    batches: Iterator[Any], total: int, epoch: int, stats: Callable[[], Dict[str, Any]], tqdm: Any
) -> Iterator[Any]:
    progress = tqdm(total=total or None, desc=f"epoch {epoch}", unit="batch")
    last = 0.0
    try:
        for b in batches:
            progress.update(1)
            now = time.monotonic()
            if now - last >= _REFRESH:
                progress.set_postfix_str(_figures(stats), refresh=False)
                last = now
            yield b
        progress.set_postfix_str(_figures(stats), refresh=False)
    finally:
        progress.close()


def _plain(
    batches: Iterator[Any], total: int, epoch: int, stats: Callable[[], Dict[str, Any]]
) -> Iterator[Any]:
    out = sys.stderr
    done, last = 0, 0.0

    def line() -> str:
        pct = f" ({done * 100 // total}%)" if total else ""
        of = f"/{total}" if total else ""
        return f"\repoch {epoch}: {done}{of} batches{pct}, {_figures(stats)}"

    try:
        for b in batches:
            done += 1
            now = time.monotonic()
            if now - last >= _REFRESH:
                out.write(line())
                out.flush()
                last = now
            yield b
    finally:
        out.write(line() + "\n")
        out.flush()
