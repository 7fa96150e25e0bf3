"""How an exercise is checked: random cases, the reader's answer against the reference, a precise complaint.

An :class:`Exercise` owns a reference solution and a generator of random cases. :func:`run` calls the reader's
function on every case (through the exercise's ``driver`` when the function is one step of a loop), compares
with the reference answer and stops at the first difference, saying which case, where and by how much.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterable

import torch


class Mismatch(AssertionError):
    """The reader's answer differs from the reference; the message says how."""


@dataclass(frozen=True)
class Case:
    """One random input: ``args`` for the driver, and a description of them for messages."""

    args: tuple
    describe: str


def call(fn: Callable, *args):
    """The reader's ``fn(*args)`` on copies of the tensors (so an in-place edit cannot change the reference)."""
    return fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])


@dataclass(frozen=True)
class Exercise:
    """A task of a chapter: write ``signature`` so that it agrees with ``reference`` on random ``cases``.

    solution: the reference solution, shown in the book after the reader has tried.
    driver: ``driver(fn, *args)`` runs a function through a case (default: ``fn(*args)``); step functions are
    driven over a whole sequence. reference: ``reference(*args)`` is the expected result (default: the driver on
    the solution). mistakes: typical wrong answers ``(function, hint)``; when the reader's result matches one,
    the report gives its hint (and the tests check that the checker rejects every one of them).
    """

    name: str
    chapter: int
    signature: str
    task: str
    solution: Callable
    cases: Callable[[random.Random], Iterable[Case]]
    driver: Callable | None = None
    reference: Callable | None = None
    mistakes: tuple[tuple[Callable, str], ...] = ()
    rtol: float = 1e-7
    atol: float = 1e-9

    def drive(self, fn: Callable, *args):
        return self.driver(fn, *args) if self.driver is not None else call(fn, *args)

    def expected(self, *args):
        return self.reference(*args) if self.reference is not None else self.drive(self.solution, *args)

    def diagnose(self, got, case: Case) -> str | None:
        """The hint of the first typical mistake whose result on ``case`` equals ``got``."""
        for mistake, hint in self.mistakes:
            try:
                compare(got, self.drive(mistake, *case.args), rtol=self.rtol, atol=self.atol)
            except Exception:  # noqa: BLE001 - a mistake that does not match (or fails) gives no hint
                continue
            return hint
        return None


def compare(got, expected, *, rtol: float, atol: float, what: str = "the result", name: str | None = None) -> None:
    """Raise :class:`Mismatch` saying where ``got`` first differs from ``expected`` (tensors, numbers, sequences).

    name: the reader's function; a dict of results keyed by its arguments is then reported as ``name(args)``.
    """
    if isinstance(expected, torch.Tensor):
        _compare_tensors(got, expected, rtol=rtol, atol=atol, what=what)
    elif isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            raise Mismatch(f"{what} should be a sequence of {len(expected)} items: {_short(expected)}, got {_short(got)}")
        for i, (g, e) in enumerate(zip(got, expected)):
            compare(g, e, rtol=rtol, atol=atol, what=f"{what}[{i}]")
    elif isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            keys = sorted(got) if isinstance(got, dict) else type(got).__name__
            raise Mismatch(f"{what} should be a dict with keys {sorted(expected)}, got {keys}")
        for key in expected:
            label = f"{what}[{key!r}]" if name is None else f"{name}{key}" if isinstance(key, tuple) else f"{name}({key!r})"
            compare(got[key], expected[key], rtol=rtol, atol=atol, what=label)
    elif isinstance(expected, range):
        if not isinstance(got, (range, list, tuple)) or list(got) != list(expected):
            raise Mismatch(f"{what} should hold the positions {_short(list(expected))}, got {_short(got)}")
    elif got != expected:
        raise Mismatch(f"{what} should be {expected!r}, got {got!r}")


def _short(x, limit: int = 80) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _compare_tensors(got, expected: torch.Tensor, *, rtol: float, atol: float, what: str) -> None:
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what} should be a torch.Tensor of shape {list(expected.shape)}, got {type(got).__name__}")
    if tuple(got.shape) != tuple(expected.shape):
        raise Mismatch(f"{what} should have shape {list(expected.shape)}, got {list(got.shape)}")
    if expected.dtype == torch.bool or not expected.is_floating_point():
        wrong = got.to(expected.dtype) != expected
        if wrong.any():
            index = tuple(i.item() for i in wrong.nonzero()[0])
            raise Mismatch(f"{what}{list(index)} should be {expected[index].item()}, got {got[index].item()}")
        return
    got = got.to(expected.dtype)
    if not torch.isfinite(got).all():
        index = tuple(i.item() for i in (~torch.isfinite(got)).nonzero()[0])
        raise Mismatch(f"{what} has a non-finite value at index {list(index)}: {got[index].item()}")
    error = (got - expected).abs()
    allowed = atol + rtol * expected.abs().max()
    if (error > allowed).any():
        index = tuple(i.item() for i in (error > allowed).nonzero()[0])
        worst = error.max().item()
        raise Mismatch(
            f"{what} differs first at index {list(index)}: got {got[index].item():.6g}, expected "
            f"{expected[index].item():.6g} (largest error {worst:.3g}, allowed {allowed.item():.3g})"
        )


