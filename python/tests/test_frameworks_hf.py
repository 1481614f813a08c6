"""Hugging Face: chute.Trainer (transformers) resumes exactly, chute.accelerate_prepare,
chute.hf_batch. Real transformers and accelerate, tiny GPT-2 models built from a config, CPU."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (CHUTE_TEST_TORCH=1 installs it)")
transformers = pytest.importorskip("transformers", reason="transformers not installed")
accelerate = pytest.importorskip("accelerate", reason="accelerate not installed")

import chute  # noqa: E402
from conftest import SEQ, WINDOW, run_python, write_tokens  # noqa: E402

N_SAMPLES = 40  # 640 tokens, ids 0..639: the vocabulary
EOS = 0


class Interrupted(Exception):
    """The job dies (see DieAfterSave)."""


class DieAfterSave(transformers.TrainerCallback):
    """Ends training with Interrupted right after the checkpoint of a step is written."""

    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Interrupted


def tiny_gpt2(vocab=N_SAMPLES * WINDOW, seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=vocab, n_positions=32,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config)


def record_inputs(model):
    """The sample ids of every batch the model is called with (tokens are their positions)."""
    seen = []

    def hook(module, args, kwargs):
        seen.append((kwargs["input_ids"][:, 0] // WINDOW).tolist())

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def training_args(out, max_steps, save_steps, accumulation=1, **kw):
    return transformers.TrainingArguments(
        output_dir=str(out), max_steps=max_steps, save_strategy="steps", save_steps=save_steps,
        gradient_accumulation_steps=accumulation, per_device_train_batch_size=4,
        learning_rate=1e-3, report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
        logging_strategy="no", **kw,
    )


def documents_file(path, n_docs=40, seed=0):
    """Token documents of 4 to 12 tokens (ids 1..49), each ended by EOS (0)."""
    rng = np.random.default_rng(seed)
    docs = [np.append(rng.integers(1, 50, int(rng.integers(3, 12))), EOS) for _ in range(n_docs)]
    np.concatenate(docs).astype(np.uint16).tofile(path)
    return str(path)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models: one thread, so OpenMP does not contend with chute's workers for 2 cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tokens40(tmp_path):
    return chute.tokens(write_tokens(tmp_path / "train.bin", N_SAMPLES, dtype=np.uint16), SEQ)


# chute.Trainer -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "accumulation,save_at,max_steps",
    [(1, 13, 25), (1, 10, 20), (3, 5, 10)],
    ids=["mid-epoch", "epoch-boundary", "accumulation-mid-epoch"],
)
def test_trainer_resumed_at_a_checkpoint_sees_the_uninterrupted_runs_batches(
    tmp_path, tokens40, accumulation, save_at, max_steps
):
    def loader():  # 10 batches an epoch, a new order each epoch
        return chute.Loader(tokens40, batch_size=4, shuffle=True, seed=7, num_workers=2)

    def trainer(out, model, callbacks=()):
        return chute.Trainer(
            model, training_args(out, max_steps, save_at, accumulation),
            train_loader=loader(), callbacks=list(callbacks),
        )

    # The uninterrupted run.
    model = tiny_gpt2()
    whole = record_inputs(model)
    trainer(tmp_path / "whole", model).train()
    uninterrupted = dict(model.named_parameters())
    assert len(whole) > len(loader())  # more than one epoch

    # The same run, dying right after its checkpoint at step save_at...
    model = tiny_gpt2()
    before = record_inputs(model)
    with pytest.raises(Interrupted):
        trainer(tmp_path / "run", model, [DieAfterSave(save_at)]).train()
    checkpoint = tmp_path / "run" / f"checkpoint-{save_at}"
    state = json.loads((checkpoint / "chute_loader_rank0.json").read_text())
    assert state["dataset"] == loader().state_dict()["dataset"]

    # ...and resumed in a new trainer, model and loader.
    model = tiny_gpt2(seed=1)
    after = record_inputs(model)
    resumed = trainer(tmp_path / "run", model)
    resumed.train(resume_from_checkpoint=str(checkpoint))

    assert before + after == whole  # nothing replayed, nothing lost, in the same order
    assert resumed.state.global_step == max_steps
    for name, p in resumed.model.named_parameters():  # the same training, to the last bit
        torch.testing.assert_close(p, uninterrupted[name], rtol=0, atol=0, msg=name)


def test_trainer_resume_true_takes_the_last_checkpoint(tmp_path, tokens40):
    def run(out, model, **kw):
        loader = chute.Loader(tokens40, batch_size=4, shuffle=True, seed=1)
        return chute.Trainer(model, training_args(out, 14, 3), train_loader=loader, **kw)

    whole = record_inputs(model := tiny_gpt2())
    run(tmp_path / "whole", model).train()
    with pytest.raises(Interrupted):  # checkpoints at 3, 6, 9 and 12, then the end
        run(tmp_path / "run", tiny_gpt2(), callbacks=[DieAfterSave(12)]).train()
    after = record_inputs(model := tiny_gpt2())
    run(tmp_path / "run", model).train(resume_from_checkpoint=True)
    assert after == whole[12:]


def test_trainer_refuses_a_checkpoint_without_the_loader_position(tmp_path, tokens40):
    loader = chute.Loader(tokens40, batch_size=4)
    chute.Trainer(tiny_gpt2(), training_args(tmp_path, 3, 3), train_loader=loader).train()
    checkpoint = tmp_path / "checkpoint-3"
    os.remove(checkpoint / "chute_loader_rank0.json")  # as transformers.Trainer writes it
    trainer = chute.Trainer(
        tiny_gpt2(), training_args(tmp_path, 6, 3),
        train_loader=chute.Loader(tokens40, batch_size=4),
    )
    with pytest.raises(chute.StateError, match="ignore_data_skip"):
        trainer.train(resume_from_checkpoint=str(checkpoint))

    # ignore_data_skip: the position is not needed, the epoch starts again (Trainer's rule).
    model = tiny_gpt2()
    seen = record_inputs(model)
    chute.Trainer(
        model, training_args(tmp_path, 6, 3, ignore_data_skip=True),
        train_loader=chute.Loader(tokens40, batch_size=4),
    ).train(resume_from_checkpoint=str(checkpoint))
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_trainer_refuses_a_position_that_does_not_match_its_step(tmp_path, tokens40):
    chute.Trainer(
        tiny_gpt2(), training_args(tmp_path, 3, 3),
        train_loader=chute.Loader(tokens40, batch_size=4),
    ).train()
    # Resumed with another batch size: 3 steps were 12 samples, now 3 batches of 2 = 6.
    trainer = chute.Trainer(
        tiny_gpt2(), training_args(tmp_path, 9, 3),
        train_loader=chute.Loader(tokens40, batch_size=2),
    )
    with pytest.raises(chute.StateError, match="batch size"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))


def test_trainer_evaluates_the_same_batches_every_time(tmp_path, tokens40):
    docs = chute.tokens(documents_file(tmp_path / "docs.bin"), seq_len=15, eos_id=EOS, pack="pad")
    # Shuffled: a loader that simply went on would read another order at the next evaluation.
    evals = chute.Loader(docs, batch_size=3, shuffle=True, seed=5)
    model = tiny_gpt2()
    seen = record_inputs(model)
    trainer = chute.Trainer(
        model, training_args(tmp_path, 1, 1, eval_strategy="no", per_device_eval_batch_size=3),
        train_loader=chute.Loader(tokens40, batch_size=4), eval_loader={"docs": evals},
    )
    first = trainer.evaluate()["eval_docs_loss"]
    assert np.isfinite(first) and len(seen) == len(evals)
    assert trainer.evaluate()["eval_docs_loss"] == first
    assert seen[len(evals) :] == seen[: len(evals)]


def test_trainer_refuses_a_loader_of_another_rank(tokens40, tmp_path):
    loader = chute.Loader(tokens40, batch_size=4, rank=1, world_size=2)
    with pytest.raises(chute.ConfigError, match="rank 1 of 2"):
        chute.Trainer(tiny_gpt2(), training_args(tmp_path, 1, 1), train_loader=loader)
    with pytest.raises(TypeError, match="chute.Loader"):
        chute.Trainer(tiny_gpt2(), training_args(tmp_path, 1, 1), train_loader=[1, 2])
    with pytest.raises(chute.ConfigError, match="batch_format"):
        chute.Trainer(
            tiny_gpt2(), training_args(tmp_path, 1, 1),
            train_loader=chute.Loader(tokens40, batch_size=4), batch_format="megatron",
        )


def test_importing_chute_imports_no_framework():
    run_python(
        """
        import sys, chute
        heavy = [m for m in ("torch", "transformers", "accelerate") if m in sys.modules]
        assert not heavy, heavy
        """
    )
    assert issubclass(chute.Trainer, transformers.Trainer) and chute.Trainer.__module__ == "chute"
    from chute import Trainer

    assert Trainer is chute.Trainer


# accelerate ----------------------------------------------------------------------------------


def ids(batch):
    return (batch["input_ids"][:, 0] // WINDOW).tolist()


def test_accelerate_save_state_and_load_state_carry_the_loader_position(tmp_path, tokens40):
    def setup():
        accelerator = accelerate.Accelerator(cpu=True)
        model = tiny_gpt2()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        loader = chute.Loader(tokens40, batch_size=4, shuffle=True, seed=3, num_workers=2)
        return accelerator, model, optimizer, chute.accelerate_prepare(accelerator, loader)

    accelerator, model, optimizer, batches = setup()
    assert accelerator.prepare(batches.loader) is batches.loader  # why accelerate_prepare exists
    batches.set_epoch(1)
    it = iter(batches)
    for _ in range(3):
        batch = next(it)
        assert batch["input_ids"].device == accelerator.device
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.save_state(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "chute_loader_rank0.json").exists()
    rest = [ids(b) for b in it]
    assert len(rest) == len(batches) - 3

    accelerator, model, optimizer, batches = setup()
    accelerator.load_state(str(tmp_path / "ckpt"))
    assert batches.epoch == 1
    assert [ids(b) for b in batches] == rest  # no skip_first_batches: nothing replayed


def test_accelerate_accumulation_syncs_at_the_end_of_each_epoch(tokens40):
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = accelerator.prepare(tiny_gpt2())
    batches = chute.accelerate_prepare(
        accelerator, chute.Loader(tokens40, batch_size=4), checkpoint=False
    )
    for _ in range(2):  # 10 batches: syncs after 4, 8 and the epoch's last
        synced = []
        for batch in batches:
            with accelerator.accumulate(model):
                synced.append(accelerator.sync_gradients)
        assert [i + 1 for i, s in enumerate(synced) if s] == [4, 8, 10]
        assert not accelerator.gradient_state.in_dataloader


def test_accelerate_prepare_places_batches_and_checks_the_rank(tokens40):
    accelerator = accelerate.Accelerator(cpu=True)
    batches = chute.accelerate_prepare(
        accelerator, chute.Loader(tokens40, batch_size=4), device="meta", checkpoint=False
    )
    batch = next(iter(batches))
    assert set(batch) == {"input_ids", "labels"}
    assert all(t.device.type == "meta" for t in batch.values())
    with pytest.raises(chute.ConfigError, match="process_index"):
        loader = chute.Loader(tokens40, batch_size=4, rank=1, world_size=2)
        chute.accelerate_prepare(accelerator, loader)


# chute.hf_batch -----------------------------------------------------------------------------


def test_hf_batch_windows_are_their_own_labels(tokens40):
    batch = next(iter(chute.Loader(tokens40, batch_size=4)))
    out = chute.hf_batch(batch)
    assert set(out) == {"input_ids", "labels"}
    np.testing.assert_array_equal(out["input_ids"], batch["tokens"])
    np.testing.assert_array_equal(out["labels"], batch["tokens"])
    assert out["labels"].dtype == np.int64
    assert not np.shares_memory(out["labels"], batch["tokens"])  # labels may be edited

    torch_batch = next(iter(chute.Loader(tokens40, batch_size=4, output="torch")))
    out = chute.hf_batch(torch_batch)
    assert isinstance(out["labels"], torch.Tensor) and out["input_ids"] is torch_batch["tokens"]


def test_loader_batch_format_hf_names_its_batches(tokens40):
    plain = list(chute.Loader(tokens40, batch_size=4, output="torch"))
    named = list(chute.Loader(tokens40, batch_size=4, output="torch", batch_format="hf"))
    assert len(named) == len(plain)
    for a, b in zip(plain, named):
        assert set(b) == {"input_ids", "labels"}
        assert torch.equal(b["input_ids"], a["tokens"]) and torch.equal(b["labels"], a["tokens"])
    own = chute.Loader(tokens40, batch_size=4, batch_format=lambda b: len(b["tokens"]))
    assert list(own) == [4] * len(plain)
    with pytest.raises(chute.ConfigError, match="invalid batch_format"):
        chute.Loader(tokens40, batch_size=4, batch_format="hugging")


def test_hf_batch_masks_padding_and_document_starts(tmp_path):
    path = documents_file(tmp_path / "docs.bin")
    pad = next(iter(chute.Loader(chute.tokens(path, 15, eos_id=EOS, pack="pad"), batch_size=4)))
    out = chute.hf_batch(pad)
    assert set(out) == {"input_ids", "labels", "attention_mask"}
    assert out["attention_mask"].dtype == np.int64 and not pad["tokens_mask"].all()
    np.testing.assert_array_equal(out["attention_mask"], pad["tokens_mask"])
    np.testing.assert_array_equal(out["labels"], np.where(pad["tokens_mask"], pad["tokens"], -100))
    as_torch = chute.hf_batch({k: torch.from_numpy(v) for k, v in pad.items()})
    assert all(isinstance(v, torch.Tensor) for v in as_torch.values())
    assert {k: v.tolist() for k, v in as_torch.items()} == {k: v.tolist() for k, v in out.items()}

    fit_source = chute.tokens(path, 15, eos_id=EOS, pack="best_fit")
    fit = next(iter(chute.Loader(fit_source, batch_size=4)))
    out = chute.hf_batch(fit)
    assert set(out) == {"input_ids", "labels", "position_ids"}
    keep = fit["loss_mask"] & (fit["position_ids"] != 0)
    np.testing.assert_array_equal(out["labels"], np.where(keep, fit["tokens"], -100))
    np.testing.assert_array_equal(out["position_ids"], fit["position_ids"])

    # A column of labels (SFT: -100 on the prompt) is kept, padding masked on top.
    sft = {
        "tokens": np.array([[5, 6, 7, 0]]), "tokens_mask": np.array([[1, 1, 1, 0]], bool),
        "labels": np.array([[-100, 6, 7, 7]]),
    }
    assert chute.hf_batch(sft)["labels"].tolist() == [[-100, 6, 7, -100]]
    # A tokenize op's padded ids.
    op = {"input_ids": np.array([[5, 6], [7, 0]]),
          "input_ids_mask": np.array([[1, 1], [1, 0]], bool)}
    assert chute.hf_batch(op)["attention_mask"].tolist() == [[1, 1], [1, 0]]


def test_hf_batch_position_ids_keep_each_packed_document_to_itself(tmp_path):
    src = chute.tokens(documents_file(tmp_path / "docs.bin"), 15, eos_id=EOS, pack="document")
    batch = chute.hf_batch(next(iter(chute.Loader(src, batch_size=4, output="torch"))))
    model = tiny_gpt2(vocab=50).eval()
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       use_cache=False).logits
        documents = 0
        for r, (row, positions) in enumerate(zip(batch["input_ids"], batch["position_ids"])):
            starts = (positions == 0).nonzero().flatten().tolist() + [len(row)]
            for a, b in zip(starts, starts[1:]):
                alone = model(input_ids=row[None, a:b], use_cache=False).logits[0]
                torch.testing.assert_close(packed[r, a:b], alone)
                documents += 1
    assert documents > 4


def test_hf_batch_names_what_is_wrong():
    with pytest.raises(chute.ConfigError, match="no 'tokens' or 'input_ids'.*'jpg'"):
        chute.hf_batch({"jpg": [b"x"]})
    with pytest.raises(chute.ConfigError, match="pad=True"):
        chute.hf_batch({"input_ids": [np.arange(3), np.arange(5)]})
