"""LLM pre-training loaders side by side in one run: chute against Megatron-Core's `GPTDataset`,
LitData's `StreamingDataset` + `TokensLoader`, and Grain's packing transforms.

The corpus: `--tokens` token ids (default 200,000,000), uniform in [1, 50000), in documents
whose lengths follow a lognormal with median 501 tokens and sigma 1.0 (mean ~825: 200M tokens
in ~243k documents, the shape of the reference corpus), written once into the workdir as a
Megatron-Core indexed dataset (`llm-<tokens>.bin` / `.idx`, uint16) and reused after. By default
it is written with `chute.MegatronWriter`, which writes the files byte for byte as Megatron's
`IndexedDatasetBuilder` does (`add_item` + `end_document` per document) but faster;
`--writer megatron` writes them with Megatron's own builder.

Concat windows (seq_len 1024, batches of 16, every token field int64 torch tensors cut from
windows of 1,025 tokens; shuffled, seed 0):

- `chute.Loader(chute.tokens(prefix, seq_len=1024, pack="concat"), batch_size=16,
  shuffle=True, seed=0, num_workers=2, output="torch")`: `tokens` [16, 1025].
- Megatron-Core `GPTDataset` built by `BlendedMegatronDatasetBuilder` (blend of the one prefix,
  split "100,0,0", one epoch, random_seed 0, reset_position_ids / reset_attention_mask /
  eod_mask_loss False, create_attention_mask False, mmap_bin_files True, a mock tokenizer with
  eod 50000 and no pad), under `torch.utils.data.DataLoader(ds, batch_size=16)` with
  num_workers 0 and 2: `tokens` and `labels` [16, 1024] int64 (the 1,025-token window and the
  same shifted by one), `loss_mask` [16, 1024] float32, `position_ids` [16, 1024] int64.
- LitData `StreamingDataset(dir, item_loader=TokensLoader(block_size=1025), shuffle=True,
  seed=0, drop_last=True)` under `StreamingDataLoader(ds, batch_size=16)` with num_workers 0
  and 2, over the same tokens converted once with `litdata.optimize(..., chunk_size=1025 * 8000,
  item_loader=TokensLoader())` (one uint16 tensor per document; not timed, reused after):
  one uint16 tensor [16, 1025], cast to int64 in the loop.

Index build: Megatron's is the dataset construction (document, sample and shuffle indices by
its C++ helpers), into a fresh cache dir every round; chute's is `chute.tokens()` plus Loader
creation and the first batch (chute builds its order when the epoch starts). "first batch" is
the time from creating the loader (DataLoader, StreamingDataLoader, chute.Loader) to its first
batch.

Packing whole documents into rows of 1024 (documents over 1024 tokens split into pieces of
1024, as chute's default `long="split"`), shuffled:

- `chute.tokens(prefix, seq_len=1024, pack="best_fit")` (best-fit decreasing in windows of
  1,024 documents) through `chute.Loader(batch_size=16, num_workers=2)`: `tokens`,
  `position_ids`, `segment_ids`, `loss_mask`; padding = 1 - mean(loss_mask).
- Grain's `grain.experimental.FirstFitPackIterDataset` and `BestFitPackIterDataset` (documents
  as {"tokens": int32 array} from `MapDataset.source(...).shuffle(seed=0)`, length_struct
  {"tokens": 1024}, `num_packing_bins` 16 (the batch, as MaxText sets it) or 1024), `.batch(16)`,
  in the main process or under `mp_prefetch` with 2 worker processes: `tokens`,
  `tokens_segment_ids`, `tokens_positions` int32; padding = share of cells with segment id 0.
  Read with `ReadOptions(num_threads=0, prefetch_buffer_size=0)`: Grain's default read-ahead
  (16 threads, 500 elements) made it ~4x slower on 2 cores over this in-memory source.

`--batches` batches per case and round (default 20,000; a loader past its epoch starts the
next). Samples (rows) per second, the median of `--rounds` interleaved rounds, page cache warm;
every peer imported before the first round. A peer that fails to import or run prints
`failed: ...` in its row, and the script goes on.

    OPENBLAS_NUM_THREADS=1 python benchsuite/llm_vs_peers.py [--tokens 200000000]
        [--batches 20000] [--rounds 3] [--writer chute|megatron] [workdir]

At the defaults on 2 cores a round takes ~6 minutes (Grain and Megatron with workers are the
slow ones); writing the corpus and converting it for LitData, about a minute more, once.

Needs: chute, numpy, torch, megatron-core (its C++ helpers `helpers_cpp`, built by
`compile_helpers()` when missing: make, a C++ compiler, pybind11), litdata, grain.
"""

