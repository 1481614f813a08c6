"""Chat templates: conversations rendered, tokenized and labelled as `transformers`'
`apply_chat_template` does it, checked against transformers itself on real chat templates of
open model families (the texts in chat_templates/, sources named in its README) and a
tokenizer trained here with every family's special tokens (nothing is downloaded)."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

import chute

tk = pytest.importorskip("tokenizers", reason="tokenizers not installed")
transformers = pytest.importorskip("transformers", reason="transformers not installed")

TEMPLATES = Path(__file__).parent / "chat_templates"

SPECIALS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<bos>", "<eos>",
    "<start_of_turn>", "<end_of_turn>", "<s>", "</s>", "[INST]", "[/INST]", "<|user|>",
    "<|assistant|>", "<|end|>", "<|system|>", "<pad>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>", "<\uff5ctool\u2581calls\u2581begin\uff5c>",
    "<\uff5ctool\u2581calls\u2581end\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "<\uff5ctool\u2581call\u2581end\uff5c>", "<\uff5ctool\u2581sep\uff5c>",
    "<\uff5ctool\u2581outputs\u2581begin\uff5c>", "<\uff5ctool\u2581outputs\u2581end\uff5c>",
    "<\uff5ctool\u2581output\u2581begin\uff5c>", "<\uff5ctool\u2581output\u2581end\uff5c>",
]
# Added tokens that are not special, as Qwen's tokenizers have them.
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]

# family: (template file, its training variant with {% generation %} blocks, special tokens)
FAMILIES = {
    "chatml": ("chatml", None, {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen2_5": ("qwen2_5", "qwen2_5_training", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen3": ("qwen3", "qwen3_training", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "llama3": ("llama3", "llama3_training", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "llama3_1": ("llama3_1", None, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "llama3_2": ("llama3_2", None, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "gemma": ("gemma", "gemma_training", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
    "gemma3": ("gemma3", "gemma3_training", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
    "mistral": ("mistral", None, {"bos_token": "<s>", "eos_token": "</s>"}),
    "phi3": ("phi3", "phi3_training", {"bos_token": "<s>", "eos_token": "<|endoftext|>"}),
    "deepseekv3": ("deepseekv3", "deepseekv3_training", {
        "bos_token": "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        "eos_token": "<\uff5cend\u2581of\u2581sentence\uff5c>"}),
    "nemotron3": ("nemotron_3_nano", "nemotron_3_nano_training", {"eos_token": "<|im_end|>"}),
    "qwen3_5": ("qwen3_5_think", "qwen3_5_think_training", {"eos_token": "<|im_end|>"}),
    "gemma4": ("gemma4", None, {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}),
    "gptoss": ("gptoss", "gptoss_training", {"eos_token": "<|return|>"}),
    "deepseek_r1": ("deepseek_r1_distill", None, {
        "bos_token": "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        "eos_token": "<\uff5cend\u2581of\u2581sentence\uff5c>"}),
}

WORDS = ("the quick brown fox jumps over lazy dogs while 42 robots compute 3.14 answers; "
         "café naïve déjà vu 東京 数据 加载器 привет мир 🙂 🚀 <b>bold</b> \"quoted\" 'single' "
         "\\ back\\slash tab\there new\nline").split(" ")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]


def sentence(rng, lo=0, hi=14):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def conversations(n, seed=0, tools=True, reasoning=False):
    """n conversations: system prompts or not, 1-4 turns, empty and non-ASCII contents, tool
    calls and tool results, reasoning."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": "You are helpful. " + sentence(rng, 0, 6)})
        use_tools = tools and rng.random() < 0.3
        for t in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": sentence(rng, 1)})
            if use_tools and t == 0:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [{
                    "type": "function", "function": {
                        "name": "get_weather", "arguments": {"city": rng.choice(["Paris", "東京"])}}}]})
                msgs.append({"role": "tool", "name": "get_weather", "content": "22 degrees"})
            reply = {"role": "assistant", "content": sentence(rng, 0 if rng.random() < 0.1 else 1)}
            if reasoning and rng.random() < 0.5:
                reply["reasoning_content"] = "Let me think. " + sentence(rng, 1, 8)
            msgs.append(reply)
        row = {"messages": msgs}
        if use_tools:
            row["tools"] = TOOLS
        out.append(row)
    return out


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def template_text(name):
    if name == "chatml":
        return CHATML
    return (TEMPLATES / f"{name}.jinja").read_text()


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A byte-level BPE trained here on the test's words, with every family's special tokens."""
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    corpus = [" ".join(WORDS)] * 20 + [template_text(f) for f in ("qwen2_5", "llama3_1", "gemma3", "phi3")]
    tok.train_from_iterator(corpus, tk.trainers.BpeTrainer(
        vocab_size=1200, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), special_tokens=SPECIALS))
    tok.add_tokens([tk.AddedToken(t, special=False, normalized=False) for t in ADDED])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def tokenizer_dir(root, tokenizer_json, family, training=False):
    """A tokenizer folder as save_pretrained writes it, with the family's template."""
    name, train, specials = FAMILIES[family]
    d = root / f"{family}{'_training' if training else ''}"
    if d.exists():
        return d
    t = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), **specials)
    t.chat_template = template_text(train if training else name)
    t.save_pretrained(str(d))
    return d