@dataclass
class Report:
    """The verdict of :func:`run`: passed or not, after how many cases, and what was wrong."""

    exercise: str
    passed: bool
    cases: int
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        mark = "✔" if self.passed else "✘"
        return f"{mark} {self.exercise}: {self.message}"

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.passed else "#cf222e"
        mark = "✔" if self.passed else "✘"
        body = str(self.message).replace("&", "&amp;").replace("<", "&lt;").replace("\n", "<br>")
        return f'<div style="border-left:4px solid {color};padding:0.3em 0.8em"><b>{mark} {self.exercise}</b>: {body}</div>'

    __repr__ = __str__


def run(exercise: Exercise, fn: Callable, *, seed: int = 0) -> Report:
    """Check ``fn`` on every random case of ``exercise``; stop at the first case it gets wrong."""
    count = 0
    for case in exercise.cases(random.Random(seed)):
        expected = exercise.expected(*case.args)
        try:
            got = exercise.drive(fn, *case.args)
        except NotImplementedError:
            return Report(exercise.name, False, count, "not attempted yet: replace `raise NotImplementedError` with your code")
        except Mismatch as err:  # a driver found a wrong intermediate result
            return Report(exercise.name, False, count, f"on the case {case.describe}: {err}")
        except Exception as err:  # noqa: BLE001 - any error of the reader's code is reported, not raised
            return Report(exercise.name, False, count, f"on the case {case.describe} your function raised "
                                                       f"{type(err).__name__}: {err}")
        try:
            compare(got, expected, rtol=exercise.rtol, atol=exercise.atol, name=exercise.signature.split("(")[0])
        except Mismatch as err:
            hint = exercise.diagnose(got, case)
            return Report(exercise.name, False, count,
                          f"on the case {case.describe}: {err}" + (f"\nHint: {hint}" if hint else ""))
        count += 1
    return Report(exercise.name, True, count, f"all {count} random cases agree with the reference")


def random_shape(rng: random.Random, *, max_len: int = 40) -> dict[str, int]:
    """Sizes ``B, T, H, K, V`` for one case; ``T`` is often 1, a power of two or not."""
    T = rng.choice([1, 2, rng.randint(3, max_len), rng.randint(3, max_len), 2 ** rng.randint(2, 5)])
    return dict(B=rng.randint(1, 2), T=T, H=rng.randint(1, 3), K=rng.randint(1, 5), V=rng.randint(1, 5))


def random_qkv(sizes: dict[str, int], seed: int, *, unit_keys: bool = False) -> tuple[torch.Tensor, ...]:
    """Float64 ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, log-decay ``g: [B, T, H]`` (<= 0), β ``[B, T, H]``."""
    gen = torch.Generator().manual_seed(seed)
    B, T, H, K, V = (sizes[n] for n in "BTHKV")
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    if unit_keys:
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    g = -0.5 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta


def describe(sizes: dict[str, int]) -> str:
    """``"B=2, T=37, H=1, K=3, V=4"``."""
    return ", ".join(f"{name}={value}" for name, value in sizes.items())


def sequence_cases(rng: random.Random, *, inputs: int = 3, unit_keys: bool = False) -> Iterable[Case]:
    """Cases ``(q, k, v)``, then ``log_decay`` and ``beta`` when ``inputs`` is 4 or 5, as :func:`random_qkv`."""
    for sizes, seed in tensor_cases(rng):
        yield Case(random_qkv(sizes, seed, unit_keys=unit_keys)[:inputs], describe(sizes))


def tensor_cases(rng: random.Random, count: int = 12, **kw) -> Iterable[tuple[dict[str, int], int]]:
    """``count`` random shapes, each with a seed for its tensors."""
    for _ in range(count):
        yield random_shape(rng, **kw), rng.randrange(2**31)


def drive_steps(step: Callable, state: torch.Tensor, *sequences: torch.Tensor) -> torch.Tensor:
    """Run ``state, o_t = step(state, x_t, ...)`` over time, ``x_t = x[:, t]`` for each ``x: [B, T, ...]``.

    Checks that the state keeps its shape. Returns the outputs stacked along time: ``[B, T, ...]``.
    """
    outputs = []
    for t in range(sequences[0].shape[1]):
        result = call(step, state, *[x[:, t] for x in sequences])
        if not isinstance(result, tuple) or len(result) != 2:
            raise Mismatch(f"the step should return (state, output), got {_short(result)}")
        new_state, out = result
        if not isinstance(new_state, torch.Tensor) or new_state.shape != state.shape:
            shape = list(new_state.shape) if isinstance(new_state, torch.Tensor) else type(new_state).__name__
            raise Mismatch(f"after token {t} the state should keep its shape {list(state.shape)}, got {shape}")
        state = new_state
        outputs.append(out)
    return torch.stack(outputs, dim=1)
