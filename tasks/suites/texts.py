"""The suites' offline text corpora: procedural English-like text from a small stochastic grammar.

Generated in memory from a seed (numpy's PCG64), so every machine gets the same bytes and nothing
is read or downloaded.
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


@functools.lru_cache(maxsize=None)
def _grammar_source(batch_size: int, seq_len: int):
    return byte_sequences(grammar_text(), batch_size, seq_len=seq_len, name="grammar_text")
