"""Process workers (``worker_mode="process"``): a map-style dataset whose ``__getitem__`` holds
the GIL, read by worker processes. The same batches as thread mode for datasets of several
shapes, worker counts, shuffles, ranks and a resume; ``collate_fn`` and ``worker_init_fn``
in the workers; exceptions raised as themselves (or skipped and counted); a killed worker, a
slow one and an unpicklable dataset as clear errors, with no hang; no process and nothing in
``/dev/shm`` left behind."""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import chute

from conftest import clean_env


def busy(i: int) -> int:
    """Pure Python work (the GIL held): what the process mode is for."""
    x = 0
    for k in range(300):
        x += (k * i) % 7
    return x


class Dicts:
    """Nested dicts and tuples of arrays, numbers, strings, bytes and None."""

    def __init__(self, n: int, fail_at: int = -1) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise KeyError(f"sample {i} is missing")
        return {
            "x": np.arange(12, dtype=np.float32).reshape(3, 4) * i,
            "meta": {"i": i, "w": busy(i) / 7.0, "ok": i % 2 == 0},
            "pair": (np.int16(i), np.array([i, -i], dtype=np.int64)),
            "name": f"item-{i}",
            "raw": bytes([i % 256]) * (i % 5),
            "none": None,
        }


class Tokens:
    """Variable-length token lists (padded by the loader with pad=True)."""

    def __len__(self) -> int:
        return 97

    def __getitem__(self, i: int):
        busy(i)
        return {"ids": np.arange(i % 13 + 1, dtype=np.int32)}


class Tensors:
    """torch tensors and a tuple, as a torchvision-style dataset returns them."""

    def __len__(self) -> int:
        return 50

    def __getitem__(self, i: int):
        import torch

        busy(i)
        return torch.full((2, 3), float(i)), i % 10


class Pids:
    """Each sample says which process read it, and what worker_init_fn set there."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        return {"pid": os.getpid(), "init": INIT.get("worker", -1), "rand": random.random()}


INIT: dict = {}


def init_worker(worker_id: int) -> None:
    INIT["worker"] = worker_id


class Sleepy:
    """Waits without the GIL (as a read from storage does): threads scale."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        time.sleep(0.01)
        return i


class Spin:
    """A fixed amount of pure Python (a few ms) a sample: the GIL serializes threads. (Work
    timed by the clock instead would scale on threads: each thread's wait would overlap.)"""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        x = 0
        for k in range(40_000):
            x = (x * 31 + k + i) % 1_000_003
        return i


class Slow:
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        if i == 3:
            time.sleep(60)
        return i


class Unpicklable:
    def __init__(self) -> None:
        self.lock = __import__("threading").Lock()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return i


def epochs(dataset, mode: str, epochs: int = 2, ready: bool = False, **kw):
    """Every batch of `epochs` epochs, as plain Python values (with `ready`, once the worker
    processes are ready, so that they read every batch)."""
    out = []
    with chute.Loader(dataset, worker_mode=mode, **kw) as loader:
        if ready:
            started(loader, kw["num_workers"])
        for e in range(epochs):
            loader.set_epoch(e)
            for b in loader:
                out.append(plain(b))
    return out


def plain(v):
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if hasattr(v, "numpy"):
        v = v.numpy()
    if isinstance(v, np.ndarray):
        return (str(v.dtype), v.shape, v.tolist())
    return v


def living(pids) -> set:
    """Those of ``pids`` still running (not ended, reaped or not)."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(pid)
        except OSError:
            pass
    return out


def children() -> set:
    """The pids of this process's live (not zombie) children, but multiprocessing's own."""
    me = str(os.getpid())
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z" and not infrastructure(pid):
            out.add(int(pid))
    return out


def infrastructure(pid: str) -> bool:
    """multiprocessing's own helpers (its resource tracker, the forkserver), which live as
    long as this process whatever the loaders do."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"resource_tracker" in cmd or b"forkserver" in cmd


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_same_batches_as_threads(workers):
    kw = dict(batch_size=8, shuffle=True, seed=4, num_workers=workers)
    assert epochs(Dicts(61), "process", **kw) == epochs(Dicts(61), "thread", **kw)


