"""Needle-in-a-haystack prompts built from the corpus (RULER's S-NIAH and MK-NIAH, in shape).

A prompt — ``length`` tokens with its longest answer candidate — is held-out text (the haystack) with
``num_keys`` needles

    " The special magic number for <city> is <7-digit number>."

inserted into it, then the question

    " What is the special magic number for <city>? The special magic number for <city> is"

whose answer is ``" <number>"``. The asked needle sits at ``depth`` (0: the start of the haystack, 1: its
end, right before the question); in the multi-key task (``num_keys > 1``) the other needles name other
cities and sit at random depths: the model must pick the right key's number. A needle is placed after the
first token at or past its depth that ends a sentence or line (within 64 tokens), so it does not split a word.

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
SENTENCE_ENDS = (".", "!", "?", ";", ":", "\n")


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
    """The first index ``i >= position`` (at most ``position + reach``) right after a token that ends a sentence
    or line; ``position`` itself if there is none (or if it is 0, the start)."""
    if position == 0:
        return 0
    for i in range(position, min(len(tokens), position + reach) + 1):
        if tokenizer.decode([tokens[i - 1]]).endswith(SENTENCE_ENDS):
            return i
    return position


def haystack(stream: TokenStream, size: int, rng: random.Random) -> list[int]:
    """``size`` tokens of one document of ``stream`` (no end-of-document token inside), from a random offset."""
    fitting = [d for d in stream.meta["documents"] if d["tokens"] - 1 >= size]
    if not fitting:
        longest = max(d["tokens"] - 1 for d in stream.meta["documents"])
        raise ValueError(f"no document of the haystack stream holds {size} tokens (the longest holds {longest}): "
                         f"use shorter prompts or a corpus with longer documents")
    doc = rng.choice(fitting)
    start = doc["start"] + rng.randrange(doc["tokens"] - 1 - size + 1)
    return [int(t) for t in stream.tokens[start: start + size]]


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
    hay = haystack(stream, size, rng)
    depths = [depth] + [rng.random() for _ in needles[1:]]
    places = [sentence_end_after(hay, round(d * size), tokenizer) for d in depths]
    order = sorted(range(num_keys), key=lambda i: (places[i], i), reverse=True)  # insert from the back
    tokens = list(hay)
    for i in order:
        tokens[places[i]: places[i]] = needles[i]
    position = places[0] + sum(len(needles[i]) for i in range(1, num_keys) if (places[i], i) < (places[0], 0))
    return NeedlePrompt(tokens + ask, candidates, position, length, depth, num_keys)