import argparse
import gc
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

import chute

SEQ, BATCH = 1024, 16
WIN = SEQ + 1
VOCAB = 50_000
MEDIAN, SIGMA = 501, 1.0


# ---------------------------------------------------------------- corpus


def write_corpus(workdir, tokens, writer):
    prefix = os.path.join(workdir, f"llm-{tokens}")
    if os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin"):
        return prefix
    rng = np.random.default_rng(0)
    lengths = []
    total = 0
    while total < tokens:
        more = np.maximum(1, rng.lognormal(np.log(MEDIAN), SIGMA, 100_000).astype(np.int64))
        lengths.append(more)
        total += int(more.sum())
    lengths = np.concatenate(lengths)
    ends = np.cumsum(lengths)
    n = int(np.searchsorted(ends, tokens)) + 1
    lengths = lengths[:n]
    lengths[-1] -= int(ends[n - 1]) - tokens
    if writer == "megatron":
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        out = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
        add = lambda ids: (out.add_item(torch.from_numpy(ids)), out.end_document())  # noqa
    else:
        out = chute.MegatronWriter(prefix, dtype="uint16")
        add = out.add_document
    t = time.perf_counter()
    step = 1 << 24  # ids drawn 16M at a time
    buf, pos = np.empty(0, np.uint16), 0
    for length in lengths:
        if pos + length > len(buf):
            buf = np.concatenate([buf[pos:], rng.integers(1, VOCAB, step, dtype=np.uint16)])
            pos = 0
        add(buf[pos:pos + length])
        pos += length
    if writer == "megatron":
        out.finalize(prefix + ".idx")
    else:
        out.finish()
    print(f"wrote {prefix}: {tokens:,} tokens in {n:,} documents (median length "
          f"{int(np.median(lengths))}) with {writer} in {time.perf_counter() - t:.1f} s",
          flush=True)
    return prefix


def read_idx(prefix):
    """Document lengths from a Megatron .idx (one sequence per document)."""
    with open(prefix + ".idx", "rb") as f:
        head = f.read(34)
        assert head[:9] == b"MMIDIDX\x00\x00", "not a Megatron index"
        count = int(np.frombuffer(head, np.uint64, 1, 18)[0])
        return np.frombuffer(f.read(4 * count), np.int32).astype(np.int64)


