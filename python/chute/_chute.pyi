"""Type stubs of the extension module ``chute._chute`` (python/src/)."""

import os
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union, final

__all__ = [
    "Loader",
    "MegatronWriter",
    "Source",
    "Tensor",
    "WorkerSockets",
    "__version__",
    "arrow",
    "arrow_table",
    "collate_samples",
    "dataset",
    "io_stats",
    "limits",
    "map_dataset",
    "mix",
    "parquet",
    "process_dataset",
    "serve_metrics",
    "serve_worker",
    "set_limits",
    "set_remote_options",
    "shutdown",
    "tfrecord",
    "tokens",
    "webdataset",
]

__version__: str

_Path = Union[str, os.PathLike[str]]
_DType = Any  # a numpy dtype name ("uint16"), a numpy dtype or a numpy scalar type

@final
class Source:
    """A dataset chute can load (``chute.dataset``, ``tokens``, ``webdataset``, ``tfrecord``,
    ``parquet``, ``arrow``)."""

    def __len__(self) -> int: ...
    @property
    def format(self) -> str: ...
    @property
    def column_types(self) -> Dict[str, str]:
        """The source types of the columns a batch holds as numbers of another type, in
        column order: ``{"ts": "timestamp[us, tz=UTC]", "day": "date32[day]", "price":
        "decimal128(10, 2)", "cat": "dictionary<Int32, Utf8>"}``."""
    @property
    def dictionaries(self) -> Dict[str, List[Any]]:
        """The dictionary of each column read as codes (``dictionaries="codes"``): code ``i``
        stands for value ``i`` (``{"level": ["low", "mid", "high"]}``)."""
    @property
    def numpy_types(self) -> Dict[str, str]:
        """The numpy dtypes of the time columns (timestamps of any zone, as UTC instants;
        dates; durations) that ``Loader(output="numpy")`` views their int64 counts as:
        ``{"ts": "datetime64[us]", "wait": "timedelta64[ms]"}`` (nulls ``NaT``)."""
    @property
    def structure(self) -> Any: ...
    @property
    def shards(self) -> List[Tuple[str, int]]: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def stats(self) -> Optional[Dict[str, Any]]: ...
    @property
    def mixture(self) -> Optional[Dict[str, Any]]: ...

