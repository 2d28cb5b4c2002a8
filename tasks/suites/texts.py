"""The suites' offline text corpora, generated in memory from a seed (numpy's PCG64), so every
machine gets the same bytes and nothing is read or downloaded:

- "grammar_text" (`grammar_text`): English-like sentences from a small stochastic grammar;
- "arithmetic_text" (`arithmetic_text`): lines of integer sums and differences with their results.

`TEXTS` maps each name (a suite task's dataset) to its generator. Both are also datasets of
`tasks.registry` (`text_dataset`), so a task family reads them by name, e.g. from gin:
`ByteLMFamily.dataset = "grammar_text"`.
"""
from __future__ import annotations

import functools

import numpy as np

from tasks.datasets.text import byte_sequences

_NOUNS = ("optimizer", "network", "river", "teacher", "garden", "signal", "window", "planet", "student",
          "engine", "forest", "letter", "market", "village", "machine", "question", "picture", "island")
_VERBS = ("sees", "builds", "follows", "carries", "finds", "measures", "opens", "trains", "paints", "answers",
          "crosses", "remembers", "moves", "writes")
_ADJECTIVES = ("small", "quiet", "bright", "old", "careful", "green", "strange", "heavy", "quick", "distant")
_ADVERBS = ("slowly", "often", "never", "gladly", "again", "together")
_PREPOSITIONS = ("near", "under", "behind", "with", "across", "beyond")


def grammar_text(num_bytes: int = 200_000, *, seed: int = 1234) -> bytes:
    """Procedural English-like text from a small stochastic grammar (the suite's byte-LM corpus).

    Sentences are "Det [Adj] Noun [Adv] Verb Det [Adj] Noun [Prep Det Noun]." with words drawn
    uniformly from fixed lists, capitalised, sometimes joined by ", and". Same seed, same bytes:
    no file, no download, and the text is identical on every machine.

    Args:
      num_bytes: the length of the text (it is cut to exactly this many bytes).
      seed: the numpy seed of the draws.

    Returns:
      the ASCII text.
    """
    rng = np.random.default_rng(seed)
    pick = lambda words: words[int(rng.integers(len(words)))]

    def phrase():
        words = [pick(("the", "a", "every", "one"))]
        if rng.random() < 0.5:
            words.append(pick(_ADJECTIVES))
        words.append(pick(_NOUNS))
        return words

    out, size = [], 0
    while size < num_bytes:
        words = phrase() + ([pick(_ADVERBS)] if rng.random() < 0.3 else []) + [pick(_VERBS)] + phrase()
        if rng.random() < 0.3:
            words += [pick(_PREPOSITIONS)] + phrase()
        if rng.random() < 0.2:
            words += [", and"] + phrase() + [pick(_VERBS)] + phrase()
        sentence = " ".join(words).replace(" ,", ",")
        sentence = sentence[0].upper() + sentence[1:] + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out).encode("ascii")[:num_bytes]


def arithmetic_text(num_bytes: int = 200_000, *, seed: int = 4321) -> bytes:
    """Procedural arithmetic: lines "A+B=C" or "A-B=C" (newline-separated), A and B uniform in
    0..999, the operator uniform, C the exact result (negative for some differences).

    The operands are unpredictable (about 10 bits each), the operator and the layout nearly free,
    and the result a function of the operands: a byte LM's loss falls as it learns the format, and
    falls further as it learns to add and subtract. Same seed, same bytes, on every machine.

    Args:
      num_bytes: the length of the text (it is cut to exactly this many bytes).
      seed: the numpy seed of the draws.

    Returns:
      the ASCII text.
    """
    rng = np.random.default_rng(seed)
    out, size = [], 0
    while size < num_bytes:
        a, b = (int(v) for v in rng.integers(0, 1000, 2))
        line = f"{a}+{b}={a + b}\n" if rng.random() < 0.5 else f"{a}-{b}={a - b}\n"
        out.append(line)
        size += len(line)
    return "".join(out).encode("ascii")[:num_bytes]


TEXTS = {"grammar_text": grammar_text, "arithmetic_text": arithmetic_text}


@functools.lru_cache(maxsize=None)
def _text_source(name: str, batch_size: int, seq_len: int):
    """The DataSource of byte windows of corpus `name` (a key of TEXTS), named `name`."""
    if name not in TEXTS:
        raise ValueError(f"unknown suite text {name!r}; the texts are {sorted(TEXTS)}")
    return byte_sequences(TEXTS[name](), batch_size, seq_len=seq_len, name=name)


def text_dataset(batch_size: int, *, name: str, seq_len: int = 32):
    """The registered dataset `name` ("grammar_text" or "arithmetic_text" in `tasks.registry`): byte
    windows of that corpus, as the suites' byte LMs read them.

    Args:
      batch_size: windows per batch.
      name: a key of `TEXTS`.
      seq_len: bytes per window (the suites use 32).

    Returns:
      the DataSource of {"tokens": [batch_size, seq_len] uint8}, named `name`.
    """
    return _text_source(name, batch_size, seq_len)


def _grammar_source(batch_size: int, seq_len: int):
    return _text_source("grammar_text", batch_size, seq_len)
