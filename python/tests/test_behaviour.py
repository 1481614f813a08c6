"""What users rely on without thinking about it: Ctrl-C, the GIL, fork."""

import multiprocessing
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import chute
from conftest import SEQ, clean_env, epoch_ids, ids, run_python

SLOW_SCRIPT = """
import signal, sys, time
import chute

# A shell that starts the tests in the background hands its children SIGINT ignored, and
# Python then installs no handler of its own: restore the interactive default.
signal.signal(signal.SIGINT, signal.default_int_handler)

def slow(sample):
    time.sleep(0.2)  # 64 samples a batch: one batch takes 13 s
    return sample

source = chute.tokens(sys.argv[1], seq_len=15, dtype="uint32")
loader = chute.Loader(source, batch_size=64, num_workers=int(sys.argv[2]), transforms=[slow])
print("ready", flush=True)
next(iter(loader))
print("not interrupted", flush=True)
"""


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_ctrl_c_interrupts_a_blocked_next(tokens100, workers):
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SCRIPT, tokens100, str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.7)  # well inside next(), which needs 13 s for its batch
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert "not interrupted" not in out
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    assert "Fatal" not in err and "panicked" not in err, err
    # Not a speed test: 13 s would mean the batch was finished first.
    assert took < 5, f"the script took {took:.1f} s to end after Ctrl-C"


def test_gil_is_released_while_next_waits(source100):
    def slow(sample):
        time.sleep(0.01)
        return sample

    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    loader = chute.Loader(source100, batch_size=25, num_workers=1, transforms=[slow])
    th = threading.Thread(target=ticker)
    th.start()
    try:
        before = len(ticks)
        batch = next(iter(loader))  # ~0.25 s of transforms on the worker thread
        during = len(ticks) - before
    finally:
        stop.set()
        th.join()
    assert ids(batch) == list(range(25))
    assert during > 10, "another Python thread ran while next() waited"


def child_iterates(shards, inherited, queue):
    try:
        # The loader inherited from the parent: its threads did not survive the fork.
        rest = [ids(b) for b in inherited]
        # A loader made in the child.
        own = chute.Loader(chute.tokens(shards, SEQ, dtype="uint32"), batch_size=9,
                           shuffle=True, seed=2, num_workers=2)
        queue.put((rest, epoch_ids(own)))
    except BaseException as e:  # report, never hang the parent
        queue.put(repr(e))


def test_a_forked_child_runs_its_own_loaders(shards):
    source = chute.tokens(shards, SEQ, dtype="uint32")
    make = lambda: chute.Loader(source, batch_size=9, shuffle=True, seed=2, num_workers=2)  # noqa: E731
    expected = epoch_ids(make())
    parent = make()
    it = iter(parent)
    head = [ids(next(it)) for _ in range(3)]  # worker threads are running now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=child_iterates, args=(shards, parent, queue))
    child.start()
    result = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert not isinstance(result, str), result
    rest, own = result
    assert head + rest == expected, "the inherited loader continues where the parent stood"
    assert own == expected
    assert head + [ids(b) for b in it] == expected, "the parent is unaffected"


def test_exit_with_a_loader_mid_epoch_is_clean(tokens100):
    # Threads busy in Python transforms at exit: the atexit hook stops them before the
    # interpreter finalizes (a thread taking the GIL during finalization would crash or hang).
    code = textwrap.dedent(
        """
        import sys, time
        import chute

        def slow(sample):
            time.sleep(0.05)
            return sample

        source = chute.tokens(sys.argv[1], seq_len=15, dtype="uint32")
        loader = chute.Loader(source, batch_size=4, num_workers=3, transforms=[slow])
        it = iter(loader)
        next(it)
        print("bye", flush=True)
        """
    )
    proc = run_python(code, tokens100, timeout=30)
    assert proc.stdout.strip() == "bye", proc.stderr
    assert proc.stderr == ""