def dataset(
    paths: Union[_Path, Sequence[_Path], Any],
    format: Optional[str] = None,
    *,
    seq_len: Optional[int] = None,
    dtype: Optional[_DType] = None,
    out_dtype: Optional[_DType] = None,
    columns: Optional[Sequence[str]] = None,
    chunk_rows: Optional[int] = None,
    stack: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
    cache_bytes: Optional[int] = None,
    nulls: str = "mask",
    fill_null: Optional[float] = None,
    structs: str = "flatten",
    decimals: str = "float",
    dictionaries: str = "values",
    index: str = "auto",
    raw: bool = False,
    verify_checksums: bool = True,
    pack: Optional[str] = None,
    eos_id: Optional[int] = None,
    pad_id: int = 0,
    long: str = "split",
    pack_window: int = 1024,
    pack_seed: int = 0,
    pad_to_multiple_of: int = 1,
    bucket: int = 0,
    tokenizer: Optional[_Path] = None,
    text_field: str = "text",
    add_special_tokens: bool = True,
    chat: Optional[bool] = None,
    chat_template: Optional[str] = None,
    chat_template_name: Optional[str] = None,
    chat_template_kwargs: Optional[Mapping[str, Any]] = None,
    train_on: str = "assistant",
    train_on_eos: bool = True,
    truncation: str = "keep_start",
    chat_date: Optional[str] = None,
    messages_field: str = "messages",
    padding_free: bool = False,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
) -> Source:
    """Any dataset: shard files or URLs, brace patterns, globs, a folder (its shards, sorted, or
    its ``manifest.json``) or a ``manifest.json``; ``format`` ("tokens", "webdataset",
    "tfrecord", "parquet", "arrow", "megatron", "json") detected from the manifest or the
    extensions unless given; packing options as for ``tokens``. ``stack`` (Parquet, Arrow,
    JSON): ``{name: columns}`` stacks numeric columns of one dtype into one ``[B, k]`` column on
    the workers (columns a list, or a string such as ``"f{0..15}"``). ``cache_bytes``
    (Parquet): as for ``parquet``. ``nulls`` and ``fill_null`` (Parquet, Arrow, JSON): as for
    ``parquet``.

    JSON Lines (``.jsonl``, ``.ndjson``, also ``.gz`` or ``.zst``; a ``.json`` file of JSON
    Lines or of one array of records with ``format="json"``) are records: the schema is
    inferred over every line as ``datasets``' JSON loader infers it when opened, the lines
    decoded into Arrow by the loader's workers when first read, and the columns are those of
    an Arrow file of the same
    records (structs by path, nested values as lists and dicts, nulls masked). A line that is
    not JSON, or a value of another type than its field's, is a ``CorruptDataError`` naming
    the file and the line.

    Tokenized Parquet or Arrow (Hugging Face's layout, one document a row) pack with ``pack``:
    the ids in ``columns[0]`` (default ``input_ids``), and with ``columns=["input_ids",
    "labels"]`` a ``labels`` column (int64, aligned with ``tokens``, -100 on padding).

    With ``tokenizer`` (a ``tokenizer.json``), the paths hold text: JSON Lines, Parquet, Arrow,
    tar, TFRecord or text files, each document's text under ``text_field`` (a key, column, tar
    member extension such as ``"txt"``, or feature; a text file is one document). Every
    document is tokenized when the source is opened, on every core without the GIL, with the
    tokenizer's special tokens when ``add_special_tokens`` (as ``Tokenizer.encode``), and
    packed by ``pack`` (``"concat"`` by default; ``eos_id`` appended after each document), so
    the epoch's row count is known before the first batch.

    With ``chat=True`` (or a ``chat_template``), ``tokenizer`` is a tokenizer folder as
    ``save_pretrained`` writes it (``tokenizer.json``, ``tokenizer_config.json`` with the
    ``chat_template`` and the special tokens, or ``chat_template.jinja``), and the paths (or a
    ``datasets.Dataset``) hold rows of conversations (``messages_field``, default
    ``messages``, with ``tools``, ``documents`` and ``chat_template_kwargs`` when a row has
    them), prompts and completions (``prompt``, ``completion``: strings or messages) or
    instruction records (``instruction``, ``input``, ``output``). Each row is rendered with the
    chat template as ``transformers``' ``apply_chat_template`` renders it (``chat_template``:
    a template's text or a ``.jinja`` file instead; ``chat_template_name`` picks a named one;
    ``chat_template_kwargs`` adds variables such as ``enable_thinking``; ``chat_date`` pins
    ``strftime_now``, by default today in UTC; ``add_generation_prompt`` and
    ``continue_final_message`` as ``apply_chat_template`` takes them), tokenized without
    adding special tokens, and
    labelled: ``labels`` holds the id where the loss counts it and -100 elsewhere, the
    ``{% generation %}`` blocks' tokens where the template has them (exactly
    ``return_assistant_tokens_mask``), else each assistant reply through its end-of-turn token
    (``train_on``: ``"assistant"``, ``"last"`` or ``"all"``; ``train_on_eos``; a message's
    ``train`` flag is honoured). Prompts and completions are masked as TRL's ``SFTTrainer``
    masks them. A row longer than ``seq_len`` is cut (``truncation``: ``"keep_start"``,
    ``"keep_end"`` keeping the system prompt, ``"drop"``, or ``"split"`` into conversations of
    the system prompt and whole turns that fit); a row with no trained token is
    left out; the counts are in ``Source.stats`` and ``Loader.stats()["source"]`` (``chat``:
    ``rows``, ``kept``, ``truncated``, ``split``, ``documents``, ``skipped_*``). Rows are packed by ``pack`` (``"pad"``, one
    conversation a row, by default; ``best_fit`` and ``document`` give ``position_ids`` that
    restart at each conversation, ``cu_seqlens`` and ``max_seqlen``).

    ``padding_free=True`` (``pack="pad"``): a batch is its rows laid end to end, ``[1, N]``,
    without padding, as ``transformers``' ``DataCollatorWithFlattening`` lays them out:
    ``tokens``, ``position_ids`` restarting at each row, ``labels`` with -100 at each row's
    first token, ``cu_seqlens`` (``[B + 1]``, int32) and ``max_seqlen`` (``[1]``, int32), for
    variable-length attention. It applies on the columnar path (a loader without
    ``transforms``)."""