def reference(tok, row, generation, **kw):
    out = tok.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=generation, **kw)
    ids = list(out["input_ids"])
    labels = [i if m else -100 for i, m in zip(ids, out["assistant_masks"])] if generation else None
    return ids, labels


def chute_rows(path, tok_dir, **kw):
    kw.setdefault("seq_len", 100_000)
    src = chute.dataset(str(path), tokenizer=str(tok_dir), chat=True, **kw)
    rows = []
    for b in chute.Loader(src, batch_size=1, shuffle=False):
        rows.append((np.asarray(b["tokens"])[0].tolist(), np.asarray(b["labels"])[0].tolist()))
    return src, rows


def rendered_rows(tok, convs, generation):
    """The conversations transformers renders (and which train at least one token), with its
    ids and labels."""
    keep = []
    for row in convs:
        try:
            ids, labels = reference(tok, row, generation)
        except Exception:  # the template refuses it (roles, system prompts): chute must too
            continue
        if labels is not None and all(x == -100 for x in labels):
            continue
        keep.append((row, ids, labels))
    return keep


@pytest.mark.parametrize("family", [f for f, v in FAMILIES.items() if v[1]])
def test_generation_templates_match_transformers(tmp_path, tokenizer_json, family):
    """Templates with {% generation %} blocks: ids and labels identical to
    apply_chat_template(tokenize=True, return_assistant_tokens_mask=True)."""
    d = tokenizer_dir(tmp_path, tokenizer_json, family, training=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    convs = conversations(120, seed=sum(map(ord, family)), reasoning=family in ("qwen3", "qwen3_5", "gptoss", "nemotron3"))
    keep = rendered_rows(tok, convs, True)
    assert len(keep) >= 20, f"{family}: transformers rendered only {len(keep)}"
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _, _ in keep))
    src, rows = chute_rows(path, d)
    assert len(rows) == len(keep)
    for (row, ids, labels), (got_ids, got_labels) in zip(keep, rows):
        assert got_ids == ids, (family, row)
        # chute leaves a row's first label out (no label crosses rows when packed); no
        # template trains its first token.
        assert labels[0] == -100
        assert got_labels == labels, (family, row)


