"""chute: a data loader for machine-learning training that keeps accelerators fed.

Batches are built by native threads into pooled, 64-byte-aligned buffers and handed to
Python without copies (numpy views, DLPack for torch and JAX), in an order that is a pure
function of (dataset, seed, epoch, rank, world size): identical for any number of workers,
resumable from a ``state_dict`` of a few integers, split exactly across ranks.

    import chute

    source = chute.dataset("train.bin", seq_len=1024)           # nanoGPT's uint16 tokens
    loader = chute.Loader(source, batch_size=16, shuffle=True, num_workers=4)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:                                     # one epoch
            tokens = batch["tokens"]                             # int64 [16, 1025] numpy view
    state = loader.state_dict()                                  # load_state_dict(state)

Public names: ``Loader``; ``dataset`` (any format: files, URLs, brace patterns, globs,
folders, a ``manifest.json``) and, with the format fixed, ``tokens``, ``webdataset``,
``tfrecord``, ``parquet`` and ``arrow`` (Arrow IPC files and streams, or a pyarrow table or
Polars frame in memory; every format may be read from URLs: ``s3://``, ``gs://``,
``az://``, ``http(s)://``); a Hugging Face ``datasets.Dataset`` passed to ``Loader`` is read
natively from its Arrow table; ``mix`` (weighted mixtures of any of these, with exact
proportions per batch and weight schedules); ``set_remote_options`` and ``io_stats`` for those;
``set_limits`` and ``limits`` (bounds on sizes read from the data: image pixels, record and
decoded bytes, Example features, tokenizer inputs, as PIL's ``MAX_IMAGE_PIXELS``);
``doctor`` (which stage binds, and how many workers keep a step fed; returns a ``Diagnosis``)
and ``serve_metrics`` (every loader's figures for Prometheus); ``Source``, ``Tensor`` and the
exceptions
``ChuteError``, ``ConfigError`` (a ``ValueError``), ``CorruptDataError``, ``StateError``;
for Hugging Face: ``Trainer`` (a ``transformers.Trainer`` taking ``train_loader=``, resuming
exactly; transformers is imported on first use), ``accelerate_prepare`` and ``hf_batch``.
"""

from typing import Any

from ._chute import (
    MegatronWriter,
    Source,
    Tensor,
    __version__,
    arrow,
    dataset,
    io_stats,
    limits,
    parquet,
    set_limits,
    set_remote_options,
    tfrecord,
    tokens,
    webdataset,
)
from ._errors import ChuteError, ConfigError, CorruptDataError, StateError
from ._frameworks import accelerate_prepare, hf_batch
from ._loader import Diagnosis, Loader, doctor, serve_metrics
from ._mix import mix

__all__ = [
    "ChuteError",
    "ConfigError",
    "CorruptDataError",
    "Diagnosis",
    "Loader",
    "MegatronWriter",
    "Source",
    "StateError",
    "Tensor",
    "__version__",
    "accelerate_prepare",
    "arrow",
    "dataset",
    "doctor",
    "hf_batch",
    "io_stats",
    "limits",
    "mix",
    "parquet",
    "serve_metrics",
    "set_limits",
    "set_remote_options",
    "tfrecord",
    "tokens",
    "webdataset",
]


def __getattr__(name: str) -> Any:
    # chute.Trainer subclasses transformers.Trainer, so it is made on first use: importing
    # chute must not import transformers (slow, and an optional dependency). For the same
    # reason it is not in __all__: `from chute import *` would import it.
    if name == "Trainer":
        from ._frameworks import trainer_class

        return trainer_class()
    raise AttributeError(f"module 'chute' has no attribute {name!r}")