def collate_samples(
    samples: List[Any], pad: bool = False, output: Optional[Callable[[Any], Any]] = None
) -> Tuple[Dict[str, Any], Any]:
    """Samples collated as a Python dataset's are (default_collate's structure, from the first):
    the columns (handed through ``output``) and the structure to rebuild them with."""

def map_dataset(
    dataset: Any,
    worker_init_fn: Optional[Callable[[int], Any]] = None,
    num_workers: int = 0,
    collate_fn: Optional[Callable[[List[Any]], Any]] = None,
) -> Source:
    """A map-style Python dataset (``__len__`` and ``__getitem__``) as a source; what
    ``chute.Loader`` calls for anything that is not a chute source. With ``collate_fn``, each
    batch is ``collate_fn([samples])``, made on the worker thread."""

@final
class WorkerSockets:
    """The sockets of a source's worker processes (``worker_mode="process"``)."""

    def close(self) -> None:
        """Closes every worker's socket: each process ends at its next read."""
    def add(self, worker: Tuple[int, int, int, int]) -> None:
        """A worker process that started: its ``(socket fd, arena memfd, index, pid)``."""
    def fail(self, why: str) -> None:
        """A worker process that failed to start: every read from now on fails with it."""

def process_dataset(
    source: Source,
    starting: int,
    timeout: float = 0.0,
    restart: Optional[Callable[[int], Tuple[int, int, int, int]]] = None,
    grow: Optional[Callable[[int], Tuple[int, int, int, int]]] = None,
    limit: int = 0,
    early: bool = False,
    transforms: Optional[List[Any]] = None,
) -> Tuple[Source, WorkerSockets]:
    """``source`` (from ``map_dataset``) read by worker processes, ``starting`` of which are
    being started (each handed over with ``WorkerSockets.add`` once ready); with ``early``,
    reads made before any is ready are made here, through ``transforms``. ``restart(index)``
    starts a process in place of one that died; ``grow(index)`` starts the next one when all
    are busy and fewer than ``limit`` run."""

def serve_worker(
    sock: int,
    memfd: int,
    dataset: Any,
    collate_fn: Optional[Callable[[List[Any]], Any]] = None,
    transforms: Optional[List[Any]] = None,
) -> None:
    """A worker process's loop: answers the parent's requests on ``sock`` with samples of
    ``dataset`` laid out in the arena ``memfd``, until the parent closes the socket."""