def pieces(prefix):
    """(start, length) of every document, those over SEQ split into pieces of SEQ."""
    lengths = read_idx(prefix)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    k = -(-lengths // SEQ)
    ps = np.repeat(starts, k) + SEQ * (np.arange(k.sum()) - np.repeat(np.cumsum(k) - k, k))
    pl = np.minimum(SEQ, np.repeat(starts + lengths, k) - ps)
    return ps, pl


# ---------------------------------------------------------------- loops


def describe(b):
    """A batch's fields as `name [shape] dtype`."""
    def one(k, v):
        if isinstance(v, list):  # one array per sample (chute's cu_seqlens)
            return f"{k} list of {len(v)} {str(v[0].dtype).replace('torch.', '')}"
        return f"{k} {list(v.shape)} {str(v.dtype).replace('torch.', '')}"

    return ", ".join(one(k, v) for k, v in b.items())


def take(make_iter, n, t=None, pad_of=None):
    """`n` batches (dicts of tensors) from `make_iter()`, restarted at the end of an epoch.
    Returns samples, seconds from `t` (default: now) to the first batch, the first batch's
    fields, and with `pad_of(batch) -> (padding cells, cells)` the padding fraction."""
    t = time.perf_counter() if t is None else t
    got, first, fields, pad, cells = 0, None, None, 0, 0
    while got < n:
        for b in make_iter():
            if pad_of is not None:
                p, c = pad_of(b)
                pad, cells = pad + p, cells + c
            if first is None:
                first = time.perf_counter() - t
                fields = describe(b)
            got += 1
            if got >= n:
                break
    out = {"n": n * BATCH, "first": first, "fields": fields}
    if pad_of is not None:
        out["pad"] = pad / cells
    return out


def chute_loader(prefix, n, pack, pad_of=None):
    """chute's index build is `chute.tokens()` (reading the .idx) plus Loader creation and the
    first batch (the first epoch's order and packing): everything before training starts."""
    t = time.perf_counter()
    src = chute.tokens(prefix, seq_len=SEQ, pack=pack)
    t0 = time.perf_counter()
    loader = chute.Loader(src, batch_size=BATCH, shuffle=True, seed=0, num_workers=2,
                          output="torch")
    r = take(lambda: loader, n, t0, pad_of)
    r["build"] = t0 - t + r["first"]
    return r


class MockTokenizer:
    """What GPTDataset asks of a tokenizer: ids outside the corpus for eod, no pad."""

    vocab_size = VOCAB + 1
    eod = VOCAB
    pad = -1
    unique_identifiers = {"class": "MockTokenizer"}


def megatron_build(prefix, cache):
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    try:
        from megatron.core.datasets import helpers_cpp  # noqa: F401
    except ImportError:
        from megatron.core.datasets.utils import compile_helpers

        try:
            compile_helpers()
        except SystemExit:
            raise RuntimeError("megatron.core.datasets helpers_cpp failed to compile") from None
    shutil.rmtree(cache, ignore_errors=True)
    os.makedirs(cache)
    kw = dict(
        random_seed=0, sequence_length=SEQ, blend=([prefix], None), split="100,0,0",
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        mmap_bin_files=True, path_to_cache=cache, tokenizer=MockTokenizer(),
    )
    if "create_attention_mask" in GPTDatasetConfig.__dataclass_fields__:
        kw["create_attention_mask"] = False
    t = time.perf_counter()
    config = GPTDatasetConfig(**kw)
    ds = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True,
                                       config).build()[0]
    return ds, time.perf_counter() - t


def megatron_run(ds, n, workers):
    from torch.utils.data import DataLoader

    return take(lambda: DataLoader(ds, batch_size=BATCH, num_workers=workers), n)


def litdata_docs(item):
    import torch

    prefix, lo, hi = item
    lengths = read_idx(prefix)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
    for i in range(lo, hi):
        yield torch.from_numpy(np.array(tokens[starts[i]:starts[i + 1]]))


