"""Tokenization with Hugging Face's tokenizers on chute's threads: `chute tokenize` (text to
Megatron datasets, the same output for any number of workers, read back by Megatron-Core's
reader) and the `tokenize` op (on the fly, on the workers) give exactly the ids the Python
`tokenizers` package gives for the same tokenizer.json, on a tokenizer trained in the test,
with unicode, empty and very long documents.

The `chute` command comes from $CHUTE_BIN (scripts/test.sh points it at the debug build), else
from the repository's target folder."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import chute
from conftest import chute_bin

tk = pytest.importorskip("tokenizers", reason="tokenizers not installed (scripts/test.sh installs it)")

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "",
    "   ",
    "Ünïcödé: naïve café, Straße, smörgåsbord; 日本語のテキスト、中文文本；한국어 텍스트.",
    "emoji 🚀🔥 and RTL عربى עִברִית mixed with numbers 12345 and\nnew\tlines",
    "<|endoftext|> appears inside a text too",
    "x" * 3000 + " " + "long document " * 5000,
]


@pytest.fixture(scope="module")
def tokenizers_json(tmp_path_factory):
    """Two tokenizers trained here: GPT-2-style byte-level BPE, and a Metaspace Unigram with a
    post-processor that adds <s> ... </s>."""
    d = tmp_path_factory.mktemp("tok")
    corpus = TEXTS * 3 + [f"sentence number {i} with words {i * 7} and more" for i in range(300)]
    bpe = tk.Tokenizer(tk.models.BPE())
    bpe.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tk.decoders.ByteLevel()
    bpe.train_from_iterator(corpus, tk.trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet()))
    uni = tk.Tokenizer(tk.models.Unigram())
    uni.normalizer = tk.normalizers.NFKC()
    uni.pre_tokenizer = tk.pre_tokenizers.Metaspace()
    uni.train_from_iterator(corpus, tk.trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>", "<unk>"], unk_token="<unk>"))
    uni.post_processor = tk.processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", uni.token_to_id("<s>")),
                                              ("</s>", uni.token_to_id("</s>"))])
    paths = {}
    for name, t in (("bpe", bpe), ("unigram", uni)):
        paths[name] = str(d / f"{name}.json")
        t.save(paths[name])
    return paths


def test_chute_tokenize_matches_the_tokenizers_package_for_any_worker_count(tmp_path, tokenizers_json):
    docs = tmp_path / "docs.jsonl"
    texts = TEXTS * 40
    with open(docs, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "id": 1}) + "\n")
    for name, path in tokenizers_json.items():
        ref = tk.Tokenizer.from_file(path)
        eod = ref.token_to_id("</s>" if name == "unigram" else "<|endoftext|>")
        outs = []
        for workers in (1, 3):
            prefix = tmp_path / f"{name}-{workers}"
            subprocess.run([chute_bin(), "tokenize", str(docs), "--tokenizer", path, "-o", str(prefix),
                            "--append-eod", "--workers", str(workers), "--quiet"],
                           check=True, capture_output=True)
            outs.append((prefix.with_suffix(".bin").read_bytes(), prefix.with_suffix(".idx").read_bytes()))
        assert outs[0] == outs[1], "the output does not depend on the worker count"
        want = [ref.encode(t).ids + [eod] for t in texts]
        # Read back as documents: one Megatron sequence per document.
        src = chute.tokens(str(tmp_path / f"{name}-1"), seq_len=7, pack="document")
        assert src.format == "megatron"
        got = np.concatenate([np.asarray(b["tokens"]).ravel()
                              for b in chute.Loader(src, batch_size=4, shuffle=False)])
        flat = np.concatenate([np.array(w, dtype=np.int64) for w in want])
        assert np.array_equal(got, flat[: len(got)])
        try:
            import torch  # noqa: F401
            from megatron.core.datasets.indexed_dataset import IndexedDataset
        except ImportError:
            continue
        ds = IndexedDataset(str(tmp_path / f"{name}-1"))
        assert len(ds) == len(texts)
        for i, w in enumerate(want):
            assert ds[i].tolist() == w, f"document {i}"


def test_the_tokenize_op_runs_on_the_workers_and_matches_the_package(tmp_path, tokenizers_json):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = TEXTS * 10
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": texts, "n": list(range(len(texts)))}), path, row_group_size=16)
    for name, tok in tokenizers_json.items():
        ref = tk.Tokenizer.from_file(tok)
        spec = {"text": {"as": "input_ids", "ops": [{"op": "tokenize", "tokenizer": tok,
                                                     "eos": "</s>" if name == "unigram" else "<|endoftext|>",
                                                     "max_length": 512}]}}
        loader = chute.Loader(chute.parquet(str(path)), batch_size=8, shuffle=True, seed=1,
                              num_workers=2, transforms=spec, pad=True)
        seen = 0
        for b in loader:
            ids, mask = np.asarray(b["input_ids"]), np.asarray(b["input_ids_mask"])
            for row, m, n in zip(ids, mask, np.asarray(b["n"])):
                eos = ref.token_to_id("</s>" if name == "unigram" else "<|endoftext|>")
                want = (ref.encode(texts[n]).ids[:511] + [eos])
                assert row[m.astype(bool)].tolist() == want, (name, n)
                seen += 1
        assert seen == len(texts)
    with pytest.raises(chute.ConfigError, match="tokenizer"):
        chute.Loader(chute.parquet(str(path)), batch_size=8,
                     transforms={"text": [{"op": "tokenize", "tokenizer": str(tmp_path / "nope.json")}]})


def test_sft_labels_mask_the_prompt_with_the_ignore_index(tmp_path, tokenizers_json):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    prompts = [f"Question {i}: what is {i} plus {i}? {TEXTS[i % len(TEXTS)][:80]}" for i in range(40)]
    answers = [f"The answer is {2 * i}. " + TEXTS[(i + 3) % len(TEXTS)][:200] for i in range(40)]
    path = tmp_path / "sft.parquet"
    pq.write_table(pa.table({"prompt": prompts, "response": answers, "n": list(range(40))}), path)
    tok = tokenizers_json["unigram"]
    ref = tk.Tokenizer.from_file(tok)
    eos = ref.token_to_id("</s>")
    spec = {"response": {"as": "input_ids", "ops": [
        {"op": "tokenize", "tokenizer": tok, "prompt": "prompt", "eos": eos, "max_length": 64}]}}
    loader = chute.Loader(chute.parquet(str(path)), batch_size=8, num_workers=2,
                          transforms=spec, pad=True)
    seen = 0
    for b in loader:
        ids, labels = np.asarray(b["input_ids"]), np.asarray(b["labels"])
        masks = np.asarray(b["input_ids_mask"]).astype(bool)
        for row, lab, m, n in zip(ids, labels, masks, np.asarray(b["n"])):
            head = ref.encode(prompts[n]).ids
            want = (head + ref.encode(answers[n], add_special_tokens=False).ids)[:63] + [eos]
            assert row[m].tolist() == want
            k = min(len(head), len(want))
            assert lab[m].tolist() == [-100] * k + want[k:]
            seen += 1
    assert seen == 40
    with pytest.raises(chute.ConfigError, match="comes first"):
        chute.Loader(chute.parquet(str(path)), batch_size=8, transforms={"response": [
            {"op": "text"}, {"op": "tokenize", "tokenizer": tok, "prompt": "prompt"}]})


def corpus_texts():
    rng = np.random.default_rng(11)
    words = ["alpha", "beta", "gamma", "Straße", "日本語", "🚀", "delta", "x" * 40]
    extra = [" ".join(rng.choice(words, size=int(rng.integers(0, 60)))) for _ in range(150)]
    return TEXTS + extra


def package_ids(path, texts, special=True):
    t = tk.Tokenizer.from_file(path)
    return [t.encode(x, add_special_tokens=special).ids for x in texts]


def write_text_files(d, texts):
    """The same documents as JSON Lines, a Parquet column, WebDataset .txt members and plain
    text files (one each), in that order of keys."""
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(exist_ok=True)
    (d / "docs.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                          for i, t in enumerate(texts)), encoding="utf-8")
    pq.write_table(pa.table({"text": texts}), d / "docs.parquet", row_group_size=37)
    with tarfile.open(d / "docs.tar", "w") as tar:
        for i, t in enumerate(texts):
            raw = t.encode()
            info = tarfile.TarInfo(f"doc{i:05d}.txt")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    (d / "plain").mkdir(exist_ok=True)
    for i, t in enumerate(texts):
        (d / "plain" / f"{i:05d}.md").write_text(t, encoding="utf-8")
    return {
        "jsonl": ([str(d / "docs.jsonl")], "text"),
        "parquet": ([str(d / "docs.parquet")], "text"),
        "tar": ([str(d / "docs.tar")], "txt"),
        "text": (sorted(str(p) for p in (d / "plain").iterdir()), "text"),
    }


@pytest.mark.parametrize("name", ["bpe", "unigram"])
def test_a_text_source_with_a_tokenizer_packs_the_packages_ids(tmp_path, tokenizers_json, name):
    """`chute.dataset(text, tokenizer=...)`: documents tokenized when opened (ids equal to the
    package's), packed across documents with the EOS appended: in file order the windows are
    the package's ids concatenated and cut every seq_len + 1 tokens."""
    path = tokenizers_json[name]
    texts = corpus_texts()
    want = package_ids(path, texts)
    eos = 0
    flat = np.concatenate([np.append(np.asarray(w, dtype=np.int64), eos) for w in want])
    files = write_text_files(tmp_path, texts)
    for kind, (paths, field) in files.items():
        src = chute.dataset(paths, tokenizer=path, text_field=field, seq_len=31, eos_id=eos)
        assert len(src) == len(flat) // 32, kind
        got = np.concatenate([np.asarray(b["tokens"]).ravel()
                              for b in chute.Loader(src, batch_size=8, shuffle=False, num_workers=2)])
        assert np.array_equal(got, flat[: len(got)]), kind
    # One document per row: each row is exactly the package's ids (pad mode).
    paths, field = files["jsonl"]
    src = chute.dataset(paths, tokenizer=path, seq_len=100_000, pack="pad", pad_id=1,
                        pad_to_multiple_of=8)
    rows = []
    for b in chute.Loader(src, batch_size=4, shuffle=False):
        t, m = np.asarray(b["tokens"]), np.asarray(b["tokens_mask"]).astype(bool)
        assert t.shape[1] % 8 == 0 and (t[~m] == 1).all()
        rows.extend(r[k].tolist() for r, k in zip(t, m))
    assert rows == want
    # Without the tokenizer's special tokens, as encode(add_special_tokens=False).
    src = chute.dataset(paths, tokenizer=path, seq_len=100_000, pack="pad",
                        add_special_tokens=False)
    rows = [r[k].tolist() for b in chute.Loader(src, batch_size=4, shuffle=False)
            for r, k in zip(np.asarray(b["tokens"]), np.asarray(b["tokens_mask"]).astype(bool))]
    assert rows == package_ids(path, texts, special=False)


def test_text_sources_pack_resume_and_split_across_ranks(tmp_path, tokenizers_json):
    """Every packing mode over tokenized text is a source like any other: ranks partition the
    epoch, a state taken mid-epoch resumes exactly, best_fit keeps fitting documents whole."""
    path = tokenizers_json["bpe"]
    texts = corpus_texts() * 4
    paths, _ = write_text_files(tmp_path, texts)["jsonl"]
    want = package_ids(path, texts)
    for pack in ["concat", "document", "best_fit", "pad"]:
        def loader(**kw):
            src = chute.dataset(paths, tokenizer=path, seq_len=48, pack=pack, eos_id=0,
                                bucket=16 if pack == "pad" else 0)
            return chute.Loader(src, batch_size=4, shuffle=True, seed=5, drop_last=True, **kw)

        full = [np.asarray(b["tokens"]).tolist() for b in loader()]
        ranks = [[np.asarray(b["tokens"]).tolist() for b in loader(rank=r, world_size=3)]
                 for r in range(3)]
        assert len({len(r) for r in ranks}) == 1, pack
        lr = loader()
        it = iter(lr)
        head = [np.asarray(next(it)["tokens"]).tolist() for _ in range(5)]
        resumed = loader()
        resumed.load_state_dict(lr.state_dict())
        assert head + [np.asarray(b["tokens"]).tolist() for b in resumed] == full, pack
        if pack == "best_fit":
            fits = {tuple(w) + (0,) for w in want if len(w) + 1 <= 48}
            rows = [tuple(r) for batch in full for r in batch]
            found = set()
            for r in rows:  # every whole document appears contiguously in some row
                found.update(f for f in fits if len(f) <= len(r) and any(
                    r[i:i + len(f)] == f for i in range(len(r) - len(f) + 1)))
            assert len(found) > 0.9 * len(fits)


def test_text_source_errors_name_the_file_and_line(tmp_path, tokenizers_json):
    path = tokenizers_json["bpe"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text key"}\n')
    with pytest.raises(chute.ConfigError, match=r"bad.jsonl line 2: no \"text\".*body"):
        chute.dataset(str(bad), tokenizer=path, seq_len=8)
    bad.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(chute.CorruptDataError, match="line 2 is not a JSON object"):
        chute.dataset(str(bad), tokenizer=path, seq_len=8)
    with pytest.raises(chute.ConfigError, match="tokenizer"):
        chute.dataset(str(bad), tokenizer=str(tmp_path / "missing.json"), seq_len=8)


def test_chute_tokenize_reads_urls_and_tar_members(tmp_path, tokenizers_json):
    """`chute tokenize` reads the same text from JSON Lines over HTTP (the test servers' nginx)
    and from WebDataset .txt members as from local files, byte for byte."""
    path = tokenizers_json["bpe"]
    texts = corpus_texts()
    files = write_text_files(tmp_path / "src", texts)

    def tokenize(inputs, out, *extra):
        subprocess.run([chute_bin(), "tokenize", *inputs, "--tokenizer", path, "-o", str(out),
                        "--append-eod", "-q", *extra], check=True, capture_output=True)
        return (Path(f"{out}.bin").read_bytes(), Path(f"{out}.idx").read_bytes())

    local = tokenize(files["jsonl"][0], tmp_path / "local")
    assert tokenize(files["tar"][0], tmp_path / "tar", "--field", "txt") == local
    http_dir, http_url = os.environ.get("CHUTE_TEST_HTTP_DIR"), os.environ.get("CHUTE_TEST_HTTP_URL")
    if not (http_dir and http_url):
        pytest.skip("no test servers (CHUTE_TEST_HTTP_DIR/_URL unset); scripts/test.sh starts them")
    import shutil
    name = f"tokenize-{os.getpid()}.jsonl"
    shutil.copy(files["jsonl"][0][0], Path(http_dir) / name)
    try:
        assert tokenize([f"{http_url}/{name}"], tmp_path / "remote") == local
    finally:
        (Path(http_dir) / name).unlink()


def test_chute_cat_decodes_tokens_and_bench_reads_text(tmp_path, tokenizers_json):
    """`chute cat --decode` turns a packed row back into the text it came from, and the CLI
    opens text with --tokenizer as Python does."""
    path = tokenizers_json["bpe"]
    texts = ["first document here", "and the second one", "third"]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    prefix = tmp_path / "ds"
    subprocess.run([chute_bin(), "tokenize", str(jsonl), "--tokenizer", path, "-o", str(prefix),
                    "-q"], check=True, capture_output=True)
    out = subprocess.run([chute_bin(), "cat", f"{prefix}.bin", "--pack", "pad", "--seq-len", "100",
                          "--decode", path], check=True, capture_output=True, text=True).stdout
    assert [json.loads(line)["tokens_text"] for line in out.splitlines()] == texts
    out = subprocess.run([chute_bin(), "cat", str(jsonl), "--tokenizer", path, "--pack", "pad",
                          "--seq-len", "100", "--decode", path],
                         check=True, capture_output=True, text=True).stdout
    assert [json.loads(line)["tokens_text"] for line in out.splitlines()] == texts
