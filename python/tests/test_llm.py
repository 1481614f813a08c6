"""LLM data: Megatron-Core indexed datasets read and written byte for byte as Megatron-Core's
own builder and reader do (the real `megatron-core` package, installed with torch by
scripts/test.sh), and documents packed into rows (concat, document, best_fit): every token of
an epoch in one window, positions restarting at documents, whole documents, exact resume."""

import collections

import numpy as np
import pytest

import chute


@pytest.fixture(scope="module")
def megatron():
    pytest.importorskip("torch", reason="torch not installed (CHUTE_TEST_TORCH=1 installs it)")
    return pytest.importorskip(
        "megatron.core.datasets.indexed_dataset",
        reason="megatron-core not installed (scripts/test.sh installs it with torch)",
    )


def documents(n, seed=0, vocab=60000, longest=200):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, rng.integers(0, longest + 1)).astype(np.int64) for _ in range(n)]


def megatron_build(megatron, prefix, docs, dtype):
    import torch

    builder = megatron.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for d in docs:
        builder.add_item(torch.from_numpy(d))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def chute_build(prefix, docs):
    with chute.MegatronWriter(prefix) as w:
        for d in docs:
            w.add_document(d)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_a_dataset_megatrons_builder_wrote_reads_as_its_documents(tmp_path, megatron, dtype):
    docs = documents(300, vocab=60000 if dtype == np.uint16 else 10**6)
    prefix = str(tmp_path / "train_text_document")
    megatron_build(megatron, prefix, docs, dtype)
    seq_len = 63
    w = seq_len + 1
    for name in (prefix, prefix + ".bin", prefix + ".idx", str(tmp_path)):
        src = chute.tokens(name, seq_len=seq_len, pack="document")
        assert src.format == "megatron"
    assert chute.dataset(prefix, seq_len=seq_len).format == "megatron"
    flat = np.concatenate(docs)
    assert len(src) == len(flat) // w, "the tail after the last whole window is not a window"
    starts = set(np.cumsum([0] + [len(d) for d in docs])[:-1].tolist())
    got = []
    for b in chute.Loader(src, batch_size=8, shuffle=False, num_workers=2):
        tokens, pos, seg = (np.asarray(b[k]) for k in ("tokens", "position_ids", "segment_ids"))
        assert tokens.dtype == np.int64 and tokens.shape[1] == w
        for i, row in enumerate(tokens):
            first = (len(got) + i) * w
            want = [j == 0 or first + j in starts for j in range(w)]
            assert (pos[i] == 0).tolist() == want, "position_ids restart at every document"
            assert seg[i][0] == 1 and np.all(np.diff(seg[i]) == (pos[i][1:] == 0))
            cu = np.asarray(b["cu_seqlens"][i])
            assert cu[0] == 0 and cu[-1] == w and np.all(pos[i][cu[:-1]] == 0)
        got.extend(tokens)
    assert np.array_equal(np.concatenate(got), flat[: len(got) * w])


def test_chutes_megatron_writer_is_read_by_megatron_core_and_matches_its_builder(tmp_path, megatron):
    docs = documents(200, seed=1)
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    with chute.MegatronWriter(ours, dtype="uint16") as w:
        for d in docs:
            w.add_document(d)
        assert w.documents == len(docs)
    megatron_build(megatron, theirs, docs, np.uint16)
    for ext in (".bin", ".idx"):
        with open(ours + ext, "rb") as a, open(theirs + ext, "rb") as b:
            assert a.read() == b.read(), f"{ext} differs from Megatron-Core's builder"
    ds = megatron.IndexedDataset(ours)
    assert len(ds) == len(docs)
    assert ds.document_indices.tolist() == list(range(len(docs) + 1))
    for i, d in enumerate(docs):
        assert np.array_equal(ds[i], d)
    with pytest.raises(chute.ConfigError, match="does not fit"):
        chute.MegatronWriter(str(tmp_path / "small"), dtype="uint8").add_document([300])