def tokens(
    paths: Union[_Path, Sequence[_Path]],
    seq_len: int,
    dtype: Optional[_DType] = None,
    out_dtype: _DType = "int64",
    *,
    documents: Optional[str] = None,
    eos_id: Optional[int] = None,
    pack: Optional[str] = None,
    pad_id: int = 0,
    long: str = "split",
    pack_window: int = 1024,
    pack_seed: int = 0,
    pad_to_multiple_of: int = 1,
    bucket: int = 0,
) -> Source:
    """Token files (nanoGPT's ``.bin``) or Megatron indexed datasets (``.bin`` + ``.idx``, by
    prefix). Without documents: windows of ``seq_len + 1`` tokens per file, column ``tokens``.
    With documents (a Megatron dataset; token files with ``eos_id`` ending each document;
    ``documents="megatron"`` or ``"eos"`` to force), packed by ``pack``:

    - ``"concat"`` (default): ``tokens`` ``[seq_len + 1]``, windows across documents, the
      documents reshuffled every epoch when the loader shuffles;
    - ``"document"``: also ``position_ids`` ``[seq_len + 1]`` int64 (0 at every document
      start), ``segment_ids`` ``[seq_len + 1]`` int32 (1, 2, ... per document in the window) and
      ``cu_seqlens`` (int32, one array per sample: piece starts, then ``seq_len + 1``);
    - ``"best_fit"``: ``tokens`` ``[seq_len]`` of whole documents padded with ``pad_id``,
      ``position_ids``, ``segment_ids`` (0 on padding) and ``loss_mask`` (bool); longer
      documents are split or dropped (``long``); packed best-fit decreasing over windows of
      ``pack_window`` documents in an order keyed by ``pack_seed``;
    - ``"pad"``: one document per row, cut to ``seq_len`` (its EOS kept): ``tokens``
      ``[L]`` padded with ``pad_id`` to the batch's longest rounded up to
      ``pad_to_multiple_of``, and ``tokens_mask`` ``[L]`` (bool, false on padding); with
      ``bucket`` > 0, each run of ``bucket`` rows of the epoch's order (all ranks) is sorted
      by length, so a batch holds documents of similar lengths (``group_by_length``).

    For Megatron datasets ``eos_id`` is appended after every document. Local files are
    memory-mapped; URLs are downloaded whole when the source is opened."""

def webdataset(urls: Union[_Path, Sequence[_Path]], *, index: str = "auto") -> Source:
    """WebDataset tar shards, paths or URLs (http(s)://, s3://, gs://, az://; brace patterns,
    globs, folders, manifests): fields by extension, plus ``__key__``."""

def tfrecord(
    urls: Union[_Path, Sequence[_Path]],
    *,
    features: Optional[Sequence[str]] = None,
    raw: bool = False,
    verify_checksums: bool = True,
    index: str = "auto",
) -> Source:
    """TFRecord files of ``tf.train.Example``s, paths or URLs: one column per feature (or raw
    records)."""

def set_remote_options(
    *,
    read_ahead: Optional[int] = None,
    retries: Optional[int] = None,
    retry_budget: Optional[float] = None,
    timeout: Optional[float] = None,
    cache_dir: Optional[_Path] = None,
    cache_limit: Optional[int] = None,
) -> None:
    """How URLs are read (read-ahead shards, retries, seconds, node-local cache), for sources
    opened from now on; ``None`` keeps the ``CHUTE_*`` environment value or the default."""

def set_limits(
    *,
    max_image_pixels: Optional[int] = None,
    max_record_bytes: Optional[int] = None,
    max_decoded_bytes: Optional[int] = None,
    max_features: Optional[int] = None,
    max_text_bytes: Optional[int] = None,
) -> None:
    """Sets this process's limits on sizes read from the data (as PIL's ``MAX_IMAGE_PIXELS``),
    for sources opened and transforms built from now on; ``None`` keeps a limit's value.

    ``max_image_pixels``: pixels an image header may declare (default 178,956,970, PIL's
    ``DecompressionBombError`` limit). ``max_record_bytes``: a tar member or TFRecord record
    (1 GiB). ``max_decoded_bytes``: a Parquet page, a dictionary page's values, a
    column of a row group and the columns read from it together, an Arrow record batch, once
    decompressed (1 GiB). ``max_features``: features of one ``tf.train.Example``
    (100,000). ``max_text_bytes``: text handed to a tokenizer at once (16 MiB). A size over a
    limit is a data error naming the sample, the size and the limit (skipped and counted under
    ``on_error="skip"``); nothing is allocated for it."""

def limits() -> Dict[str, int]:
    """The limits in force, by name (see ``set_limits``)."""

def io_stats() -> Dict[str, int]:
    """Remote reads since the process started: ``bytes_fetched``, ``requests``, ``retries``,
    ``cache_hits``, ``shards_fetched``, ``failures``."""

