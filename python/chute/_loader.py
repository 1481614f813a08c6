"""``chute.Loader``: the engine with ``torch.utils.data.DataLoader``'s arguments.

What lives here is about Python conventions only (torchrun's environment variables,
DataLoader's ``prefetch_factor``, which framework the arrays are handed to, warnings); the
work is done by the Rust engine through ``chute._chute``.
"""

from __future__ import annotations

import atexit
import functools
import glob
import inspect
import json
import os
import pickle
import sys
import threading
import time
import warnings
import weakref
from typing import (
    Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union, cast,
)

import numpy

from . import _chute, _progress
from ._batch_format import BatchFormat, format_function
from ._errors import ConfigError
from ._iterable import IterableEngine as _IterableEngine

__all__ = ["Loader"]

Transform = Union[Callable[..., Optional[Dict[str, Any]]], Mapping[str, Any]]

_OUTPUTS = ("numpy", "dlpack", "torch", "jax")

# Worker processes num_workers="auto" starts with (more start as its tuner needs them): as
# many as DataLoader users set most often, and each one's memory is paid only when it helps.
_AUTO_START = 2

# Loaders alive in this process, closed at exit (see _at_exit).
_live: "weakref.WeakSet[Union[_chute.Loader, _IterableEngine]]" = weakref.WeakSet()
_warned_pin_memory = False


def _begin_after_first(batches: Iterator[Any], workers: Any) -> Iterator[Any]:
    """``batches``, the worker processes started as the first one is handed over (it was read
    in this process meanwhile: see ``_workers.WorkerPool.begin``)."""
    for b in batches:
        workers.begin()
        yield b
        yield from batches
        return


