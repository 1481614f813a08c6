"""pin_memory=True: page-locked buffers where CUDA is present; elsewhere one warning and
ordinary memory. (The GPU side is checked by benchsuite/gpu_pinned_check.py on a CUDA host.)"""

import os
import sys
import types

import numpy as np
import pytest

import chute
from chute import _loader
from conftest import ids, run_python

pytestmark = pytest.mark.filterwarnings("ignore:chute. pin_memory=True:RuntimeWarning")


def cuda_pinned_available(source) -> bool:
    return chute.Loader(source, pin_memory=True).pinned


def test_without_cuda_it_warns_once_and_works(tokens100):
    if cuda_pinned_available(chute.tokens(tokens100, 15, dtype="uint32")):
        pytest.skip("a CUDA runtime pinned the buffers: nothing falls back on this machine")
    # A fresh process, so that "once per process" is what is measured.
    proc = run_python(
        """
        import sys, warnings
        import chute
        source = chute.tokens(sys.argv[1], seq_len=15, dtype="uint32")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaders = [chute.Loader(source, batch_size=10, pin_memory=True, num_workers=w)
                       for w in (0, 2)]
        assert len(caught) == 1, [str(w.message) for w in caught]
        w = caught[0]
        assert w.category is RuntimeWarning, w.category
        print(w.message)
        for loader in loaders:
            assert not loader.pinned and loader.pin_memory_fallback
            got = [int(i) for b in loader for i in b["tokens"][:, 0] // 16]
            assert got == list(range(100)), got
        plain = chute.Loader(source, batch_size=10)
        assert not plain.pinned and plain.pin_memory_fallback is None
        """,
        tokens100,
    )
    msg = proc.stdout.strip()
    assert msg.startswith("chute: pin_memory=True but ") and msg.endswith(": using ordinary memory")


def test_torch_cuda_runtime_is_found(tmp_path, monkeypatch):
    # A pip-installed torch ships libcudart in site-packages/nvidia/cuda_runtime/lib.
    lib = tmp_path / "site" / "nvidia" / "cuda_runtime" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.12").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")] + sys.path)
    monkeypatch.delenv("CHUTE_CUDART", raising=False)
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    _loader._find_torch_cudart()
    assert os.environ["CHUTE_CUDART"] == str(lib / "libcudart.so.12")
    # A value the user set wins.
    monkeypatch.setenv("CHUTE_CUDART", "/opt/cuda/libcudart.so")
    _loader._find_torch_cudart()
    assert os.environ["CHUTE_CUDART"] == "/opt/cuda/libcudart.so"


def test_without_torch_imported_nothing_is_looked_up(monkeypatch):
    monkeypatch.delenv("CHUTE_CUDART", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    _loader._find_torch_cudart()
    assert "CHUTE_CUDART" not in os.environ


def test_pinned_batches_are_ordinary_arrays(source100):
    loader = chute.Loader(source100, batch_size=10, pin_memory=True)
    batch = next(iter(loader))
    assert isinstance(batch["tokens"], np.ndarray) and ids(batch) == list(range(10))