def test_the_same_batches_for_ranks_padding_and_tensors():
    for rank in range(2):
        kw = dict(batch_size=5, shuffle=True, seed=2, num_workers=2, rank=rank, world_size=2,
                  drop_last=True)
        assert epochs(Dicts(33), "process", **kw) == epochs(Dicts(33), "thread", **kw)
    kw = dict(batch_size=6, shuffle="global", seed=1, num_workers=2, pad=True)
    assert epochs(Tokens(), "process", **kw) == epochs(Tokens(), "thread", **kw)
    pytest.importorskip("torch")
    kw = dict(batch_size=7, num_workers=2, output="torch")
    got = epochs(Tensors(), "process", **kw)
    assert got == epochs(Tensors(), "thread", **kw)
    assert got[0][0][0] == "float32" and got[0][0][1] == (7, 2, 3)


def test_a_resume_continues_with_the_same_batches():
    kw = dict(batch_size=4, shuffle=True, seed=9, num_workers=2)
    whole = epochs(Dicts(40), "thread", epochs=1, **kw)
    with chute.Loader(Dicts(40), worker_mode="process", **kw) as loader:
        it = iter(loader)
        head = [plain(next(it)) for _ in range(3)]
        state = loader.state_dict()
    with chute.Loader(Dicts(40), worker_mode="process", **kw) as loader:
        loader.load_state_dict(state)
        rest = [plain(b) for b in loader]
    assert head + rest == whole


def jitter(sample, rng):
    """A Python transform drawing from the sample's RNG."""
    sample["x"] = sample["x"] + rng.normal(size=sample["x"].shape).astype(np.float32)
    sample["pid"] = np.int64(os.getpid())
    return sample


def test_python_transforms_run_in_the_workers_with_the_same_randomness():
    kw = dict(batch_size=8, shuffle=True, seed=3, num_workers=2, transforms=[jitter])
    got = epochs(Dicts(30), "process", ready=True, **kw)
    want = epochs(Dicts(30), "thread", **kw)
    pids = {p for b in got for p in b["pid"][2]}
    assert os.getpid() not in pids and len(pids) == 2
    for b in got + want:
        del b["pid"]
    assert got == want
    assert got != epochs(Dicts(30), "thread", **dict(kw, seed=4))
    with pytest.raises(chute.ConfigError, match="must pickle"):
        chute.Loader(Dicts(4), num_workers=1, worker_mode="process",
                     transforms=[lambda s: s])


def collate_pairs(samples):
    return {"n": len(samples), "first": samples[0]["meta"]["i"], "pid": os.getpid()}


def test_collate_fn_and_worker_init_fn_run_in_the_workers():
    with chute.Loader(Dicts(20), batch_size=6, num_workers=2, worker_mode="process",
                      collate_fn=collate_pairs) as loader:
        started(loader)
        got = list(loader)
    assert [b["n"] for b in got] == [6, 6, 6, 2]
    assert [b["first"] for b in got] == [0, 6, 12, 18]
    assert os.getpid() not in {b["pid"] for b in got}
    with chute.Loader(Pids(), batch_size=4, num_workers=2, worker_mode="process",
                      worker_init_fn=init_worker, seed=5) as loader:
        samples = [s for b in loader for s in zip(b["pid"].tolist(), b["init"].tolist())]
        pids = {p for p, _ in samples}
        assert os.getpid() not in pids and len(pids) <= 2
        assert {w for _, w in samples} <= {0, 1}
        assert all(w >= 0 for _, w in samples)


def test_an_exception_is_raised_as_itself_or_skipped_and_counted():
    with chute.Loader(Dicts(30, fail_at=13), batch_size=4, num_workers=2,
                      worker_mode="process") as loader:
        started(loader)
        with pytest.raises(KeyError, match="sample 13 is missing") as info:
            list(loader)
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "worker process" in notes and "__getitem__" in notes, notes
    # Read here while the workers start: the same exception.
    with chute.Loader(Dicts(30, fail_at=1), batch_size=4, num_workers=2,
                      worker_mode="process") as loader:
        with pytest.raises(KeyError, match="sample 1 is missing"):
            list(loader)
    with chute.Loader(Dicts(30, fail_at=13), batch_size=4, num_workers=2,
                      worker_mode="process", on_error="skip") as loader:
        n = sum(len(b["name"]) for b in loader)
        assert n == 30 and loader.stats()["skipped"] == 1


