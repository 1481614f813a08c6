"""A chute.Loader inside Lightning's loops (the real package, CPU): every batch of every epoch
exactly once under each epoch, step and limit setting, validation sees the whole set every
time, mid-epoch checkpoints resume exactly, and DDP ranks read disjoint data."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import numpy as np
import pytest

import chute
from conftest import SEQ, clean_env, epoch_ids, write_tokens

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

N = 100  # samples; batches of 8: 13 per epoch, the last of 4


def make_loader(path: str, shuffle=True) -> chute.Loader:
    return chute.Loader(chute.tokens(path, seq_len=SEQ, dtype="uint32"), batch_size=8,
                        shuffle=shuffle, seed=7, num_workers=2, output="torch")


def reference(path: str, epochs: int, shuffle=True) -> List[List[List[int]]]:
    loader = make_loader(path, shuffle)
    return [epoch_ids(loader) for _ in range(epochs)]


class Model(L.LightningModule):
    """Records the sample ids of every training and validation batch, per epoch."""

    def __init__(self, train: chute.Loader, val: chute.Loader = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(SEQ + 1, 1)
        self.train_loader, self.val_loader = train, val
        self.trained: List[List[int]] = []  # one list of ids per training batch
        self.train_epochs: List[int] = []
        self.validations: List[List[int]] = []  # all ids of one validation run

    def batch_ids(self, batch) -> List[int]:
        return (batch["tokens"][:, 0] // (SEQ + 1)).tolist()

    def training_step(self, batch, i):
        self.trained.append(self.batch_ids(batch))
        self.train_epochs.append(self.current_epoch)
        return self.layer(batch["tokens"].float()).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)

    def train_dataloader(self):
        return self.train_loader


class WithVal(Model):
    """Also a validation loader (Lightning validates only where the hooks exist)."""

    def on_validation_epoch_start(self):
        self.validations.append([])

    def validation_step(self, batch, i):
        self.validations[-1] += self.batch_ids(batch)

    def val_dataloader(self):
        return self.val_loader


def trainer(tmp_path: Path, **kwargs) -> "L.Trainer":
    defaults = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False,
                    default_root_dir=str(tmp_path), num_sanity_val_steps=0)
    defaults.update(kwargs)
    return L.Trainer(**defaults)


@pytest.fixture
def data(tmp_path) -> str:
    return write_tokens(tmp_path / "train.bin", N)


def by_epoch(model: Model) -> List[List[List[int]]]:
    out: List[List[List[int]]] = []
    for e, ids in zip(model.train_epochs, model.trained):
        while len(out) <= e:
            out.append([])
        out[e].append(ids)
    return out


def test_max_epochs_trains_every_batch_of_every_epoch(tmp_path, data):
    model = Model(make_loader(data))
    trainer(tmp_path, max_epochs=4).fit(model)
    assert by_epoch(model) == reference(data, 4)


@pytest.mark.parametrize("limit", [5, 13, 0.5])
def test_limit_train_batches_takes_each_epochs_head(tmp_path, data, limit):
    model = Model(make_loader(data))
    trainer(tmp_path, max_epochs=3, limit_train_batches=limit).fit(model)
    k = {5: 5, 13: 13, 0.5: 6}[limit]
    assert by_epoch(model) == [epoch[:k] for epoch in reference(data, 3)]


def test_max_steps_runs_across_epochs(tmp_path, data):
    model = Model(make_loader(data))
    trainer(tmp_path, max_epochs=-1, max_steps=20).fit(model)
    ref = reference(data, 2)
    assert by_epoch(model) == [ref[0], ref[1][:7]]


@pytest.mark.parametrize("interval", [1.0, 0.5])
def test_validation_sees_the_whole_set_every_time(tmp_path, data, interval):
    val = make_loader(data, shuffle=False)
    model = WithVal(make_loader(data), val)
    trainer(tmp_path, max_epochs=3, num_sanity_val_steps=2, val_check_interval=interval).fit(model)
    runs = model.validations
    assert len(runs[0]) == 16, "the sanity check: two batches"
    assert len(runs) == 1 + 3 * round(1 / interval)
    for run in runs[1:]:
        assert run == list(range(N))


def test_limit_val_batches(tmp_path, data):
    model = WithVal(make_loader(data), make_loader(data, shuffle=False))
    trainer(tmp_path, max_epochs=2, limit_val_batches=3).fit(model)
    assert model.validations == [list(range(24))] * 2


class WithTest(Model):
    """A test loader: each trainer.test() run records the ids it saw."""

    def on_test_epoch_start(self):
        self.validations.append([])

    def test_step(self, batch, i):
        self.validations[-1] += self.batch_ids(batch)

    def test_dataloader(self):
        return self.val_loader


def test_test_dataloader_runs_whole_every_time(tmp_path, data):
    model = WithTest(make_loader(data), make_loader(data, shuffle=False))
    t = trainer(tmp_path)
    t.test(model, verbose=False)
    t.test(model, verbose=False)
    trainer(tmp_path, limit_test_batches=2).test(model, verbose=False)
    t.test(model, verbose=False)
    assert model.validations == [list(range(N))] * 2 + [list(range(16))] + [list(range(N))]


def test_mid_epoch_checkpoint_resumes_exactly(tmp_path, data):
    from lightning.pytorch.callbacks import ModelCheckpoint

    whole = Model(make_loader(data))
    trainer(tmp_path / "whole", max_epochs=3).fit(whole)

    ckpt_dir = tmp_path / "ckpt"
    first = Model(make_loader(data))
    every = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=5, save_top_k=-1)
    trainer(tmp_path / "first", max_epochs=3, max_steps=18, enable_checkpointing=True,
            callbacks=[every]).fit(first)
    assert first.trained == whole.trained[:18]
    ckpt = ckpt_dir / "epoch=1-step=15.ckpt"
    assert ckpt.exists(), sorted(p.name for p in ckpt_dir.iterdir())

    second = Model(make_loader(data))  # a new process would build it the same way
    trainer(tmp_path / "second", max_epochs=3).fit(second, ckpt_path=str(ckpt))
    assert second.trained == whole.trained[15:]


DDP_SCRIPT = """
import json, sys
import lightning as L
import torch
import chute