def parquet(
    urls: Union[_Path, Sequence[_Path]],
    *,
    columns: Optional[Sequence[str]] = None,
    chunk_rows: Optional[int] = None,
    stack: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
    cache_bytes: Optional[int] = None,
    nulls: str = "mask",
    fill_null: Optional[float] = None,
    structs: str = "flatten",
    decimals: str = "float",
    dictionaries: str = "values",
) -> Source:
    """Parquet files, paths or URLs (downloaded whole when opened): projected columns; numeric
    ``[B]``, fixed-size lists ``[B, k]``; ``stack={"x": ["f0", "f1"]}`` (or ``"f{0..15}"``)
    stacks numeric columns of one dtype into one ``[B, k]`` column ``x`` on the workers.
    Timestamps, dates, times and durations come out as int64 counts of their unit (numpy
    ``datetime64`` / ``timedelta64`` from a loader with numpy output; see
    ``Source.numpy_types``), decimals as float64 (the nearest double) or, with
    ``decimals="exact"``, ``decimal.Decimal`` values (a list a batch, as pyarrow's
    ``to_pylist`` gives them; a Python transform sees their text), fixed-size binary as
    ``[B, k]`` uint8, dictionary columns as their values or, with ``dictionaries="codes"``,
    int64 codes into one dictionary for the source (``Source.dictionaries``).
    ``nulls="mask"`` (the default): a column that holds nulls (as the files' metadata says)
    has its null slots filled (``fill_null`` for numbers, else NaN for floats and 0 for
    integers; false, empty bytes, text and lists) and a ``<name>_valid`` bool column, true
    where a value is present, in every batch; ``nulls="fill"``: the slots filled the same way
    and no ``_valid`` column (pandas' ``fillna``: temporal columns then hold the fill's count,
    not ``NaT``); ``nulls="raise"``: a null is an error naming the file, the column and the
    row. A struct column is read as its leaves, a column each named
    by its path (``meta.a``; ``columns=["meta.a"]`` selects one, ``columns=["meta"]`` all of
    them), or whole with ``structs="record"`` (a dict a row). Lists of strings or structs,
    lists of lists, maps and unions are nested values: a Python list a batch of lists, dicts
    (every field, ``None`` where null), ``(key, value)`` tuples for maps and scalars.
    Shards are chunks of ``chunk_rows`` rows (default 16,384) of a row group. A row group is
    decoded a piece at a time (a run of whole chunks, about 16 MiB decoded), and a piece leaves
    memory as soon as the epoch has read its rows (streaming); ``cache_bytes`` keeps the
    decoded data for later epochs when it fits in that many bytes. ``shuffle="block"`` reads
    pieces in random order and a piece's chunks together, in random order, so each piece is
    decoded once an epoch. A global shuffle needs the cache to hold the whole dataset (each
    batch draws from every piece): without that room it is refused at the first batch, naming
    the ``cache_bytes`` that would do."""

def arrow(
    data: Any,
    *,
    columns: Optional[Sequence[str]] = None,
    chunk_rows: Optional[int] = None,
    stack: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
    nulls: str = "mask",
    fill_null: Optional[float] = None,
    structs: str = "flatten",
    decimals: str = "float",
    dictionaries: str = "values",
) -> Source:
    """Arrow IPC files or streams (paths or URLs, folders, globs, manifests; memory-mapped), or
    Arrow data in memory (anything with ``__arrow_c_stream__``: a pyarrow ``Table``, a Polars
    ``DataFrame``), read in place: numbers and bools ``[B]``, fixed-size lists ``[B, k]``,
    lists of numbers one array per sample, binary and strings lists; other types, nulls
    (``nulls``, ``fill_null``), structs (``structs``), decimals (``decimals``), dictionaries
    (``dictionaries``) and nested values as for ``parquet``. A Hugging Face
    ``datasets.Dataset`` is read as ``chute.Loader(ds)`` reads it (its table in place, its
    indices mapping applied), with these options (``chute.arrow(ds, decimals="exact")``)."""

