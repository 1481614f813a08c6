"""Processes that used chute exit with status 0, every time: plain Python processes ended at
every point a job ends (loaders alive mid-epoch, exhausted, closed, persistent, busy in Python
code, an iterable dataset's producer, a metrics endpoint, after Ctrl-C, after fork, with
torch.distributed), and torchrun jobs, each launched many times in a row. An abort at exit is
rare (it depends on what the threads are doing at that instant), so one launch proves
nothing: the launches are repeated, and any non-zero exit or any line of a C++ terminate, a
Rust panic or a fatal Python error fails the test."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env, torchrun, write_tokens

HERE = Path(__file__).resolve().parent

# What an abort or a crash at exit prints.
BAD = re.compile(r"terminate called|panicked|Fatal Python error|Segmentation fault|core dumped")

CASES = ["alive", "exhausted", "closed", "persistent", "python", "iterable", "metrics",
         "ctrl-c", "fork"]


def check(proc: subprocess.CompletedProcess, what: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{out[-4000:]}"
    bad = BAD.search(out)
    assert bad is None, f"{what}: {bad.group(0)!r} in its output\n{out[-4000:]}"


@pytest.mark.parametrize("case", CASES)
def test_a_process_exits_cleanly(tmp_path, case):
    data = write_tokens(tmp_path / "t.bin", 400)
    for launch in range(4):
        proc = subprocess.run([sys.executable, str(HERE / "exit_cases.py"), case, data],
                              capture_output=True, text=True, timeout=120, env=clean_env())
        check(proc, f"{case}, launch {launch}")
        assert proc.stdout.strip().endswith("done")


def test_a_process_with_torch_distributed_exits_cleanly(tmp_path):
    pytest.importorskip("torch")
    data = write_tokens(tmp_path / "t.bin", 400)
    for launch in range(4):
        proc = subprocess.run([sys.executable, str(HERE / "exit_cases.py"), "torch", data],
                              capture_output=True, text=True, timeout=120, env=clean_env())
        check(proc, f"torch, launch {launch}")


def test_torchrun_jobs_exit_cleanly_launch_after_launch(tmp_path):
    """The issue's job, 30 launches: DDP on chute token batches, the epoch run whole and with
    drop_last, the process group destroyed, main() returning normally (no os._exit)."""
    pytest.importorskip("torch")
    data = write_tokens(tmp_path / "t.bin", 101)
    for launch in range(30):
        world = 2 + launch % 2
        out = tmp_path / f"out{launch}.json"
        proc = torchrun("dist_train.py", "tokens", data, out, nproc=world, timeout=300,
                        check=False)
        check(proc, f"launch {launch} ({world} ranks)")
        assert out.exists()