# Qwen 2's split regex (Qwen 2.5 and 3 ship it too), before a byte-level step without its own.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.mark.parametrize("shape", ["qwen", "llama3"])
def test_byte_level_pipelines_of_released_tokenizers(tmp_path, shape):
    """Tokenizers built as Qwen 2.5's and Llama 3's tokenizer.json are (an NFC normalizer or
    none, a split regex then a byte-level step, a byte-level post-processor that keeps offsets,
    Llama's adding a BOS): chute's ids and labels identical to transformers', texts the
    normalizer changes (a decomposed accent) and characters cut by tokens among them."""
    tok = tk.Tokenizer(tk.models.BPE())
    if shape == "qwen":
        tok.normalizer = tk.normalizers.NFC()
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(QWEN_SPLIT), behavior="isolated"),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tk.decoders.ByteLevel()
    tok.train_from_iterator([" ".join(WORDS)] * 20 + [template_text("qwen2_5_training")],
                            tk.trainers.BpeTrainer(vocab_size=600, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                                   special_tokens=SPECIALS))
    byte_level = tk.processors.ByteLevel(trim_offsets=False)
    if shape == "llama3":
        bos = "<|begin_of_text|>"
        tok.post_processor = tk.processors.Sequence([byte_level, tk.processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])])
    else:
        tok.post_processor = byte_level
    tok.save(str(tmp_path / "tokenizer.json"))
    d = tokenizer_dir(tmp_path, tmp_path / "tokenizer.json", "qwen2_5", training=True)
    ref = transformers.AutoTokenizer.from_pretrained(str(d))
    convs = conversations(60, seed=11)
    for i, row in enumerate(convs):  # decomposed accents (NFC composes them), CJK, emoji
        m = row["messages"][-1]
        if isinstance(m.get("content"), str) and i % 2:
            m["content"] += " cafe\u0301 re\u0301sume\u0301 東京の数据 🦀🦀 "
    keep = rendered_rows(ref, convs, True)
    assert len(keep) >= 20
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _, _ in keep))
    _, rows = chute_rows(path, d)
    assert len(rows) == len(keep)
    for (row, ids, labels), (got_ids, got_labels) in zip(keep, rows):
        assert got_ids == ids, (shape, row)
        assert got_labels == labels, (shape, row)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_original_templates_ids_and_assistant_spans(tmp_path, tokenizer_json, family):
    """The templates as the models ship them (no generation blocks): ids identical to
    transformers'; the trained tokens are each assistant reply's, through its end-of-turn
    token, and nothing of the system, user or tool messages."""
    d = tokenizer_dir(tmp_path, tokenizer_json, family)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    convs = conversations(80, seed=7, reasoning=family in ("qwen3", "qwen3_5", "deepseek_r1", "gptoss", "nemotron3"))
    keep = rendered_rows(tok, convs, False)
    assert len(keep) >= 10, f"{family}: transformers rendered only {len(keep)}"
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _, _ in keep))
    src, rows = chute_rows(path, d)
    eos = FAMILIES[family][2]["eos_token"]
    assert len(rows) <= len(keep)
    by_ids = {tuple(ids): row for row, ids, _ in keep}
    for got_ids, got_labels in rows:
        row = by_ids[tuple(got_ids)]  # ids identical to transformers'
        trained = [i for i in got_labels if i != -100]
        text = tok.decode(trained)
        for m in row["messages"]:
            if m["role"] == "assistant" and m["content"].strip():
                assert m["content"].strip() in text, (family, m, text)
            if m["role"] == "user" and len(m["content"]) > 12:
                assert m["content"] not in text, (family, m, text)