def litdata_convert(prefix, out):
    """Run in a child process (`--litdata-convert`): `optimize` sets the process's
    multiprocessing start method to "spawn" and leaves threads behind, which would slow every
    DataLoader started after it in this process."""
    from litdata import TokensLoader, optimize

    shutil.rmtree(out, ignore_errors=True)
    docs = len(read_idx(prefix))
    step = -(-docs // 16)
    t = time.perf_counter()
    optimize(fn=litdata_docs, inputs=[(prefix, lo, min(docs, lo + step))
                                      for lo in range(0, docs, step)],
             output_dir=out, chunk_size=WIN * 8000, item_loader=TokensLoader(),
             num_workers=2, verbose=False)
    print(f"litdata optimize: {time.perf_counter() - t:.1f} s", flush=True)


def litdata_run(out, n, workers):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    t0 = time.perf_counter()
    ds = StreamingDataset(out, item_loader=TokensLoader(block_size=WIN), shuffle=True, seed=0,
                          drop_last=True)
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
    # LitData batches are one uint16 tensor [16, 1025]: cast to int64 as the others yield.
    return take(lambda: ({"tokens": b.long()} for b in loader), n, t0)


def chute_best_fit(prefix, n):
    # Padding is where loss_mask is 0 (the cells of segment id 0).
    return chute_loader(prefix, n, "best_fit",
                        lambda b: (int(b["loss_mask"].numel() - b["loss_mask"].sum()),
                                   b["loss_mask"].numel()))


class Pieces:
    """Grain source: every document (piece) as {"tokens": int32 array}."""

    def __init__(self, prefix):
        self.bin = prefix + ".bin"
        self.starts, self.lengths = pieces(prefix)
        self.tokens = None

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        if self.tokens is None:
            self.tokens = np.memmap(self.bin, dtype=np.uint16, mode="r")
        s = self.starts[i]
        return {"tokens": self.tokens[s:s + self.lengths[i]].astype(np.int32)}

    def __getstate__(self):
        return {**self.__dict__, "tokens": None}


def grain_pack(source, n, kind, bins, workers):
    import grain
    import grain.experimental as ge

    t = time.perf_counter()
    cls = {"first": ge.FirstFitPackIterDataset, "best": ge.BestFitPackIterDataset}[kind]
    # No read threads: the source is a slice of an mmap, and grain's default read-ahead (16
    # threads, 500 elements) made packing 4x slower on 2 cores.
    ds = grain.MapDataset.source(source).shuffle(seed=0).repeat()
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    ds = cls(ds, length_struct={"tokens": SEQ}, num_packing_bins=bins, seed=0)
    ds = ds.batch(BATCH)
    if workers:
        from absl import flags

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()  # grain's worker processes read its absl flags
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    # Padding is where the segment id is 0.
    return take(lambda: ds, n, t,
                lambda b: (int((b["tokens_segment_ids"] == 0).sum()),
                           b["tokens_segment_ids"].size))


# ---------------------------------------------------------------- main


def short(e):
    msg = f"{type(e).__name__}: {e}".replace("|", "/").replace("\n", " ")
    return "failed: " + (msg[:160] + "..." if len(msg) > 160 else msg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200_000_000)
    ap.add_argument("--batches", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writer", choices=["chute", "megatron"], default="chute")
    ap.add_argument("--litdata-convert", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("workdir", nargs="?", default="bench-data")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    prefix = write_corpus(a.workdir, a.tokens, a.writer)
    lit_dir = os.path.join(a.workdir, f"llm-{a.tokens}-litdata")
    if a.litdata_convert:
        litdata_convert(prefix, lit_dir)
        return
    np.fromfile(prefix + ".bin", dtype=np.uint8)[::4096].sum()  # page cache
    n = a.batches
    cache = os.path.join(a.workdir, f"llm-{a.tokens}-megatron-cache")
    failed = {}
    # Every peer imported before the rounds, so that no first run pays for an import.
    for peer, mods in [("chute", ["torch"]),
                       ("megatron", ["megatron.core.datasets.gpt_dataset",
                                     "megatron.core.datasets.blended_megatron_dataset_builder"]),
                       ("litdata", ["litdata"]), ("grain", ["grain", "grain.experimental"])]:
        try:
            for m in mods:
                importlib.import_module(m)
        except Exception as e:  # noqa: BLE001
            failed[peer] = short(e)
    if "litdata" not in failed and not os.path.exists(os.path.join(lit_dir, "index.json")):
        argv = [sys.executable, os.path.abspath(__file__), "--litdata-convert", "--tokens",
                str(a.tokens), a.workdir]
        if subprocess.run(argv).returncode != 0:
            failed["litdata"] = "failed: litdata.optimize (see its traceback above)"
    try:
        if "grain" not in failed:
            source = Pieces(prefix)
    except Exception as e:  # noqa: BLE001
        failed["grain"] = short(e)
    state = {}

    def mega_build():
        state["mega"], build = megatron_build(prefix, cache)
        return {"build": build}

    def mega(workers):
        if "mega" not in state:
            raise RuntimeError("GPTDataset was not built")
        return megatron_run(state["mega"], n, workers)

    concat = {
        "chute concat, 2 workers": ("chute", lambda: chute_loader(prefix, n, "concat")),
        "chute document, 2 workers": ("chute", lambda: chute_loader(prefix, n, "document")),
        "Megatron GPTDataset build": ("megatron", mega_build),
        "Megatron GPTDataset, DataLoader(num_workers=0)": ("megatron", lambda: mega(0)),
        "Megatron GPTDataset, DataLoader(num_workers=2)": ("megatron", lambda: mega(2)),
        "LitData TokensLoader, num_workers=0": ("litdata",
                                                lambda: litdata_run(lit_dir, n, 0)),
        "LitData TokensLoader, num_workers=2": ("litdata",
                                                lambda: litdata_run(lit_dir, n, 2)),
    }
    packing = {
        "chute best_fit, 2 workers": ("chute", lambda: chute_best_fit(prefix, n)),
        "Grain FirstFit, 16 bins, main process": ("grain",
                                                  lambda: grain_pack(source, n, "first", 16, 0)),
        "Grain BestFit, 16 bins, main process": ("grain",
                                                 lambda: grain_pack(source, n, "best", 16, 0)),
        "Grain BestFit, 16 bins, mp_prefetch(2)": ("grain",
                                                   lambda: grain_pack(source, n, "best", 16, 2)),
        "Grain BestFit, 1024 bins, main process": ("grain", lambda: grain_pack(
            source, n, "best", 1024, 0)),
    }
    cases = {**concat, **packing}
    res = {k: [] for k in cases}
    errors = {}
    for r in range(a.rounds):
        for k, (peer, run) in cases.items():
            if peer in failed:
                errors[k] = failed[peer]
            if k in errors:
                continue
            gc.collect()
            t = time.perf_counter()
            try:
                out = run()
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                errors[k] = short(e)
                continue
            out["rate"] = out["n"] / (time.perf_counter() - t) if "n" in out else None
            res[k].append(out)
        print(f"round {r + 1}/{a.rounds}", flush=True)
    shutil.rmtree(cache, ignore_errors=True)

    def med(k, f):
        v = [o[f] for o in res[k] if o.get(f) is not None]
        return statistics.median(v) if v else None

    docs = len(read_idx(prefix))
    print(f"\n{a.tokens:,} tokens, {docs:,} documents; seq_len {SEQ}, batch {BATCH}, "
          f"{n:,} batches per case, medians of {a.rounds} rounds\n")
    for title, unit, group, base_key in [
        ("concat windows", "samples/s", concat, "chute concat, 2 workers"),
        ("packing", "rows/s", packing, "chute best_fit, 2 workers"),
    ]:
        base = med(base_key, "rate")
        print(f"| {title} | {unit} | chute / this | index build | first batch | padding |")
        print("| --- | --- | --- | --- | --- | --- |")
        for k in group:
            if k in errors:
                print(f"| {k} | {errors[k]} | | | | |")
                continue
            rate, build, first, pad = (med(k, f) for f in ("rate", "build", "first", "pad"))
            cols = [
                f"{rate:,.0f}" if rate else "-",
                f"{base / rate:.2f}x" if rate and base else "-",
                f"{build:.3f} s" if build is not None else "-",
                f"{first:.3f} s" if first is not None else "-",
                f"{pad:.4f}" if pad is not None else "-",
            ]
            print(f"| {k} | " + " | ".join(cols) + " |")
        print()
    print("Fields of a batch:\n")
    for k in cases:
        fields = next((o["fields"] for o in res[k] if o.get("fields")), None)
        if fields:
            print(f"- {k}: {fields}")


if __name__ == "__main__":
    main()