class Loader:
    """Deterministic, resumable, parallel batches from a chute source or your own dataset.

    ``source`` is a chute source (``chute.dataset(...)``, ``chute.tokens(...)``, ...), any
    map-style dataset (``__len__`` and ``__getitem__``: a ``torch.utils.data.Dataset``, a
    list, a numpy array) or an iterable dataset (``__iter__`` only; see ``chute._iterable``:
    one producer thread, stream order or a seeded shuffle buffer with ``shuffle=True`` /
    ``"buffer:N"``, round-robin ranks, resume through the dataset's own ``state_dict`` or by
    counting). A Hugging Face ``datasets.Dataset`` is read natively instead, from
    its Arrow table (memory-mapped cache files) and indices mapping, with no Python per row
    (unless it has a ``set_transform``): numbers, bools and fixed-length sequences become
    arrays, variable-length sequences (token ids) lists of arrays (or padded, with ``pad``),
    strings and binaries lists, ``Image``/``Audio`` columns their encoded bytes (decode them
    with ``transforms``); ``with_format("torch")`` gives torch tensors and its ``columns``
    select. A dataset's ``__getitem__`` runs on the worker threads with the GIL
    held (what it does without the GIL, such as PIL decoding, numpy, torch ops and file reads,
    runs in parallel); indices come from chute's plan, so every guarantee below holds. Its
    samples are collated as ``torch.utils.data.default_collate`` does: sample 0 (read when
    the loader is made) fixes the structure (dicts and other mappings, namedtuples, tuples and lists as lists), arrays,
    numpy scalars and tensors are stacked, ``int`` gives int64, ``float`` float64, ``bool``
    bool, ``str``/``bytes``/``None`` lists; a sample of another structure is a ``TypeError``
    naming its index and the path inside it. Arrays are copied when ``__getitem__`` returns
    (so a dataset may reuse its buffers). With a
    torch tensor among the leaves and no ``output=``, batches are torch tensors. Native
    ``transforms`` apply to the fields of a dict sample (``{"jpg": b"...", "cls": 3}``); a
    field they rename (``{"as": ...}``) arrives under its new name in place of the old one.

    ``for batch in loader`` is one epoch; the next ``for`` is the next epoch. Each batch is a
    ``dict[str, array]``: fixed-shape columns are numpy arrays viewing chute's buffers (no
    copy; the buffer goes back to chute's pool when the last view is dropped), or torch/JAX
    tensors or ``chute.Tensor`` objects with ``output=``; variable-length columns are
    ``list[bytes]`` / ``list[str]``. The order is a pure function of (dataset, seed, epoch,
    rank, world size), whatever ``num_workers``.

    Arguments follow ``torch.utils.data.DataLoader`` where the meaning is the same:

    - ``batch_size``: samples per batch (per rank).
    - ``global_batch_size``: instead of ``batch_size``, the samples per step over all ranks;
      each rank's batch is ``global_batch_size // world_size`` (it must divide). Keeps the
      training recipe unchanged when a job resumes on another world size (MosaicML
      Streaming's ``global_batch_size``).
    - ``shuffle``: ``False``/``"none"`` (dataset order), ``True``/``"global"`` (a new
      permutation of all samples each epoch), ``"block"`` or ``"block:N"`` (shards shuffled,
      samples shuffled within windows of N shards, for streaming sources).
    - ``seed``: seeds the order and the per-sample RNG of transforms.
    - ``num_workers``: worker *threads* (0 builds batches in the calling thread): chute's
      workers run native code without the GIL. ``"auto"``: the engine tunes the workers and
      the prefetch depth while the loader runs, to the consumer's pace (as tf.data's
      AUTOTUNE): a consumer that waits gets more workers, then more prefetch; workers that
      stay ahead of a consumer that does not wait give one back (its core goes to the
      training step). Within a budget: the cores this process may use (CPU affinity, a
      container's quota) and a tenth of the memory (the container's limit), shared among
      the ranks on the node (``LOCAL_WORLD_SIZE``). Threads start with every worker,
      processes (``worker_mode="process"``) with two, more started as the tuner runs more.
      The order is the same as with any fixed count; ``stats()["autotune"]``, the metrics
      (``chute_workers``, ``chute_queue_capacity_batches``), the progress line and
      ``loader.num_workers`` say what it chose. An iterable dataset gets one producer.
    - ``worker_mode``: ``"thread"`` (the default), ``"process"`` or ``"auto"``. With
      ``"auto"``, a map-style Python dataset gets processes when its ``__getitem__`` does not
      scale on threads (a few samples are read on one thread, then on two at once: two
      threads under 1.8 times as fast as one) and it pickles; anything else gets threads
      (``loader.worker_mode`` and ``stats()`` say which). With ``"process"``, a
      map-style Python dataset's ``__getitem__`` (and ``collate_fn``) runs in
      ``num_workers`` worker processes, for datasets whose Python holds the GIL. By default
      (and with ``multiprocessing_context="forkserver"``) they are forks of chute's fork
      server: a fresh interpreter, started with BLAS and OpenMP at one thread, that imports
      what ``__main__`` imports (and what reading a sample imported here) and unpickles the
      dataset once, so the workers share those pages (as DataLoader's forked workers share
      their parent's) and each starts in milliseconds; never forks of this process, whose
      threads a fork would copy.
      ``"spawn"`` starts a fresh interpreter for each. Each worker runs
      ``worker_init_fn(worker_id)``
      (``random`` and ``torch`` seeded with ``seed + worker_id``, as DataLoader seeds its
      workers), and hands samples back through shared memory (anonymous: nothing in
      ``/dev/shm``), not pickled. Order, ranks, resume and ``on_error`` are the same as in
      thread mode: the same batches. A worker that dies (killed, out of memory) or outlasts
      ``timeout`` is a ``RuntimeError`` naming it and its samples. The Python callables at the
      head of ``transforms`` run in the worker processes (with the sample's RNG, as on the
      threads), native ops on this process's worker threads. An iterable dataset's stream
      is one: with ``"process"`` its ``__iter__``, the rank split, the shuffle buffer and the
      collation run in one worker process (started for each pass), and each batch comes back
      pickled once: the same batches as with threads, the GIL here left to the training step.
    - ``dataset_factory``: instead of the dataset, a function of no arguments that builds
      it (a top-level function, or ``functools.partial`` of a class), for a dataset that
      does not pickle (open connections, handles): this process calls it for its copy (the
      length, sample 0), and with ``worker_mode="process"`` each worker process calls it
      instead of getting the dataset pickled.
    - ``prefetch_factor``: batches prefetched per worker, as in DataLoader; chute's ready
      queue then holds ``max(1, prefetch_factor * max(num_workers, 1))`` batches, on top of
      the one each worker is building (``loader.prefetch`` is that depth).
    - ``drop_last``: drop each rank's last incomplete batch.
    - ``pin_memory``: batch buffers page-locked through the CUDA runtime (found at run time),
      for ``tensor.to("cuda", non_blocking=True)``. Without CUDA, a warning (once per process)
      and ordinary memory.
    - ``rank`` / ``world_size``: this process's share. When not given they are found as the
      launchers set them: an initialized ``torch.distributed`` process group (Lightning, any
      launcher), else ``RANK`` / ``WORLD_SIZE`` (torchrun, accelerate), else SLURM's
      ``SLURM_PROCID`` / ``SLURM_NTASKS``, else 0 / 1; ``WORLD_SIZE > 1`` without a rank is
      a ``ConfigError`` naming the fix, never a silent rank 0 (``loader.rank_from`` and
      ``stats()`` say which was used). Every rank gets the same number of batches.
      ``LOCAL_RANK`` is read into ``loader.local_rank``.
    - ``transforms``: native ops declared as data, a dict of field -> list of ops (run on the
      worker threads without the GIL), e.g. ``{"jpg": [{"op": "decode"}, {"op":
      "random_resized_crop", "size": 224}, {"op": "horizontal_flip"}], "cls": [{"op":
      "label"}]}`` (the ops: ``decode``, ``resize``, ``center_crop``, ``random_resized_crop``,
      ``horizontal_flip``, ``normalize``, ``chw``, ``cast``, ``label``, ``npy``, ``text``,
      ``json``, ``msgpack``, ``npz``, ``tenbin``, ``tokenize``, ``chat``; ``auto`` decodes
      a WebDataset member by its extension as the ``webdataset`` package's ``.decode()``
      does, pickles only with ``{"op": "auto", "pickle": True}``, and the key ``"*"`` stands
      for every field no other key names; audio: ``decode_audio``, ``resample``,
      ``crop_audio``, ``log_mel`` (Whisper's features), ``fbank`` (Kaldi's),
      ``spec_augment``; video (the cargo feature ``video``): ``decode_video`` (clips of
      uint8 frames sampled as torchcodec's samplers sample them, resized and cropped, with a
      ``<name>_pts`` field; see the README's "Video"); a field may be ``{"as": name, "ops": [...], "optional": bool}``; see
      the README's "Transforms" and "Audio"); and/or callables ``f(sample)`` or ``f(sample, rng)`` run on the worker
      threads (under the GIL), in the order given. ``sample`` is a dict of numpy arrays (copies, in the batch's dtype),
      ``bytes`` and ``str``, plus ``"__index__"`` (the global sample id) and ``"__key__"``
      when the format has keys. ``rng`` is a ``numpy.random.Generator`` seeded from (seed,
      epoch, sample), passed when ``f`` has two required positional parameters (or a second
      one named ``rng``). ``f`` returns the new dict, or ``None`` after editing ``sample`` in
      place. An exception raised in ``f`` is raised by ``next()`` as itself.
    - ``on_error``: ``"raise"`` (a failed sample fails its batch: ``next()`` raises, and
      iteration may continue with the next batch) or ``"skip"`` (the sample is replaced by
      the next one in the order; counted in ``stats()``).
    - ``pad``: arrays whose shapes differ within a batch (images decoded without a crop, say)
      come as a list of arrays, one per sample (``False``, the default; a batch whose arrays
      happen to share a shape comes as one array), or zero-padded to the batch's largest shape
      in one array plus a ``"<name>_mask"`` bool array that is true where a value is real
      (``True``: every array field of one or more dimensions then has its mask, in every batch).
    - ``batch_format``: ``"hf"`` gives token batches under the names Hugging Face models
      take (``input_ids``, ``labels`` with -100 where no loss belongs, ``attention_mask`` for
      padded rows, ``position_ids`` for packed ones: see ``chute.hf_batch``); a function of
      the batch is applied to each; ``None`` (default) leaves batches as they are.
    - ``output``: ``"numpy"`` (default), ``"torch"`` (``torch.from_dlpack``), ``"jax"``
      (``jax.numpy.from_dlpack``) or ``"dlpack"`` (the ``chute.Tensor`` objects, which
      implement ``__dlpack__`` and ``__array_interface__``). All are zero-copy.

    Watching it (see the README's "Is my GPU waiting?"):

    - ``progress``: a progress bar per epoch with throughput and the fraction of time the
      step waited, over the last ``stats_window`` seconds (tqdm when installed, a plain line
      on stderr otherwise); ``len(loader)`` stays the batch count for your own bars.
    - ``metrics_port`` / ``metrics_address``: serve every loader's metrics for Prometheus at
      ``http://ADDRESS:PORT/metrics`` (``chute.serve_metrics``), the port plus ``LOCAL_RANK``
      (so torchrun's processes on a node take consecutive ports; 0 picks a free port);
      ``name`` labels this loader's series (``loader="train"``), beside its ``rank``.
    - ``stats_window``: the seconds ``stats()["window"]`` covers (default 10).

    DataLoader's other arguments: ``timeout`` (seconds ``next()`` waits for a batch when
    ``num_workers >= 1``, then ``TimeoutError``), ``worker_init_fn(worker_id)`` (Python
    datasets: called on each worker thread before its first sample, each epoch),
    ``generator`` (its ``initial_seed()`` is the seed unless ``seed`` is given),
    ``persistent_workers`` and ``in_order`` (accepted: threads persist, order is always
    kept), ``collate_fn`` (Python datasets: a batch's samples, as ``__getitem__`` returned
    them, go to ``collate_fn(list)`` on the worker thread and its result is the batch, as
    is: ``output`` and ``pad`` do not apply, ``transforms`` and ``on_error="skip"`` are
    refused, an exception in it is raised as itself). ``sampler`` and ``batch_sampler`` are
    refused with what replaces them, and so is ``multiprocessing_context`` in thread mode.

    ``state_dict()`` / ``load_state_dict()`` follow PyTorch's Stateful protocol (so the loader
    drops into ``torch.distributed.checkpoint``); the state is the position after the last
    batch delivered, a few integers. ``as_torch_dataset()`` wraps the loader as a
    ``torch.utils.data.IterableDataset``.

    Threads start lazily on the first batch of an epoch, and a process forked after the
    loader was made (multiprocessing's ``fork``) starts its own. A loader is iterated by one
    thread at a time.
    """

    def __init__(
        self,
        source: Any = None,
        *,
        batch_size: Optional[int] = None,
        shuffle: Union[bool, str] = False,
        seed: Optional[int] = None,
        num_workers: Union[int, str] = 0,
        worker_mode: str = "thread",
        prefetch_factor: Optional[int] = 2,
        drop_last: bool = False,
        pin_memory: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        transforms: Union[Transform, Sequence[Transform], None] = None,
        on_error: str = "raise",
        output: Optional[str] = None,
        pad: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], Any]] = None,
        generator: Any = None,
        persistent_workers: bool = False,
        in_order: bool = True,
        collate_fn: Any = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        multiprocessing_context: Any = None,
        progress: bool = False,
        metrics_port: Optional[int] = None,
        metrics_address: str = "127.0.0.1",
        name: Optional[str] = None,
        stats_window: float = 10.0,
        global_batch_size: Optional[int] = None,
        batch_format: BatchFormat = None,
        dataset_factory: Optional[Callable[[], Any]] = None,
    ) -> None:
        # What reading a sample imports (here, for the structure), the fork server of
        # worker_mode="process" imports too, so that its workers share it (see _workers.py).
        self._modules_before = set(sys.modules)
        if dataset_factory is not None:
            if source is not None:
                raise ConfigError(
                    "invalid dataset_factory: pass the dataset or the function that builds "
                    "it (dataset_factory=), not both"
                )
            if not callable(dataset_factory):
                raise ConfigError(
                    f"invalid dataset_factory: {dataset_factory!r} is not callable; pass a "
                    "function of no arguments that returns the dataset"
                )
            # This process's copy (its length, sample 0); each worker process builds its own.
            source = dataset_factory()
        elif source is None:
            raise TypeError("chute.Loader() needs a source: a chute source or a dataset object")
        # num_workers="auto": every worker this process's share of the cores allows, of
        # which the engine's tuner runs as many as the consumer needs (see _workers.budget).
        self._budget: Optional[Tuple[int, int]] = None
        if num_workers == "auto":
            from ._workers import budget

            self._budget = budget()
            num_workers = self._budget[0]
        elif isinstance(num_workers, str):
            raise ConfigError(
                f"invalid num_workers: {num_workers!r}; pass a count (0 builds batches in the "
                "calling thread) or 'auto' (tuned while the loader runs)"
            )
        if worker_mode not in ("thread", "process", "auto"):
            raise ConfigError(
                f"invalid worker_mode: {worker_mode!r}; use 'thread' (the default: worker "
                "threads in this process), 'process' (worker processes, for Python datasets "
                "whose __getitem__ holds the GIL) or 'auto' (measure, then choose)"
            )
        self._probe: Optional[Dict[str, Any]] = None
        # A map-style Python dataset, as given (the doctor probes how it scales on threads).
        self._dataset: Any = None
        if worker_mode == "auto":
            worker_mode = self._choose_mode(source, num_workers, collate_fn, dataset_factory)
        self.worker_mode: str = worker_mode
        """``"thread"`` or ``"process"``: how the workers run (``worker_mode="auto"``'s
        choice)."""
        process = worker_mode == "process"
        _refuse_dataloader_only(
            sampler, batch_sampler, None if process else multiprocessing_context
        )
        self._workers: Optional[Any] = None
        # The engine's transforms; in process mode, the Python callables at their head run in
        # the worker processes instead (before the native ops, as listed).
        specs = [_transform(t) for t in _with_unpicklers(_as_list(transforms))]
        worker_specs: List[Any] = []
        while process and specs and isinstance(specs[0], tuple):
            worker_specs.append(specs.pop(0))
        self.progress = bool(progress)
        self._batch_format = None if batch_format is None else format_function(batch_format)
        # The position load_state_dict() set, until a batch is taken (see `sampler`).
        self._restored: Optional[Dict[str, Any]] = None
        stream_shuffle = shuffle  # an iterable dataset's (a buffer), before it is normalized
        del persistent_workers, in_order  # threads persist; chute is always in order
        if seed is None:
            seed = int(generator.initial_seed()) if generator is not None else 0
        self._structure: Any = None
        self._collate_fn = collate_fn is not None
        if collate_fn is not None and not isinstance(source, _chute.Source):
            # DataLoader's collate_fn: samples as __getitem__ returns them, collated by the
            # user's function on the worker thread (Hugging Face datasets included).
            _check_collate_fn(collate_fn, transforms, on_error)
            if _is_map_style(source):
                dataset = self._dataset = source
                source = _chute.map_dataset(
                    source, None if process else worker_init_fn, max(int(num_workers), 0),
                    collate_fn
                )
                if process:
                    source = self._start_workers(
                        dataset, source, num_workers, multiprocessing_context, worker_init_fn,
                        collate_fn, seed, timeout, worker_specs, on_error, dataset_factory,
                    )
            elif not hasattr(source, "__iter__"):
                raise TypeError(
                    f"collate_fn needs a dataset (map-style, or iterable), got "
                    f"{type(source).__name__}"
                )
        elif isinstance(source, _chute.Source):
            if collate_fn is not None:
                raise ConfigError(
                    "invalid collate_fn: chute's own sources are collated natively into "
                    "contiguous batches; post-process the batch in your loop"
                )
            if worker_init_fn is not None:
                raise ConfigError(
                    "invalid worker_init_fn: it is for Python datasets (chute.Loader(my_dataset, "
                    "...)); chute's own sources have no Python state to set up per worker"
                )
        elif isinstance(source, (str, bytes, os.PathLike)):
            raise TypeError(
                f"source must be a chute source or a dataset object, got the path {source!r}; "
                "open it with chute.dataset(path) first"
            )
        elif (hf := _hf_arrow(source)) is not None:
            hf_format = source.format.get("type")
            source = hf
            if output is None and hf_format in ("torch", "jax"):
                output = hf_format
            if worker_init_fn is not None:
                raise ConfigError(
                    "invalid worker_init_fn: this Hugging Face dataset is read natively from its "
                    "Arrow table, with no Python code per worker"
                )
        elif _is_map_style(source):
            # A bad num_workers is reported by the engine, naming the option.
            dataset = self._dataset = source
            source = _chute.map_dataset(
                source, None if process else worker_init_fn, max(int(num_workers), 0)
            )
            if process:
                source = self._start_workers(
                    dataset, source, num_workers, multiprocessing_context, worker_init_fn,
                    None, seed, timeout, worker_specs, on_error, dataset_factory,
                )
        elif hasattr(source, "__iter__"):
            pass  # an iterable dataset: see _iterable.py
        else:
            raise TypeError(
                "source must be a chute source (chute.dataset(...)), a map-style dataset "
                "(with __len__ and __getitem__) or an iterable one (with __iter__), got "
                f"{type(source).__name__}"
            )
        iterable = not isinstance(source, _chute.Source)
        if process and self._workers is None and not iterable:
            raise ConfigError(
                "invalid worker_mode: 'process' runs a Python dataset's __getitem__ or "
                "__iter__ (and collate_fn) in worker processes; chute's own sources and "
                "Hugging Face datasets read from Arrow are read natively by worker threads "
                "(worker_mode='thread')"
            )
        iterable_process = None
        if process and iterable:
            from ._workers import _context

            if isinstance(num_workers, bool) or not isinstance(num_workers, int) \
                    or num_workers < 1:
                raise ConfigError(
                    "invalid num_workers: worker_mode='process' reads the iterable dataset in "
                    f"a worker process, so it needs num_workers >= 1, got {num_workers!r}"
                )
            iterable_process = {"context": _context(multiprocessing_context),
                                "factory": dataset_factory}
        if iterable and transforms:
            raise ConfigError(
                "invalid transforms: an iterable dataset's samples are collated outside "
                "chute's workers; do the per-sample work in its __iter__"
            )
        self._iterable = iterable
        self._source = source
        self._tensors_out = output is None
        if output is None:
            output = "numpy"
        # Columns of time counts that numpy has a type for, viewed as it (numpy output only:
        # torch and JAX have no datetime types, so they keep the int64 counts).
        self._time_views: Dict[str, Any] = {}
        if output == "numpy" and isinstance(source, _chute.Source) and source.format != "python":
            self._time_views = {k: numpy.dtype(v) for k, v in source.numpy_types.items()}
        if isinstance(shuffle, bool):
            shuffle = "global" if shuffle else "none"
        elif not isinstance(shuffle, str):
            raise ConfigError(
                f"invalid shuffle: {shuffle!r}; use False, True, 'none', 'global', 'block' "
                "or 'block:N'"
            )
        self.local_rank: int = _env_int("LOCAL_RANK", minimum=0) or 0
        """``LOCAL_RANK`` (this process's GPU on its node, as torchrun sets it), else 0."""
        rank, world_size, self.rank_from = _find_rank(rank, world_size)
        batch_size = _per_rank_batch(batch_size, global_batch_size, world_size)
        if prefetch_factor is None:
            prefetch_factor = 2
        if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int):
            raise ConfigError(f"invalid prefetch_factor: {prefetch_factor!r} is not an int")
        if prefetch_factor < 1:
            raise ConfigError(
                f"invalid prefetch_factor: must be at least 1 (batches per worker), "
                f"got {prefetch_factor}"
            )
        if output not in _OUTPUTS:
            raise ConfigError(f"invalid output: {output!r}; use one of {', '.join(_OUTPUTS)}")
        # The engine: the Rust loader, or for an iterable dataset its stand-in with the same
        # interface.
        self._inner: Union[_chute.Loader, _IterableEngine]
        if iterable and (metrics_port is not None or name is not None):
            raise ConfigError(
                "invalid metrics_port/name: an iterable dataset is read by its own __iter__, "
                "outside chute's engine, which has no metrics of it; use a map-style dataset "
                "or a chute source"
            )
        if iterable:
            self._inner = _IterableEngine(
                source,
                batch_size=batch_size,
                shuffle=stream_shuffle,
                seed=seed,
                rank=rank,
                world_size=world_size,
                drop_last=drop_last,
                pad=pad,
                prefetch=max(1, prefetch_factor * max(num_workers, 1)),
                timeout=timeout,
                output=_converter(output),
                rebuild=self._rebuild_tree,
                collate_fn=collate_fn,
                # An iterable is one stream, read by one producer thread ("auto" included).
                num_workers=1 if self._budget is not None else num_workers,
                worker_init_fn=worker_init_fn if num_workers > 0 else None,
                process=iterable_process,
            )
            self.output = output
            _live.add(self._inner)
            return
        if pin_memory:
            _find_torch_cudart()
        # A Python dataset whose samples hold torch tensors gets torch tensors (default
        # collate's rule): straight from the engine, so dtypes numpy lacks (bfloat16) pass.
        engine_output = output
        if (
            self._tensors_out
            and source.format == "python"
            and source.structure is not None
            and _has_tensor_leaf(source.structure)
        ):
            engine_output = "torch"
        autotune = None
        if self._budget is not None:
            # The tuner starts with every worker in thread mode (threads cost little, and
            # the first batch is shared among them), with the processes started in process
            # mode, and moves within the budget.
            start = num_workers if not process else min(_AUTO_START, num_workers)
            autotune = (start, self._budget[1])
        inner = _chute.Loader(
            source,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            num_workers=num_workers,
            prefetch=max(1, prefetch_factor * max(num_workers, 1)),
            autotune=autotune,
            drop_last=drop_last,
            pin_memory=pin_memory,
            rank=rank,
            world_size=world_size,
            transforms=specs,
            on_error=on_error,
            output=_converter(engine_output),
            pad=pad,
            timeout=timeout,
            name=name,
            stats_window=stats_window,
        )
        if metrics_port is not None:
            # One port per process on a node: torchrun's ranks there are LOCAL_RANK 0, 1...
            _chute.serve_metrics(metrics_port + self.local_rank if metrics_port else 0,
                                 metrics_address)
        self._inner = inner
        self.output = output
        _live.add(inner)
        if pin_memory and inner.pin_memory_fallback is not None:
            _warn_pin_memory(inner.pin_memory_fallback)

    # Iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch (from its start, unless resumed mid-epoch)."""
        batches = self._batches()
        if self._batch_format is not None:
            batches = map(self._batch_format, batches)
        if self.progress:
            try:
                total = len(self)
            except TypeError:  # an iterable dataset without __len__
                total = 0
            return _progress.bar(batches, total, self.epoch, self.stats)
        return batches

    def _batches(self) -> Iterator[Any]:
        batches = self._pass()
        workers = getattr(self, "_workers", None)
        if workers is not None and not workers.begun:
            return _begin_after_first(batches, workers)
        return batches

    def _pass(self) -> Iterator[Any]:
        if self._iterable:
            return iter(self._inner)
        if self._collate_fn:
            return (b["__collated__"] for b in self._inner)
        if self._source.format != "python":
            # iter(): a new pass (the engine's __iter__ starts the next epoch when the last
            # one's batches were all delivered).
            if self._time_views:
                return (self._view_times(b) for b in self._inner)
            return iter(self._inner)
        return (self._rebuild(b) for b in self._inner)

    def _view_times(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """Timestamp, date and duration columns as numpy ``datetime64`` / ``timedelta64``
        (views of the int64 counts, no copy), ``NaT`` where ``<name>_valid`` marks a null."""
        for name, dtype in self._time_views.items():
            col = batch.get(name)
            if isinstance(col, list):  # one array per sample (lists of times, pad=False)
                batch[name] = [a.view(dtype) if getattr(a, "dtype", None) == numpy.int64 else a
                               for a in col]
                continue
            if not isinstance(col, numpy.ndarray) or col.dtype != numpy.int64:
                continue
            times = col.view(dtype)
            valid = batch.get(name + "_valid")
            if isinstance(valid, numpy.ndarray) and valid.shape == times.shape[: valid.ndim] \
                    and not valid.all():
                if not times.flags.writeable:
                    times = times.copy()
                times[~valid] = numpy.datetime64("NaT") if dtype.kind == "M" else \
                    numpy.timedelta64("NaT")
            batch[name] = times
        return batch

    def _rebuild(self, batch: Dict[str, Any]) -> Any:
        """A Python dataset's batch in its samples' structure, as default_collate builds it."""
        if self._structure is None:
            self._structure = self._source.structure
        return self._rebuild_tree(batch, self._structure)

    def _rebuild_tree(self, batch: Dict[str, Any], structure: Any) -> Any:
        """``batch`` in the structure ``structure`` describes."""
        if structure is None:
            return batch
        tensors = self._tensors_out and _has_tensor_leaf(structure)
        out = _collated(structure, batch, _converter("torch") if tensors else None)
        if isinstance(out, dict):
            # Columns the structure does not hold (pad's <name>_mask, fields a transform added)
            # come along under their own names.
            leaves = _columns(structure)
            for name, value in batch.items():
                if name not in leaves:
                    out[name] = value
        return out

    def __len__(self) -> int:
        """Batches per epoch on this rank (a full epoch)."""
        return len(self._inner)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._inner.epoch

    def set_epoch(self, epoch: int) -> None:
        """Moves to the start of ``epoch``; the current epoch keeps its position (so calling it
        at the top of an epoch loop is safe after ``load_state_dict``). Calling it is optional:
        an epoch is over as soon as its last batch is delivered, and the next ``iter()`` reads
        the next epoch. See ``sampler`` for ``DistributedSampler.set_epoch``'s contract."""
        self._inner.set_epoch(epoch)

    @property
    def sampler(self) -> "EpochSampler":
        """What frameworks that drive a ``DataLoader``'s sampler talk to (Lightning's loops
        call ``loader.sampler.set_epoch(epoch)`` before each training epoch and each
        validation run). Its ``set_epoch`` has ``DistributedSampler.set_epoch``'s contract:
        the next pass is the whole of that epoch, from its start (a validation after a sanity
        check of two batches sees the whole set; a training epoch cut short by
        ``limit_train_batches`` does not leak into the next), except right after
        ``load_state_dict``, whose position is kept for the epoch it names."""
        return EpochSampler(self)

    @property
    def batch_sampler(self) -> None:
        """None: chute makes its own batches (``DataLoader``'s attribute, read by frameworks
        that look for a sampler through it)."""
        return None

    # State ---------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The position after the last batch delivered, as a plain dict (JSON-serializable).
        After an epoch's last batch it is the start of the next epoch."""
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: Union[Mapping[str, Any], str]) -> None:
        """Continues from ``state_dict`` (a dict from ``state_dict()``, or its JSON text, e.g. a
        file written by ``chute bench --save-state-at``). Raises ``chute.StateError`` for a
        state of another dataset, seed, shuffle mode or format version."""
        self._inner.load_state_dict(state_dict)
        self._restored = self._inner.state_dict()

    # Figures and settings ------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The engine's figures (the names of Rust's ``Loader::stats()``), cheap enough to call
        every step:

        - since the loader was built: ``samples``, ``batches``, ``bytes``, ``errors``,
          ``skipped`` (with ``skipped_recent``), ``samples_per_sec``, ``wait_secs`` /
          ``wait_fraction`` (time the consumer was blocked in ``next()``: how long a GPU
          would have waited), per-stage busy time and items (``read``, ``transform``,
          ``collate``), ``remote`` (the process's remote reads: ``bytes_fetched``,
          ``requests``, ``retries``, ``cache_hits``, ``shards_fetched``, ``failures``);
        - ``window``: the same over the last ``window_secs`` seconds (``stats_window=``),
          with ``samples_per_sec``, ``wait_fraction`` and ``remote_bytes_per_sec``;
          ``current_epoch`` and ``last_epoch`` (``None`` before the second epoch) likewise,
          ``epoch`` the epoch being read;
        - ``queue``: ``ready`` (batches waiting for the consumer), ``in_flight`` (being built),
          ``capacity``, ``workers``;
        - ``wait_histogram``: ``buckets`` of ``[upper bound in seconds, batches]``
          (cumulative), ``count``, ``sum``;
        - ``source``: the source's own figures (a mixture's samples per component against its
          target), when it has any;
        - ``rank``, ``world_size``: this process's share, and ``rank_from`` where they came
          from (``"arguments"``, ``"torch.distributed"``, ``"RANK/WORLD_SIZE"``, ``"SLURM"``
          or ``"default"``);
        - ``worker_mode``: ``"thread"`` or ``"process"``, and with ``worker_mode="auto"``
          ``worker_probe``, what the choice was made from (``thread_scaling``: how much faster
          two threads read than one).
        """
        s = self._inner.stats()
        s["rank"], s["world_size"], s["rank_from"] = self.rank, self.world_size, self.rank_from
        s["worker_mode"] = self.worker_mode
        if self._probe is not None:
            s["worker_probe"] = dict(self._probe)
        return s

    def doctor(
        self,
        *,
        step_ms: Optional[float] = None,
        target_samples_per_s: Optional[float] = None,
        seconds: float = 1.5,
        try_workers: Optional[Sequence[int]] = None,
    ) -> "Diagnosis":
        """Runs ``chute.doctor`` on this loader's dataset, transforms and options (the loader
        itself is not advanced); see ``chute.doctor``."""
        if self._iterable:
            raise ConfigError(
                "invalid doctor: an iterable dataset is read by its own __iter__, outside "
                "chute's stages; the doctor needs a map-style dataset or a chute source"
            )
        inner = cast(_chute.Loader, self._inner)
        text = inner.doctor(
            step_ms=step_ms,
            target_samples_per_s=target_samples_per_s,
            seconds=seconds,
            try_workers=list(try_workers) if try_workers is not None else None,
        )
        d = Diagnosis(json.loads(text))
        # In Python the queue depth is prefetch_factor * num_workers.
        d["recommended_prefetch_factor"] = max(
            1, -(-int(d["recommended_prefetch"]) // max(int(d["recommended_workers"]), 1))
        )
        if self._dataset is not None and self.worker_mode == "thread":
            self._gil_advice(d)
        return d

    def _gil_advice(self, d: "Diagnosis") -> None:
        """The doctor's ``gil`` rule, for a Python dataset on threads: how its
        ``__getitem__`` scales on two threads (``worker_probe``), and process mode advised
        where the GIL holds the threads back."""
        from ._workers import THREADS_SCALE, probe

        p = self._probe or probe(self._dataset)
        d["worker_probe"] = p
        scaling = p.get("thread_scaling")
        if scaling is None or scaling >= THREADS_SCALE:
            return
        msg = (
            f"__getitem__ reads {scaling:.2f}x as fast on two threads as on one: the GIL "
            "holds the worker threads back (Python code in __getitem__); "
            "worker_mode='process' reads it in worker processes, one GIL each "
            "(worker_mode='auto' measures and chooses)"
        )
        d.setdefault("advice", []).append({"rule": "gil", "message": msg})
        text = str(d.get("text", ""))
        if "\nadvice:\n" not in text:
            text = text.rstrip("\n") + "\n\nadvice:\n"
        d["text"] = text + f"  [gil] {msg}\n"

    @property
    def pinned(self) -> bool:
        """True when batch buffers are page-locked (``pin_memory=True`` and CUDA present)."""
        return self._inner.pinned

    @property
    def pin_memory_fallback(self) -> Optional[str]:
        """Why ``pin_memory=True`` fell back to ordinary memory, or None."""
        return self._inner.pin_memory_fallback

    @property
    def batch_size(self) -> int:
        return int(self._inner.options["batch_size"])

    @property
    def num_workers(self) -> int:
        """Workers building batches: with ``num_workers="auto"``, as many as the tuner runs
        now (``stats()["autotune"]`` has its bounds)."""
        if self._budget is not None and not self._iterable:
            tuned = self._inner.stats().get("autotune")
            if tuned:
                return int(tuned["workers"])
        return int(self._inner.options["num_workers"])

    @property
    def prefetch(self) -> int:
        """Depth of the engine's ready queue: ``max(1, prefetch_factor * max(num_workers, 1))``."""
        return int(self._inner.options["prefetch"])

    @property
    def shuffle(self) -> str:
        """The shuffle mode, normalized (``"none"``, ``"global"``, ``"block:N"``)."""
        return str(self._inner.options["shuffle"])

    @property
    def seed(self) -> int:
        return int(self._inner.options["seed"])

    @property
    def rank(self) -> int:
        return int(self._inner.options["rank"])

    @property
    def world_size(self) -> int:
        return int(self._inner.options["world_size"])

    @property
    def drop_last(self) -> bool:
        return bool(self._inner.options["drop_last"])

    @property
    def on_error(self) -> str:
        return str(self._inner.options["on_error"])

    @property
    def pad(self) -> bool:
        return bool(self._inner.options["pad"])

    # Lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the worker threads (waiting for transforms in progress), ends the worker
        processes (``worker_mode="process"``) and releases the loader's buffers. Batches
        already delivered stay valid. Also done at exit."""
        # The worker processes first: a worker thread waiting on a process that hangs in
        # __getitem__ is freed by the process's end, so stopping the threads cannot block.
        if self._workers is not None:
            self._workers.close()
        self._inner.release()

    def _choose_mode(
        self, source: Any, num_workers: Any, collate_fn: Any, factory: Any = None
    ) -> str:
        """``worker_mode="auto"``: processes for a map-style Python dataset whose
        ``__getitem__`` does not scale on threads (see ``chute._workers.probe``) and that
        pickles (or whose ``dataset_factory`` does); threads for everything else."""
        from ._workers import probe

        if (
            isinstance(source, _chute.Source)
            or not _is_map_style(source)
            or _hf_arrow(source) is not None
            or not isinstance(num_workers, int)
            or isinstance(num_workers, bool)
            or num_workers < 1
        ):
            return "thread"
        self._probe = probe(source)
        if self._probe["choice"] == "process":
            try:
                pickle.dumps(source if factory is None else factory)
            except Exception as e:
                self._probe["choice"] = "thread"
                self._probe["why"] = f"the dataset does not pickle ({e})"
        return str(self._probe["choice"])

    def _start_workers(
        self,
        dataset: Any,
        source: "_chute.Source",
        num_workers: int,
        context: Any,
        worker_init_fn: Any,
        collate_fn: Any,
        seed: int,
        timeout: float,
        transforms: List[Any],
        on_error: str,
        factory: Any,
    ) -> "_chute.Source":
        """``worker_mode="process"``: ``num_workers`` worker processes serving ``dataset``
        (with ``num_workers="auto"``, ``_AUTO_START`` of them at first, more as the tuner
        runs more workers); the source that reads through them."""
        from ._workers import WorkerPool

        if isinstance(num_workers, bool) or not isinstance(num_workers, int):
            raise ConfigError(f"invalid num_workers: {num_workers!r} is not an int")
        start = num_workers if self._budget is None else min(_AUTO_START, num_workers)
        self._workers = WorkerPool(
            dataset, source, start, context=context, worker_init_fn=worker_init_fn,
            collate_fn=collate_fn, seed=seed, timeout=timeout, transforms=transforms,
            restart=on_error == "skip", factory=factory, limit=num_workers,
            preload=sorted(set(sys.modules) - self._modules_before),
        )
        source = self._workers.source
        del self._workers.source  # the loader holds it; the pool must not (see _workers.py)
        return source

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "chute.Loader(closed)"
        o = self._inner.options
        return (
            f"chute.Loader(batch_size={o['batch_size']}, shuffle={o['shuffle']!r}, "
            f"seed={o['seed']}, num_workers={o['num_workers']}, rank={o['rank']}, "
            f"world_size={o['world_size']}, epoch={self.epoch}, batches={len(self)})"
        )

    # PyTorch -------------------------------------------------------------------------------

    def as_torch_dataset(self) -> Any:
        """The loader as a ``torch.utils.data.IterableDataset`` (each ``iter()`` is one epoch
        of batches), for code that expects a dataset: use it with
        ``torch.utils.data.DataLoader(ds, batch_size=None)`` (chute batches already) and
        ``num_workers=0`` (chute has its own workers). ``state_dict``/``load_state_dict`` pass
        through to the loader, but the ``DataLoader`` around it has none, so frameworks that
        checkpoint a ``DataLoader`` cannot resume it mid-epoch. Not for
        ``transformers.Trainer(train_dataset=...)`` (it would batch the batches) nor for
        ``accelerator.prepare`` (it would split the rank's batches again): use the loader
        itself in Lightning, ``chute.Trainer`` and ``chute.accelerate_prepare``."""
        return _torch_dataset_class()(self)


class EpochSampler:
    """``loader.sampler``: a loader's epochs as ``DistributedSampler.set_epoch`` drives them
    (see ``Loader.sampler``). Not a sampler of indices: chute orders its own samples."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        loader = self.loader
        restored = loader._restored
        if restored is not None and restored == loader._inner.state_dict():
            if int(restored["epoch"]) == int(epoch):
                return  # resumed: continue where the checkpoint was taken
        loader._restored = None
        if int(epoch) == loader.epoch:
            # The whole epoch, from its start, whatever an earlier pass left of it.
            loader._inner.set_epoch(int(epoch) + 1)
        loader._inner.set_epoch(int(epoch))


def _refuse_dataloader_only(sampler: Any, batch_sampler: Any, context: Any) -> None:
    """DataLoader's arguments that chute replaces, each refused with what replaces it."""
    if sampler is not None or batch_sampler is not None:
        raise ConfigError(
            "invalid sampler/batch_sampler: chute draws the order itself, so that it is exact "
            "across ranks and resumable; use shuffle= (False, True, 'block'), seed=, rank= and "
            "world_size= (a DistributedSampler's arguments) instead"
        )
    if context is not None:
        raise ConfigError(
            "invalid multiprocessing_context: chute's workers are threads in this process "
            "(num_workers=), so there are no worker processes to start; for a Python dataset "
            "whose __getitem__ holds the GIL, worker_mode='process' starts them"
        )


def _check_collate_fn(collate_fn: Any, transforms: Any, on_error: str) -> None:
    """What a ``collate_fn`` cannot be combined with: the batch is then the user's own."""
    if not callable(collate_fn):
        raise ConfigError(f"invalid collate_fn: {collate_fn!r} is not callable")
    if transforms:
        raise ConfigError(
            "invalid transforms: with collate_fn, samples go to your function as __getitem__ "
            "returned them; do the per-sample work in __getitem__ or in collate_fn"
        )
    if on_error != "raise":
        raise ConfigError(
            f"invalid on_error: {on_error!r} replaces single samples in chute's own batches; "
            "with collate_fn an exception fails its batch (on_error='raise')"
        )


# The native source of each live Hugging Face dataset object (by id, dropped with it; not on
# the object, which datasets deep-copies): its fingerprint and columns, and the source.
_hf_sources: "Dict[int, Tuple[Any, _chute.Source]]" = {}


def _hf_arrow(obj: Any, decimals: str = "float", dictionaries: str = "values",
              nulls: str = "mask", fill_null: Optional[float] = None,
              structs: str = "flatten", columns: Optional[List[str]] = None,
              chunk_rows: Optional[int] = None,
              stack: Any = None) -> "Optional[_chute.Source]":
    """A Hugging Face ``datasets.Dataset`` as a native source over its Arrow table (the
    cache files' memory maps, or the table in memory) and its indices mapping (``shuffle()``,
    ``select()``), with no Python per row, read with ``chute.arrow``'s options (``columns``
    given here override the dataset's format's); ``None`` for anything else, and for datasets
    with a Python transform (``set_transform``/``with_transform``), which must run per row."""
    datasets = sys.modules.get("datasets")
    if datasets is None or not isinstance(obj, datasets.Dataset):
        return None
    fmt = obj.format
    if fmt.get("type") == "custom":
        return None
    if columns is None:
        columns = fmt.get("columns")
        if fmt.get("output_all_columns"):
            columns = None
    # A dataset object's table never changes (its methods return new datasets; the in-place
    # ones change its fingerprint), so the source is made once per (fingerprint, options):
    # importing the table's record batches costs about 25 us each.
    key = (getattr(obj, "_fingerprint", None), None if columns is None else tuple(columns),
           decimals, dictionaries, nulls, fill_null, structs, chunk_rows, repr(stack))
    cached = _hf_sources.get(id(obj))
    if cached is not None and key[0] is not None and cached[0] == key:
        return cached[1]
    indices = None
    if obj._indices is not None:
        column = obj._indices.column(0)
        indices = numpy.asarray(column.to_numpy(), dtype="<u8").tobytes()
    files = [f.get("filename") for f in obj.cache_files]
    name = files[0] if files else f"datasets.Dataset({obj.info.dataset_name or 'in memory'})"
    source = _chute.arrow_table(obj.data.table, indices=indices, columns=columns, name=str(name),
                                decimals=decimals, dictionaries=dictionaries, nulls=nulls,
                                fill_null=fill_null, structs=structs, chunk_rows=chunk_rows,
                                stack=stack)
    if id(obj) not in _hf_sources:
        weakref.finalize(obj, _hf_sources.pop, id(obj), None)
    _hf_sources[id(obj)] = (key, source)
    return source


def _is_map_style(obj: Any) -> bool:
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None and isinstance(obj, torch_data.IterableDataset):
        return False  # it may define __len__, and Dataset's __getitem__ only raises
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


def _columns(tree: Any) -> "set[str]":
    """The batch columns a structure's leaves name."""
    kind = tree[0]
    if kind == "leaf":
        return {tree[1]}
    out: "set[str]" = set()
    for node in tree[2]:
        out |= _columns(node if kind == "seq" else node[1])
    return out


def _has_tensor_leaf(tree: Any) -> bool:
    kind = tree[0]
    if kind == "leaf":
        return bool(tree[2] == "tensor")
    return any(_has_tensor_leaf(node if kind == "seq" else node[1]) for node in tree[2])


def _collated(tree: Any, batch: Dict[str, Any], to_torch: Optional[Callable[[Any], Any]]) -> Any:
    """Rebuilds default_collate's structure: mappings of the samples' type (else dict),
    namedtuples as namedtuples, other tuples and lists as lists, leaves as their columns."""
    kind = tree[0]
    if kind == "leaf":
        _, column, leaf = tree
        if column not in batch:
            raise KeyError(
                f"the batch has no column {column!r}, which the dataset's samples have at a "
                "position of a tuple or list: a transform removed or renamed it (keep the "
                "names of fields inside sequences; fields of a mapping may be renamed)"
            )
        value = batch[column]
        if leaf == "None":
            return [None] * len(value)
        if to_torch is not None and isinstance(value, numpy.ndarray):
            return to_torch(value)
        return value
    _, typ, items = tree
    if kind == "map":
        # A field a transform renamed ({"as": ...}) or removed is not there: the mapping
        # leaves it out (its new name comes along, as other added columns do).
        d = {key: _collated(node, batch, to_torch) for key, node in items
             if node[0] != "leaf" or node[1] in batch}
        if typ is dict:
            return d
        try:
            return typ(d)
        except TypeError:
            return d
    values = [_collated(node, batch, to_torch) for node in items]
    if isinstance(typ, type) and issubclass(typ, tuple) and hasattr(typ, "_fields"):
        return typ(*values)
    return values


def _per_rank_batch(batch_size: Optional[int], global_batch: Optional[int], world: int) -> int:
    """``batch_size``, or ``global_batch_size // world_size`` (which must divide)."""
    if global_batch is None:
        return 1 if batch_size is None else batch_size
    if batch_size is not None:
        raise ConfigError(
            "invalid global_batch_size: give batch_size (per rank) or global_batch_size (over "
            "all ranks), not both"
        )
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ConfigError(
            f"invalid global_batch_size: must be a positive int, got {global_batch!r}"
        )
    if isinstance(world, int) and world >= 1 and global_batch % world:
        raise ConfigError(
            f"invalid global_batch_size: {global_batch} samples do not split evenly over "
            f"world_size = {world} ranks; use a multiple of the world size"
        )
    return global_batch // max(int(world), 1)


def _find_rank(
    rank: Optional[int], world_size: Optional[int]
) -> Tuple[int, int, str]:
    """This process's rank and the world size, found as the launchers set them, and where
    they came from: the arguments; an initialized ``torch.distributed`` process group
    (Lightning, any launcher); torchrun's and accelerate's ``RANK`` / ``WORLD_SIZE``; SLURM's
    ``SLURM_PROCID`` / ``SLURM_NTASKS`` where nothing else is set; else 0 of 1. A world size
    above 1 with no way to tell the rank is an error, never a silent rank 0."""
    if rank is not None and world_size is not None:
        return rank, world_size, "arguments"
    found: Optional[Tuple[int, int, str]] = None
    dist = sys.modules.get("torch.distributed")  # never imports torch
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            found = (int(dist.get_rank()), int(dist.get_world_size()), "torch.distributed")
    except Exception:  # a half-built process group: fall back to the environment
        found = None
    if found is None:
        env_rank = _env_int("RANK", minimum=0)
        env_world = _env_int("WORLD_SIZE", minimum=1)
        if env_rank is not None or env_world is not None:
            if env_rank is None and (env_world or 1) > 1 and rank is None:
                raise ConfigError(
                    f"WORLD_SIZE={env_world} is set but RANK is not, so this process's share "
                    "cannot be told (Lightning's launcher sets only LOCAL_RANK and NODE_RANK): "
                    "build the loader once torch.distributed is initialized (in a "
                    "LightningModule's or DataModule's train_dataloader()), or pass rank= and "
                    "world_size="
                )
            found = (env_rank or 0, env_world or 1, "RANK/WORLD_SIZE")
    if found is None:
        slurm_rank = _env_int("SLURM_PROCID", minimum=0)
        slurm_world = _env_int("SLURM_STEP_NUM_TASKS", minimum=1) or _env_int(
            "SLURM_NTASKS", minimum=1
        )
        if slurm_rank is not None and slurm_world is not None:
            found = (slurm_rank, slurm_world, "SLURM")
    if found is None:
        found = (0, 1, "default")
    if rank is not None:
        return rank, found[1], "arguments"
    if world_size is not None:
        if found[2] == "default" and world_size > 1:
            raise ConfigError(
                f"world_size={world_size} was given but not rank=, and neither "
                "torch.distributed nor the environment (RANK, SLURM_PROCID) tells this "
                "process's rank: pass rank= too"
            )
        return found[0], world_size, "arguments"
    return found


def _env_int(name: str, *, minimum: int) -> Optional[int]:
    """An integer environment variable (torchrun's), None when unset."""
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(
            f"invalid {name} environment variable: {text!r} is not an integer "
            "(torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; unset it or pass rank= and "
            "world_size= explicitly)"
        ) from None
    if value < minimum:
        raise ConfigError(
            f"invalid {name} environment variable: must be at least {minimum}, got {value}"
        )
    return value


def _as_list(transforms: Union[Transform, Sequence[Transform], None]) -> List[Transform]:
    if transforms is None:
        return []
    if callable(transforms) or isinstance(transforms, Mapping):
        return [transforms]
    return list(transforms)


_PICKLES = ("pyd", "pkl", "pickle")


def _with_unpicklers(transforms: List[Transform]) -> List[Transform]:
    """After each op spec whose ``auto`` op lets pickles through (``"pickle": True``), a
    transform that unpickles them, as the ``webdataset`` package's default decoder does: the
    explicit opt-in for members whose loading runs code. Their values must be what a batch
    holds (numbers, strings, bytes, lists, dicts, numpy arrays)."""
    out: List[Transform] = []
    for t in transforms:
        out.append(t)
        if not isinstance(t, Mapping):
            continue
        keys: "set[str]" = set()
        for key, entry in t.items():
            ops = entry.get("ops", []) if isinstance(entry, Mapping) else entry
            if any(isinstance(op, Mapping) and op.get("op") == "auto" and op.get("pickle")
                   for op in ops or []):
                keys.update(k.strip() for k in str(key).split(";"))
        if keys:
            out.append(_Unpickle(frozenset(keys)))
    return out


class _Unpickle:
    """Unpickles the pickle members (``.pyd``, ``.pkl``, ``.pickle``) among ``keys`` (``*``:
    any field)."""

    def __init__(self, keys: "frozenset[str]") -> None:
        self.keys = keys

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        import pickle

        for k, v in sample.items():
            if not isinstance(v, bytes) or not ("*" in self.keys or k in self.keys):
                continue
            name = k[:-3] if k.endswith(".gz") else k
            if name.rsplit(".", 1)[-1] in _PICKLES:
                sample[k] = pickle.loads(v)
        return sample


def _transform(t: Transform) -> Any:
    """What the native loader takes: a native op spec as JSON text, or (callable, takes_rng)."""
    if isinstance(t, Mapping):
        try:
            return json.dumps(t)
        except TypeError as e:
            raise ConfigError(f"invalid transforms: an op spec must be JSON data: {e}") from None
    if not callable(t):
        raise TypeError(
            f"transforms must be callables f(sample) or f(sample, rng), or op specs (a dict of "
            f"field -> ops, e.g. {{'jpg': [{{'op': 'decode'}}]}}); got {t!r}"
        )
    return (t, _accepts_rng(t))


def _accepts_rng(f: Any) -> bool:
    """Whether ``f`` takes ``(sample, rng)``: two required positional parameters, or a second
    positional parameter named ``rng``."""
    try:
        params = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) >= 2:
        return True
    if len(positional) >= 2 and positional[1].name == "rng":
        return True
    return any(p.kind == p.VAR_POSITIONAL for p in params) and len(positional) < 2


