"""Chat conversations rendered, tokenized and masked, side by side in one run: the same
conversations (a `.jsonl` file of multi-turn `messages`, some with tool calls), the same
template (Qwen 2.5's with `{% generation %}` blocks, TRL's training variant) and the same
tokenizer (a byte-level BPE trained here with Qwen's special tokens), giving ids and
assistant-only labels, by

- `chute.dataset(path, tokenizer=folder, chat=True)` then `chute.Loader(..., num_workers=2)`:
  opening (every conversation rendered, tokenized and labelled on every core) and the epoch;
- `datasets.Dataset.map(batched=True, num_proc=2)` calling `tokenizer.apply_chat_template(...,
  tokenize=True, return_assistant_tokens_mask=True)` (a fresh cache each round), then
  reading the ids;
- `torch.utils.data.DataLoader(num_workers=2)` over a `Dataset` whose `__getitem__` calls it
  for one conversation.

    python benchsuite/chat_vs_transformers.py [--rows 4000] [--rounds 3] [--shape long|short]

Checks first that all three give identical ids and labels, then reports tokens per second,
the median of `--rounds` interleaved rounds, and chute's ratios. Needs transformers,
tokenizers, datasets, torch.
"""

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

TEMPLATE = Path(__file__).parent.parent / "python" / "tests" / "chat_templates" / "qwen2_5_training.jinja"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>"]
WORDS = ("the quick brown fox jumps over lazy dogs while robots compute answers data loader "
         "tokens batches GPUs training models café naïve 東京 数据 привет мир 42 3.14").split()
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def conversations(n, seed=0, turns=(1, 6), words=(10, 150)):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        msgs = [{"role": "system", "content": "You are a helpful assistant. " + sentence(rng, 0, 20)}]
        tools = rng.random() < 0.2
        for t in range(rng.randint(*turns)):
            msgs.append({"role": "user", "content": sentence(rng, max(words[0] // 2, 1), max(words[1] * 2 // 5, 2))})
            if tools and t == 0:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "get_weather", "arguments": {"city": rng.choice(["Paris", "東京"])}}}]})
                msgs.append({"role": "tool", "content": "22 degrees"})
            msgs.append({"role": "assistant", "content": sentence(rng, *words)})
        out.append({"messages": msgs, "tools": TOOLS if tools else None})
    return out


