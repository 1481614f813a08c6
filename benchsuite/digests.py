"""Batch digests of every format, shuffle mode and packing mode, to show a change leaves the
delivered stream unchanged (the house issue's check: the same `chute bench --digest` before and
after).

    python benchsuite/digests.py --chute OLD/chute --out before.json
    python benchsuite/digests.py --chute target/release/chute --out after.json --compare before.json

Give both runs the same `--data` folder: the datasets are written there once, on the first run,
and reused after (a set's folder is written under a temporary name and renamed when complete).

The datasets are written by the peers' own writers where there is one: numpy (token files,
flat and with documents ending in an EOS id), the `webdataset` package's ShardWriter (tar
shards of JPEGs, labels and JSON), pyarrow (Parquet with several row groups; Arrow IPC files
and streams with several record batches), Hugging Face `datasets` (`save_to_disk` folders:
plain columns, a ClassLabel and a string, and a tokenized `input_ids`/`labels` layout), a
Megatron-Core indexed dataset (`.bin` + `.idx`, written with numpy byte for byte in the
`MMIDIDX` layout of `megatron.core.datasets.indexed_dataset`'s `_IndexWriter`; Megatron-LM is
not a dependency), a tokenizer.json trained here with Hugging Face's `tokenizers` over a JSON
Lines / Parquet text corpus, chute's TFRecord writer (`chute convert`, whose bytes TensorFlow
reads, see testdata/tfrecord/README.md) plus TensorFlow's own files in testdata/tfrecord, and
chute's Megatron writer (`chute tokenize`) over the text corpus; and mixture files (JSON) over
the token and Megatron sets. Needs numpy, pillow, pyarrow, webdataset, datasets, tokenizers.

Every set runs every shuffle of SHUFFLES (or the set's own list) with each of OPTS. What the
CLI refuses, and so is left out of the matrix rather than run (a failed run is an error):
- mixture files: `--shuffle block` and `block:N` (a mixture orders its own samples; each
  component's shuffle is set in the file); `--shuffle global` unless every component
  shuffles (refused for "mixture", whose "code" component has "shuffle": "none"; accepted
  for "mixture-random", where it gives the same batches as none: the mixture orders itself).
- `--stack` with a column in two stacks, or columns of different dtypes (not used).
- token files with `--pack` but no `--eos-id` (not used).
Every other combination here was accepted by the baseline CLI (every packing mode takes every
shuffle, for token files, Megatron datasets, tokenized text and tokenized Arrow alike).
"""

import argparse
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHUFFLES = ["none", "global", "block", "block:3"]
OPTS = (["--workers", "1"], ["--workers", "3", "--drop-last"],
        ["--workers", "2", "--world-size", "3", "--rank", "1", "--epochs", "2"])


class Failed(Exception):
    """A command that failed: its arguments, exit status and stderr."""


def run(cmd) -> str:
    """Runs `cmd`; its stdout, or Failed with its stderr."""
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != 0:
        raise Failed(f"command failed (exit status {p.returncode}): "
                     f"{' '.join(str(c) for c in cmd)}\n{p.stderr.strip()}")
    return p.stdout


def fresh(path: Path) -> Path:
    """A new empty folder to write `path`'s set into; `done` renames it to `path`."""
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def done(tmp: Path, path: Path) -> None:
    tmp.rename(path)


def write_megatron(prefix: Path, docs, dtype) -> None:
    """A Megatron-Core indexed dataset (`prefix.bin` + `prefix.idx`), as Megatron-Core's
    `IndexedDatasetBuilder` writes it: one sequence per document, no multimodal modes."""
    dtype = np.dtype(dtype)
    code = {np.dtype(t): c for t, c in [(np.uint8, 1), (np.int8, 2), (np.int16, 3),
                                        (np.int32, 4), (np.int64, 5), (np.float64, 6),
                                        (np.float32, 7), (np.uint16, 8)]}[dtype]
    with open(f"{prefix}.bin", "wb") as f:
        for doc in docs:
            f.write(np.asarray(doc, dtype=dtype).tobytes(order="C"))
    lengths = np.array([len(doc) for doc in docs], dtype=np.int32)
    pointers = np.zeros(len(docs), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1], dtype=np.int64) * dtype.itemsize
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(doc_idx.tobytes(order="C"))