def test_concat_shuffled_epochs_hold_every_token_once_across_ranks(tmp_path):
    docs = documents(400, seed=2, longest=120)
    prefix = str(tmp_path / "ds")
    chute_build(prefix, docs)
    seq_len, world = 31, 3
    w_ = seq_len + 1
    flat = collections.Counter(np.concatenate(docs).tolist())
    epochs = []
    for epoch in range(2):
        windows = []
        for rank in range(world):
            src = chute.tokens(prefix, seq_len=seq_len)
            loader = chute.Loader(src, batch_size=4, shuffle=True, seed=5, rank=rank,
                                  world_size=world, drop_last=True, num_workers=2)
            loader.set_epoch(epoch)
            windows.extend(tuple(r) for b in loader for r in np.asarray(b["tokens"]))
        assert len(set(windows)) == len(windows), "no window twice across ranks"
        got = collections.Counter(t for win in windows for t in win)
        assert not (got - flat), "every token a window holds is one of the epoch's"
        assert sum((flat - got).values()) < (world * 4 + 1) * w_, "all but the tail and the dropped"
        epochs.append(windows)
    assert set(epochs[0]) != set(epochs[1]), "documents are reshuffled every epoch"


@pytest.mark.parametrize("pack", ["concat", "document", "best_fit"])
def test_every_packing_mode_resumes_exactly(tmp_path, pack):
    docs = documents(300, seed=3, longest=90)
    flat = tmp_path / "tokens.bin"
    # Flat token files with documents ending in EOS 0.
    np.concatenate([np.append(d, 0) for d in docs]).astype(np.uint16).tofile(flat)

    def loader():
        src = chute.tokens(str(flat), seq_len=48, eos_id=0, pack=pack, pad_id=65535)
        return chute.Loader(src, batch_size=4, shuffle=True, seed=9, num_workers=2)

    full = [{k: np.array(v) for k, v in b.items() if k != "cu_seqlens"} for b in loader()]
    first = loader()
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    rest = loader()
    rest.load_state_dict(state)
    again = [{k: np.array(v) for k, v in b.items() if k != "cu_seqlens"} for b in rest]
    assert len(again) == len(full) - 5
    for a, b in zip(again, full[5:]):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    if pack == "best_fit":
        rows = np.concatenate([b["tokens"] for b in full])
        mask = np.concatenate([b["loss_mask"] for b in full])
        assert rows.shape[1] == 48 and mask.dtype == np.bool_
        assert np.all(rows[~mask] == 65535)
        # Every document (with its EOS) whole in one row; longer ones in 48-token pieces.
        seg = np.concatenate([b["segment_ids"] for b in full])
        found = collections.Counter()
        for r, s in zip(rows, seg):
            for k in range(1, s.max() + 1):
                found[tuple(r[s == k])] += 1
        want = collections.Counter()
        for d in docs:
            d = np.append(d, 0)
            for k in range(0, len(d), 48):
                want[tuple(d[k : k + 48])] += 1
        assert found == want


def test_packing_needs_documents_and_names_what_is_wrong(tmp_path):
    flat = tmp_path / "t.bin"
    np.arange(100, dtype=np.uint16).tofile(flat)
    with pytest.raises(chute.ConfigError, match="eos_id"):
        chute.tokens(str(flat), seq_len=8, pack="concat")
    with pytest.raises(chute.ConfigError, match="eos_id"):
        chute.tokens(str(flat), seq_len=8, documents="eos")
    with pytest.raises(chute.ConfigError, match="packing mode"):
        chute.tokens(str(flat), seq_len=8, eos_id=0, pack="nope")
    bad = tmp_path / "bad"
    (tmp_path / "bad.bin").write_bytes(b"\0" * 10)
    (tmp_path / "bad.idx").write_bytes(b"MMIDIDX\0\0" + b"\1" + b"\0" * 40)
    with pytest.raises(chute.CorruptDataError, match="bad.idx"):
        chute.tokens(str(bad), seq_len=8)


@pytest.mark.parametrize("ext", ["parquet", "arrow"])
def test_tokenized_parquet_and_arrow_rows_are_documents(tmp_path, ext):
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (scripts/test.sh installs it)")
    docs = documents(150, seed=4, longest=60)
    ids = pa.array([d.astype(np.int32).tolist() for d in docs], type=pa.list_(pa.int32()))
    table = pa.table({"input_ids": ids, "attention_mask": ids})
    path = tmp_path / f"tok.{ext}"
    if ext == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path, row_group_size=40)
    else:
        import pyarrow.feather as feather

        feather.write_feather(table, path, chunksize=40)
    src = chute.dataset(str(path), seq_len=15, pack="concat", eos_id=0)
    flat = np.concatenate([np.append(d, 0) for d in docs])
    assert len(src) == len(flat) // 16
    got = np.concatenate([np.asarray(b["tokens"]).ravel()
                          for b in chute.Loader(src, batch_size=8, shuffle=False)])
    assert np.array_equal(got, flat[: len(got)])
    fit = chute.dataset(str(path), seq_len=64, pack="best_fit", eos_id=0)
    rows = sum(len(b["tokens"]) for b in chute.Loader(fit, batch_size=8, shuffle=True))
    assert rows == len(fit)
    with pytest.raises(chute.ConfigError, match="nope"):
        chute.dataset(str(path), seq_len=15, pack="concat", columns=["nope"])


def test_pad_mode_rows_are_documents_padded_to_the_batch(tmp_path):
    docs = documents(100, seed=5, longest=50)
    prefix = str(tmp_path / "ds")
    chute_build(prefix, docs)
    src = chute.tokens(prefix, seq_len=40, pack="pad", eos_id=0)
    assert len(src) == len(docs)
    found = []
    for b in chute.Loader(src, batch_size=8, shuffle=True, seed=2, pad=True, num_workers=2):
        tokens, mask = np.asarray(b["tokens"]), np.asarray(b["tokens_mask"]).astype(bool)
        assert tokens.shape[1] == mask.sum(axis=1).max(), "padded to the batch's longest"
        found.extend(tuple(r[m]) for r, m in zip(tokens, mask))
    want = [tuple(np.append(d[:39], 0)) for d in docs]
    assert sorted(found) == sorted(want)


@pytest.mark.parametrize("pack", ["concat", "document", "best_fit"])
def test_packing_resumes_in_a_new_process_and_on_fewer_ranks(tmp_path, pack):
    import json

    from conftest import run_python

    docs = documents(200, seed=6, longest=70)
    prefix = str(tmp_path / "ds")
    chute_build(prefix, docs)

    def loader(**kw):
        src = chute.tokens(prefix, seq_len=24, pack=pack, eos_id=0)
        return chute.Loader(src, batch_size=4, shuffle=True, seed=3, **kw)

    full = [np.asarray(b["tokens"]).tolist() for b in loader()]
    # Two ranks read 6 batches each, then one process resumes them as a single rank.
    states = []
    for rank in range(2):
        lr = loader(rank=rank, world_size=2)
        it = iter(lr)
        for _ in range(6):
            next(it)
        states.append(lr.state_dict())
    code = """
        import json, sys, numpy as np, chute
        prefix, pack, state = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
        src = chute.tokens(prefix, seq_len=24, pack=pack, eos_id=0)
        l = chute.Loader(src, batch_size=4, shuffle=True, seed=3)
        l.load_state_dict(state)
        print(json.dumps([np.asarray(b["tokens"]).tolist() for b in l]))
    """
    proc = run_python(code, prefix, pack, json.dumps(states[0]))
    rest = json.loads(proc.stdout)
    # 2 ranks x 6 batches of 4 = the first 12 batches of the single-rank stream.
    assert rest == full[12:], "an elastic resume in a new process continues exactly"