def arrow_table(
    data: Any,
    *,
    indices: Optional[bytes] = None,
    columns: Optional[Sequence[str]] = None,
    chunk_rows: Optional[int] = None,
    stack: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
    name: str = "arrow",
    nulls: str = "mask",
    fill_null: Optional[float] = None,
    structs: str = "flatten",
    decimals: str = "float",
    dictionaries: str = "values",
) -> Source:
    """Arrow data in memory (``__arrow_c_stream__``) as a source, with an optional row mapping
    (little-endian uint64 bytes: sample ``i`` is row ``indices[i]``); what ``chute.Loader``
    uses for a Hugging Face dataset."""

@final
class MegatronWriter:
    """Writes a Megatron-Core indexed dataset (``<prefix>.bin`` + ``<prefix>.idx``) byte for
    byte as Megatron-Core's ``IndexedDatasetBuilder`` does; files are renamed into place by
    ``finish()`` (the ``.idx`` last)."""

    def __new__(cls, prefix: _Path, dtype: Optional[_DType] = None) -> "MegatronWriter": ...
    def add_document(self, ids: Sequence[int]) -> None: ...
    @property
    def documents(self) -> int: ...
    def finish(self) -> int: ...
    def __enter__(self) -> "MegatronWriter": ...
    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool: ...

@final
class Tensor:
    """A batch column in chute's pooled buffer; numpy / DLPack views share its memory."""

    @property
    def data_ptr(self) -> int: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def ndim(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

@final
class Loader:
    """The engine's loader; ``chute.Loader`` is the public face with DataLoader's arguments."""

    def __new__(
        cls,
        source: Source,
        *,
        batch_size: int = 1,
        shuffle: str = "none",
        seed: int = 0,
        num_workers: int = 0,
        prefetch: int = 2,
        drop_last: bool = False,
        pin_memory: bool = False,
        rank: int = 0,
        world_size: int = 1,
        epoch: int = 0,
        transforms: Optional[List[Union[str, Tuple[Callable[..., Any], bool]]]] = None,
        on_error: str = "raise",
        output: Optional[Callable[[Tensor], Any]] = None,
        pad: bool = False,
        timeout: float = 0.0,
        name: Optional[str] = None,
        stats_window: float = 10.0,
        autotune: Optional[Tuple[int, int]] = None,
    ) -> "Loader": ...
    def __iter__(self) -> Iterator[Dict[str, Any]]: ...
    def __next__(self) -> Dict[str, Any]: ...
    def __len__(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> Dict[str, Any]: ...
    def load_state_dict(self, state: Any) -> None: ...
    def stats(self) -> Dict[str, Any]: ...
    def doctor(
        self,
        *,
        step_ms: Optional[float] = None,
        target_samples_per_s: Optional[float] = None,
        seconds: float = 1.5,
        try_workers: Optional[List[int]] = None,
    ) -> str: ...
    @property
    def pinned(self) -> bool: ...
    @property
    def pin_memory_fallback(self) -> Optional[str]: ...
    @property
    def options(self) -> Dict[str, Any]: ...
    @property
    def closed(self) -> bool: ...
    def release(self) -> None: ...

def serve_metrics(port: int = 0, address: str = "127.0.0.1") -> int:
    """Serves every live loader's metrics for Prometheus; returns the port."""

def shutdown() -> None:
    """Stops transforms from calling into Python (the package's atexit hook)."""

def mix(
    components: Sequence[Tuple[str, Source, str, Optional[int], List[Any]]],
    schedule: Sequence[Tuple[int, Sequence[float]]],
    *,
    ramp: bool = False,
    mode: str = "stratified",
    policy: Optional[str] = None,
    samples_per_epoch: Optional[int] = None,
    seed: Optional[int] = None,
    source_column: Optional[str] = None,
) -> Source: ...