def test_errors_name_the_row_and_the_template_exception(tmp_path, tokenizer_json):
    d = tokenizer_dir(tmp_path, tokenizer_json, "mistral")
    path = tmp_path / "bad.jsonl"
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
            {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(chute.CorruptDataError, match=r"line 2.*Conversation roles must alternate"):
        chute.dataset(str(path), tokenizer=str(d), chat=True)
    path.write_text(json.dumps({"messages": [{"content": "no role"}]}) + "\n")
    with pytest.raises(chute.CorruptDataError, match="line 1: message 0 has no role"):
        chute.dataset(str(path), tokenizer=str(d), chat=True)


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def trl_prompt_completion(tok, prompt, completion):
    """TRL 1.16's SFTTrainer tokenization of a prompt and completion (completion_only_loss):
    the prompt with the generation prompt, the whole, their shared ids masked; plain strings
    tokenized as they are, the EOS text appended to the completion."""
    if isinstance(prompt, str):
        if not completion.endswith(tok.eos_token):
            completion = completion + tok.eos_token
        p = tok(text=prompt)["input_ids"]
        pc = tok(text=prompt + completion)["input_ids"]
    else:
        p = tok.apply_chat_template(prompt, tokenize=True, return_dict=True, add_generation_prompt=True)["input_ids"]
        pc = tok.apply_chat_template(prompt + completion, tokenize=True, return_dict=True)["input_ids"]
    n = common_prefix(p, pc)
    return list(pc), [-100] * n + list(pc[n:])


@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1", "gemma3"])
def test_prompt_completion_and_instructions_as_trl(tmp_path, tokenizer_json, family):
    d = tokenizer_dir(tmp_path, tokenizer_json, family)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    rng = random.Random(3)
    rows, want = [], []
    for i in range(40):
        if i % 3 == 0:
            row = {"prompt": sentence(rng, 1), "completion": " " + sentence(rng, 1)}
            want.append(trl_prompt_completion(tok, row["prompt"], row["completion"]))
        elif i % 3 == 1:
            p = [{"role": "user", "content": sentence(rng, 1)}]
            c = [{"role": "assistant", "content": sentence(rng, 1)}]
            row = {"prompt": p, "completion": c}
            want.append(trl_prompt_completion(tok, p, c))
        else:
            row = {"instruction": sentence(rng, 1), "input": sentence(rng, 0, 4), "output": sentence(rng, 1)}
            user = row["instruction"] + ("\n\n" + row["input"] if row["input"] else "")
            want.append(trl_prompt_completion(tok, [{"role": "user", "content": user}],
                                              [{"role": "assistant", "content": row["output"]}]))
        rows.append(row)
    for kind in ["prompt", "instruction"]:
        chosen = [(r, w) for r, w in zip(rows, want) if (kind in r)]
        path = tmp_path / f"{kind}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _ in chosen))
        _, got = chute_rows(path, d)
        for (row, (ids, labels)), (gi, gl) in zip(chosen, got):
            assert gi == ids, row
            assert gl == [-100] + labels[1:], row


def test_hf_dataset_and_parquet_with_arrow_nulls(tmp_path, tokenizer_json):
    """A datasets.Dataset (and its Parquet export): Arrow gives every message every field,
    null where the JSON had none; those are dropped, so the template sees the original
    messages (a tool_calls test, is defined) and the ids are transformers' on the JSON."""
    datasets = pytest.importorskip("datasets")
    d = tokenizer_dir(tmp_path, tokenizer_json, "qwen2_5", training=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    keep = rendered_rows(tok, conversations(60, seed=11), True)
    rows = [r for r, _, _ in keep]
    for r in rows:
        r.setdefault("tools", None)
    ds = datasets.Dataset.from_list(rows)
    assert "tool_calls" in ds.features["messages"].feature
    ds.to_parquet(str(tmp_path / "chats.parquet"))
    for source in [ds, str(tmp_path / "chats.parquet")]:
        src = chute.dataset(source, tokenizer=str(d), chat=True, seq_len=100_000)
        got = [(np.asarray(b["tokens"])[0].tolist(), np.asarray(b["labels"])[0].tolist())
               for b in chute.Loader(src, batch_size=1, shuffle=False)]
        assert len(got) == len(keep)
        for (row, ids, labels), (gi, gl) in zip(keep, got):
            assert gi == ids, row
            assert gl == labels, row


def test_chat_op_in_a_loader_preference_pairs_and_skips(tmp_path, tokenizer_json):
    """The chat op: conversations to input_ids and labels on the Loader's workers; preference
    pairs (prompt, chosen, rejected) to two sequences a sample, prompt masked as TRL's DPO
    masks it; a conversation with nothing to train on is an error, or a counted skip."""
    d = tokenizer_dir(tmp_path, tokenizer_json, "qwen2_5", training=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    keep = rendered_rows(tok, conversations(30, seed=5, tools=False), True)
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _, _ in keep))
    op = {"messages": [{"op": "chat", "tokenizer": str(d)}]}
    src = chute.dataset(str(path))
    got = [(np.asarray(b["input_ids"])[0].tolist(), np.asarray(b["labels"])[0].tolist())
           for b in chute.Loader(src, batch_size=1, shuffle=False, transforms=op, num_workers=2)]
    assert got == [(ids, labels) for _, ids, labels in keep]
    # Preference pairs.
    rng = random.Random(9)
    pairs = []
    for _ in range(12):
        p = [{"role": "user", "content": sentence(rng, 1)}]
        pairs.append({"prompt": p, "chosen": [{"role": "assistant", "content": sentence(rng, 1)}],
                      "rejected": [{"role": "assistant", "content": sentence(rng, 1)}]})
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pairs))
    op = {"prompt": [{"op": "chat", "tokenizer": str(d), "chosen": "chosen", "rejected": "rejected"}]}
    batches = list(chute.Loader(chute.dataset(str(path)), batch_size=1, shuffle=False, transforms=op))
    for row, b in zip(pairs, batches):
        p = tok.apply_chat_template(row["prompt"], tokenize=True, return_dict=True, add_generation_prompt=True)["input_ids"]
        c = tok.apply_chat_template(row["prompt"] + row["chosen"], tokenize=True, return_dict=True)["input_ids"]
        r = tok.apply_chat_template(row["prompt"] + row["rejected"], tokenize=True, return_dict=True)["input_ids"]
        n = min(common_prefix(p, c), common_prefix(p, r))
        assert np.asarray(b["chosen_input_ids"])[0].tolist() == list(c)
        assert np.asarray(b["rejected_input_ids"])[0].tolist() == list(r)
        assert np.asarray(b["chosen_labels"])[0].tolist() == [-100] * n + list(c[n:])
        assert np.asarray(b["rejected_labels"])[0].tolist() == [-100] * n + list(r[n:])
    # Nothing to train on: an error naming why, or a counted skip.
    path = tmp_path / "u.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "only a question"}]}) + "\n"
                    + json.dumps(keep[0][0]) + "\n")
    op = {"messages": [{"op": "chat", "tokenizer": str(d)}]}
    with pytest.raises(Exception, match="no token of this conversation counts in the loss"):
        list(chute.Loader(chute.dataset(str(path)), batch_size=1, shuffle=False, transforms=op))
    loader = chute.Loader(chute.dataset(str(path)), batch_size=1, shuffle=False, transforms=op,
                          on_error="skip")
    assert len(list(loader)) >= 1
    assert loader.stats()["skipped"] >= 1
    src = chute.dataset(str(path), tokenizer=str(d), chat=True)
    assert len(src) == 1


