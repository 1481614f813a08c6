"""Hugging Face ``Trainer`` and ``accelerate`` with a ``chute.Loader``.

Both frameworks assume a ``torch.utils.data.DataLoader`` whose position is a count of
batches, skipped on resume by iterating them again (accelerate's ``skip_first_batches``).
A chute loader knows its position (``state_dict()``: a few integers), so here the position
is saved beside each checkpoint, one JSON file per process (``chute_loader_rank{R}.json``),
and restored before the first batch is read: no batch is replayed or skipped.

- ``chute.Trainer``: ``transformers.Trainer`` taking ``train_loader=`` / ``eval_loader=``.
- ``chute.accelerate_prepare(accelerator, loader)``: what ``Accelerator.prepare`` does for a
  ``DataLoader`` (batches on the accelerator's device, the end of an epoch known to gradient
  accumulation) and ``save_state`` / ``load_state`` carrying the position.
- ``chute.hf_batch(batch)``: a chute token batch under the names Hugging Face models take.

Nothing here imports torch, transformers or accelerate until it is used, so ``import chute``
stays cheap and works without them.
"""

from __future__ import annotations

import functools
import glob
import importlib
import json
import os
import re
import sys
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Union

import numpy

from ._batch_format import BatchFormat, format_function, hf_batch
from ._errors import ConfigError, StateError
from ._loader import Loader

__all__ = [
    "STATE_FILE",
    "LoaderBatches",
    "accelerate_prepare",
    "hf_batch",
    "load_loader_state",
    "save_loader_state",
    "trainer_class",
]

STATE_FILE = "chute_loader_rank{rank}.json"
"""The file, in a checkpoint folder, that holds process ``rank``'s loader state."""

# Batches as torch wants them ---------------------------------------------------------------


def _to_torch(obj: Any) -> Any:
    """Arrays in a batch as torch tensors, sharing their memory (chute's buffers stay alive
    while a tensor views them); strings, bytes and other leaves as they are."""
    torch = sys.modules["torch"]
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, numpy.ndarray):
        return torch.from_numpy(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):  # chute.Tensor
        return torch.from_dlpack(obj)
    if isinstance(obj, Mapping):
        return {k: _to_torch(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_to_torch(v) for v in obj))
    if isinstance(obj, (list, tuple)) and obj and not isinstance(obj[0], (str, bytes)):
        return type(obj)(_to_torch(v) for v in obj)
    return obj


def _to_device(obj: Any, device: Any, non_blocking: bool) -> Any:
    torch = sys.modules["torch"]
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        return {k: _to_device(v, device, non_blocking) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_device(v, device, non_blocking) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device, non_blocking) for v in obj)
    return obj


class LoaderBatches:
    """A ``chute.Loader`` as the training loops of transformers and accelerate take a
    ``DataLoader``: each batch through ``batch_format`` (see ``chute.Trainer``), as torch
    tensors (zero-copy), on ``device`` when one is given. ``len()``, ``set_epoch()``,
    ``epoch``, ``batch_size``, ``state_dict()`` and ``load_state_dict()`` are the loader's;
    ``loader`` is the loader itself.

    With ``restart=True`` (evaluation), every pass starts where the loader stood when this
    was made, so each evaluation reads the same batches."""

    def __init__(
        self,
        loader: Loader,
        batch_format: BatchFormat = "auto",
        *,
        device: Any = None,
        non_blocking: bool = False,
        restart: bool = False,
    ) -> None:
        _check_loader(loader, "loader")
        self.loader = loader
        self.batch_format = batch_format
        self._format = format_function(batch_format)
        self.device = device
        self.non_blocking = non_blocking
        self._start = loader.state_dict() if restart else None

    def __iter__(self) -> Iterator[Any]:
        if self._start is not None:
            self.loader.load_state_dict(self._start)
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        import torch  # type: ignore[import-not-found, unused-ignore]  # noqa: F401

        for batch in self.loader:
            batch = _to_torch(self._format(batch))
            if self.device is not None:
                batch = _to_device(batch, self.device, self.non_blocking)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def batch_size(self) -> int:
        return self.loader.batch_size

    @property
    def epoch(self) -> int:
        return self.loader.epoch

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> Dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"LoaderBatches({self.loader!r}, batch_format={self.batch_format!r})"


