"""Process workers for map-style datasets (``chute.Loader(..., worker_mode="process")``), and
the budget ``num_workers="auto"`` tunes within.

The workers are forks of one fresh interpreter, chute's fork server (the default, also what
``multiprocessing_context="forkserver"`` gives), or each a fresh interpreter of its own
(``"spawn"``); never a fork of this process, whose threads a fork would copy mid-flight. The
fork server is started with BLAS and OpenMP at one thread (as DataLoader runs torch at one
thread in its workers), imports what this process's ``__main__`` imports and what reading a
sample imported here, unpickles the dataset once and then forks a worker whenever one is asked
for: the workers share its pages (the imports, the dataset) as DataLoader's forked workers
share their parent's, and a worker starts in milliseconds. It forks only while it holds no
thread but its own (else the workers are spawned, with a warning). Each worker gets the
dataset (built there by ``dataset_factory`` for a dataset that does not pickle), runs
``worker_init_fn(worker_id)``, makes its arena (anonymous shared memory, ``memfd_create``)
and hands it to this process over a socket pair. From then on the engine's worker threads send
it sample ids and copy the samples' fields out of its arena (``_chute.process_dataset``): no
sample is pickled, nothing is created in ``/dev/shm``, and nothing outlives the processes.
The Python transforms at the head of the loader's ``transforms`` run there too, each sample
with the RNG the engine would give it, so the batches are thread mode's. Without a
``worker_init_fn`` (which only the workers run) the engine's threads read here until a worker
is ready, and the processes start as the first batch is handed over (``WorkerPool.begin``).

A worker process exits when this process closes its socket (the loader is closed or garbage
collected, or this process ends or is killed), and the fork server when this process closes its
own socket, once its workers have exited; both ignore Ctrl-C, which this process handles.
"""

import multiprocessing
import os
import pickle
import random
import signal
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _chute
from ._errors import ConfigError

_CONTEXTS = ("spawn", "forkserver")


def _context(context: Any) -> Any:
    """The multiprocessing context to start workers with: spawn by default (the map-style
    pool forks its workers from chute's fork server instead where ``_forks`` says so)."""
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


