"""Iterable datasets (``__iter__`` only) under ``chute.Loader``: what can honestly be kept.

An iterable has no random access, so chute's plan (global shuffle, block shuffle, an exact
split by shards) cannot apply. What this engine keeps instead:

- **Order:** the stream's own, or with ``shuffle`` a seeded shuffle buffer (``True``: 10,000
  samples; ``"buffer:N"``), the same for (stream, seed, epoch, rank, world size).
- **Ranks:** sample ``k`` of the stream goes to rank ``k % world_size``. With ``__len__``,
  each rank takes ``len // world_size`` samples (the remainder is dropped), so every rank has
  the same number of batches; without it, counts may differ by one batch.
- **State:** ``state_dict()`` holds the dataset's own ``state_dict()`` (taken after the last
  sample of the last batch delivered) when it has one and there is no shuffle buffer;
  otherwise the count of batches delivered, and a resume replays the stream to there (the
  skipped batches are not collated).
- **Work:** one producer thread iterates the dataset (an iterator is one stream), collates
  batches natively (or with ``collate_fn``) and keeps ``prefetch`` batches ready.
  ``dataset.set_epoch(epoch)`` is called at each epoch's start when it exists. With
  ``worker_mode="process"`` the producer's work (the dataset's ``__iter__``, the rank split,
  the shuffle buffer, collation) runs in one worker process instead (the stream is one),
  started for each pass as DataLoader starts its workers, so Python that holds the GIL there
  leaves this process's GIL to the training step; each batch comes back pickled once (with
  the dataset's ``state_dict()`` when it has one), and the same batches as with the thread.
"""

from __future__ import annotations

import pickle
import queue
import random
import sys
import threading
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy

from . import _chute
from ._errors import ConfigError, StateError

_FORMAT = "chute-iterable/1"
DEFAULT_BUFFER = 10_000


def buffer_size(shuffle: Any) -> int:
    """The shuffle buffer ``shuffle`` asks for (0: none)."""
    if shuffle is False or shuffle == "none":
        return 0
    if shuffle is True:
        return DEFAULT_BUFFER
    if isinstance(shuffle, str) and shuffle.startswith("buffer:"):
        try:
            n = int(shuffle.split(":", 1)[1])
        except ValueError:
            n = 0
        if n >= 1:
            return n
    raise ConfigError(
        f"invalid shuffle: {shuffle!r} for an iterable dataset; use False, True (a shuffle "
        f"buffer of {DEFAULT_BUFFER:,} samples) or 'buffer:N' (an iterable has no random "
        "access, so 'global' and 'block' cannot apply)"
    )


class _Stop(Exception):
    pass