def _check_loader(loader: Any, what: str) -> None:
    if not isinstance(loader, Loader):
        raise TypeError(
            f"{what} must be a chute.Loader, got {type(loader).__name__}; for a dataset, "
            "wrap it: chute.Loader(dataset, batch_size=...)"
        )


# Checkpoint files ---------------------------------------------------------------------------


def save_loader_state(loader: Loader, folder: str, rank: int) -> str:
    """Writes ``loader.state_dict()`` as JSON to ``folder/chute_loader_rank{rank}.json``
    (through a temporary file and a rename, so a crash leaves no half-written state) and
    returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, STATE_FILE.format(rank=rank))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(loader.state_dict(), f)
    os.replace(tmp, path)
    return path


def load_loader_state(loader: Loader, folder: str, rank: int) -> str:
    """Restores ``loader`` from the state ``save_loader_state`` wrote for ``rank`` in
    ``folder`` and returns the file read. A process with no file of its own (a job resumed
    on more processes than saved it) reads rank 0's: chute's engine states are the same on
    every rank and resume on any world size. No state at all is a ``StateError``."""
    path = os.path.join(folder, STATE_FILE.format(rank=rank))
    if not os.path.isfile(path):
        found = sorted(
            glob.glob(os.path.join(glob.escape(folder), STATE_FILE.format(rank="*"))),
            key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0),
        )
        if not found:
            raise StateError(
                f"{folder} holds no chute loader state ({STATE_FILE.format(rank='*')}): it "
                "was saved without chute.Trainer or chute.accelerate_prepare, or with "
                "save_only_model=True; to start the interrupted epoch from its beginning "
                "instead, pass ignore_data_skip=True (Trainer)"
            )
        path = found[0]
    with open(path) as f:
        text = f.read()
    loader.load_state_dict(text)
    return path


# transformers.Trainer ------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def trainer_class() -> type:
    """``chute.Trainer``, made on first use (it subclasses ``transformers.Trainer``)."""
    try:
        import transformers  # type: ignore[import-not-found, unused-ignore]
        from transformers import trainer_utils  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        raise ImportError("chute.Trainer needs transformers (pip install transformers)") from e

    # An Any-typed base: the type check is the same with transformers installed or not.
    base: Any = transformers.Trainer
    get_last_checkpoint: Any = trainer_utils.get_last_checkpoint

    class Trainer(base):  # type: ignore[misc]
        """``transformers.Trainer`` fed by chute loaders, resuming exactly.

        ``Trainer(model, args, train_loader=loader, eval_loader=None,
        batch_format="auto", **trainer_kwargs)``: every other argument is
        ``transformers.Trainer``'s (``train_dataset``, ``eval_dataset`` and
        ``data_collator`` are replaced by the loaders and ``batch_format``).

        - Training reads ``train_loader``: its ``batch_size`` is the per-device batch
          (``per_device_train_batch_size`` is not used), its ``rank`` / ``world_size`` must
          be this process's (``torchrun`` / ``accelerate launch`` set them for both).
        - Each checkpoint holds the loader's position, ``chute_loader_rank{R}.json`` per
          process, written where the Trainer writes its RNG state (so not with
          ``save_only_model=True``, which cannot resume anyway).
        - ``train(resume_from_checkpoint=...)`` restores that position before the first
          batch, and the Trainer's own skipping of the epoch's first batches (accelerate's
          ``skip_first_batches``) does nothing: no batch is read twice or lost. With
          ``ignore_data_skip=True`` the position is not restored and the interrupted epoch
          starts again from its beginning, as Trainer does. A checkpoint whose position does
          not match the Trainer's step (another batch size, gradient accumulation or world
          size) is a ``chute.StateError``.
        - ``eval_loader``: a loader, or a dict of name -> loader (metrics prefixed by the
          name, as ``eval_dataset`` dicts); every evaluation reads it from where it stood
          when the Trainer was made. ``evaluate(loader)`` and ``predict(loader)`` take
          loaders too.
        - ``batch_format``: ``"auto"`` (default: a batch with a ``tokens`` column goes
          through ``chute.hf_batch``, giving ``input_ids``, ``labels`` and
          ``attention_mask`` or ``position_ids``; other batches as they are), ``"hf"``
          (always ``hf_batch``), ``None`` (as they are) or a function of the batch.
          Arrays become torch tensors without a copy; the Trainer moves them to its device.
        """

        def __init__(
            self,
            model: Any = None,
            args: Any = None,
            *,
            train_loader: Optional[Loader] = None,
            eval_loader: Union[Loader, Mapping[str, Loader], None] = None,
            batch_format: BatchFormat = "auto",
            **kwargs: Any,
        ) -> None:
            format_function(batch_format)  # a bad value fails here, not at the first batch
            if train_loader is not None:
                _check_loader(train_loader, "train_loader")
                if kwargs.get("train_dataset") is not None:
                    raise ConfigError(
                        "invalid train_dataset: give train_loader or train_dataset, not both"
                    )
            evals: Dict[str, Loader] = {}
            if eval_loader is not None:
                if kwargs.get("eval_dataset") is not None:
                    raise ConfigError(
                        "invalid eval_dataset: give eval_loader or eval_dataset, not both"
                    )
                if isinstance(eval_loader, Mapping):
                    for name, loader in eval_loader.items():
                        _check_loader(loader, f"eval_loader[{name!r}]")
                    evals = dict(eval_loader)
                else:
                    _check_loader(eval_loader, "eval_loader")
                # Trainer checks that eval_strategy has something to evaluate.
                kwargs["eval_dataset"] = evals if isinstance(eval_loader, Mapping) else eval_loader
            if kwargs.get("data_collator") is not None and train_loader is not None:
                raise ConfigError(
                    "invalid data_collator: chute loaders collate their own batches; turn "
                    "them into model inputs with batch_format= (a function of the batch)"
                )
            super().__init__(model, args, **kwargs)
            if train_loader is not None and self.args.auto_find_batch_size:
                raise ConfigError(
                    "invalid auto_find_batch_size: it changes the DataLoader's batch size, and "
                    "the batch size here is the chute loader's (batch_size=)"
                )
            self.batch_format = batch_format
            self.train_loader = train_loader
            self._train_batches = (
                LoaderBatches(train_loader, batch_format) if train_loader is not None else None
            )
            if train_loader is not None:
                self._check_rank(train_loader)
                # Logged batch sizes and sample counts are the loader's.
                self._train_batch_size = train_loader.batch_size
            # Each evaluation starts where the eval loader stands now.
            self._eval_batches = {
                id(loader): LoaderBatches(loader, batch_format, restart=True)
                for loader in ([eval_loader] if isinstance(eval_loader, Loader) else evals.values())
            }

        def _check_rank(self, loader: Loader) -> None:
            """The loader must read this process's share. Under tensor, context or sequence
            parallelism the loader takes the data-parallel rank, which is not checked."""
            try:
                parallel = self.get_tp_size() * self.get_cp_size() * self.get_sp_size()
            except Exception:  # an attribute a future transformers renames: no check
                return
            world, rank = int(self.args.world_size), int(self.args.process_index)
            if parallel == 1 and (loader.world_size, loader.rank) != (world, rank):
                raise ConfigError(
                    f"invalid train_loader: it reads rank {loader.rank} of {loader.world_size} "
                    f"but this process is rank {rank} of {world}; build the loader after the "
                    "process group is set up, or pass rank= and world_size="
                )

        # Data ------------------------------------------------------------------------------

        def get_train_dataloader(self) -> Any:
            if self._train_batches is None:
                return super().get_train_dataloader()
            return self._train_batches

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            chosen = eval_dataset
            if chosen is None:
                chosen = self.eval_dataset
            elif isinstance(chosen, str) and isinstance(self.eval_dataset, Mapping):
                chosen = self.eval_dataset[chosen]
            if isinstance(chosen, Loader):
                return self._eval_batches_of(chosen)
            return super().get_eval_dataloader(eval_dataset)

        def get_test_dataloader(self, test_dataset: Any) -> Any:
            if isinstance(test_dataset, Loader):
                return self._eval_batches_of(test_dataset)
            return super().get_test_dataloader(test_dataset)

        def _eval_batches_of(self, loader: Loader) -> LoaderBatches:
            if id(loader) not in self._eval_batches:
                self._eval_batches[id(loader)] = LoaderBatches(
                    loader, self.batch_format, restart=True
                )
            return self._eval_batches[id(loader)]

        def num_examples(self, dataloader: Any) -> int:
            if isinstance(dataloader, LoaderBatches):
                loader = dataloader.loader
                return len(loader) * loader.batch_size * loader.world_size
            return int(super().num_examples(dataloader))

        # Resuming --------------------------------------------------------------------------

        def train(
            self,
            resume_from_checkpoint: Union[str, bool, None] = None,
            trial: Any = None,
            ignore_keys_for_eval: Any = None,
        ) -> Any:
            """``transformers.Trainer.train``, with the train loader's position restored
            from ``resume_from_checkpoint`` before the first batch is read."""
            if resume_from_checkpoint is True:
                resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
                if resume_from_checkpoint is None:
                    raise ValueError(
                        f"invalid resume_from_checkpoint: True, but output_dir "
                        f"{self.args.output_dir!r} holds no checkpoint-N folder"
                    )
            if resume_from_checkpoint is False:
                resume_from_checkpoint = None
            if (
                resume_from_checkpoint is not None
                and self.train_loader is not None
                and not self.args.ignore_data_skip
            ):
                load_loader_state(
                    self.train_loader, str(resume_from_checkpoint), int(self.args.process_index)
                )
            return super().train(
                resume_from_checkpoint=resume_from_checkpoint,
                trial=trial,
                ignore_keys_for_eval=ignore_keys_for_eval,
            )

        def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
            """The loader already stands after the checkpoint's last batch (``train``
            restored it): nothing to skip. Checks that its position is the Trainer's."""
            if not isinstance(dataloader, LoaderBatches):
                return super().get_resumed_dataloader(dataloader, num_batches)
            loader = dataloader.loader
            accumulation = max(int(self.args.gradient_accumulation_steps), 1)
            updates_per_epoch = max(-(-len(loader) // accumulation), 1)
            epoch = int(self.state.global_step) // updates_per_epoch
            done = _batches_done(loader)
            if loader.epoch != epoch or (done is not None and done != num_batches):
                raise StateError(
                    f"the train loader's restored position (epoch {loader.epoch}, "
                    f"{'?' if done is None else done} batches in) is not the checkpoint's "
                    f"step {self.state.global_step} (epoch {epoch}, {num_batches} batches in, "
                    f"{len(loader)} batches an epoch): resume with the batch size, "
                    "gradient_accumulation_steps and world size the checkpoint was made with, "
                    "or pass ignore_data_skip=True to start the epoch from its beginning"
                )
            return dataloader

        def _save_rng_state(self, output_dir: str) -> None:
            # Every process writes its RNG state here, beside the optimizer's: the loader's
            # position belongs with them.
            super()._save_rng_state(output_dir)
            if self.train_loader is not None:
                save_loader_state(self.train_loader, output_dir, int(self.args.process_index))

    Trainer.__module__ = "chute"
    Trainer.__qualname__ = "Trainer"
    return Trainer


def _batches_done(loader: Loader) -> Optional[int]:
    """Batches of the current epoch already delivered, from the loader's state (``None``
    where the state does not say: a mixture's, say)."""
    state = loader.state_dict()
    if "batches" in state:  # an iterable dataset's engine
        return int(state["batches"])
    if "delivered" in state and loader.batch_size > 0:  # samples, this rank's
        return -(-int(state["delivered"]) // loader.batch_size)
    return None


# accelerate ---------------------------------------------------------------------------------


def accelerate_prepare(
    accelerator: Any,
    loader: Loader,
    *,
    batch_format: BatchFormat = "auto",
    device: Any = None,
    checkpoint: bool = True,
) -> LoaderBatches:
    """What ``accelerator.prepare(dataloader)`` does, for a ``chute.Loader``.

    ``Accelerator.prepare`` hands back anything that is not a ``torch.utils.data.DataLoader``
    unchanged (it has no hook for other loaders), and a ``DataLoader`` over
    ``loader.as_torch_dataset()`` would be re-split across processes by accelerate (the
    batches are already this rank's). Instead this returns the loader's batches (a
    ``LoaderBatches``: ``len``, ``set_epoch``, ``state_dict``...):

    - through ``batch_format`` (as ``chute.Trainer``: ``"auto"`` gives Hugging Face names to
      token batches) as torch tensors, moved to ``device`` (default: ``accelerator.device``
      when ``accelerator.device_placement``; ``non_blocking`` when the loader's buffers are
      pinned);
    - telling accelerate's gradient state where an epoch ends, as a prepared ``DataLoader``
      does, so ``accelerator.accumulate(model)`` syncs on an epoch's last batch;
    - with ``checkpoint=True``, the loader's position saved by ``accelerator.save_state``
      (``chute_loader_rank{R}.json`` per process, through ``register_save_state_pre_hook``)
      and restored by ``accelerator.load_state`` (``register_load_state_pre_hook``). After
      ``load_state`` the next batch is the one after the checkpoint: do not call
      ``skip_first_batches`` (it would skip again, and needs a ``DataLoader``).

    The loader must read this process's share (``rank`` / ``world_size``, which
    ``accelerate launch`` sets in the environment): a mismatch is a ``ConfigError``.
    """
    _check_loader(loader, "loader")
    format_function(batch_format)
    if getattr(accelerator, "parallelism_config", None) is None:
        world, rank = int(accelerator.num_processes), int(accelerator.process_index)
        if (loader.world_size, loader.rank) != (world, rank):
            raise ConfigError(
                f"invalid loader: it reads rank {loader.rank} of {loader.world_size} but this "
                f"process is rank {rank} of {world}; build the loader after the Accelerator, "
                "or pass rank=accelerator.process_index, world_size=accelerator.num_processes"
            )
    if device is None and getattr(accelerator, "device_placement", True):
        device = accelerator.device
    non_blocking = bool(loader.pinned and device is not None and str(device).startswith("cuda"))
    batches: LoaderBatches = _accelerate_batches_class()(
        loader, batch_format, device=device, non_blocking=non_blocking
    )
    if checkpoint:
        rank = int(accelerator.process_index)

        def save(models: Any, weights: Any, output_dir: str) -> None:
            save_loader_state(loader, output_dir, rank)

        def load(models: Any, input_dir: str) -> None:
            load_loader_state(loader, input_dir, rank)

        accelerator.register_save_state_pre_hook(save)
        accelerator.register_load_state_pre_hook(load)
    return batches


@functools.lru_cache(maxsize=None)
def _accelerate_batches_class() -> type:
    """``LoaderBatches`` with accelerate's ``DataLoaderStateMixin``: the gradient state
    learns which loader is active and when its epoch ends, as for a prepared DataLoader."""
    try:
        # Through importlib: accelerate ships no type information.
        data_loader = importlib.import_module("accelerate.data_loader")
        state = importlib.import_module("accelerate.state")
    except ImportError as e:
        raise ImportError(
            "chute.accelerate_prepare needs accelerate (pip install accelerate)"
        ) from e

    mixin: Any = data_loader.DataLoaderStateMixin
    gradient_state: Any = state.GradientState

    class AcceleratedBatches(LoaderBatches, mixin):  # type: ignore[misc]
        # No remainder for gather_for_metrics to cut: each rank's batches are its own.
        _drop_last = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.gradient_state = gradient_state()

        def _batches(self) -> Iterator[Any]:
            self.begin()
            try:
                epoch = self.loader.epoch
                for batch in super()._batches():
                    # The loader's epoch moves on with the epoch's last batch.
                    if self.loader.epoch != epoch:
                        self.end_of_dataloader = True
                    yield batch
            finally:
                self.end()

    return AcceleratedBatches
