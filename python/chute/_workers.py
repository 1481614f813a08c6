"""Process workers for map-style datasets (``chute.Loader(..., worker_mode="process")``), and
the budget ``num_workers="auto"`` tunes within.

Each worker is a fresh interpreter (``spawn``, or ``forkserver``: never a fork of this
process, whose threads a fork would copy mid-flight) that gets the dataset once (pickled, or
built there by ``dataset_factory`` for a dataset that does not pickle), runs
``worker_init_fn(worker_id)``, makes its arena (anonymous shared memory, ``memfd_create``) and
hands it to this process over a socket pair. From then on the engine's worker threads send it
sample ids and copy the samples' fields out of its arena (``_chute.process_dataset``): no
sample is pickled, nothing is created in ``/dev/shm``, and nothing outlives the processes.
The Python transforms at the head of the loader's ``transforms`` run there too, each sample
with the RNG the engine would give it, so the batches are thread mode's.

A worker process exits when this process closes its socket (the loader is closed or garbage
collected, or this process ends or is killed); it ignores Ctrl-C, which this process handles.
"""

import multiprocessing
import os
import pickle
import random
import signal
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _chute
from ._errors import ConfigError

_CONTEXTS = ("spawn", "forkserver")


def _context(context: Any) -> Any:
    """The multiprocessing context to start workers with: spawn by default."""
    if context is None:
        return multiprocessing.get_context("spawn")
    name = context if isinstance(context, str) else getattr(context, "get_start_method", None)
    if callable(name):
        name = name()
    if name not in _CONTEXTS:
        raise ConfigError(
            f"invalid multiprocessing_context: {context!r}; worker processes start with "
            "'spawn' (the default) or 'forkserver': a fork would copy this process's threads "
            "mid-flight"
        )
    return multiprocessing.get_context(name) if isinstance(context, str) else context