def _converter(output: str) -> Optional[Callable[[Any], Any]]:
    """What each tensor column is handed through (None: the chute.Tensor itself)."""
    if output == "numpy":
        return numpy.asarray
    if output == "dlpack":
        return None
    if output == "torch":
        try:
            import torch  # type: ignore[import-not-found, unused-ignore]
        except ImportError as e:
            raise ImportError(
                "chute.Loader(output='torch') needs PyTorch (pip install torch); "
                "output='numpy' or 'dlpack' do not"
            ) from e
        # getattr: the same type check passes with and without torch installed.
        return cast(Callable[[Any], Any], getattr(torch, "from_dlpack"))
    try:
        import jax.numpy as jnp  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        raise ImportError(
            "chute.Loader(output='jax') needs JAX (pip install jax); output='numpy' or "
            "'dlpack' do not"
        ) from e
    return cast(Callable[[Any], Any], jnp.from_dlpack)


def _find_torch_cudart() -> None:
    """Points the engine at the CUDA runtime PyTorch ships (pip wheels bundle it in
    site-packages/nvidia/...), when torch is already imported and CHUTE_CUDART is unset: the
    engine dlopens CHUTE_CUDART first, then libcudart.so* from the system's search path."""
    if os.environ.get("CHUTE_CUDART") or "torch" not in sys.modules:
        return
    roots = [p for p in sys.path if p and os.path.isdir(p)]
    torch = sys.modules["torch"]
    torch_file = getattr(torch, "__file__", None)
    patterns = [os.path.join(r, "nvidia", "cuda_runtime", "lib", "libcudart.so*") for r in roots]
    patterns += [os.path.join(r, "nvidia", "*", "lib", "libcudart.so*") for r in roots]
    if torch_file:
        patterns.append(os.path.join(os.path.dirname(torch_file), "lib", "libcudart*.so*"))
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            os.environ["CHUTE_CUDART"] = found[-1]
            return


def _warn_pin_memory(reason: str) -> None:
    global _warned_pin_memory
    if _warned_pin_memory:
        return
    _warned_pin_memory = True
    warnings.warn(
        f"chute: pin_memory=True but {reason}: using ordinary memory",
        RuntimeWarning,
        stacklevel=3,
    )


@functools.lru_cache(maxsize=None)
def _torch_dataset_class() -> type:
    try:
        import torch.utils.data  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        raise ImportError("Loader.as_torch_dataset() needs PyTorch (pip install torch)") from e

    # An Any-typed base: the type check is the same with torch installed (a generic base) or
    # not (an unknown module).
    base: Any = torch.utils.data.IterableDataset

    class LoaderDataset(base):  # type: ignore[misc]
        """A ``chute.Loader`` as an ``IterableDataset``: each ``iter()`` is one epoch of
        batches. Use ``DataLoader(ds, batch_size=None, num_workers=0)``."""

        def __init__(self, loader: Loader) -> None:
            self.loader = loader

        def __iter__(self) -> Iterator[Dict[str, Any]]:
            info = torch.utils.data.get_worker_info()
            if info is not None and info.num_workers > 1:
                raise ConfigError(
                    f"invalid num_workers: a chute loader inside DataLoader(num_workers="
                    f"{info.num_workers}) would deliver every batch {info.num_workers} "
                    "times; use num_workers=0 (chute already runs its own worker threads)"
                )
            return iter(self.loader)

        def __len__(self) -> int:
            return len(self.loader)

        def state_dict(self) -> Dict[str, Any]:
            return self.loader.state_dict()

        def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
            self.loader.load_state_dict(state_dict)

    LoaderDataset.__module__ = "chute"
    return LoaderDataset


class Diagnosis(Dict[str, Any]):
    """What ``chute.doctor`` found, as a dict (the fields of Rust's ``Diagnosis``:
    ``stages``, ``trials``, ``bottleneck``, ``recommended_workers``, ``recommended_prefetch``,
    ``predicted_wait_fraction``, ``advice`` (``[{"rule": ..., "message": ...}]``)...), plus
    ``recommended_prefetch_factor`` (``recommended_prefetch``, the queue depth, as
    ``chute.Loader``'s ``prefetch_factor``); ``str()`` gives the report in plain words
    (``text``)."""

    def __str__(self) -> str:
        return str(self.get("text", ""))

    @property
    def rules(self) -> List[str]:
        """The names of the rules that gave advice."""
        return [a["rule"] for a in self.get("advice", [])]


def doctor(
    source: Any,
    *,
    step_ms: Optional[float] = None,
    target_samples_per_s: Optional[float] = None,
    seconds: float = 1.5,
    try_workers: Optional[Sequence[int]] = None,
    **loader_args: Any,
) -> Diagnosis:
    """Runs the pipeline briefly on ``source`` (what ``chute.Loader`` takes, with the same
    keyword arguments: ``batch_size``, ``num_workers``, ``transforms``...) and says where the
    time goes: each stage alone on one thread (``read``, ``transform``, ``collate``, and
    ``consumer``: the hand-over of each batch to Python), the whole loader with a few worker
    counts (``try_workers``, default 1, 2, 4... up to twice the cores), which stage binds,
    the workers and prefetch depth that keep a ``step_ms`` training step (or
    ``target_samples_per_s``) fed, the wait it predicts, and advice where a known cause
    applies (rules ``workers``, ``prefetch``, ``no-scaling``, ``consumer``, ``not-indexed``,
    ``page-cache``, ``remote-read-ahead``, ``streaming-shuffle``, ``reduced-decode``, and for a
    Python dataset on threads ``gil``: its ``__getitem__`` read on one thread and on two,
    ``worker_probe``, and process mode advised when two threads are under 1.8x as fast).
    Each measurement runs ``seconds``. ``print(chute.doctor(...))`` shows the report."""
    loader = Loader(source, **loader_args)
    try:
        return loader.doctor(
            step_ms=step_ms,
            target_samples_per_s=target_samples_per_s,
            seconds=seconds,
            try_workers=try_workers,
        )
    finally:
        loader.close()


