"""``batch_format``: chute token batches under the names models take (``hf_batch``), the one
place both ``chute.Loader(batch_format=...)`` and the framework adapters (``_frameworks``)
take them from."""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Mapping, Union

import numpy

from ._errors import ConfigError

BatchFormat = Union[str, Callable[[Any], Any], None]

# Hugging Face's (and PyTorch's cross_entropy's) label that takes no part in the loss.
IGNORE_INDEX = -100


# Token batches ------------------------------------------------------------------------------


def hf_batch(batch: Mapping[str, Any], *, ignore_index: int = IGNORE_INDEX) -> Dict[str, Any]:
    """A chute token batch under the names Hugging Face causal LMs take: ``input_ids``,
    ``labels``, and ``attention_mask`` (padded rows) or ``position_ids`` (packed rows).

    ``batch`` is what ``chute.Loader`` yields for ``chute.tokens(...)`` /
    ``chute.dataset(..., pack=...)`` (numpy arrays or torch tensors; the result holds the
    same kind):

    - ``input_ids``: ``tokens`` as they are (``[B, seq_len + 1]`` windows give ``seq_len``
      predictions, since the model shifts the labels itself: choose ``seq_len`` one below the
      model's context), or the ``input_ids`` column a ``tokenize`` op made;
    - ``labels``: a copy of ``input_ids`` (int64), or of the batch's own ``labels`` column
      (SFT's), with ``ignore_index`` (-100) where no loss belongs: padding (``tokens_mask`` /
      ``input_ids_mask`` false, ``loss_mask`` false) and, in packed rows, each document's first
      token (``position_ids`` 0), so no document is predicted from the one before it (as
      ``DataCollatorWithFlattening`` labels them);
    - ``attention_mask``: ``tokens_mask`` (``pack="pad"``) or ``input_ids_mask`` (the
      ``tokenize`` op with ``pad=True``), as int64;
    - ``position_ids``: for packed rows (``pack="document"``, ``"best_fit"``), restarting
      at 0 at every document; with no ``attention_mask`` beside them, transformers' attention
      keeps each document to itself (see ``masking_utils.find_packed_sequence_indices``; the
      model must run without a KV cache, as ``Trainer`` runs it).

    Other columns (``segment_ids``, ``cu_seqlens``, keys) are left out: models take none of
    them. A batch without ``tokens`` or ``input_ids``, or with rows of different lengths
    not padded (give the loader ``pad=True``), is a ``ConfigError``.
    """
    if not isinstance(batch, Mapping):
        raise ConfigError(
            f"invalid batch_format 'hf': it takes a dict batch of token columns, got "
            f"{type(batch).__name__}"
        )
    if "tokens" in batch:
        name, mask_name = "tokens", "tokens_mask"
    elif "input_ids" in batch:
        name = "input_ids"
        mask_name = "input_ids_mask" if "input_ids_mask" in batch else "attention_mask"
    else:
        raise ConfigError(
            f"invalid batch_format 'hf': the batch has no 'tokens' or 'input_ids' column (it has "
            f"{', '.join(map(repr, batch)) or 'none'}); it is for token sources "
            "(chute.tokens, chute.dataset(..., pack=...)) or a tokenize op"
        )
    ids = _array(batch[name], name)
    if ids.ndim != 2:
        raise ConfigError(
            f"invalid batch_format 'hf': {name!r} must be [batch, length], got shape "
            f"{tuple(ids.shape)}"
        )
    if _dtype_name(ids) not in ("int64", "int32"):
        ids = _cast(ids, "int64")
    out: Dict[str, Any] = {"input_ids": ids}
    labels = _array(batch["labels"], "labels") if "labels" in batch else ids
    labels = _cast(labels, "int64", copy=True)
    if mask_name in batch:
        mask = _cast(_array(batch[mask_name], mask_name), "bool")
        out["attention_mask"] = _cast(mask, "int64")
        labels[~mask] = ignore_index
    if "loss_mask" in batch:
        labels[~_cast(_array(batch["loss_mask"], "loss_mask"), "bool")] = ignore_index
    if "position_ids" in batch:
        positions = _cast(_array(batch["position_ids"], "position_ids"), "int64")
        out["position_ids"] = positions
        labels[positions == 0] = ignore_index
    out["labels"] = labels
    return out


def _array(value: Any, name: str) -> Any:
    """A column as a torch tensor (kept) or a numpy array (anything else: ``chute.Tensor``,
    JAX arrays, lists of equal-length rows)."""
    if _is_tensor(value):
        return value
    if isinstance(value, list):
        lengths = {len(v) for v in value}
        if len(lengths) > 1:
            raise ConfigError(
                f"invalid batch_format 'hf': the rows of {name!r} have different lengths "
                f"({min(lengths)} to {max(lengths)}) and come as a list; give the loader "
                "pad=True so they come padded, with a mask"
            )
    return numpy.asarray(value)


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a torch tensor exists only if torch was imported
    return torch is not None and isinstance(value, torch.Tensor)


def _dtype_name(a: Any) -> str:
    return str(a.dtype).replace("torch.", "")


def _cast(a: Any, dtype: str, copy: bool = False) -> Any:
    if _is_tensor(a):
        torch = sys.modules["torch"]
        t = a.to(getattr(torch, dtype))
        return t.clone() if copy and t is a else t
    return numpy.array(a, dtype=dtype, copy=True) if copy else numpy.asarray(a, dtype=dtype)


def format_function(batch_format: BatchFormat) -> Callable[[Any], Any]:
    """The function each batch goes through: ``"auto"`` (``hf_batch`` for a dict batch with a
    ``tokens`` column, the rest as it is), ``"hf"`` (``hf_batch``), ``None`` (as it is) or
    the caller's own."""
    if callable(batch_format):
        return batch_format
    if batch_format == "hf":
        return hf_batch
    if batch_format is None:
        return lambda batch: batch
    if batch_format == "auto":
        return lambda batch: (
            hf_batch(batch) if isinstance(batch, Mapping) and "tokens" in batch else batch
        )
    raise ConfigError(
        f"invalid batch_format: {batch_format!r}; use 'auto', 'hf', None or a function of "
        "the batch"
    )
