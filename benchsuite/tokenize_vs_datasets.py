"""On-the-fly tokenization against Hugging Face's own tools, side by side in one run (issue 15):

- chute: `chute.Loader(chute.parquet(path), transforms={"text": {"as": "input_ids", "ops":
  [{"op": "tokenize", "tokenizer": ...}]}}, batch_size=64, num_workers=2)`: the `tokenizers`
  crate on chute's 2 worker threads, no GIL; tokens/s over one epoch;
- `datasets.Dataset.map(tokenize, batched=True, num_proc=2)` with the `tokenizers` package's
  tokenizer (wall time of the map, as users run it before training);
- the `tokenizers` package's `encode_batch` on one thread (`TOKENIZERS_PARALLELISM=false`);
- the `tokenizers` crate's own single-thread rate: `chute tokenize --workers 1 --to tokens`
  (one tokenizer thread; reading and writing on two others, a few percent of a core), the
  rate it prints: the limit, as 2 threads can reach at most twice it;
- `chute.dataset(path, tokenizer=..., pack="concat")`: a text source tokenized when opened,
  on every core (2 here), the tokens over the time `chute.dataset` takes.

The corpus is synthetic pseudo-English (words drawn from a fixed list, Zipf-distributed,
documents of 20 to 2,000 words), written once as Parquet; the tokenizer is a byte-level BPE
(32,000 ids) trained on it here. Medians of `--rounds` interleaved rounds.

    OPENBLAS_NUM_THREADS=1 python benchsuite/tokenize_vs_datasets.py [--docs 20000] [--rounds 3] \
        [--chute-bin target/release/chute] [workdir]
"""

import argparse
import os
import re
import statistics
import subprocess
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import tokenizers as tk  # noqa: E402

import chute  # noqa: E402


def corpus(n, seed=0):
    rng = np.random.default_rng(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "an", "el", "or", "is", "um", "at",
            "be", "de", "fi", "go", "hu", "ja"]
    words = ["".join(rng.choice(syll, rng.integers(1, 4))) for _ in range(5000)]
    ranks = np.arange(1, len(words) + 1)
    p = 1 / ranks
    p /= p.sum()
    out = []
    for _ in range(n):
        k = int(rng.integers(20, 2000))
        ws = rng.choice(len(words), k, p=p)
        text = " ".join(words[w] for w in ws)
        out.append(text[:1].upper() + text[1:] + ".")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chute-bin", default=os.environ.get("CHUTE_BIN", "target/release/chute"))
    ap.add_argument("workdir", nargs="?", default="bench-data")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    path = os.path.join(a.workdir, f"text-{a.docs}.parquet")
    tok_path = os.path.join(a.workdir, f"text-{a.docs}-bpe.json")
    if not os.path.exists(path):
        texts = corpus(a.docs)
        pq.write_table(pa.table({"text": texts}), path, row_group_size=1024)
    texts = pq.read_table(path).column("text").to_pylist()
    if not os.path.exists(tok_path):
        t = tk.Tokenizer(tk.models.BPE())
        t.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.train_from_iterator(texts[:5000], tk.trainers.BpeTrainer(
            vocab_size=32000, special_tokens=["<|endoftext|>"],
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet()))
        t.save(tok_path)
    tok = tk.Tokenizer.from_file(tok_path)
    total = sum(len(e.ids) for e in tok.encode_batch(texts[:2000]))
    print(f"{len(texts)} documents; ~{total / 2000:.0f} tokens per document", flush=True)

    def package_one_thread():
        n = 0
        for i in range(0, len(texts), 256):
            n += sum(len(e.ids) for e in tok.encode_batch(texts[i:i + 256]))
        return n

    def chute_loader():
        spec = {"text": {"as": "input_ids", "ops": [{"op": "tokenize", "tokenizer": tok_path}]}}
        loader = chute.Loader(chute.parquet(path), batch_size=64, num_workers=2,
                              transforms=spec)
        return sum(len(x) for b in loader for x in b["input_ids"])

    def datasets_map():
        import datasets

        datasets.disable_progress_bars()
        ds = datasets.Dataset.from_dict({"text": texts})
        from tokenizers import Tokenizer

        def f(batch):
            t = Tokenizer.from_file(tok_path)
            return {"input_ids": [e.ids for e in t.encode_batch(batch["text"])]}

        out = ds.map(f, batched=True, num_proc=2, remove_columns=["text"],
                     load_from_cache_file=False)
        return sum(len(x) for x in out["input_ids"])

    def crate_one_thread():
        out = os.path.join(a.workdir, "tokenize-bench.bin")
        r = subprocess.run([a.chute_bin, "tokenize", path, "--tokenizer", tok_path, "-o", out,
                            "--to", "tokens", "--workers", "1", "--overwrite", "-q"],
                           check=True, capture_output=True, text=True)
        m = re.search(r"(\d+) \w+ tokens \(([\d.]+) M tokens/s", r.stdout)
        crate_tokens[0] = int(m.group(1))
        return float(m.group(2)) * 1e6  # the rate it measured itself

    crate_tokens = [0]

    def text_source():
        src = chute.dataset(path, tokenizer=tok_path, pack="concat", seq_len=1024,
                            add_special_tokens=False)
        assert len(src) == crate_tokens[0] // 1025
        return crate_tokens[0]

    cases = {
        "tokenizers crate, 1 thread (chute tokenize --workers 1)": crate_one_thread,
        "tokenizers encode_batch, 1 thread": package_one_thread,
        "chute.dataset(tokenizer=), 2 threads, when opened": text_source,
        "chute tokenize op, 2 workers": chute_loader,
        "datasets.map(batched=True, num_proc=2)": datasets_map,
    }
    rates = {k: [] for k in cases}
    for r in range(a.rounds):
        for k, run in cases.items():
            t = time.perf_counter()
            n = run()
            dt = time.perf_counter() - t
            rates[k].append(n if k.startswith("tokenizers crate") else n / dt)
        print(f"round {r + 1}/{a.rounds}", flush=True)
    one = statistics.median(rates["tokenizers crate, 1 thread (chute tokenize --workers 1)"])
    dm = statistics.median(rates["datasets.map(batched=True, num_proc=2)"])
    print("| loader | tokens/s | vs datasets.map | vs 2 x the crate's one thread |")
    print("| --- | --- | --- | --- |")
    for k, v in rates.items():
        m = statistics.median(v)
        print(f"| {k} | {m / 1e6:.2f} M | {m / dm:.2f}x | {m / (2 * one):.2f}x |")


if __name__ == "__main__":
    main()
