"""What the tests share: token files whose tokens are their own positions, so every batch says
which samples it holds (sample id = first token // (SEQ + 1)); fresh interpreters; the
`chute` command; the test servers' addresses; the fault proxy (scripts/faultproxy.py); and
torchrun launching the training scripts of this folder (dist_*.py, which share
dist_common.py)."""

import os
import select
import shutil
import socket
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import pytest

import chute

SEQ = 15  # tokens per sequence; a sample is SEQ + 1 = 16 tokens
WINDOW = SEQ + 1

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository


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


def all_rows(loader) -> Dict[str, list]:
    """Every batch of ``loader``, its columns' rows joined: ``{name: [row, ...]}``."""
    out: Dict[str, list] = {}
    for batch in loader:
        for k, v in batch.items():
            out.setdefault(k, []).extend(list(v))
    return out


def run_python(code: str, *args: str, timeout: float = 120,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (the test's Python), failing on a non-zero exit.
    env: the process's environment (default: this one without launcher variables)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env() if env is None else env,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


# What launchers set to tell a process its rank (torchrun, Lightning, SLURM).
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                 "SLURM_STEP_NUM_TASKS")


def video_missing() -> Optional[str]:
    """Why this build of chute has no FFmpeg (the cargo feature `video`; None: it has):
    building a loader with decode_video is then a ConfigError naming the feature."""
    try:
        chute.Loader([{"v": b"not a video"}], batch_size=1,
                     transforms={"v": [{"op": "decode_video"}]})
    except chute.ConfigError as e:
        if "video" in str(e):
            return f"chute built without video: {e}"
        raise
    except chute.ChuteError:
        pass  # the op exists (a data error would come from reading, not from building)
    return None


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


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (for a server the test starts next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chute_bin() -> str:
    """The `chute` command: $CHUTE_BIN (scripts/test.sh points it at the debug build that
    `cargo test` made), else the repository's target folder, else one on PATH; the test skips
    without one."""
    env = os.environ.get("CHUTE_BIN")
    if env:
        assert Path(env).is_file(), f"CHUTE_BIN={env} does not exist"
        return env
    for build in ("debug", "release"):
        path = ROOT / "target" / build / "chute"
        if path.is_file():
            return str(path)
    path = shutil.which("chute")
    if path:
        return path
    pytest.skip("no chute binary: run `cargo build -p chute-cli` or set CHUTE_BIN")


# The test servers scripts/servers.sh starts (CHUTE_TEST_SERVERS=1 ./scripts/test.sh, as .ci/run
# does): nginx serving HTTP_DIR at HTTP_URL, and the fault proxy in front of it at PROXY_URL.
HTTP_DIR = os.environ.get("CHUTE_TEST_HTTP_DIR")
HTTP_URL = os.environ.get("CHUTE_TEST_HTTP_URL")
PROXY_URL = os.environ.get("CHUTE_TEST_PROXY_URL")


def needs_servers(*names: str):
    """A skip mark for tests that need the test servers: names are the CHUTE_TEST_ variables
    they read, without the prefix ("HTTP_DIR", "HTTP_URL", "PROXY_URL", "S3_ENDPOINT", ...)."""
    unset = [f"CHUTE_TEST_{n}" for n in names if not os.environ.get(f"CHUTE_TEST_{n}")]
    return pytest.mark.skipif(
        bool(unset), reason=f"no test servers ({', '.join(unset)} unset); "
        "run CHUTE_TEST_SERVERS=1 ./scripts/test.sh")


FAULTPROXY = ROOT / "scripts" / "faultproxy.py"


@contextmanager
def fault_proxy(upstream: str, *args: str, exec_prefix: Sequence[str] = (), host: str = "127.0.0.1",
                port: int = 0, log=None) -> Iterator[str]:
    """scripts/faultproxy.py in front of upstream (host:port), with its other arguments args
    ("--pattern", ..., "--delay-ms", ...), listening on host:port (port 0: a free one), run
    under exec_prefix (`ip netns exec NS`, for a network namespace) with its stderr to log.
    Yields its URL (http://127.0.0.1:PORT when it listens on every address) once it listens;
    stops it on exit."""
    cmd = [*exec_prefix, sys.executable, str(FAULTPROXY), "--host", host, "--listen", str(port),
           "--upstream", upstream, *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        # It prints "listening on PORT" once ready; nothing else on stdout.
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("listening on"), (
            f"the fault proxy did not start (exit {proc.poll()}): {line!r}; {' '.join(cmd)}")
        address = "127.0.0.1" if host == "0.0.0.0" else host
        yield f"http://{address}:{int(line.split()[-1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def torchrun_cmd(script: str, *args, nproc: int, restarts: Optional[int] = None) -> List[str]:
    """torchrun running this folder's script with args on nproc processes (CPU, gloo), its
    master on a free port of 127.0.0.1. With restarts (--max-restarts, 0 included), the c10d
    rendezvous instead of a static master address: restarted workers rendezvous anew (and
    dist_crash.py keys its process group by attempt in that store)."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if restarts is None:
        cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    else:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                f"--max-restarts={restarts}"]
    return [*cmd, f"--nproc_per_node={nproc}", str(HERE / script), *map(str, args)]


def torchrun(script: str, *args, nproc: int, restarts: Optional[int] = None,
             timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Runs torchrun_cmd(...) to its end, one thread per process (OMP_NUM_THREADS=1) and no
    launcher variable of this process; with check, fails the test on a non-zero exit."""
    env = clean_env()
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(torchrun_cmd(script, *args, nproc=nproc, restarts=restarts),
                          capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert proc.returncode == 0, (
            f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc
