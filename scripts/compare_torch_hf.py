"""A shipped learned optimizer in a Hugging Face Trainer against tuned torch AdamW, on a tiny GPT-2.

    python scripts/compare_torch_hf.py                         # the defaults: d 64, 2 layers, 300 steps, 2 seeds
    python scripts/compare_torch_hf.py --d 128 --steps 600 --rates 3e-4,1e-3,3e-3,1e-2,3e-2

The model is a GPT-2 built from a config (byte vocabulary of 256, `--layers` layers of width `--d`,
no download), trained on the bytes of Python standard-library source files in sequences of
`--length`: the training split from one list of modules, the validation and test splits (`--eval-rows` rows
each, evenly spaced) from two others. Every run is a `transformers.Trainer` with the same arguments and seed:

- "lopt hf": `lopt.torch.hf.optimizers(model, args, source=...)` and nothing else;
- "lopt by hand": `lopt.torch.optimizer` over parameter groups that state each role and layout
  by name, a Trainer subclass that hands the loss of each `training_step` to the optimizer, and
  a constant scheduler (the setup a user would write without `lopt.torch.hf`);
- "AdamW lr=...": the Trainer's default optimizer (torch AdamW) and schedule (linear decay) at
  each of `--rates`; the rate is chosen on the validation loss, per seed.

The table reports the test loss at the end of training (mean over seeds and per seed), and the
verdicts: "lopt hf" within 1 % of "lopt by hand", and at or below the tuned AdamW.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import statistics
import tempfile
import time
import warnings
from typing import Optional, Sequence

import torch

from lopt.pretrained import RECOMMENDED

TRAIN_MODULES = ("argparse", "json.decoder", "json.encoder", "collections", "inspect", "typing", "dataclasses",
                 "textwrap", "shutil", "tempfile", "pathlib", "logging", "functools", "contextlib")
VALID_MODULES = ("enum", "string", "fractions", "statistics")
TEST_MODULES = ("heapq", "bisect", "copy", "pprint", "calendar", "random")


def byte_rows(modules: Sequence[str], length: int, rows: Optional[int] = None) -> list:
    """Non-overlapping `length`-byte rows of the modules' source, as Trainer examples (labels = inputs);
    `rows` of them evenly spaced (None: all)."""
    text = b"".join(inspect.getsource(importlib.import_module(m)).encode() for m in modules)
    n = len(text) // length
    ids = torch.tensor(list(text[: n * length]), dtype=torch.long).view(n, length)
    if rows is not None and rows < n:
        ids = ids[torch.linspace(0, n - 1, rows).long()]
    return [{"input_ids": r, "labels": r} for r in ids]


def gpt2(d: int, layers: int, length: int, seed: int):
    """A GPT-2 from a config (byte vocabulary, no download), seeded."""
    import transformers
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=256, n_positions=length, n_embd=d, n_layer=layers,
                                     n_head=max(d // 32, 1), bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def by_hand(model, source: str, num_steps: int):
    """The setup without lopt.torch.hf: role and layout groups by name, a constant scheduler."""
    import lopt.torch
    groups = {"embedding": [], "conv1d": [], "vector": []}
    for name, p in model.named_parameters():
        if name.endswith(("wte.weight", "wpe.weight")):
            groups["embedding"].append(p)
        elif p.ndim == 2:
            groups["conv1d"].append(p)
        else:
            groups["vector"].append(p)
    opt = lopt.torch.optimizer(source, [
        {"params": groups["embedding"], "role": "embedding", "layout": "jax"},
        {"params": groups["conv1d"], "role": "matrix", "layout": "jax"},  # HF Conv1D stores [in, out]
        {"params": groups["vector"], "role": "vector"}], num_steps=num_steps)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)


def run(kind: str, rate: Optional[float], seed: int, flags, data: dict) -> dict:
    """One Trainer run; its validation and test losses and seconds."""
    import transformers
    import lopt.torch.hf

    transformers.logging.set_verbosity_error()
    model = gpt2(flags.d, flags.layers, flags.length, seed)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=flags.steps, per_device_train_batch_size=flags.batch, seed=seed,
            learning_rate=rate or 5e-5, save_strategy="no", logging_steps=10 ** 6, report_to=[], use_cpu=True,
            disable_tqdm=True, per_device_eval_batch_size=64)
        trainer_cls, optimizers = transformers.Trainer, (None, None)
        if kind == "lopt hf":
            optimizers = lopt.torch.hf.optimizers(model, args, source=flags.source)
        elif kind == "lopt by hand":
            optimizers = by_hand(model, flags.source, flags.steps)

            class FeedLoss(transformers.Trainer):
                def training_step(self, *a, **k):
                    loss = super().training_step(*a, **k)
                    self.optimizer.optimizer.set_loss(loss)  # the Trainer wraps it in accelerate's
                    return loss

            trainer_cls = FeedLoss
        trainer = trainer_cls(model=model, args=args, train_dataset=data["train"], optimizers=optimizers)
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train()
        seconds = time.perf_counter() - t0
        losses = {split: trainer.evaluate(data[split])["eval_loss"] for split in ("valid", "test")}
    return {"kind": kind, "rate": rate, "seed": seed, **losses, "seconds": seconds,
            "warnings": sorted({f"{w.category.__name__}: {str(w.message)[:120]}" for w in caught
                                if "lopt" in str(w.filename) or "lopt" in str(w.message)})}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Runs every setup for every seed; prints the markdown table and returns the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=RECOMMENDED, help="a shipped name (default: lopt.pretrained.RECOMMENDED)")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--rates", default="3e-4,1e-3,3e-3,1e-2,3e-2")
    ap.add_argument("--eval-rows", type=int, default=512, help="rows of the validation and test splits")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the results here")
    flags = ap.parse_args(argv)
    if flags.threads:
        torch.set_num_threads(flags.threads)
    data = {"train": byte_rows(TRAIN_MODULES, flags.length),
            "valid": byte_rows(VALID_MODULES, flags.length, flags.eval_rows),
            "test": byte_rows(TEST_MODULES, flags.length, flags.eval_rows)}
    seeds = [int(s) for s in flags.seeds.split(",")]
    rates = [float(r) for r in flags.rates.split(",")]
    results = []
    for seed in seeds:
        for kind, rate in [("lopt hf", None), ("lopt by hand", None)] + [("AdamW", r) for r in rates]:
            results.append(run(kind, rate, seed, flags, data))
            r = results[-1]
            print(f"seed {seed} {kind} {rate or ''}: valid {r['valid']:.4f} test {r['test']:.4f} "
                  f"({r['seconds']:.0f} s){' warnings: ' + '; '.join(r['warnings']) if r['warnings'] else ''}",
                  flush=True)
    per_seed = {}
    for seed in seeds:
        mine = [r for r in results if r["seed"] == seed]
        adamw = min((r for r in mine if r["kind"] == "AdamW"), key=lambda r: r["valid"])
        per_seed[seed] = {"lopt hf": next(r for r in mine if r["kind"] == "lopt hf")["test"],
                          "lopt by hand": next(r for r in mine if r["kind"] == "lopt by hand")["test"],
                          "AdamW (tuned)": adamw["test"], "AdamW rate": adamw["rate"]}
    rows = ["| setup | test loss (mean) | per seed |", "|---|---:|---|"]
    for key in ("lopt hf", "lopt by hand", "AdamW (tuned)"):
        vals = [per_seed[s][key] for s in seeds]
        chosen = ", ".join(f"{per_seed[s]['AdamW rate']:g}" for s in seeds)
        extra = f" (rates {chosen})" if key.startswith("AdamW") else ""
        rows.append(f"| {key} | {statistics.mean(vals):.4f} | {', '.join(f'{v:.4f}' for v in vals)}{extra} |")
    hf_mean = statistics.mean(per_seed[s]["lopt hf"] for s in seeds)
    hand_mean = statistics.mean(per_seed[s]["lopt by hand"] for s in seeds)
    adam_mean = statistics.mean(per_seed[s]["AdamW (tuned)"] for s in seeds)
    verdict = (f"lopt hf vs by hand: {100 * (hf_mean / hand_mean - 1):+.2f} % (bar: within 1 %); "
               f"vs tuned AdamW: {100 * (hf_mean / adam_mean - 1):+.2f} % (bar: <= 0)")
    print("\n".join(rows) + "\n\n" + verdict)
    out = {"flags": vars(flags), "results": results, "per_seed": per_seed, "verdict": verdict}
    if flags.json:
        with open(flags.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