def _forks(context: Any) -> bool:
    """Whether map-style workers are forked from chute's fork server: by default and for
    ``"forkserver"``; ``"spawn"`` starts a fresh interpreter for each."""
    if context is None:
        return True
    name = context if isinstance(context, str) else context.get_start_method()
    return name == "forkserver"


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
    two threads are less than ``THREADS_SCALE`` times as fast as one. Returns the figures:
    ``samples``, ``one_thread_s``, ``two_threads_s`` (per sample), ``thread_scaling`` and the
    ``choice``."""
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
        preload: Optional[List[str]] = None,
    ) -> None:
        if num_workers < 1:
            raise ConfigError(
                "invalid num_workers: worker_mode='process' reads in worker processes, so it "
                f"needs num_workers >= 1, got {num_workers}"
            )
        ctx = _context(context)
        payload = _pickled(dataset, list(transforms or []), factory)
        for name, fn in (("worker_init_fn", worker_init_fn), ("collate_fn", collate_fn)):
            try:
                pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                raise ConfigError(
                    f"invalid {name}: each worker process gets it pickled, and {fn!r} does not "
                    f"pickle ({e}); define it at a module's top level (or use "
                    "functools.partial of one), not as a lambda or a nested function"
                ) from None
        self._ctx = ctx
        self._args = (max(limit, num_workers), payload, worker_init_fn, collate_fn, seed)
        self.processes: List[Any] = []
        self._lock = threading.Lock()
        self._closed = False
        # Started now (it takes an interpreter's start-up), asked for workers by the thread
        # below: the loader does not wait for either.
        self._server: Optional[_ForkServer] = None
        blob = _ForkServer.message(self._args, preload or []) if _forks(context) else None
        # With reads made here until a worker is ready, the processes start once the first
        # batch is handed over (``begin``), or after _START_AFTER_S: the interpreter's start-up
        # does not take the cores from the reads of the first batch.
        early = worker_init_fn is None
        self._go = threading.Event()
        self.begun = not early
        if not early:
            self._go.set()
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
        try:
            self.source, self._sockets = _chute.process_dataset(
                source, num_workers, float(timeout or 0), restart_worker if restart else None,
                grow if limit > num_workers else None, max(limit, num_workers),
                early=early, transforms=list(transforms or []),
            )
        except BaseException:
            self.close()
            raise
        sockets = self._sockets
        self._starter = threading.Thread(
            target=_hand_over, args=(me, self._go, sockets, num_workers, blob),
            name="chute-worker-start", daemon=True,
        )
        self._starter.start()

    def begin(self) -> None:
        """Starts the worker processes now (the loader calls it as it hands over the first
        batch)."""
        self.begun = True
        self._go.set()

    def _serve_from(self, blob: Optional[bytes]) -> None:
        """Starts the fork server (with ``blob``, what it loads), unless closed."""
        with self._lock:
            if blob is not None and not self._closed:
                self._server = _ForkServer(blob)

    def _launch(self, k: int) -> Tuple[Any, socket.socket]:
        """Starts worker ``k``: its process and this process's end of its socket pair."""
        server = self._server
        if server is not None:
            try:
                return server.fork(k)
            except _Threaded as e:
                warnings.warn(
                    f"chute's worker fork server holds threads ({e}), and a fork would copy "
                    "them mid-flight, so worker processes are spawned instead (each a fresh "
                    "interpreter: slower to start, more memory); start no thread while "
                    "__main__ or the dataset's module is imported, or unpickled",
                    RuntimeWarning, stacklevel=2,
                )
                self._server = None
                server.close()
        parent, child = socket.socketpair()
        p = self._ctx.Process(
            target=_main, args=(child, k, *self._args), name=f"chute-worker-{k}", daemon=True
        )
        try:
            p.start()
        finally:
            child.close()
        return p, parent

    def _add(self, k: int) -> socket.socket:
        """Starts worker ``k``, the next one, and counts it; its socket end returned."""
        with self._lock:
            if k != len(self.processes) or self._closed:
                raise RuntimeError(f"worker process {k} cannot be started now")
            p, end = self._launch(k)
            self.processes.append(p)
        return end

    def _restart(self, k: int) -> Any:
        """A new worker ``k`` in place of one that died (``on_error="skip"``)."""
        with self._lock:
            old = self.processes[k]
            old.join(0)
            p, end = self._launch(k)
            self.processes[k] = p
        return self._started(k, end)

    def _started(self, k: int, end: socket.socket) -> Any:
        """Worker ``k``'s socket and arena once it is ready; ``end`` closed if it failed."""
        try:
            return self._ready(k, end)
        except BaseException:
            end.close()
            raise

    def _grow(self, k: int) -> Any:
        """Worker ``k``, the next one, started because every one running is busy."""
        return self._started(k, self._add(k))

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
                raise RuntimeError(
                    f"chute worker process {k} (pid {p.pid}) was {_how(code)} before it "
                    "started (the out-of-memory killer sends SIGKILL)"
                )
            why = msg.decode(errors="replace") or f"exit code {code}"
            raise RuntimeError(f"chute worker process {k} (pid {p.pid}) failed to start: {why}")
        end.settimeout(None)
        return (end.detach(), fds[0], k, p.pid)

    def close(self) -> None:
        """Ends the workers: their sockets are closed, so each ends at its next read; one
        that does not within seconds is terminated. Then the fork server."""
        sockets = getattr(self, "_sockets", None)
        if sockets is not None:
            sockets.close()
        with self._lock:
            self._closed = True
            processes = list(self.processes)
        self._go.set()
        for p in processes:
            if p.is_alive():
                p.join(2)
            if p.is_alive():
                p.terminate()
                p.join(2)
            if p.is_alive():
                p.kill()
                p.join(1)
            if isinstance(p, _Forked):
                p.close()
        self.processes = []
        server, self._server = self._server, None
        if server is not None:
            server.close()


# Longest the worker processes wait for the first batch before they start (see
# WorkerPool.begin).
_START_AFTER_S = 0.5


def _hand_over(pool_ref: Any, go: threading.Event, sockets: Any, n: int,
               blob: Optional[bytes]) -> None:
    """Starts the fork server (where ``blob`` is given) and the first ``n`` worker processes
    once ``go`` is set (or after ``_START_AFTER_S``), and hands each to the reading source as it
    becomes ready (a thread: the loader does not wait for them), or its failure."""
    go.wait(_START_AFTER_S)
    ends: List[socket.socket] = []
    pool = pool_ref()
    try:
        if pool is None:
            return
        pool._serve_from(blob)
        for k in range(n):
            ends.append(pool._add(k))
    except BaseException as e:  # every read from now on raises it
        sockets.fail(str(e))
        for end in ends:
            end.close()
        return
    finally:
        del pool
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
    """A spawned worker process: the dataset, then as ``_serve``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        loaded = pickle.loads(payload)
    except BaseException as e:  # reported to the parent, which raises it
        _report(sock, e)
        return
    _serve(sock, index, loaded, worker_init_fn, collate_fn, seed)


def _report(sock: socket.socket, e: BaseException) -> None:
    """A worker's startup failure, sent to the parent, which raises it."""
    import traceback

    sock.sendall("".join(traceback.format_exception(type(e), e, e.__traceback__)).encode())