def _pickled(dataset: Any, transforms: List[Any], factory: Any = None) -> bytes:
    """The dataset (or the factory that builds it) and the transforms as each worker
    process gets them."""
    if factory is not None:
        try:
            return pickle.dumps((factory, True, transforms), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise ConfigError(
                f"invalid dataset_factory: each worker process gets it pickled, and "
                f"{factory!r} does not pickle ({e}); define it at a module's top level (or "
                "use functools.partial of one), not as a lambda or a nested function"
            ) from None
    try:
        pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # what pickle raises varies: TypeError, PicklingError, ...
        raise ConfigError(
            f"invalid worker_mode: 'process' gives each worker process the dataset pickled, "
            f"and this {type(dataset).__name__} does not pickle ({e}); pass "
            "dataset_factory= (a function that builds it: each worker process calls it), "
            "open files and connections in __getitem__ or worker_init_fn rather than "
            "__init__, or use worker_mode='thread'"
        ) from None
    try:
        return pickle.dumps((dataset, False, transforms), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise ConfigError(
            f"invalid transforms: with worker_mode='process' the Python transforms run in the "
            f"worker processes, so they must pickle, and one does not ({e}); define it at a "
            "module's top level (not a lambda or a nested function)"
        ) from None


# Two threads must read at least this many times as fast as one for worker_mode="auto" to
# keep threads: below it the GIL (or the Python around the native work) holds them back, and
# processes, which DataLoader uses, scale better.
THREADS_SCALE = 1.8


def probe(dataset: Any, budget: float = 0.5) -> Dict[str, Any]:
    """How a map-style dataset's ``__getitem__`` scales on threads: a few samples read on one
    thread, then as many on each of two threads at once, then on one thread again (about
    ``budget`` seconds for the one-thread runs); ``worker_mode="auto"`` picks processes when
    two threads are less than ``THREADS_SCALE`` times as fast as one. Returns the figures: ``samples``, ``one_thread_s``,
    ``two_threads_s`` (per sample), ``thread_scaling`` and the ``choice``."""
    n = len(dataset)
    if n == 0:
        return {"choice": "thread", "why": "the dataset is empty"}
    order = [(i * 7919) % n for i in range(n)]  # spread over the dataset, not its head only
    dataset[order[0]]  # the first read pays for imports and opened files

    def read(ids: List[int]) -> int:
        for i in ids:
            dataset[i]
        return len(ids)

    # One thread: as many samples as fit in the budget (at least 2); then two threads, k
    # samples each; then one thread again, so that a drift (caches warming, a neighbour's
    # load) falls on both sides of the comparison: the one-thread time is the two runs' mean.
    k, t0 = 0, time.perf_counter()
    while k < min(n, 64) and (k < 2 or time.perf_counter() - t0 < budget / 2):
        read([order[(1 + k) % n]])
        k += 1
    first = time.perf_counter() - t0
    ids = [order[(1 + k + j) % n] for j in range(2 * k)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=read, args=(ids[j::2],)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    two = (time.perf_counter() - t0) / (2 * k)
    t0 = time.perf_counter()
    read([order[(1 + 3 * k + j) % n] for j in range(k)])
    one = (first + time.perf_counter() - t0) / (2 * k)
    scaling = one / two if two > 0 else 2.0
    return {
        "samples": 4 * k + 1,
        "one_thread_s": one,
        "two_threads_s": two,
        "thread_scaling": round(scaling, 3),
        "choice": "thread" if scaling >= THREADS_SCALE else "process",
    }


def budget() -> Tuple[int, int]:
    """What ``num_workers="auto"`` may use in this process: ``(cores, memory bytes)``.

    Cores: those this process may run on (its CPU affinity, and a container's CPU quota from
    cgroup v2's ``cpu.max``), shared among the ranks on this node (``LOCAL_WORLD_SIZE``, as
    torchrun sets it). Memory: a tenth of the machine's (or the container's ``memory.max``),
    shared the same way, for the batches the loader holds ready."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            memory = min(memory, int(limit))
    except (OSError, ValueError):
        pass
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, cores // local), max(1 << 26, memory // 10 // local)


class WorkerPool:
    """``num_workers`` worker processes serving ``dataset`` (up to ``limit``, started as the
    loader's tuner needs them); ``source`` reads through them."""

    def __init__(
        self,
        dataset: Any,
        source: "_chute.Source",
        num_workers: int,
        *,
        context: Any = None,
        worker_init_fn: Optional[Callable[[int], Any]] = None,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        seed: int = 0,
        timeout: float = 0,
        transforms: Optional[List[Any]] = None,
        restart: bool = False,
        factory: Any = None,
        limit: int = 0,
    ) -> None:
        if num_workers < 1:
            raise ConfigError(
                "invalid num_workers: worker_mode='process' reads in worker processes, so it "
                f"needs num_workers >= 1, got {num_workers}"
            )
        ctx = _context(context)
        payload = _pickled(dataset, list(transforms or []), factory)
        self._ctx = ctx
        self._args = (max(limit, num_workers), payload, worker_init_fn, collate_fn, seed)
        self.processes: List[Any] = []
        self._lock = threading.Lock()
        self._closed = False
        ends = []
        try:
            for k in range(num_workers):
                p, end = self._launch(k)
                self.processes.append(p)
                ends.append(end)
        except BaseException:
            self.close()
            for end in ends:
                end.close()
            raise
        # The source holds the restart callback: through a weak reference, so that a loader
        # dropped without close() frees the pool, its sockets and so its processes.
        me = weakref.ref(self)

        def restart_worker(k: int) -> Any:
            pool = me()
            if pool is None:
                raise RuntimeError("the worker pool is gone")
            return pool._restart(k)

        def grow(k: int) -> Any:
            pool = me()
            if pool is None:
                raise RuntimeError("the worker pool is gone")
            return pool._grow(k)

        # Until a worker process is ready, the engine's threads read in this process (as
        # thread mode does, the workers' Python transforms included), so the first batch
        # does not wait for the interpreters to start; not with a worker_init_fn, which only
        # the workers run.
        self.source, self._sockets = _chute.process_dataset(
            source, num_workers, float(timeout or 0), restart_worker if restart else None,
            grow if limit > num_workers else None, max(limit, num_workers),
            early=worker_init_fn is None, transforms=list(transforms or []),
        )
        sockets = self._sockets
        self._starter = threading.Thread(
            target=_hand_over, args=(me, sockets, ends), name="chute-worker-start", daemon=True
        )
        self._starter.start()

    def _launch(self, k: int) -> Any:
        """Starts worker ``k``: its process and this process's end of its socket pair."""
        parent, child = socket.socketpair()
        p = self._ctx.Process(
            target=_main, args=(child, k, *self._args), name=f"chute-worker-{k}", daemon=True
        )
        try:
            p.start()
        finally:
            child.close()
        return p, parent

    def _restart(self, k: int) -> Any:
        """A new worker ``k`` in place of one that died (``on_error="skip"``)."""
        old = self.processes[k]
        old.join(0)
        p, end = self._launch(k)
        self.processes[k] = p
        try:
            return self._ready(k, end)
        except BaseException:
            end.close()
            raise

    def _started(self, k: int, end: socket.socket) -> Any:
        """Worker ``k``'s socket and arena once it is ready; ``end`` closed if it failed."""
        try:
            return self._ready(k, end)
        except BaseException:
            end.close()
            raise

    def _grow(self, k: int) -> Any:
        """Worker ``k``, the next one, started because every one running is busy."""
        with self._lock:
            if k != len(self.processes) or self._closed:
                raise RuntimeError(f"worker process {k} cannot be started now")
            p, end = self._launch(k)
            self.processes.append(p)
        try:
            return self._ready(k, end)
        except BaseException:
            end.close()
            raise

    def _ready(self, k: int, end: socket.socket) -> Any:
        """Worker ``k``'s socket and arena once it has started; its startup error raised."""
        p = self.processes[k]
        while True:
            end.settimeout(0.5)
            try:
                msg, fds, _, _ = socket.recv_fds(end, 1 << 16, 1)
                break
            except socket.timeout:
                if not p.is_alive():
                    msg, fds = b"", []
                    break
        if not fds:
            p.join(5)
            code = p.exitcode
            if not msg and code is not None and code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = "?"
                raise RuntimeError(
                    f"chute worker process {k} (pid {p.pid}) was killed by signal {-code} "
                    f"({name}) before it started (the out-of-memory killer sends SIGKILL)"
                )
            why = msg.decode(errors="replace") or f"exit code {code}"
            raise RuntimeError(f"chute worker process {k} (pid {p.pid}) failed to start: {why}")
        end.settimeout(None)
        return (end.detach(), fds[0], k, p.pid)

    def close(self) -> None:
        """Ends the workers: their sockets are closed, so each ends at its next read; one
        that does not within seconds is terminated."""
        sockets = getattr(self, "_sockets", None)
        if sockets is not None:
            sockets.close()
        with self._lock:
            self._closed = True
            processes = list(self.processes)
        for p in processes:
            if p.is_alive():
                p.join(2)
            if p.is_alive():
                p.terminate()
                p.join(2)
            if p.is_alive():
                p.kill()
                p.join(1)
        self.processes = []


def _hand_over(pool_ref: Any, sockets: Any, ends: List[socket.socket]) -> None:
    """Hands each worker process to the reading source as it becomes ready (a thread: the
    loader does not wait for them to start), or its failure to start."""
    for k, end in enumerate(ends):
        pool = pool_ref()
        if pool is None:
            end.close()
            continue
        try:
            worker = pool._started(k, end)
        except BaseException as e:  # every read from now on raises it
            sockets.fail(str(e))
        else:
            sockets.add(worker)
        del pool


def _main(
    sock: socket.socket,
    index: int,
    count: int,
    payload: bytes,
    worker_init_fn: Optional[Callable[[int], Any]],
    collate_fn: Optional[Callable[[List[Any]], Any]],
    seed: int,
) -> None:
    """A worker process: the dataset, the seeds and ``worker_init_fn`` as DataLoader's
    workers have them, then the serving loop until this process's parent closes the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        dataset, built_here, transforms = pickle.loads(payload)
        if built_here:
            dataset = dataset()
        # As DataLoader seeds its workers: base seed + worker id, for random and torch.
        random.seed(seed + index)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.manual_seed(seed + index)
        if worker_init_fn is not None:
            worker_init_fn(index)
        arena = os.memfd_create(f"chute-worker-{index}", os.MFD_CLOEXEC)
    except BaseException as e:  # reported to the parent, which raises it
        import traceback

        sock.sendall("".join(traceback.format_exception(type(e), e, e.__traceback__)).encode())
        return
    socket.send_fds(sock, [b"ready"], [arena])
    _chute.serve_worker(sock.fileno(), arena, dataset, collate_fn, transforms)