def _put(ready: "queue.Queue[Tuple[Any, ...]]", stop: threading.Event, item: Any) -> None:
    """Puts ``item`` in ``ready`` once there is room; ``_Stop`` if the pass is stopped first."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return
        except queue.Full:
            pass
    raise _Stop


class _Raw:
    """A batch collated in a worker process, before ``output`` and the structure apply."""

    def __init__(self, columns: Dict[str, Any], structure: Any) -> None:
        self.columns, self.structure = columns, structure


def _raw(columns: Dict[str, Any], structure: Any) -> _Raw:
    return _Raw(columns, structure)


class IterableEngine:
    """What ``chute.Loader`` drives for an iterable dataset; the interface of
    ``chute._chute.Loader`` (iteration per epoch, state, stats, options)."""

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        shuffle: Any,
        seed: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        pad: bool,
        prefetch: int,
        timeout: float,
        output: Optional[Callable[[Any], Any]],
        rebuild: Callable[[Dict[str, Any], Any], Any],
        collate_fn: Optional[Callable[[List[Any]], Any]],
        num_workers: int,
        worker_init_fn: Optional[Callable[[int], Any]] = None,
        process: Optional[Dict[str, Any]] = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"invalid batch_size: {batch_size!r}; use at least 1")
        if not 0 <= rank < world_size:
            raise ConfigError(f"invalid rank: {rank} is not in 0..{world_size}")
        self.dataset = dataset
        self.buffer = buffer_size(shuffle)
        self.options: Dict[str, Any] = {
            "batch_size": batch_size,
            "num_workers": num_workers,
            "prefetch": prefetch,
            "shuffle": f"buffer:{self.buffer}" if self.buffer else "none",
            "seed": seed,
            "rank": rank,
            "world_size": world_size,
            "drop_last": drop_last,
            "on_error": "raise",
            "pad": pad,
        }
        self.timeout = timeout
        self.output = output
        self.rebuild = rebuild
        self.collate_fn = collate_fn
        self.worker_init_fn = worker_init_fn
        # worker_mode="process": the multiprocessing context, the dataset_factory, and what
        # the worker process gets (the dataset or its factory, and this engine's options).
        self._process = process
        self._payload: Optional[bytes] = None
        if process is not None:
            self._payload = _payload(dataset, process.get("factory"), self.options,
                                     collate_fn, worker_init_fn)
        self._epoch = 0
        self.closed = False
        self.pinned = False
        self.pin_memory_fallback: Optional[str] = None
        # Position: batches delivered this epoch, the stream index after the last one, and
        # the dataset's own state then (when it keeps one and no buffer reorders).
        self._delivered = 0
        self._stream_index = 0
        self._dataset_state: Any = None
        self._resume: Optional[Dict[str, Any]] = None
        self._stats = {"batches": 0, "samples": 0}
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None
        self._stateful = (
            self.buffer == 0
            and callable(getattr(dataset, "state_dict", None))
            and callable(getattr(dataset, "load_state_dict", None))
        )

    # Length --------------------------------------------------------------------------------

    def _per_rank(self) -> Optional[int]:
        try:
            n = len(self.dataset)
        except TypeError:
            return None
        return int(n) // int(self.options["world_size"])

    def __len__(self) -> int:
        per_rank = self._per_rank()
        if per_rank is None:
            raise TypeError(
                f"{type(self.dataset).__name__} is an iterable dataset without __len__: its "
                "number of batches is not known before it ends"
            )
        b = int(self.options["batch_size"])
        return per_rank // b if self.options["drop_last"] else -(-per_rank // b)

    # Epochs --------------------------------------------------------------------------------

    def _epoch_done(self) -> bool:
        """Every batch of the epoch was delivered (a consumer that took exactly ``len``
        batches and never asked for the end): the epoch is over, the next pass reads the next."""
        if self._delivered == 0:
            return False
        try:
            return self._delivered >= len(self)
        except TypeError:  # no __len__: the end is known only when the stream ends
            return False

    def _next_epoch(self) -> None:
        self._epoch += 1
        self._delivered = 0
        self._stream_index = 0
        self._dataset_state = None
        self._resume = None

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch + 1 if self._epoch_done() else self._epoch

    def set_epoch(self, epoch: int) -> None:
        if self._epoch_done():
            self._next_epoch()
        if epoch != self._epoch:
            self._epoch = int(epoch)
            self._delivered = 0
            self._stream_index = 0
            self._dataset_state = None
            self._resume = None

    def __iter__(self) -> Iterator[Any]:
        return self._run()

    def _run(self) -> Iterator[Any]:
        if self.closed:
            raise ValueError("the loader is closed")
        self._halt()
        if self._epoch_done():
            self._next_epoch()
        stop = threading.Event()
        ready: "queue.Queue[Tuple[Any, ...]]" = queue.Queue(maxsize=max(1, self.options["prefetch"]))
        resume = self._resume
        self._resume = None
        start = (self._delivered, self._stream_index, self._dataset_state)
        if resume is not None:
            start = (resume["batches"], resume["stream_index"], resume["dataset"])
        produce = self._produce if self._process is None else self._produce_in_process
        thread = threading.Thread(
            target=produce, args=(ready, stop, self._epoch, *start), daemon=True,
            name="chute-iterable",
        )
        self._stop, self._thread = stop, thread
        thread.start()
        try:
            while True:
                try:
                    item = ready.get(timeout=self.timeout if self.timeout > 0 else 0.1)
                except queue.Empty:
                    if self.timeout > 0:
                        raise TimeoutError(
                            f"no batch within timeout={self.timeout} s from the iterable dataset"
                        ) from None
                    continue
                kind = item[0]
                if kind == "end":
                    break
                if kind == "error":
                    raise item[1]
                _, batch, rows, stream_index, dataset_state = item
                self._delivered += 1
                self._stream_index = stream_index
                self._dataset_state = dataset_state
                self._stats["batches"] += 1
                self._stats["samples"] += rows
                yield batch
            self._next_epoch()
        finally:
            stop.set()

    def _halt(self, timeout: Optional[float] = None) -> None:
        """Stops the producer and waits for it (at most ``timeout`` seconds: a thread stuck
        in the dataset's own code is left to finish on its own; it is a daemon)."""
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._stop = self._thread = None

    # The producer --------------------------------------------------------------------------

    def _produce(
        self,
        ready: "queue.Queue[Tuple[Any, ...]]",
        stop: threading.Event,
        epoch: int,
        skip: int,
        stream_index: int,
        dataset_state: Any,
    ) -> None:
        def put(item: Tuple[Any, ...]) -> None:
            _put(ready, stop, item)

        try:
            for item in self._items(epoch, skip, stream_index, dataset_state):
                put(item)
        except _Stop:
            pass
        except BaseException as e:  # raised by next() as itself
            try:
                put(("error", e))
            except _Stop:
                pass

    def _items(
        self, epoch: int, skip: int, stream_index: int, dataset_state: Any
    ) -> Iterator[Tuple[Any, ...]]:
        """The pass's batches from the position given, as ``("batch", batch, rows, stream
        index after it, the dataset's state after it)``, then ``("end",)``."""
        ds = self.dataset
        if self.worker_init_fn is not None:
            self.worker_init_fn(0)  # the one producer is worker 0
        if callable(getattr(ds, "set_epoch", None)):
            ds.set_epoch(epoch)
        resumed = self._stateful and dataset_state is not None
        if resumed:
            ds.load_state_dict(dataset_state)
        else:
            stream_index = 0  # replay from the start, skipping delivered batches
        samples = self._mine(iter(ds), stream_index)
        if self.buffer:
            samples = self._shuffled(samples, epoch)
        b, batch, index = 0, [], stream_index
        bs = self.options["batch_size"]
        for index, sample in samples:
            batch.append(sample)
            if len(batch) < bs:
                continue
            b += 1
            if resumed or b > skip:
                state = ds.state_dict() if self._stateful else None
                yield ("batch", self._collate(batch), bs, index + 1, state)
            batch = []
        if batch and not self.options["drop_last"] and (resumed or b + 1 > skip):
            state = ds.state_dict() if self._stateful else None
            yield ("batch", self._collate(batch), len(batch), index + 1, state)
        yield ("end",)

    def _produce_in_process(
        self,
        ready: "queue.Queue[Tuple[Any, ...]]",
        stop: threading.Event,
        epoch: int,
        skip: int,
        stream_index: int,
        dataset_state: Any,
    ) -> None:
        """``_produce`` with the work in a worker process: this thread starts it, receives
        its batches and puts them in ``ready``; the process ends with the pass, when the
        consumer stops early (its pipe closes) or when this process ends."""
        assert self._process is not None
        ctx = self._process["context"]
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_worker_main,
            args=(writer, self._payload, self.options["seed"], epoch, skip, stream_index,
                  dataset_state),
            name="chute-iterable-worker", daemon=True,
        )

        def put(item: Tuple[Any, ...]) -> None:
            _put(ready, stop, item)

        try:
            p.start()
            writer.close()
            while not stop.is_set():
                if not reader.poll(0.1):
                    continue
                try:
                    item = reader.recv()
                except EOFError:
                    p.join(1)
                    raise RuntimeError(
                        f"chute's iterable worker process (pid {p.pid}) ended without "
                        f"finishing the pass (exit code {p.exitcode}; a negative code is the "
                        "signal that killed it: -9 is SIGKILL, as the out-of-memory killer "
                        "sends); with worker_mode='thread' the dataset is read in this process"
                    ) from None
                if item[0] == "batch" and isinstance(item[1], _Raw):
                    item = ("batch", self._finish(item[1]), *item[2:])
                put(item)
                if item[0] in ("end", "error"):
                    break
        except _Stop:
            pass
        except BaseException as e:
            try:
                put(("error", e))
            except _Stop:
                pass
        finally:
            reader.close()  # a worker still sending ends at its next batch
            p.join(2)
            if p.is_alive():
                p.terminate()
                p.join(2)

    def _finish(self, raw: _Raw) -> Any:
        """A batch collated in the worker process, handed through ``output`` and rebuilt."""
        out = self.output
        columns = {
            k: out(v) if out is not None and isinstance(v, numpy.ndarray) else v
            for k, v in raw.columns.items()
        }
        return self.rebuild(columns, raw.structure)

    def _mine(self, it: Iterator[Any], start: int) -> Iterator[Tuple[int, Any]]:
        """This rank's samples of the stream from stream index ``start``, with the index of
        each (a resumed dataset's iterator starts there)."""
        world, rank = self.options["world_size"], self.options["rank"]
        per_rank = self._per_rank()
        limit = None if per_rank is None else per_rank * world
        k = start
        for sample in it:
            if limit is not None and k >= limit:
                return
            if k % world == rank:
                yield k, sample
            k += 1

    def _shuffled(self, samples: Iterator[Tuple[int, Any]], epoch: int) -> Iterator[Tuple[int, Any]]:
        """A seeded shuffle buffer over ``samples``."""
        seed = (self.options["seed"], epoch, self.options["rank"])
        rng = numpy.random.default_rng(numpy.random.SeedSequence(list(seed)))
        buf: List[Tuple[int, Any]] = []
        for item in samples:
            if len(buf) < self.buffer:
                buf.append(item)
                continue
            j = int(rng.integers(len(buf)))
            out, buf[j] = buf[j], item
            yield out
        order = rng.permutation(len(buf))
        for j in order:
            yield buf[int(j)]

    def _collate(self, samples: List[Any]) -> Any:
        if self.collate_fn is not None:
            return self.collate_fn(samples)
        columns, structure = _chute.collate_samples(samples, self.options["pad"], self.output)
        return self.rebuild(columns, structure)

    # State ---------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        o = self.options
        done = self._epoch_done()  # after an epoch's last batch: the start of the next
        return {
            "format": _FORMAT,
            "epoch": self.epoch,
            "batches": 0 if done else self._delivered,
            "stream_index": 0 if done else self._stream_index,
            "dataset": None if done else self._dataset_state,
            "seed": o["seed"],
            "shuffle": o["shuffle"],
            "batch_size": o["batch_size"],
            "rank": o["rank"],
            "world_size": o["world_size"],
        }

    def load_state_dict(self, state: Any) -> None:
        if isinstance(state, str):
            import json

            state = json.loads(state)
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise StateError(
                "not the state of a chute loader over an iterable dataset "
                f"(expected format {_FORMAT!r})"
            )
        o = self.options
        for key in ("seed", "shuffle", "batch_size", "rank", "world_size"):
            if state.get(key) != o[key]:
                raise StateError(
                    f"the state was saved with {key}={state.get(key)!r}, this loader has "
                    f"{key}={o[key]!r}"
                )
        self._halt()
        self._epoch = int(state["epoch"])
        self._delivered = int(state["batches"])
        self._stream_index = int(state["stream_index"])
        self._dataset_state = state.get("dataset") if self._stateful else None
        self._resume = {
            "batches": self._delivered,
            "stream_index": self._stream_index,
            "dataset": self._dataset_state,
        }

    # Figures and lifetime ------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        return dict(self._stats)

    def release(self) -> None:
        self._halt(timeout=10.0)
        self.closed = True