def _serve(
    sock: socket.socket,
    index: int,
    loaded: Tuple[Any, bool, List[Any]],
    worker_init_fn: Optional[Callable[[int], Any]],
    collate_fn: Optional[Callable[[List[Any]], Any]],
    seed: int,
) -> None:
    """A worker process: the dataset (``loaded``: it, or its factory, and the transforms), the
    seeds and ``worker_init_fn`` as DataLoader's workers have them, then the serving loop until
    this process's parent closes the socket."""
    try:
        dataset, built_here, transforms = loaded
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
    except BaseException as e:
        _report(sock, e)
        return
    socket.send_fds(sock, [b"ready"], [arena])
    _chute.serve_worker(sock.fileno(), arena, dataset, collate_fn, transforms)


# The fork server. Messages on its socket are length-prefixed (8 bytes, little-endian), a
# file descriptor riding with the prefix where one is passed.

_LEN = struct.Struct("<Q")
# Run single-threaded in the fork server and so in every worker: a fork copies no thread, and
# N workers on N cores do not start N BLAS pools each (DataLoader sets torch's threads to 1).
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# A worker that has ended stays unreaped this long, so that this process can read how it ended
# from /proc (it is not this process's child).
_REAP_AFTER_S = 5.0


def _send(sock: socket.socket, data: bytes, fd: Optional[int] = None) -> None:
    socket.send_fds(sock, [_LEN.pack(len(data))], [fd] if fd is not None else [])
    sock.sendall(data)


def _recv(sock: socket.socket) -> Tuple[bytes, Optional[int]]:
    """One message and the descriptor that came with it; ``EOFError`` at the end."""
    head, fds, _, _ = socket.recv_fds(sock, _LEN.size, 1)
    while head and len(head) < _LEN.size:
        more = sock.recv(_LEN.size - len(head))
        if not more:
            break
        head += more
    if len(head) < _LEN.size:
        for fd in fds:
            os.close(fd)
        raise EOFError
    (n,) = _LEN.unpack(head)
    data = bytearray()
    while len(data) < n:
        more = sock.recv(min(n - len(data), 1 << 20))
        if not more:
            raise EOFError
        data += more
    return bytes(data), (fds[0] if fds else None)


class _Threaded(Exception):
    """The fork server holds threads, so it must not fork."""