def trained_runs(ids, labels):
    """The (position, label) of every trained token of a row."""
    return [(i, l) for i, l in enumerate(labels) if l != -100]


def test_packed_conversations_keep_every_trained_token_once(tmp_path, tokenizer_json):
    """Conversations packed best-fit, in document windows, and padding-free: every trained
    token of every conversation is in exactly one row, position_ids restart at each
    conversation, cu_seqlens say where they start, and resuming mid-epoch continues exactly."""
    d = tokenizer_dir(tmp_path, tokenizer_json, "qwen2_5", training=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    keep = rendered_rows(tok, conversations(150, seed=21), True)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _, _ in keep))
    longest = max(len(ids) for _, ids, _ in keep)
    seq_len = longest + 16
    # Each conversation's ids and labels (the first label -100: nothing crosses rows).
    docs = {tuple(ids): [-100] + labels[1:] for _, ids, labels in keep}

    src = chute.dataset(str(path), tokenizer=str(d), chat=True, seq_len=seq_len, pack="best_fit")
    assert src.stats["chat"]["kept"] == len(keep)
    seen = []
    for b in chute.Loader(src, batch_size=4, shuffle=False):
        toks, labels, pos = (np.asarray(b[k]) for k in ("tokens", "labels", "position_ids"))
        for r in range(toks.shape[0]):
            cu = np.asarray(b["cu_seqlens"][r]).tolist()
            assert int(np.asarray(b["max_seqlen"])[r]) == max(np.diff(cu))
            for a, e in zip(cu[:-1], cu[1:]):
                assert pos[r, a] == 0 and (pos[r, a:e] == np.arange(e - a)).all()
                seen.append((tuple(toks[r, a:e].tolist()), labels[r, a:e].tolist()))
            assert (labels[r, cu[-1]:] == -100).all()
    assert sorted(seen) == sorted(docs.items())

    # Padding-free: a batch is one row of its conversations end to end.
    src = chute.dataset(str(path), tokenizer=str(d), chat=True, seq_len=seq_len, padding_free=True)
    seen = []
    for b in chute.Loader(src, batch_size=5, shuffle=False):
        toks, labels, pos = (np.asarray(b[k]) for k in ("tokens", "labels", "position_ids"))
        cu = np.asarray(b["cu_seqlens"]).tolist()
        assert toks.shape[0] == 1 and cu[0] == 0 and cu[-1] == toks.shape[1]
        assert int(np.asarray(b["max_seqlen"])[0]) == max(np.diff(cu))
        for a, e in zip(cu[:-1], cu[1:]):
            assert (pos[0, a:e] == np.arange(e - a)).all() and labels[0, a] == -100
            seen.append((tuple(toks[0, a:e].tolist()), labels[0, a:e].tolist()))
    assert seen == list(docs.items())

    # Resume mid-epoch, shuffled, on two ranks.
    for pack in ["best_fit", "pad"]:
        src = chute.dataset(str(path), tokenizer=str(d), chat=True, seq_len=seq_len, pack=pack)

        def loader():
            return chute.Loader(src, batch_size=3, shuffle=True, seed=5, rank=1, world_size=2, pad=True)

        full = [np.asarray(b["tokens"]).tolist() for b in loader()]
        first = loader()
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
        again = loader()
        again.load_state_dict(state)
        assert [np.asarray(b["tokens"]).tolist() for b in again] == full[3:], pack