def _payload(
    dataset: Any,
    factory: Any,
    options: Dict[str, Any],
    collate_fn: Any,
    worker_init_fn: Any,
) -> bytes:
    """What the worker process of an iterable gets: the dataset (or its factory) and the
    engine's options."""
    what = (factory, True) if factory is not None else (dataset, False)
    try:
        return pickle.dumps((*what, options, collate_fn, worker_init_fn),
                            protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # what pickle raises varies
        raise ConfigError(
            "invalid worker_mode: 'process' gives the worker process the dataset (or "
            f"dataset_factory), collate_fn and worker_init_fn pickled, and one does not pickle "
            f"({e}); pass dataset_factory= (a top-level function that builds the dataset), "
            "or use worker_mode='thread'"
        ) from None


def _worker_main(
    conn: Any,
    payload: bytes,
    seed: int,
    epoch: int,
    skip: int,
    stream_index: int,
    dataset_state: Any,
) -> None:
    """An iterable's worker process: one pass of the stream, each batch sent to the parent."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        dataset, built_here, o, collate_fn, worker_init_fn = pickle.loads(payload)
        if built_here:
            dataset = dataset()
        random.seed(seed)  # as DataLoader seeds worker 0
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.manual_seed(seed)
        engine = IterableEngine(
            dataset, batch_size=o["batch_size"], shuffle=o["shuffle"], seed=o["seed"],
            rank=o["rank"], world_size=o["world_size"], drop_last=o["drop_last"], pad=o["pad"],
            prefetch=1, timeout=0, output=numpy.asarray, rebuild=_raw, collate_fn=collate_fn,
            num_workers=1, worker_init_fn=worker_init_fn,
        )
        for item in engine._items(epoch, skip, stream_index, dataset_state):
            conn.send(item)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent stopped reading: the pass was abandoned
    except BaseException as e:
        note = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        try:
            if hasattr(e, "add_note"):  # Python 3.11+
                e.add_note(f"raised in chute's iterable worker process:\n{note}")
            conn.send(("error", e))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # an exception that does not pickle: its text instead
            try:
                conn.send(("error", RuntimeError(note)))
            except Exception:
                pass
    finally:
        conn.close()