def started(loader, n: int = 2) -> None:
    """Waits until the loader's ``n`` worker processes are ready (they start in the
    background, and batches are read here meanwhile)."""
    deadline = time.monotonic() + 60
    while loader.stats()["source"]["ready_processes"] < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader.stats()["source"]["ready_processes"] == n


def test_a_killed_worker_is_a_clear_error_and_nothing_hangs():
    before = children()
    loader = chute.Loader(Dicts(4000), batch_size=8, num_workers=2, worker_mode="process")
    it = iter(loader)
    next(it)
    started(loader)
    victim = loader._workers.processes[1].pid
    os.kill(victim, signal.SIGKILL)
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"worker process 1 \(pid {victim}\) was killed by "
                                           r"signal 9"):
        for _ in it:
            pass
    assert time.monotonic() - t < 30
    loader.close()
    assert children() <= before


def test_under_skip_a_killed_worker_is_replaced_and_its_samples_skipped():
    before = children()
    loader = chute.Loader(Dicts(600), batch_size=8, num_workers=2, worker_mode="process",
                          on_error="skip")
    it = iter(loader)
    n = len(next(it)["name"])
    started(loader)
    victim = loader._workers.processes[0].pid
    os.kill(victim, signal.SIGKILL)
    for b in it:
        n += len(b["name"])
    stats = loader.stats()
    assert n == 600
    assert 1 <= stats["skipped"] <= 32, stats["skipped"]
    assert stats["source"]["restarts"] == 1
    assert victim not in {p.pid for p in loader._workers.processes}
    loader.close()
    assert children() <= before


def test_a_worker_over_timeout_is_an_error_and_close_ends_it():
    before = children()
    loader = chute.Loader(Slow(), batch_size=2, num_workers=1, worker_mode="process", timeout=2)
    started(loader, 1)
    t = time.monotonic()
    # Two clocks of timeout= run out together: next()'s (a TimeoutError) and the worker
    # request's (the worker process's error), whichever is first.
    with pytest.raises((TimeoutError, RuntimeError), match=r"timeout=2"):
        list(loader)
    # The worker process itself outlasts timeout=: the batch after is its error.
    with pytest.raises(RuntimeError, match=r"took more than timeout=2"):
        list(loader)
    assert time.monotonic() - t < 20
    loader.close()
    assert children() <= before


def test_auto_picks_processes_where_threads_do_not_scale():
    with chute.Loader(Spin(), batch_size=8, num_workers=2, worker_mode="auto") as loader:
        assert loader.worker_mode == "process", loader.stats()["worker_probe"]
        assert len([b for b in loader]) == 8
        probe = loader.stats()["worker_probe"]
        assert probe["thread_scaling"] < 1.8 and loader.stats()["worker_mode"] == "process"
    with chute.Loader(Sleepy(), batch_size=8, num_workers=2, worker_mode="auto") as loader:
        assert loader.worker_mode == "thread", loader.stats()["worker_probe"]
        assert loader.stats()["worker_probe"]["thread_scaling"] >= 1.8
    unpicklable = Unpicklable()
    with chute.Loader(unpicklable, num_workers=2, worker_mode="auto") as loader:
        assert loader.worker_mode == "thread"
    with chute.Loader(Dicts(4), num_workers=0, worker_mode="auto") as loader:
        assert loader.worker_mode == "thread" and "worker_probe" not in loader.stats()


def test_the_doctor_advises_processes_where_the_gil_binds():
    d = chute.doctor(Spin(), batch_size=8, num_workers=2, seconds=0.3, try_workers=[1, 2])
    assert "gil" in d.rules and d["worker_probe"]["thread_scaling"] < 1.8
    assert "[gil]" in str(d) and "worker_mode='process'" in str(d)
    d = chute.doctor(Sleepy(), batch_size=8, num_workers=2, seconds=0.3, try_workers=[1, 2])
    assert "gil" not in d.rules and d["worker_probe"]["thread_scaling"] >= 1.8