def tokenizer_folder(root):
    import tokenizers as tk
    import transformers

    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.train_from_iterator([" ".join(WORDS)] * 50 + [TEMPLATE.read_text()], tk.trainers.BpeTrainer(
        vocab_size=4000, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), special_tokens=SPECIALS))
    tok.add_tokens([tk.AddedToken(t, special=False, normalized=False) for t in ADDED])
    tok.save(str(root / "tokenizer.json"))
    t = transformers.PreTrainedTokenizerFast(tokenizer_file=str(root / "tokenizer.json"),
                                             eos_token="<|im_end|>", pad_token="<|endoftext|>")
    t.chat_template = TEMPLATE.read_text()
    folder = root / "tok"
    t.save_pretrained(str(folder))
    return folder


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--shape", choices=["long", "short"], default="long",
                    help="long: 1-6 turns of replies of 10-150 words; short: one turn of 5-40")
    args = ap.parse_args()

    import datasets
    import numpy as np
    import torch
    import transformers

    import chute

    datasets.disable_progress_bars()
    tmp = Path(tempfile.mkdtemp(prefix="chute-chat-"))
    folder = tokenizer_folder(tmp)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    shape = {"long": dict(turns=(1, 6), words=(10, 150)), "short": dict(turns=(1, 1), words=(5, 40))}
    rows = conversations(args.rows, **shape[args.shape])
    path = tmp / "chats.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def encode(messages, tools):
        out = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        return out["input_ids"], out["assistant_masks"]

    def run_chute(check=False):
        src = chute.dataset(str(path), tokenizer=str(folder), chat=True, seq_len=1 << 20)
        tokens, got = 0, []
        for b in chute.Loader(src, batch_size=args.batch, shuffle=False, num_workers=2):
            m = np.asarray(b["tokens_mask"]).astype(bool)
            tokens += int(m.sum())
            if check:
                t, lab = np.asarray(b["tokens"]), np.asarray(b["labels"])
                got.extend((r[k].tolist(), x[k].tolist()) for r, x, k in zip(t, lab, m))
        return tokens, got

    def run_datasets(check=False):
        ds = datasets.Dataset.from_list(rows)
        cache = tempfile.mkdtemp(dir=tmp)

        def batch_fn(batch):
            ids, labels = [], []
            for msgs, t in zip(batch["messages"], batch["tools"]):
                msgs = [{k: v for k, v in m.items() if v is not None} for m in msgs]
                i, m = encode(msgs, t)
                ids.append(i)
                labels.append([x if k else -100 for x, k in zip(i, m)])
            return {"input_ids": ids, "labels": labels}

        out = ds.map(batch_fn, batched=True, num_proc=2, remove_columns=ds.column_names,
                     cache_file_name=str(Path(cache) / "map.arrow"))
        tokens, got = 0, []
        for b in out.iter(batch_size=args.batch):
            tokens += sum(len(x) for x in b["input_ids"])
            if check:
                got.extend(zip(b["input_ids"], b["labels"]))
        return tokens, got

    class Chats(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            r = rows[i]
            ids, mask = encode(r["messages"], r["tools"])
            return ids, [x if k else -100 for x, k in zip(ids, mask)]

    def run_dataloader(check=False):
        tokens, got = 0, []
        for b in torch.utils.data.DataLoader(Chats(), batch_size=args.batch, num_workers=2,
                                             collate_fn=lambda s: s):
            tokens += sum(len(ids) for ids, _ in b)
            if check:
                got.extend(b)
        return tokens, got

    # Identical ids and labels (chute's first label is -100 by design; no template trains it).
    want = None
    for name, fn in [("chute", run_chute), ("datasets", run_datasets), ("DataLoader", run_dataloader)]:
        _, got = fn(check=True)
        got = [(list(i), [-100] + list(l[1:])) for i, l in got]
        if want is None:
            want = got
        assert got == want, f"{name} differs from chute"
    print(f"{len(want)} conversations: ids and labels identical across the three")

    cases = {"chute": run_chute, "datasets.map": run_datasets, "DataLoader": run_dataloader}
    times = {k: [] for k in cases}
    total = None
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t = time.perf_counter()
            n, _ = fn()
            times[name].append(time.perf_counter() - t)
            total = n
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.rows} {args.shape} conversations, {total:,} tokens, median of {args.rounds} "
          f"rounds, end to end")
    for name, t in med.items():
        print(f"  {name:14s} {total / t:12,.0f} tokens/s  ({t:.2f} s)")
    for peer in ("datasets.map", "DataLoader"):
        print(f"  chute / {peer}: {med[peer] / med['chute']:.2f}x")

    # Multi-turn cost is linear in a conversation's length: tokens/s on 1-2 turn and on
    # 24-32 turn conversations (nothing is rendered per prefix).
    for turns in [(1, 2), (24, 32)]:
        rows_t = conversations(max(args.rows * 3 // (2 * sum(turns)), 50), seed=1, turns=turns)
        p = tmp / f"turns{turns[0]}.jsonl"
        p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows_t))
        ts = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            src = chute.dataset(str(p), tokenizer=str(folder), chat=True, seq_len=1 << 20)
            n = sum(int(np.asarray(b["tokens_mask"]).sum())
                    for b in chute.Loader(src, batch_size=args.batch, shuffle=False, num_workers=2))
            ts.append(time.perf_counter() - t)
        print(f"  chute, {turns[0]}-{turns[1]} turns: {n / statistics.median(ts):12,.0f} tokens/s "
              f"({len(rows_t)} conversations, {n:,} tokens)")


if __name__ == "__main__":
    main()
