"""Shared fixtures: token files whose tokens are their own positions, so every batch says
which samples it holds (sample id = first token // (SEQ + 1))."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import chute

SEQ = 15  # tokens per sequence; a sample is SEQ + 1 = 16 tokens
WINDOW = SEQ + 1


def write_tokens(path: Path, n_samples: int, first: int = 0, dtype=np.uint32) -> str:
    """A token file of n_samples windows whose tokens are consecutive integers from first."""
    np.arange(first, first + n_samples * WINDOW, dtype=dtype).tofile(path)
    return str(path)


def ids(batch: Dict[str, object]) -> List[int]:
    """Global sample ids of a batch (token files written by write_tokens from 0)."""
    tokens = np.asarray(batch["tokens"])
    assert tokens.shape[1] == WINDOW
    assert (tokens[:, 1:] - tokens[:, :-1] == 1).all(), "a window is consecutive tokens"
    return (tokens[:, 0] // WINDOW).tolist()


def epoch_ids(loader) -> List[List[int]]:
    """The ids of every batch of one epoch."""
    return [ids(b) for b in loader]


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (the test's Python), failing on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


# What launchers set to tell a process its rank (torchrun, Lightning, SLURM).
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                 "SLURM_STEP_NUM_TASKS")


def clean_env() -> Dict[str, str]:
    env = dict(os.environ)
    for k in LAUNCHER_VARS + ("CHUTE_CUDART",):
        env.pop(k, None)
    return env


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch):
    """Tests choose their own rank; a CI runner's RANK/WORLD_SIZE must not leak in."""
    for k in LAUNCHER_VARS:
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def tokens100(tmp_path) -> str:
    """One token file of 100 samples."""
    return write_tokens(tmp_path / "train.bin", 100)


@pytest.fixture
def source100(tokens100) -> chute.Source:
    return chute.tokens(tokens100, seq_len=SEQ, dtype="uint32")


@pytest.fixture
def shards(tmp_path) -> List[str]:
    """Five shards of 20, 13, 30, 7 and 30 samples (100 in all), ids consecutive across them."""
    paths, first = [], 0
    for i, n in enumerate([20, 13, 30, 7, 30]):
        paths.append(write_tokens(tmp_path / f"shard-{i}.bin", n, first=first * WINDOW))
        first += n
    return paths