def make_data(chute: str, d: Path) -> dict:
    """Writes the datasets under `d` (once) and returns {name: (paths, extra args[, shuffles])}."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset as wds
    from PIL import Image

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    sets = {}

    tok = d / "tokens"
    if not tok.exists():
        tok.mkdir()
        for i, n in enumerate([50_000, 33_333, 20_001]):
            rng.integers(0, 50_000, n, dtype=np.uint16).tofile(tok / f"part-{i}.bin")
    sets["tokens"] = ([str(tok / f"part-{i}.bin") for i in range(3)], ["--seq-len", "127"])

    w = d / "wds"
    if not w.exists():
        w.mkdir()
        with wds.ShardWriter(str(w / "shard-%06d.tar"), maxcount=37) as sink:
            for i in range(150):
                h, wd = int(rng.integers(40, 90)), int(rng.integers(40, 90))
                px = rng.integers(0, 255, (h, wd, 3), dtype=np.uint8)
                buf = io.BytesIO()
                Image.fromarray(px).save(buf, format="JPEG", quality=90)
                sink.write({"__key__": f"s{i:05d}", "jpg": buf.getvalue(), "cls": str(i % 10),
                            "json": json.dumps({"i": i}).encode()})
    shards = sorted(str(p) for p in w.glob("*.tar"))
    sets["webdataset"] = (shards, [])
    spec = json.dumps({"jpg": {"as": "image", "ops": [
        {"op": "decode"}, {"op": "random_resized_crop", "size": 32}, {"op": "horizontal_flip"},
        {"op": "normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}, {"op": "chw"}]},
        "cls": [{"op": "label"}]})
    sets["webdataset-images"] = (shards, ["--transform", spec])

    pqd = d / "parquet"
    if not pqd.exists():
        pqd.mkdir()
        for f in range(2):
            n = 5_000 + f * 1_234
            t = pa.table({
                "x": pa.array(rng.standard_normal(n).astype(np.float32)),
                "y": pa.array(rng.integers(0, 1 << 40, n, dtype=np.int64)),
                "v": pa.array(list(rng.standard_normal((n, 4)).astype(np.float32)),
                              type=pa.list_(pa.float32(), 4)),
            })
            pq.write_table(t, pqd / f"part-{f}.parquet", row_group_size=1_500)
    sets["parquet"] = (sorted(str(p) for p in pqd.glob("*.parquet")), ["--chunk-rows", "700"])

    tfd = d / "tfrecord"
    if not tfd.exists():
        tfd.mkdir()
        jl = d / "rows.jsonl"
        with open(jl, "w") as f:
            for i in range(900):
                f.write(json.dumps({"id": i, "score": float(rng.standard_normal()),
                                    "emb": [float(v) for v in rng.standard_normal(3)],
                                    "name": f"row-{i}"}) + "\n")
        run([chute, "convert", jl, "--to", "tfrecord", "-o", tfd, "--shard-size", "211"])
    sets["tfrecord"] = (sorted(str(p) for p in tfd.glob("*.tfrecord")), [])
    sets["tfrecord-tensorflow"] = ([str(ROOT / "testdata/tfrecord/examples.tfrecord")], [])

    # The sets below each draw from their own generator, so each is a pure function of its
    # seed whichever folders already exist.
    sets.update(make_columnar(d))
    sets.update(make_documents(chute, d))
    return sets


def make_columnar(d: Path) -> dict:
    """Arrow IPC files and streams (pyarrow) and Hugging Face `save_to_disk` folders."""
    import datasets
    import pyarrow as pa

    datasets.disable_progress_bars()
    sets = {}
    ad = d / "arrow"
    if not ad.exists():
        rng = np.random.default_rng(11)
        tmp = fresh(ad)
        for f in range(2):
            n = 3_000 + f * 777
            t = pa.table({
                "a": pa.array(rng.standard_normal(n)),
                "b": pa.array(rng.integers(-1_000, 1_000, n, dtype=np.int32)),
                "c": pa.array(rng.standard_normal(n).astype(np.float32)),
                "e": pa.array(rng.standard_normal(n).astype(np.float32)),
                "v": pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.standard_normal(n * 3).astype(np.float32)), 3),
                "k": pa.array(rng.integers(0, 1 << 40, n, dtype=np.int64)),
            })
            with pa.ipc.new_file(tmp / f"part-{f}.arrow", t.schema) as sink:
                for b in t.to_batches(max_chunksize=450):
                    sink.write_batch(b)
            with pa.ipc.new_stream(tmp / f"part-{f}.arrows", t.schema) as sink:
                for b in t.to_batches(max_chunksize=610):
                    sink.write_batch(b)
        done(tmp, ad)
    files = sorted(str(p) for p in ad.glob("*.arrow"))
    sets["arrow"] = (files, [])
    sets["arrow-columns-stack"] = (files, ["--columns", "v,c,e,k", "--stack", "ce=c,e"])
    sets["arrow-stream"] = (sorted(str(p) for p in ad.glob("*.arrows")), [])

    hf = d / "hf"
    if not hf.exists():
        rng = np.random.default_rng(12)
        tmp = fresh(hf)
        n = 1_000
        ds = datasets.Dataset.from_dict(
            {"i": list(range(n)), "f": rng.standard_normal(n).tolist(),
             "label": [int(x) for x in rng.integers(0, 5, n)],
             "s": [f"text-{i}-" + "x" * int(rng.integers(0, 20)) for i in range(n)]},
            features=datasets.Features({
                "i": datasets.Value("int64"), "f": datasets.Value("float32"),
                "label": datasets.ClassLabel(names=["a", "b", "c", "d", "e"]),
                "s": datasets.Value("string")}))
        ds.save_to_disk(str(tmp / "plain"), num_shards=7)
        ids = [rng.integers(1, 30_000, int(rng.integers(1, 150))).tolist() for _ in range(400)]
        ds = datasets.Dataset.from_dict(
            {"input_ids": ids, "labels": [[-100] * min(5, len(x)) + x[5:] for x in ids],
             "attention_mask": [[1] * len(x) for x in ids]},
            features=datasets.Features({
                "input_ids": datasets.Sequence(datasets.Value("int32")),
                "labels": datasets.Sequence(datasets.Value("int64")),
                "attention_mask": datasets.Sequence(datasets.Value("int8"))}))
        ds.save_to_disk(str(tmp / "tokenized"), num_shards=5)
        done(tmp, hf)
    # A save_to_disk folder is opened by its path (its data-*.arrow files, Arrow streams).
    sets["hf"] = ([str(hf / "plain")], [])
    sets["hf-files"] = (sorted(str(p) for p in (hf / "plain").glob("*.arrow")), ["--columns", "label,f"])
    tokd = [str(hf / "tokenized")]
    sets["hf-tokenized"] = (tokd, ["--pad"])
    sets["hf-tokenized-concat"] = (tokd, ["--pack", "concat", "--seq-len", "63", "--eos-id", "0"])
    sets["hf-tokenized-document"] = (tokd, ["--pack", "document", "--seq-len", "63", "--eos-id", "0"])
    sets["hf-tokenized-best_fit"] = (tokd, ["--pack", "best_fit", "--seq-len", "63",
                                            "--columns", "input_ids,labels"])
    sets["hf-tokenized-pad"] = (tokd, ["--pack", "pad", "--seq-len", "63", "--eos-id", "0",
                                       "--columns", "input_ids,labels"])
    return sets


def make_documents(chute: str, d: Path) -> dict:
    """Megatron datasets, token files of EOS-ended documents, mixtures, tokenized text."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    sets = {}
    md = d / "megatron"
    if not md.exists():
        rng = np.random.default_rng(13)
        tmp = fresh(md)
        (tmp / "u16").mkdir()
        for k in range(2):
            docs = [rng.integers(1, 30_000, int(rng.integers(1, 200))) for _ in range(300 + 50 * k)]
            write_megatron(tmp / "u16" / f"part{k}_text_document", docs, np.uint16)
        docs = [rng.integers(1, 100_000, int(rng.integers(1, 90))) for _ in range(400)]
        write_megatron(tmp / "i32_text_document", docs, np.int32)
        done(tmp, md)
    meg = [str(md / "u16")]
    sets["megatron"] = (meg, ["--seq-len", "63"])
    sets["megatron-eos"] = (meg, ["--seq-len", "63", "--eos-id", "0"])
    sets["megatron-int32"] = ([str(md / "i32_text_document.bin")], ["--seq-len", "63", "--out-dtype", "int32"])
    sets["megatron-document"] = (meg, ["--seq-len", "63", "--pack", "document", "--eos-id", "0"])
    sets["megatron-best_fit"] = (meg, ["--seq-len", "63", "--pack", "best_fit", "--pad-id", "0",
                                       "--eos-id", "1"])
    sets["megatron-best_fit-drop"] = (meg, ["--seq-len", "63", "--pack", "best_fit", "--long", "drop",
                                            "--pack-window", "64", "--pack-seed", "3", "--pad-id", "7"])
    sets["megatron-pad"] = (meg, ["--seq-len", "63", "--pack", "pad", "--bucket", "8",
                                  "--pad-to-multiple-of", "4", "--eos-id", "0"])

    tp = d / "tokens-docs"
    if not tp.exists():
        rng = np.random.default_rng(14)
        tmp = fresh(tp)
        for k in range(2):
            parts = []
            for _ in range(250 + 40 * k):
                parts += [rng.integers(1, 30_000, int(rng.integers(1, 150))), [0]]
            np.concatenate(parts).astype(np.uint16).tofile(tmp / f"docs-{k}.bin")
        done(tmp, tp)
    tpf = sorted(str(p) for p in tp.glob("*.bin"))
    base = ["--seq-len", "63", "--eos-id", "0"]
    sets["tokens-pack-concat"] = (tpf, [*base, "--pack", "concat"])
    sets["tokens-pack-document"] = (tpf, [*base, "--pack", "document"])
    sets["tokens-pack-best_fit"] = (tpf, [*base, "--pack", "best_fit"])
    sets["tokens-pack-pad"] = (tpf, [*base, "--pack", "pad"])
    sets["tokens-pack-pad-bucket"] = (tpf, [*base, "--pack", "pad", "--bucket", "8",
                                            "--pad-to-multiple-of", "4", "--pad-id", "3"])

    mx = d / "mixture"
    if not mx.exists():
        rng = np.random.default_rng(15)
        tmp = fresh(mx)
        for i, n in enumerate([20_000, 13_001]):
            rng.integers(0, 50_000, n, dtype=np.uint16).tofile(tmp / f"web-{i}.bin")
        # Paths are relative to the mixture file's folder.
        (tmp / "mix.json").write_text(json.dumps({
            "components": [
                {"name": "web", "paths": ["web-0.bin", "web-1.bin"], "seq_len": 63},
                {"name": "books", "path": "../megatron/u16", "format": "megatron",
                 "seq_len": 63, "shuffle": "block", "seed": 11},
                {"name": "code", "paths": ["../tokens-docs/*.bin"], "seq_len": 63,
                 "shuffle": "none"}],
            "weights": {"0": {"web": 0.6, "books": 0.3, "code": 0.1},
                        "400": {"web": 0.2, "books": 0.5, "code": 0.3},
                        "1200": {"web": 0.34, "books": 0.33, "code": 0.33}},
            "policy": "stop_on_all", "seed": 3, "source_column": "source"}, indent=1))
        (tmp / "mix-random.json").write_text(json.dumps({
            "components": [
                {"name": "web", "paths": ["web-0.bin", "web-1.bin"], "seq_len": 63},
                {"name": "books", "path": "../megatron/u16", "format": "megatron",
                 "seq_len": 63, "shuffle": "block:2", "seed": 11}],
            "weights": {"0": {"web": 0.9, "books": 0.1}, "1000": {"web": 0.3, "books": 0.7}},
            "ramp": True, "mode": "random", "policy": "cycle", "samples_per_epoch": 1500,
            "seed": 4}, indent=1))
        done(tmp, mx)
    # Mixtures order their own samples: block shuffles are refused, and global where a
    # component keeps its order ("code" in mix.json).
    sets["mixture"] = ([str(mx / "mix.json")], [], ["none"])
    sets["mixture-random"] = ([str(mx / "mix-random.json")], [], ["none", "global"])

    td = d / "text"
    if not td.exists():
        rng = np.random.default_rng(16)
        tmp = fresh(td)
        syll = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "ve", "zu", "an", "el", "or",
                "ith", "um", "é", "ß"]
        words = ["".join(rng.choice(syll, int(rng.integers(1, 4)))) for _ in range(400)]
        docs = [" ".join(rng.choice(words, int(rng.integers(1, 120)))).capitalize()
                + str(rng.choice([".", "!", "?"])) for _ in range(500)]
        for k, chunk in enumerate([docs[:230], docs[230:]]):
            with open(tmp / f"corpus-{k}.jsonl", "w") as f:
                for i, t in enumerate(chunk):
                    f.write(json.dumps({"id": i, "text": t}) + "\n")
        pq.write_table(pa.table({"id": np.arange(300), "body": docs[:300]}),
                       tmp / "corpus.parquet", row_group_size=70)
        t = Tokenizer(BPE(unk_token="<unk>"))
        t.normalizer = normalizers.NFKC()
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.decoder = decoders.ByteLevel()
        t.train_from_iterator(docs, trainers.BpeTrainer(
            vocab_size=600, special_tokens=["<|endoftext|>", "<unk>", "<s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        t.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                         special_tokens=[("<s>", 2)])
        t.save(str(tmp / "tokenizer.json"))
        # chute's own Megatron writer over the same corpus (EOD 0 after every document).
        run([chute, "tokenize", tmp / "corpus-0.jsonl", tmp / "corpus-1.jsonl", "--tokenizer",
             tmp / "tokenizer.json", "-o", tmp / "corpus_text_document", "--append-eod",
             "--eod-id", "0", "--workers", "2", "-q"])
        done(tmp, td)
    jl = [str(td / "corpus-0.jsonl"), str(td / "corpus-1.jsonl")]
    base = ["--tokenizer", str(td / "tokenizer.json"), "--seq-len", "63", "--eos-id", "0"]
    sets["text"] = (jl, base)
    sets["text-best_fit"] = (jl, [*base, "--pack", "best_fit"])
    sets["text-document-nospecial"] = (jl, [*base, "--pack", "document", "--no-special-tokens"])
    sets["text-pad"] = (jl, [*base, "--pack", "pad", "--bucket", "4"])
    sets["text-parquet"] = ([str(td / "corpus.parquet")], [*base, "--text-field", "body"])
    sets["text-megatron-best_fit"] = ([str(td / "corpus_text_document")],
                                      ["--format", "megatron", "--seq-len", "63", "--pack", "best_fit"])
    return sets


def digest(chute: str, paths, extra) -> str:
    out = run([chute, "bench", *paths, *extra, "--digest", "--json"])
    return json.loads(out)["digest"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chute", required=True)
    ap.add_argument("--data", default=str(ROOT / "bench-data/digests"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare")
    a = ap.parse_args()
    start = time.monotonic()
    try:
        sets = make_data(a.chute, Path(a.data))
        results = {}
        for name, (paths, extra, *shuffles) in sets.items():
            for shuffle in (shuffles[0] if shuffles else SHUFFLES):
                for opts in OPTS:
                    args = [*extra, "--shuffle", shuffle, "--batch-size", "16", "--seed", "5", *opts]
                    key = f"{name} {' '.join(args[len(extra):])}"
                    results[key] = digest(a.chute, paths, args)
    except Failed as e:
        print(e, file=sys.stderr)
        return 2
    Path(a.out).write_text(json.dumps(results, indent=1, sort_keys=True))
    print(f"{len(results)} digests of {len(sets)} sets -> {a.out} "
          f"({time.monotonic() - start:.0f} s)")
    if a.compare:
        before = json.loads(Path(a.compare).read_text())
        diff = [k for k in before if results.get(k) != before[k]]
        for k in diff:
            print(f"DIFFERENT: {k}: {before[k]} -> {results.get(k)}")
        new = [k for k in results if k not in before]
        if new:
            print(f"{len(new)} digests not in {a.compare} (new keys, not compared)")
        print(f"{len(before) - len(diff)} of {len(before)} digests unchanged")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