def test_truncation_and_counts(tmp_path, tokenizer_json):
    """Conversations longer than seq_len: cut keeping the start, keeping the end with the
    system prompt, or dropped; the counts in the manifest."""
    d = tokenizer_dir(tmp_path, tokenizer_json, "qwen2_5", training=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    keep = rendered_rows(tok, conversations(60, seed=4), True)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _, _ in keep))
    lengths = sorted(len(ids) for _, ids, _ in keep)
    cut = lengths[len(lengths) // 2]
    longer = sum(n > cut for n in lengths)
    src, rows = chute_rows(path, d, seq_len=cut, truncation="drop")
    p = src.stats["chat"]
    assert p["skipped_too_long"] == longer and len(rows) == len(keep) - longer
    src = chute.dataset(str(path), tokenizer=str(d), chat=True, seq_len=cut)
    rows = [np.asarray(b["tokens"])[0].tolist() for b in chute.Loader(src, batch_size=1, shuffle=False)]
    # Cut at the end: those left with no trained token are skipped, counted.
    want = [ids[:cut] for _, ids, labels in keep if any(x != -100 for x in labels[1:cut])]
    assert rows == want
    chat = chute.Loader(src, batch_size=1, shuffle=False).stats()["source"]["chat"]
    assert chat["truncated"] + chat.get("skipped_no_trained_token", 0) == longer
    assert chat["kept"] == len(want) and chat["rows"] == len(keep)
    # Keep the end, and the system prompt: the rows are a start then the end of the ids.
    src = chute.dataset(str(path), tokenizer=str(d), chat=True, seq_len=cut, truncation="keep_end")
    rows = [np.asarray(b["tokens"])[0].tolist() for b in chute.Loader(src, batch_size=1, shuffle=False)]
    assert len(rows) == len(keep)
    for (row, ids, _), got in zip(keep, rows):
        if len(ids) <= cut:
            assert got == ids
            continue
        heads = [p for p in range(cut + 1) if got == ids[:p] + ids[len(ids) - (cut - p):]]
        assert heads, row
        if row["messages"][0]["role"] == "system" and not row.get("tools"):
            system = tok.apply_chat_template(row["messages"][:1], tokenize=True, return_dict=True)["input_ids"]
            assert heads[0] == (len(system) if len(system) <= cut // 2 else 0), row


def test_cli_tokenize_chat_writes_parquet_that_opens(tmp_path, tokenizer_json):
    from conftest import chute_bin
    import subprocess
    pq = pytest.importorskip("pyarrow.parquet")
    d = tokenizer_dir(tmp_path, tokenizer_json, "llama3", training=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    keep = rendered_rows(tok, conversations(40, seed=8), True)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _, _ in keep))
    out = tmp_path / "tok.parquet"
    r = subprocess.run([chute_bin(), "tokenize", "--chat", "--tokenizer", str(d), "-o", str(out),
                        str(path), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"wrote {len(keep)} of {len(keep)} rows" in r.stdout
    t = pq.read_table(out).to_pydict()
    assert t["input_ids"] == [ids for _, ids, _ in keep]
    assert t["labels"] == [labels for _, _, labels in keep]
    src = chute.dataset(str(out), seq_len=100_000, pack="pad", columns=["input_ids", "labels"])
    got = [np.asarray(b["labels"])[0].tolist() for b in chute.Loader(src, batch_size=1, shuffle=False)]
    assert got == [labels for _, _, labels in keep]


def test_split_at_turn_boundaries(tmp_path, tokenizer_json):
    """truncation="split": a conversation longer than seq_len becomes several, each its system
    prompt and as many whole turns as fit, rendered by transformers as conversations of their
    own; every part fits, and those that train are kept, counted."""
    d = tokenizer_dir(tmp_path, tokenizer_json, "qwen2_5", training=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    convs = [c for c in conversations(80, seed=13, tools=False) if len(c["messages"]) >= 5]
    keep = rendered_rows(tok, convs, True)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _, _ in keep))
    cut = sorted(len(ids) for _, ids, _ in keep)[len(keep) // 3]

    def encode(msgs):
        return reference(tok, {"messages": msgs}, True)

    want, split = [], 0
    for row, ids, labels in keep:
        if len(ids) <= cut:
            want.append((ids, [-100] + labels[1:]))
            continue
        split += 1
        msgs = row["messages"]
        head = 1 if msgs[0]["role"] == "system" else 0
        turns = []
        for i in range(head, len(msgs)):
            if turns and msgs[i]["role"] != "user":
                turns[-1][1] = i + 1
            else:
                turns.append([i, i + 1])
        t = 0
        while t < len(turns):
            part = encode(msgs[:head] + msgs[turns[t][0]:turns[t][1]])
            end = t + 1
            while end < len(turns) and len(part[0]) <= cut:
                longer = encode(msgs[:head] + msgs[turns[t][0]:turns[end][1]])
                if len(longer[0]) > cut:
                    break
                part, end = longer, end + 1
            i, l = part[0][:cut], part[1][:cut]
            if any(x != -100 for x in l[1:]):
                want.append((i, [-100] + l[1:]))
            t = end
    src, rows = chute_rows(path, d, seq_len=cut, truncation="split")
    assert split > 0 and rows == want
    assert all(len(i) <= cut for i, _ in rows)
    s = src.stats["chat"]
    assert s["split"] == split and s["documents"] == len(want) and s["rows"] == len(keep)


@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1", "mistral"])
def test_generation_prompt_and_continue_final_message(tmp_path, tokenizer_json, family):
    """add_generation_prompt and continue_final_message render as apply_chat_template renders
    them (the final message left open: cut after its content)."""
    d = tokenizer_dir(tmp_path, tokenizer_json, family)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    convs = conversations(40, seed=17, tools=False)
    for option in ["add_generation_prompt", "continue_final_message"]:
        keep = []
        for row in convs:
            msgs = row["messages"] if option == "continue_final_message" else row["messages"][:-1]
            try:
                ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, **{option: True})["input_ids"]
            except Exception:
                continue
            keep.append(({"messages": msgs}, list(ids)))
        assert len(keep) >= 10, (family, option)
        path = tmp_path / f"{option}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r, _ in keep))
        _, rows = chute_rows(path, d, train_on="all", **{option: True})
        assert [ids for ids, _ in rows] == [ids for _, ids in keep], (family, option)
