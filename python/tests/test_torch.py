"""PyTorch: zero-copy tensors, DataLoader/IterableDataset, the Stateful protocol."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch not installed: the PyPI wheel pulls ~3 GB of CUDA libraries; see README"
)

import chute  # noqa: E402
from conftest import WINDOW, epoch_ids, ids  # noqa: E402


def test_output_torch_shares_chute_memory(source100):
    loader = chute.Loader(source100, batch_size=4, output="torch")
    t = next(iter(loader))["tokens"]
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int64 and tuple(t.shape) == (4, WINDOW)
    assert t[1, 0].item() == WINDOW
    dl = next(iter(chute.Loader(source100, batch_size=4, output="dlpack")))["tokens"]
    assert torch.from_dlpack(dl).data_ptr() == dl.data_ptr
    arr = np.asarray(dl)
    assert torch.from_numpy(arr).data_ptr() == dl.data_ptr


def test_inside_torch_dataloader(source100):
    loader = chute.Loader(source100, batch_size=10, shuffle=True, seed=3, num_workers=2)
    expected = epoch_ids(chute.Loader(source100, batch_size=10, shuffle=True, seed=3))
    ds = loader.as_torch_dataset()
    assert isinstance(ds, torch.utils.data.IterableDataset) and len(ds) == 10
    got = [ids({"tokens": b["tokens"].numpy()}) for b in torch.utils.data.DataLoader(ds, batch_size=None)]
    assert got == expected
    assert all(isinstance(b["tokens"], torch.Tensor) for b in torch.utils.data.DataLoader(ds, batch_size=None))


def test_dataloader_with_one_worker_process(source100):
    loader = chute.Loader(source100, batch_size=10, num_workers=2)
    dl = torch.utils.data.DataLoader(
        loader.as_torch_dataset(), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    got = [ids({"tokens": b["tokens"].numpy()}) for b in dl]
    assert sum(got, []) == list(range(100))


def test_more_worker_processes_are_refused(source100):
    ds = chute.Loader(source100, batch_size=10).as_torch_dataset()
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(Exception, match="num_workers"):
        list(dl)


def test_stateful_protocol(source100):
    from torch.distributed.checkpoint.stateful import Stateful

    loader = chute.Loader(source100, batch_size=10, shuffle=True)
    assert isinstance(loader, Stateful)
    it = iter(loader)
    next(it)
    resumed = chute.Loader(source100, batch_size=10, shuffle=True)
    resumed.load_state_dict(loader.state_dict())
    assert epoch_ids(resumed) == [ids(b) for b in it]