def serve_metrics(port: int = 0, address: str = "127.0.0.1") -> int:
    """Serves every live loader's metrics for Prometheus at ``http://ADDRESS:PORT/metrics``
    (text exposition format) on a background thread for the rest of the process, and returns
    the port (chosen by the system when ``port`` is 0). Series are labelled with each loader's
    ``rank`` and ``name`` (``loader``), so one dashboard shows every rank: see the README's
    "Is my GPU waiting?". Bound to this machine only unless ``address`` says otherwise
    (``"0.0.0.0"`` for every interface)."""
    return _chute.serve_metrics(port, address)


def _at_exit() -> None:
    # Transforms stop calling into Python first, then every loader's threads are stopped
    # while the interpreter still lets them take the GIL to finish a call in progress.
    _chute.shutdown()
    for loader in list(_live):
        loader.release()
    _settle_native_threads()


def _runnable_threads() -> Optional[int]:
    """Threads of this process other than the calling one that are running or runnable
    (Linux's /proc/self/task; None where it cannot be read)."""
    me = threading.get_native_id()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    n = 0
    for tid in tasks:
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        # "pid (comm) S ...": the state follows the last ')' (comm may hold one).
        state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
        n += state == b"R"
    return n


def _settle_native_threads(limit: float = 0.25) -> None:
    """Lets other native threads finish what they are doing with Python objects while the
    interpreter still accepts them (RELIABILITY.md, "Exit"): the GIL is released in short
    sleeps until no other thread of the process is running or runnable (at most ``limit``
    seconds). Once the interpreter starts finalizing, Python 3.11 to 3.13 end any thread that
    takes the GIL with ``pthread_exit``, whose forced unwinding through a C++ destructor is
    ``std::terminate``: SIGABRT, "terminate called without an active exception". torch's
    gloo workers drop finished collectives (and the Python objects their captured thread-local
    state holds) just after the caller has been woken, so a job whose last collective
    completes as ``main()`` returns would otherwise abort now and then."""
    if _runnable_threads() is None:
        time.sleep(0.02)  # not Linux: a fixed pause does most of it
        return
    deadline = time.monotonic() + limit
    quiet = 0
    while time.monotonic() < deadline and quiet < 2:
        time.sleep(0.002)  # the GIL is free: a thread waiting for it gets it now
        quiet = quiet + 1 if _runnable_threads() == 0 else 0


atexit.register(_at_exit)
