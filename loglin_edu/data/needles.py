"""Needle-in-a-haystack prompts built from the corpus (RULER's S-NIAH and MK-NIAH, in shape).

A prompt — ``length`` tokens with its longest answer candidate — is held-out text (the haystack) with
``num_keys`` needles

    " The special magic number for <city> is <7-digit number>."

inserted into it, then the question

    " What is the special magic number for <city>? The special magic number for <city> is"

whose answer is ``" <number>"``. The asked needle sits at ``depth`` (0: the start of the haystack, 1: its
end, right before the question); in the multi-key task (``num_keys > 1``) the other needles name other
cities and sit at random depths: the model must pick the right key's number. A needle is placed at the first
sentence end at or past its depth (within 64 tokens; else at the next word), so it splits no word.

Candidates for scoring by rank: the right number first, then the other needles' numbers, then random
7-digit numbers, ``choices`` in all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .token_stream import TokenStream

CITIES = (
    "Paris", "Lagos", "Lima", "Oslo", "Cairo", "Tokyo", "Delhi", "Quito", "Dublin", "Vienna", "Madrid", "Athens",
    "Nairobi", "Havana", "Manila", "Hanoi", "Seoul", "Warsaw", "Prague", "Lisbon", "Bogota", "Santiago", "Jakarta",
    "Kabul", "Dakar", "Accra", "Muscat", "Doha", "Riga", "Tallinn", "Helsinki", "Zagreb", "Sofia", "Tunis",
    "Rabat", "Amman", "Beirut", "Ottawa", "Canberra", "Wellington", "Montevideo", "Caracas", "Kingston", "Reykjavik",
    "Bern", "Brussels", "Budapest", "Bucharest", "Vilnius", "Minsk",
)
SENTENCE_ENDS = (".", "!", "?")


@dataclass(frozen=True)
class NeedlePrompt:
    """One prompt: ``tokens`` (haystack, needles, question; the answer follows), the ``candidates`` (token
    lists; ``candidates[0]`` is the right answer), where the asked needle starts (``needle_position``), and the
    ``length`` it was made for (prompt and longest candidate)."""

    tokens: list[int]
    candidates: list[list[int]]
    needle_position: int
    length: int
    depth: float
    num_keys: int

    @property
    def answer(self) -> list[int]:
        return self.candidates[0]


def needle_sentence(city: str, number: int) -> str:
    return f" The special magic number for {city} is {number}."


def question(city: str) -> str:
    return f" What is the special magic number for {city}? The special magic number for {city} is"


def sentence_end_after(tokens: list[int], position: int, tokenizer, reach: int = 64) -> int:
    """The first index ``i >= position`` (at most ``position + reach``) that lies between a token ending a
    sentence and a token starting with white space — failing that, the first before a token starting with
    white space (a word boundary); ``position`` itself if there is neither, or if it is the start or the end."""
    if position == 0 or position >= len(tokens):
        return position
    candidates = range(position, min(len(tokens) - 1, position + reach) + 1)
    word_starts = [i for i in candidates if tokenizer.decode([tokens[i]])[:1].isspace()]
    for i in word_starts:
        if tokenizer.decode([tokens[i - 1]]).endswith(SENTENCE_ENDS):
            return i
    return word_starts[0] if word_starts else position


def haystack(stream: TokenStream, size: int, rng: random.Random, tokenizer, reach: int = 64) -> list[int]:
    """``size`` tokens of one document of ``stream`` (no end-of-document token inside), from a random offset
    moved forward to the next sentence start (within ``reach`` tokens)."""
    fitting = [d for d in stream.meta["documents"] if d["tokens"] - 1 >= size + reach]
    if not fitting:
        longest = max(d["tokens"] - 1 for d in stream.meta["documents"])
        raise ValueError(f"no document of the haystack stream holds {size + reach} tokens (the longest holds "
                         f"{longest}): use shorter prompts or a corpus with longer documents")
    doc = rng.choice(fitting)
    offset = doc["start"] + rng.randrange(doc["tokens"] - 1 - size - reach + 1)
    window = [int(t) for t in stream.tokens[offset: offset + size + reach]]
    start = sentence_end_after(window, 1, tokenizer, reach - 1) if window else 0
    return window[start: start + size]


def needle_prompt(tokenizer, stream: TokenStream, *, length: int, depth: float, num_keys: int = 1, choices: int = 10,
                  seed: int = 0) -> NeedlePrompt:
    """A prompt of ``length - max(len(c) for c in candidates)`` tokens (module docstring): with any candidate
    answer it fits a model of ``max_len = length``. A pure function of its arguments."""
    if not 0 <= depth <= 1:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    if not 1 <= num_keys <= len(CITIES) or choices < num_keys:
        raise ValueError(f"need 1 <= num_keys <= {len(CITIES)} and choices >= num_keys, got {num_keys}, {choices}")
    rng = random.Random(seed)
    cities = rng.sample(CITIES, num_keys)
    numbers = rng.sample(range(1_000_000, 10_000_000), choices)  # the needles' first, then distractor answers
    needles = [tokenizer.encode(needle_sentence(c, n)) for c, n in zip(cities, numbers)]
    ask = tokenizer.encode(question(cities[0]))
    candidates = [tokenizer.encode(f" {n}") for n in numbers]
    size = length - len(ask) - sum(len(n) for n in needles) - max(len(c) for c in candidates)
    if size < 1:
        raise ValueError(f"length={length} leaves no room for a haystack around {num_keys} needle(s) and the question")
    hay = haystack(stream, size, rng, tokenizer)
    depths = [depth] + [rng.random() for _ in needles[1:]]
    places = [sentence_end_after(hay, round(d * size), tokenizer) for d in depths]
    order = sorted(range(num_keys), key=lambda i: (places[i], i), reverse=True)  # insert from the back
    tokens = list(hay)
    for i in order:
        tokens[places[i]: places[i]] = needles[i]
    position = places[0] + sum(len(needles[i]) for i in range(1, num_keys) if (places[i], i) < (places[0], 0))
    return NeedlePrompt(tokens + ask, candidates, position, length, depth, num_keys)