def test_refused_setups_say_what_to_do():
    with pytest.raises(chute.ConfigError, match="does not pickle"):
        chute.Loader(Unpicklable(), num_workers=1, worker_mode="process")
    with pytest.raises(chute.ConfigError, match="num_workers >= 1"):
        chute.Loader(Dicts(4), num_workers=0, worker_mode="process")
    with pytest.raises(chute.ConfigError, match="'spawn'"):
        chute.Loader(Dicts(4), num_workers=1, worker_mode="process",
                     multiprocessing_context="fork")
    with pytest.raises(chute.ConfigError, match="invalid worker_mode"):
        chute.Loader(Dicts(4), num_workers=1, worker_mode="processes")


def test_every_start_method_gives_the_same_batches():
    import multiprocessing

    kw = dict(batch_size=8, num_workers=2)
    want = epochs(Dicts(20), "thread", epochs=1, **kw)
    for context in ("spawn", "forkserver", multiprocessing.get_context("spawn")):
        assert epochs(Dicts(20), "process", epochs=1, multiprocessing_context=context, ready=True,
                      **kw) == want, context


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_workers_are_forks_of_the_fork_server_not_of_this_process():
    before = children()
    with chute.Loader(Dicts(400), batch_size=8, num_workers=2, worker_mode="process") as loader:
        started(loader)
        (server,) = children() - before
        assert loader._workers._server.popen.pid == server
        pids = [p.pid for p in loader._workers.processes]
        assert [parent_of(p) for p in pids] == [server, server]
        # The server holds no thread (a fork copies none) and runs BLAS on one.
        assert os.listdir(f"/proc/{server}/task") == [str(server)]
        with open(f"/proc/{pids[0]}/environ", "rb") as f:
            assert b"OPENBLAS_NUM_THREADS=1" in f.read().split(b"\0")
        assert sum(len(b["name"]) for b in loader) == 400
    assert children() <= before and not living(pids)
    # Spawned workers are this process's children.
    with chute.Loader(Dicts(40), batch_size=8, num_workers=1, worker_mode="process",
                      multiprocessing_context="spawn") as loader:
        started(loader, 1)
        assert parent_of(loader._workers.processes[0].pid) == os.getpid()


class Threaded(Dicts):
    """Starts a thread where it is unpickled (in the fork server, too)."""

    def __setstate__(self, state):
        import threading

        self.__dict__.update(state)
        self.stop = threading.Event()
        threading.Thread(target=self.stop.wait, args=(30,), daemon=True).start()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "stop"}


def test_a_fork_server_that_holds_threads_spawns_the_workers_instead():
    kw = dict(batch_size=8, num_workers=2)
    with pytest.warns(RuntimeWarning, match="holds threads .* spawned instead"):
        got = epochs(Threaded(20), "process", epochs=1, ready=True, **kw)
    assert got == epochs(Dicts(20), "thread", epochs=1, **kw)


def test_no_process_or_shared_memory_is_left_behind():
    """Each way a program leaves: a normal end, an exception, the loader never closed."""
    code = """
import sys, numpy as np, chute
sys.path.insert(0, {here!r})
from test_process_workers import Dicts, started
loader = chute.Loader(Dicts(500), batch_size=8, num_workers=2, worker_mode="process")
it = iter(loader)
next(it)
started(loader)
print(" ".join(str(p.pid) for p in loader._workers.processes), flush=True)
if sys.argv[1] == "raise":
    raise ValueError("the training step failed")
if sys.argv[1] == "interrupt":  # Ctrl-C while the loop waits for a batch
    import os, signal
    # As a terminal's Ctrl-C finds it (a shell that started the tests in the background
    # handed this process SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in it:
        pass
"""
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    here = os.path.dirname(os.path.abspath(__file__))
    for how in ("end", "raise", "interrupt"):
        r = subprocess.run([sys.executable, "-c", code.format(here=here), how],
                           capture_output=True, text=True, timeout=120, env=clean_env())
        want = {"end": (0,), "raise": (1,), "interrupt": (1, 130, -signal.SIGINT)}[how]
        assert r.returncode in want, (how, r.returncode, r.stderr)
        pids = [int(p) for p in r.stdout.split()]
        assert len(pids) == 2
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(os.path.exists(f"/proc/{p}") for p in pids), "worker processes left"
        if how == "raise":
            assert r.stderr.count("Traceback") == 1 and "the training step failed" in r.stderr
        elif how == "interrupt":
            assert "KeyboardInterrupt" in r.stderr and r.stderr.count("Traceback") == 1, r.stderr
        else:
            assert r.stderr == "", r.stderr
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) <= shm_before