SEQ = 15
path, out = sys.argv[1], sys.argv[2]

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(SEQ + 1, 1)
        self.ids = []
    def train_dataloader(self):
        # Built here, where the process group exists (Lightning's launcher sets no RANK).
        self.loader = chute.Loader(chute.tokens(path, seq_len=SEQ, dtype="uint32"),
                                   batch_size=5, shuffle=True, seed=3, output="torch")
        return self.loader
    def training_step(self, batch, i):
        self.ids += (batch["tokens"][:, 0] // (SEQ + 1)).tolist()
        return self.layer(batch["tokens"].float()).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)

model = Model()
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    enable_checkpointing=False, num_sanity_val_steps=0)
trainer.fit(model)
with open(f"{out}.{trainer.global_rank}", "w") as f:
    json.dump({"ids": model.ids, "rank": model.loader.rank,
               "world_size": model.loader.world_size, "from": model.loader.rank_from}, f)
"""


def test_ddp_ranks_read_disjoint_data(tmp_path, data):
    script = tmp_path / "ddp_fit.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    out = tmp_path / "ids"
    proc = subprocess.run([sys.executable, str(script), data, str(out)], capture_output=True,
                          text=True, timeout=300, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    for r, got in enumerate(ranks):
        assert (got["rank"], got["world_size"], got["from"]) == (r, 2, "torch.distributed")
    per_epoch = N // 2
    for epoch in range(2):
        a = ranks[0]["ids"][epoch * per_epoch:(epoch + 1) * per_epoch]
        b = ranks[1]["ids"][epoch * per_epoch:(epoch + 1) * per_epoch]
        assert not set(a) & set(b), f"epoch {epoch}: the ranks share samples"
        assert sorted(a + b) == list(range(N))
    assert np.asarray(ranks[0]["ids"][:per_epoch]).tolist() != ranks[0]["ids"][per_epoch:]


def test_readme_lightning_example_runs(tmp_path, monkeypatch):
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Lightning, Hugging Face Trainer, accelerate"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    np.arange(20 * 1025, dtype=np.uint16).tofile("train.bin")  # 20 windows: 3 batches of 8
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["trainer"].global_step == 2 * 3
