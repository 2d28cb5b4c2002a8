"""lopt.torch.hf in a Hugging Face Trainer (tiny GPT-2 from a config, no download) and the torch
conventions it rests on: the loss from the forward, weight decay, scheduler warnings, num_steps."""
from __future__ import annotations

import inspect
import json
import warnings

import pytest

torch = pytest.importorskip("torch", reason='PyTorch is not installed: pip install -e ".[torch]"')
transformers = pytest.importorskip("transformers", reason='pip install -e ".[test]" (transformers)')
pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")

import lopt.torch as lt  # noqa: E402
import lopt.torch.hf as hf  # noqa: E402
from tests.fixtures import single_torch_thread  # noqa: E402

one_torch_thread = pytest.fixture(autouse=True)(single_torch_thread)


def gpt2(seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=256, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def byte_rows(n=16, length=16):
    """n rows of `length` bytes of the standard library's json.decoder source (no download)."""
    text = inspect.getsource(json.decoder).encode()
    ids = torch.tensor(list(text[: n * length]), dtype=torch.long).view(n, length)
    return [{"input_ids": r, "labels": r} for r in ids]


def trainer_args(out, **kw):
    base = dict(output_dir=str(out), per_device_train_batch_size=8, logging_steps=1000, report_to=[], use_cpu=True,
                disable_tqdm=True, save_strategy="no", dataloader_num_workers=0)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def test_trainer_trains_resumes_bit_identically_without_warnings(tmp_path):
    """hf.optimizers and nothing else: num_steps counted from epochs (16 rows, batch 8, 3 epochs: 6),
    no warning, and a run resumed from its step-3 checkpoint ends bit-identical to the straight one."""
    transformers.logging.set_verbosity_error()

    def run(out, resume=None):
        model = gpt2()
        args = trainer_args(out, num_train_epochs=3, save_strategy="steps", save_steps=3)
        opt, sched = hf.optimizers(model, args, source="celo2_v5", train_dataset=byte_rows())
        trainer = transformers.Trainer(model=model, args=args, train_dataset=byte_rows(), optimizers=(opt, sched))
        trainer.train(resume_from_checkpoint=resume)
        assert trainer.state.global_step == opt.param_groups[0]["num_steps"] == 6
        return model, opt

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        straight, opt = run(tmp_path / "a")
    state = opt.state[straight.transformer.wte.weight]
    assert (state["role"], state["axes"], int(state["step"])) == ("embedding", (0, 1), 6)
    assert opt.state[straight.transformer.h[0].attn.c_attn.weight]["axes"] == (0, 1)
    assert float(state["loss_state"][1]) == 1  # the loss reached the optimizer
    resumed, _ = run(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-3"))
    fresh = gpt2()
    assert any(not torch.equal(p, q) for p, q in zip(straight.parameters(), fresh.parameters()))
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_optimizer_cls_and_kwargs_with_weight_decay(tmp_path):
    transformers.logging.set_verbosity_error()
    model = gpt2()
    args = trainer_args(tmp_path, max_steps=2, weight_decay=0.1, learning_rate=1e-3, lr_scheduler_type="constant")
    pair = hf.optimizer_cls_and_kwargs(model, args, source="celo2_v5")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=byte_rows(), optimizer_cls_and_kwargs=pair)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.train()
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(g["weight_decay_lr"] == 1e-3 and g["num_steps"] == 2 for g in groups)
    assert int(trainer.optimizer.state[model.transformer.wte.weight]["step"]) == 2


def test_weight_decay_is_decoupled_as_adamw():
    """p ← p − lr · weight_decay_lr · wd · p, then the learned update (the same as without decay)."""
    def stepped(**options):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = lt.optimizer("normmlp_v3", model, num_steps=10, **options)
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.ones(2, 4)).sum().backward()
        opt.step(loss=1.0)
        return before, [p.detach() for p in model.parameters()]

    before, plain = stepped()
    _, decayed = stepped(lr=0.5, weight_decay=0.4, weight_decay_lr=0.2)
    _, half = stepped(lr=0.5, require_loss=True)
    for p0, p, q in zip(before, half, decayed):
        torch.testing.assert_close(q - p, -0.5 * 0.2 * 0.4 * p0, rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(p0, p) for p0, p in zip(before, plain))


def test_loss_from_forward_skips_eval_and_accumulates_micro_batches():
    model = gpt2()
    opt = lt.optimizer("celo2_v5", model, num_steps=10)
    hook = hf.LossFromForward(model, opt)
    rows = torch.stack([r["input_ids"] for r in byte_rows(4)])
    model.eval()
    with torch.no_grad():
        model(input_ids=rows, labels=rows)
    assert opt._pending_loss is None
    model.train()
    losses = [model(input_ids=rows[i:i + 2], labels=rows[i:i + 2]).loss for i in (0, 2)]
    torch.testing.assert_close(opt._pending_loss, (losses[0] + losses[1]).detach() / 2)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert opt._pending_loss is None and hook._count == 0
    with pytest.raises(ValueError, match="set_loss"):
        opt.step()
    hook.remove()


def test_warnings_point_at_the_users_line_and_schedulers_attach():
    model = torch.nn.Linear(4, 3)
    with pytest.warns(UserWarning, match="lr=0.001 .*multiplier") as record:
        lt.optimizer("normmlp_v3", model, num_steps=10, lr=1e-3)
    assert record[0].filename == __file__
    with pytest.warns(UserWarning, match="outside them") as record:
        lt.optimizer("normmlp_v3", model, num_steps=10 ** 6)
    assert record[0].filename == __file__
    opt = lt.optimizer("normmlp_v3", model, num_steps=10)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10)  # cycle_momentum=True attaches
    model(torch.ones(2, 4)).sum().backward()
    with pytest.warns(lt.ScheduleWarning) as record:
        for _ in range(2):
            opt.step(loss=1.0)
            sched.step()
    assert sorted(str(r.message).split(" ")[0] for r in record) == ["a", "momentum"]
    assert all(r.filename == __file__ for r in record)


def test_num_steps_from_epochs_counts_as_the_trainer():
    assert lt.num_steps_from_epochs(3, 2) == 6
    assert lt.num_steps_from_epochs(2, 5, gradient_accumulation_steps=2) == 6  # the partial accumulation steps
    assert lt.num_steps_from_epochs(0.5, 7) == 4
    args = trainer_args("unused", num_train_epochs=2, per_device_train_batch_size=3, gradient_accumulation_steps=2)
    assert hf.num_training_steps(args, list(range(10))) == 4  # 4 batches per epoch, 2 steps each
    with pytest.raises(ValueError, match="max_steps"):
        hf.num_training_steps(args)
    with pytest.raises(ValueError, match="epochs > 0"):
        lt.num_steps_from_epochs(0, 3)