def test_packed_sources_mix_and_keep_every_window_once_per_component_epoch(tmp_path):
    """Packed sources as a mixture's components: the mixture reads several epochs of a
    component at once (one rolls over mid-batch), so each keeps one document order for all
    epochs and its windows are each read once per component epoch, none lost or doubled."""
    parts = {}
    for name, n in (("web", 120), ("code", 40)):
        docs = documents(n, seed=len(name), longest=60)
        prefix = str(tmp_path / name)
        chute_build(prefix, docs)
        parts[name] = (prefix, sum(len(d) + 1 for d in docs))
    w = 16
    srcs = {k: chute.tokens(p, seq_len=w - 1, eos_id=0) for k, (p, _) in parts.items()}
    per = {k: len(s) for k, s in srcs.items()}
    mix = chute.mix(srcs, weights={"web": 0.5, "code": 0.5}, source_column="part")
    # Enough batches for code (the smaller part, half of every batch) to pass 3 epochs.
    batches = 3 * per["code"] * 2 // 8 + 1
    rows = {"web": [], "code": []}
    for i, b in enumerate(chute.Loader(mix, batch_size=8, num_workers=3, seed=4)):
        for r, c in zip(np.asarray(b["tokens"]).tolist(), np.asarray(b["part"]).tolist()):
            rows[["web", "code"][c]].append(tuple(r))
        if i + 1 == batches:
            break
    from collections import Counter

    for name, got in rows.items():
        epochs, rest = divmod(len(got), per[name])
        counts = Counter(got[: epochs * per[name]])
        assert epochs >= 1 and set(counts.values()) == {epochs}, name
        assert len(counts) == per[name], name
        # The windows are the component's tokens (with EOS) cut every 16, less the tail.
        assert sum(len(r) for r in counts) == parts[name][1] // w * w, name


def test_tokenized_labels_pack_beside_their_ids(tmp_path):
    """Hugging Face SFT data: `input_ids` and `labels` (-100 on the prompt) per row; with
    columns=["input_ids", "labels"] every packing mode gives a `labels` column aligned with
    `tokens` (the appended EOS labelled with itself, padding -100)."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (scripts/test.sh installs it)")
    import pyarrow.parquet as pq

    docs = documents(120, seed=9, longest=40)
    rng = np.random.default_rng(3)
    labels = [np.where(np.arange(len(d)) < rng.integers(0, len(d) + 1), -100, d) for d in docs]
    pq.write_table(pa.table({
        "input_ids": pa.array([d.tolist() for d in docs], type=pa.list_(pa.int32())),
        "labels": pa.array([x.tolist() for x in labels], type=pa.list_(pa.int64())),
    }), tmp_path / "sft.parquet", row_group_size=50)
    path = str(tmp_path / "sft.parquet")
    cols = ["input_ids", "labels"]
    flat_t = np.concatenate([np.append(d, 0) for d in docs])
    flat_l = np.concatenate([np.append(x, 0) for x in labels])
    src = chute.dataset(path, seq_len=15, pack="concat", eos_id=0, columns=cols)
    bs = list(chute.Loader(src, batch_size=4, shuffle=False))
    t = np.concatenate([np.asarray(b["tokens"]).ravel() for b in bs])
    lab = np.concatenate([np.asarray(b["labels"]).ravel() for b in bs])
    assert np.array_equal(t, flat_t[: len(t)]) and np.array_equal(lab, flat_l[: len(t)])
    # Wherever a label is not ignored it is its token.
    for pack in ["document", "best_fit", "pad"]:
        src = chute.dataset(path, seq_len=48, pack=pack, eos_id=0, columns=cols)
        for b in chute.Loader(src, batch_size=4, shuffle=True, seed=1):
            t, lab = np.asarray(b["tokens"]), np.asarray(b["labels"])
            assert lab.shape == t.shape and lab.dtype == np.int64, pack
            keep = lab != -100
            assert np.array_equal(lab[keep], t[keep]), pack
            if pack == "pad":
                assert (lab[~np.asarray(b["tokens_mask"]).astype(bool)] == -100).all()
            if pack == "best_fit":
                assert (lab[~np.asarray(b["loss_mask"]).astype(bool)] == -100).all()
    # The loader's pad=True adds nothing to rows the source padded itself.
    src = chute.dataset(path, seq_len=48, pack="pad", eos_id=0, columns=cols)
    b = next(iter(chute.Loader(src, batch_size=4, pad=True)))
    assert sorted(b) == ["labels", "tokens", "tokens_mask"]
    bad = pa.table({"input_ids": pa.array([[1, 2, 3]]), "labels": pa.array([[1, 2]])})
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(chute.CorruptDataError, match="2 labels for 3 ids"):
        chute.dataset(str(tmp_path / "bad.parquet"), seq_len=8, pack="concat", columns=cols)