class _ForkServer:
    """This process's end of chute's fork server: a fresh interpreter (started as
    multiprocessing's spawn starts one, with this process's ``__main__``, path and working
    directory) that loads the dataset once and forks workers from it."""

    @staticmethod
    def message(args: Tuple[Any, ...], preload: List[str]) -> bytes:
        """What the server loads: how to prepare (as multiprocessing's spawn prepares a
        process), the workers' ``args`` and the modules to ``preload`` (those reading a
        sample imported here)."""
        from multiprocessing import reduction, spawn

        prep = spawn.get_preparation_data("chute-fork-server")
        # Pickled as bytes: an AuthenticationString refuses to pickle outside a spawn.
        prep["authkey"] = bytes(prep["authkey"])
        try:
            # Two layers: the workers' arguments may name functions of modules that only
            # the preparation (this process's path, __main__) makes importable there.
            inner = bytes(reduction.ForkingPickler.dumps((args, preload)))
            return pickle.dumps((prep, inner), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise ConfigError(f"invalid worker_mode: 'process' could not pickle what each "
                              f"worker process gets ({e})") from None

    def __init__(self, blob: bytes) -> None:
        from multiprocessing import spawn, util

        env = dict(os.environ)
        env.update({k: "1" for k in _ONE_THREAD})
        mine, theirs = socket.socketpair()
        # chute is imported from where this process imported it (spawn.prepare then sets the
        # path to this process's).
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        flags = util._args_from_interpreter_flags()  # type: ignore[attr-defined]
        cmd = [spawn.get_executable(), *flags, "-c",
               f"import sys; sys.path.insert(0, {here!r}); from chute._workers import "
               f"_fork_server; _fork_server({theirs.fileno()})"]
        try:
            self.popen = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), env=env,
                                          stdin=subprocess.DEVNULL)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self._sock = mine
        self._lock = threading.Lock()
        self._ready = False
        try:
            _send(mine, blob)
        except OSError:
            pass  # it died at once: fork() says how

    def _answer(self) -> str:
        try:
            data, _ = _recv(self._sock)
        except (EOFError, OSError):
            code = self.popen.poll()
            raise RuntimeError(
                f"chute's worker fork server (pid {self.popen.pid}) ended"
                + (f" ({_how(code)})" if code is not None else "")
            ) from None
        return data.decode(errors="replace")

    def fork(self, k: int) -> Tuple["_Forked", socket.socket]:
        """Worker ``k``, forked by the server: its process and this process's socket end."""
        with self._lock:
            if not self._ready:
                answer = self._answer()
                if answer != "ready":
                    raise RuntimeError(f"chute worker process {k} failed to start: {answer}")
                self._ready = True
            parent, child = socket.socketpair()
            try:
                _send(self._sock, str(k).encode(), child.fileno())
            except OSError:
                parent.close()
                raise RuntimeError(
                    f"chute's worker fork server (pid {self.popen.pid}) ended") from None
            finally:
                child.close()
            answer = self._answer()
        if answer.startswith("threads "):
            parent.close()
            raise _Threaded(answer[len("threads "):])
        if not answer.startswith("pid "):
            parent.close()
            raise RuntimeError(f"chute worker process {k} failed to start: {answer}")
        return _Forked(int(answer[4:])), parent

    def close(self) -> None:
        """Closes its socket: it ends once its workers have."""
        self._sock.close()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Forked:
    """A worker forked by the fork server, as much of ``multiprocessing.Process`` as the pool
    uses: it is not this process's child, so it is watched through a pidfd and how it ended
    read from ``/proc`` (the server reaps it seconds later)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: Optional[int] = os.pidfd_open(pid)
        self._code: Optional[int] = None

    def is_alive(self) -> bool:
        return not self.join(0)

    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits up to ``timeout`` seconds for it to end; whether it has."""
        if self._fd is None:
            return True
        ended = bool(select.select([self._fd], [], [], timeout)[0])
        if ended and self._code is None:
            self._code = _exit_code(self.pid)
        return ended

    @property
    def exitcode(self) -> Optional[int]:
        if self._code is None and self.join(0):
            self._code = _exit_code(self.pid)
        return self._code

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self._fd is not None:
            try:
                signal.pidfd_send_signal(self._fd, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


def _exit_code(pid: int) -> Optional[int]:
    """How an ended (not yet reaped) process ended, in ``Process.exitcode``'s terms."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        status = int(fields[49])  # field 52, the exit code as waitpid reports it
    except (OSError, ValueError, IndexError):
        return None
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def _fork_server(fd: int) -> None:
    """The fork server's life: prepare as a spawned process does, load the dataset, then fork
    a worker for each request until this process's parent closes the socket; wait for the
    workers to end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    try:
        blob, _ = _recv(sock)
    except EOFError:
        return
    from multiprocessing import process, spawn

    try:
        process.current_process()._inheriting = True  # type: ignore[attr-defined]
        try:
            prep, inner = pickle.loads(blob)
            process.current_process().authkey = prep.pop("authkey")
            spawn.prepare(prep)
            args, preload = pickle.loads(inner)
            _, payload, worker_init_fn, collate_fn, seed = args
            loaded = pickle.loads(payload)
        finally:
            del process.current_process()._inheriting  # type: ignore[attr-defined]
        # What a sample's reading imported in the parent (PIL, where __getitem__ imports it):
        # imported once here, shared by the workers. Those that fail are the workers' affair.
        import importlib

        for name in preload:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except Exception:
                    pass
    except BaseException as e:
        import traceback

        _send(sock, "".join(traceback.format_exception(type(e), e, e.__traceback__)).encode())
        return
    del blob, payload
    import gc

    # What is loaded now stays where it is: the workers' collections do not write to (and so
    # copy) the pages they share with this process.
    gc.collect()
    gc.freeze()
    _send(sock, b"ready")
    workers: Dict[int, Optional[float]] = {}  # pid: when it was first seen ended
    while True:
        if select.select([sock], [], [], 1.0)[0]:
            try:
                data, child = _recv(sock)
            except (EOFError, OSError):
                break
            if child is None:
                continue
            index = int(data)
            threads = len(os.listdir("/proc/self/task"))
            if threads > 1:
                os.close(child)
                _send(sock, f"threads {threads - 1} besides its own".encode())
                continue
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    sock.close()
                    _serve(socket.socket(fileno=child), index, loaded, worker_init_fn,
                           collate_fn, seed)
                    code = 0
                except BaseException:
                    import traceback

                    traceback.print_exc()
                finally:
                    try:
                        sys.stdout.flush()
                        sys.stderr.flush()
                    finally:
                        os._exit(code)
            os.close(child)
            workers[pid] = None
            _send(sock, f"pid {pid}".encode())
        _reap(workers, time.monotonic())
    sock.close()
    for pid in workers:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _reap(workers: Dict[int, Optional[float]], now: float) -> None:
    """Reaps the workers that ended at least ``_REAP_AFTER_S`` ago."""
    for pid, since in list(workers.items()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "Z"
        if state not in ("Z", "X"):
            continue
        if since is None:
            workers[pid] = now
        elif now - since >= _REAP_AFTER_S:
            os.waitpid(pid, 0)
            del workers[pid]
