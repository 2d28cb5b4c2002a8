"""Evaluation suites: named, fixed lists of held-out tasks, each with its step budget and seeds::

    for t in tasks.suites.get("heldout-cpu"):
        family = t.build()              # a TaskFamily whose every draw is the same task
        ...                             # train t.num_steps steps for each seed in t.seeds

A suite task is declared by its static config (`SuiteTask.static_config`): what must differ
for a task to be held out from meta-training, i.e. what a compiled program is specialised on —
the model kind, the dataset (with its resolution), the architecture (layer sizes, kernel, norm,
activation, sequence length) and the batch size. Per-seed values (initialisation, batch order)
are not part of it. `static_configs(family)` lists every static config a (meta-training) family
can draw, and `overlaps(suite_tasks, family)` the suite tasks whose static config it can draw:
a shipped optimizer's meta-training family must have none. Neither reads a dataset file.

Suites (`names()`):

- heldout-cpu: 14 tasks sized for a 2-core CPU: MLPs of several widths and depths, convnets (1-D
  and 2-D), two convnets with BatchNorm and dropout (digits 16-32 ReLU, dropout 0.2; Fashion-MNIST
  14x14 8-16-32 GELU, dropout 0.1), a transformer and an LSTM byte LM and a linear regression, on digits, signals1d,
  Fashion-MNIST (14x14) and a procedural English-like text (`grammar_text`), 300-2000 steps,
  3 seeds each. Needs the Fashion-MNIST IDX files (Debian package dataset-fashion-mnist); every
  other dataset is built without files.
- heldout-cpu-mnist: heldout-cpu plus two MNIST tasks; needs the MNIST IDX files locally (without
  them `build` raises DatasetNotFoundError naming where it looked).
- validation-cpu: 6 cheaper tasks (300-600 steps, 3 seeds) disjoint from heldout-cpu and from
  the shipped recipes' meta-training families, on the same datasets (Fashion-MNIST at 7x7): for
  choosing among a run's checkpoints, so heldout-cpu stays a test set nothing was selected on.
- validation-long-cpu: validation-cpu's 6 tasks at 10 000 steps each (`val10k_...`): for choosing
  what concerns long runs (a deployment option, a checkpoint for long horizons) on tasks that are
  not the long-horizon suites'; about 10 CPU-minutes against tuned Adam and a learned optimizer.
- validation-scaling-cpu: validation-cpu's 3 image MLPs 4x wider (`..._x4wide`) and 3x deeper
  (`..._x3deep`): for choosing what concerns wider and deeper nets on tasks that are not scaling-cpu's.
- validation-signals-cpu: a GELU MLP (96x96, batch 64, 800 steps) and a swish-LayerNorm MLP (32,
  batch 32, 600 steps) on signals1d, each 4x wider and 3x deeper (4 tasks, 3 seeds): the wide and
  deep smooth-activation and LayerNorm MLPs on a small noisy dataset that validation-scaling-cpu
  lacks, for choosing what concerns their over-fitting; no file.
- validation-conv-cpu: 6 convnets (digits: 16 GELU channels at batch 32 and 4-8-8 ReLU; Fashion-MNIST
  at 7x7: 8-16 ReLU; signals1d: 32 ReLU, kernel 5; with BatchNorm and dropout: signals1d 32 ReLU,
  kernel 5, dropout 0.1, and Fashion-MNIST 7x7 16-16 tanh, dropout 0.3), 300-500 steps, 3 seeds,
  none a test suite's: with validation-cpu's convnet, for choosing what concerns convnets alone.
- smoke: 3 tiny tasks (at most 60 steps, 2 seeds) for tests and quick checks.
- long-horizon-cpu: 7 small tasks at 10 000-20 000 steps, 5-10x the 2000-step meta-training
  horizons of the shipped optimizers up to celo2_v2 (1-2x celo2_v4's 10 000): MLP autoencoders
  on digits (the 64-32-8-32-64 ReLU one) and signals1d, MLPs on digits and signals1d, a digits convnet and an ill-conditioned
  least squares (condition number 10^4); 3 seeds each; built-in data only.
- long-horizon-50k-cpu: long-horizon-cpu's 7 tasks at 5x their budgets (50 000-100 000 steps,
  `long50k_...`), >= 5x the longest meta-training horizon of the shipped optimizers (celo2_v4's
  10 000 steps); about 15 CPU-minutes against tuned Adam.
- lm-cpu: 5 byte-level LMs (transformers of width 16-48 and depth 1-2, LSTMs of width 64-96) on
  the procedural English-like text and on procedural arithmetic (`arithmetic_text`), 600-1000
  steps, 3 seeds each; no file.
- scaling-cpu: heldout-cpu's 6 image MLPs with every hidden layer 4x wider (`..._x4wide`) and with
  every hidden layer repeated 3 times (`..._x3deep`): 12 tasks, heldout-cpu's datasets, batch sizes
  and budgets; needs the Fashion-MNIST IDX files as heldout-cpu does.

Every suite is disjoint from the meta-training families of the shipped optimizers' recipes and
of the quick start (the tests check it with `held_out_report`); no task of the long-horizon suites,
lm-cpu or scaling-cpu has the static config of a heldout-cpu(-mnist) or validation-cpu task.

Every task is evaluated on the "test" split: the held-out loss after training is the mean
loss over batches of that split.
"""
from tasks.suites.catalog import _SUITES, get, names
from tasks.suites.held_out import held_out_report, overlaps, static_configs
from tasks.suites.suite_task import METRICS, SuiteTask
from tasks.suites.texts import (_ADJECTIVES, _ADVERBS, _NOUNS, _PREPOSITIONS, _VERBS, TEXTS, _grammar_source,
                                _text_source, arithmetic_text, grammar_text)

__all__ = ["SuiteTask", "get", "names", "static_configs", "overlaps", "held_out_report", "grammar_text",
           "arithmetic_text"]