def test_a_loader_dropped_without_close_ends_its_workers():
    import gc

    loader = chute.Loader(Dicts(500), batch_size=8, num_workers=2, worker_mode="process",
                          on_error="skip")
    before = children()
    next(iter(loader))
    started(loader)
    pids = [p.pid for p in loader._workers.processes]
    del loader
    gc.collect()
    deadline = time.monotonic() + 15
    while (living(pids) or children() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not living(pids), "the workers of a dropped loader are still running"
    assert not children() - before, "the fork server of a dropped loader is still running"


def test_a_killed_parent_takes_its_workers_with_it():
    code = """
import sys, time, chute
sys.path.insert(0, {here!r})
from test_process_workers import Dicts, started
loader = chute.Loader(Dicts(10**6), batch_size=8, num_workers=2, worker_mode="process")
it = iter(loader)
next(it)
started(loader)
print(" ".join(str(p.pid) for p in loader._workers.processes), flush=True)
for _ in it:
    pass
"""
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen([sys.executable, "-c", code.format(here=here)], stdout=subprocess.PIPE,
                         text=True)
    pids = [int(x) for x in p.stdout.readline().split()]
    assert len(pids) == 2
    p.kill()
    p.wait(10)
    deadline = time.monotonic() + 15
    while any(os.path.exists(f"/proc/{q}") for q in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{q}") for q in pids), "workers outlived the parent"


class UnpicklableSpin(Spin):
    def __init__(self) -> None:
        self.lock = __import__("threading").Lock()


def make_spin():
    return UnpicklableSpin()


def make_unpicklable():
    """A dataset_factory: each worker process builds its own Unpicklable."""
    return Unpicklable()


def test_a_dataset_that_does_not_pickle_is_built_in_each_worker_by_its_factory():
    import functools

    with pytest.raises(chute.ConfigError, match="dataset_factory="):
        chute.Loader(Unpicklable(), num_workers=1, worker_mode="process")
    kw = dict(batch_size=2, num_workers=2)
    with chute.Loader(dataset_factory=make_unpicklable, worker_mode="process", **kw) as loader:
        got = [b.tolist() for b in loader]
    assert got == [[0, 1], [2, 3]]
    # A class with its arguments, through functools.partial; thread mode takes it too.
    factory = functools.partial(Dicts, 21)
    assert epochs(None, "process", dataset_factory=factory, **kw) == epochs(Dicts(21), "thread",
                                                                            **kw)
    assert epochs(None, "thread", dataset_factory=factory, **kw) == epochs(Dicts(21), "thread",
                                                                           **kw)
    with pytest.raises(chute.ConfigError, match="does not pickle"):
        chute.Loader(dataset_factory=lambda: Dicts(4), num_workers=1, worker_mode="process")
    # worker_mode="auto" may pick processes for a dataset that does not pickle but has a
    # factory that does.
    with chute.Loader(dataset_factory=make_spin, num_workers=2, worker_mode="auto") as loader:
        assert loader.worker_mode == "process", loader.stats()["worker_probe"]
    with pytest.raises(chute.ConfigError, match="not both"):
        chute.Loader(Dicts(4), dataset_factory=make_unpicklable)


def test_num_workers_auto_gives_the_same_batches_and_says_what_it_chose():
    kw = dict(batch_size=8, shuffle=True, seed=4)
    want = epochs(Dicts(61), "thread", num_workers=2, **kw)
    for mode in ("thread", "process"):
        assert epochs(Dicts(61), mode, num_workers="auto", **kw) == want, mode
    import chute._workers

    cores = chute._workers.budget()[0]
    with chute.Loader(Dicts(61), num_workers="auto", progress=False, **kw) as loader:
        list(loader)
        tuned = loader.stats()["autotune"]
        assert tuned["max_workers"] == cores and 1 <= tuned["workers"] <= cores
        assert loader.num_workers == tuned["workers"]
        assert tuned["memory_budget"] > 0 and tuned["max_prefetch"] >= 2
    with pytest.raises(chute.ConfigError, match="'auto'"):
        chute.Loader(Dicts(4), num_workers="many")


class Pace:
    """About 10 ms of pure Python a sample: with four samples a batch, one process builds
    25 batches a second."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int):
        end = time.perf_counter() + 0.01
        while time.perf_counter() < end:
            pass
        return i


def test_num_workers_auto_starts_worker_processes_as_the_consumer_needs_them(monkeypatch):
    import chute._workers

    # A budget of four cores (whatever this machine has): two processes at the start, and
    # two more once the consumer, which never stops for a step, keeps waiting.
    monkeypatch.setattr(chute._workers, "budget", lambda: (4, 1 << 30))
    before = children()
    loader = chute.Loader(Pace(), batch_size=4, num_workers="auto", worker_mode="process")
    started(loader, 2)
    assert len(loader._workers.processes) == 2
    expect = 0
    deadline = time.monotonic() + 20
    for b in loader:
        assert b.tolist() == list(range(expect, expect + 4))
        expect += 4
        if loader.stats()["source"]["worker_processes"] == 4 or time.monotonic() > deadline:
            break
    s = loader.stats()
    assert s["source"]["worker_processes"] == 4, s
    assert s["autotune"]["workers"] >= 3 and s["source"]["max_worker_processes"] == 4
    # The fourth is counted as it is asked for; its process follows within moments.
    deadline = time.monotonic() + 30
    while len(loader._workers.processes) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(loader._workers.processes) == 4
    loader.close()
    assert children() <= before


class Stream:
    """An iterable dataset (``__iter__`` only, plus ``__len__``) whose samples say which
    process read them; it raises at ``fail_at``, and sleeps per sample when ``slow``."""

    def __init__(self, n: int, fail_at: int = -1, slow: float = 0.0) -> None:
        self.n, self.fail_at, self.slow = n, fail_at, slow

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise KeyError(f"record {i} is missing")
            if self.slow:
                time.sleep(self.slow)
            yield {"x": np.full(3, busy(i), dtype=np.int64) + i, "name": f"r{i}",
                   "pid": os.getpid()}


class Resumable(Stream):
    """A stream that keeps its own position (``state_dict``/``load_state_dict``)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.start = 0

    def state_dict(self):
        return {"next": self.pos}

    def load_state_dict(self, state):
        self.start = state["next"]

    def __iter__(self):
        for i in range(self.start, self.n):
            self.pos = i + 1
            yield {"x": np.full(3, i, dtype=np.int64), "name": f"r{i}", "pid": os.getpid()}
        self.start = 0


def collate_names(samples):
    return {"n": len(samples), "first": samples[0]["name"], "pid": os.getpid()}


def without_pids(batches):
    pids = set()
    for b in batches:
        pids |= set(b.pop("pid")[2])
    return batches, pids


def test_an_iterable_dataset_is_read_in_one_worker_process_with_the_same_batches():
    for kw in (dict(batch_size=5), dict(batch_size=4, shuffle=True, seed=3, drop_last=True),
               dict(batch_size=3, rank=1, world_size=2)):
        got, pids = without_pids(epochs(Stream(41), "process", num_workers=2, **kw))
        want, mine = without_pids(epochs(Stream(41), "thread", num_workers=2, **kw))
        assert got == want, kw
        assert os.getpid() not in pids and len(pids) == 2  # one process each pass
        assert mine == {os.getpid()}
    with chute.Loader(Stream(10), batch_size=4, num_workers=1, worker_mode="process",
                      collate_fn=collate_names) as loader:
        got = list(loader)
    assert [(b["n"], b["first"]) for b in got] == [(4, "r0"), (4, "r4"), (2, "r8")]
    assert os.getpid() not in {b["pid"] for b in got}


def test_an_iterable_in_a_process_resumes_and_fails_as_itself():
    kw = dict(batch_size=4, num_workers=1)
    for make in (lambda: Stream(30), lambda: Resumable(30)):
        whole, _ = without_pids(epochs(make(), "thread", epochs=1, **kw))
        with chute.Loader(make(), worker_mode="process", **kw) as loader:
            it = iter(loader)
            head = [plain(next(it)) for _ in range(3)]
            state = loader.state_dict()
        with chute.Loader(make(), worker_mode="process", **kw) as loader:
            loader.load_state_dict(state)
            rest = [plain(b) for b in loader]
        got, _ = without_pids(head + rest)
        assert got == whole
    with chute.Loader(Stream(30, fail_at=9), worker_mode="process", **kw) as loader:
        with pytest.raises(KeyError, match="record 9 is missing") as info:
            list(loader)
    assert "iterable worker process" in "".join(getattr(info.value, "__notes__", []))


def test_a_killed_iterable_worker_is_a_clear_error_and_nothing_is_left():
    before = children()
    loader = chute.Loader(Stream(10_000, slow=0.002), batch_size=4, num_workers=1,
                          worker_mode="process")
    it = iter(loader)
    next(it)
    (victim,) = children() - before
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"iterable worker process \(pid {victim}\) ended"):
        for _ in it:
            pass
    # A pass left early ends its process too.
    it = iter(loader)
    next(it)
    assert len(children() - before) == 1
    del it
    loader.close()
    deadline = time.monotonic() + 10
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() <= before


class SlowToStart(Dicts):
    """Takes two seconds to arrive in a worker process (its unpickling sleeps there)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.parent = os.getpid()

    def __setstate__(self, state):
        self.__dict__.update(state)
        if os.getpid() != self.parent:
            time.sleep(2)


def failing_init(worker_id: int) -> None:
    raise OSError(f"worker {worker_id} cannot open its database")


def test_batches_are_read_here_while_the_workers_start_and_they_are_the_same():
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=2, transforms=[jitter])
    want = epochs(Dicts(40), "thread", epochs=1, **kw)
    with chute.Loader(SlowToStart(40), worker_mode="process", **kw) as loader:
        t = time.monotonic()
        first = plain(next(iter(loader)))
        assert time.monotonic() - t < 1.5, "the first batch waited for the workers"
        got = [first] + [plain(b) for b in loader]
        stats = loader.stats()["source"]
    assert stats["local_reads"] >= 1, stats
    for b in got + want:
        del b["pid"]
    assert got == want
    # With a worker_init_fn, which only the workers run, reads wait for them.
    with chute.Loader(SlowToStart(16), batch_size=4, num_workers=2, worker_mode="process",
                      worker_init_fn=init_worker) as loader:
        assert len(list(loader)) == 4
        assert loader.stats()["source"]["local_reads"] == 0


def test_a_worker_that_fails_to_start_is_the_next_batch_s_error():
    with chute.Loader(Dicts(16), batch_size=4, num_workers=2, worker_mode="process",
                      worker_init_fn=failing_init) as loader:
        with pytest.raises(RuntimeError, match=r"(?s)worker process [01] \(pid \d+\) failed to "
                                               r"start: .*cannot open its database"):
            next(iter(loader))


class LazyImport:
    """Imports a module in ``__getitem__`` and says whether it had been imported already."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        had = "plistlib" in sys.modules
        import plistlib  # noqa: F401

        return {"had": had, "pid": os.getpid()}


def test_the_fork_server_imports_what_reading_a_sample_imported_here():
    sys.modules.pop("plistlib", None)
    with chute.Loader(LazyImport(), batch_size=8, num_workers=2,
                      worker_mode="process") as loader:
        # The structure is read here, importing plistlib; the workers find it imported.
        assert "plistlib" in sys.modules
        started(loader)
        pids = {p.pid for p in loader._workers.processes}
        got = [(h, p) for b in loader for h, p in zip(b["had"].tolist(), b["pid"].tolist())]
    assert {p for _, p in got} == pids and all(h for h, _ in got), got


def test_worker_processes_start_with_the_first_batch_or_soon_after_the_loader():
    loader = chute.Loader(Dicts(400), batch_size=8, num_workers=2, worker_mode="process")
    assert not loader._workers.begun
    # Never iterated: they start anyway, half a second on.
    started(loader)
    loader.close()
    loader = chute.Loader(Dicts(400), batch_size=8, num_workers=2, worker_mode="process")
    it = iter(loader)
    next(it)
    assert loader._workers.begun
    started(loader)
    assert sum(len(b["name"]) for b in it) == 392
    loader.close()
