"""Chapter 11: associative recall — the best possible reader of lagged recall, choosing a learning rate honestly,
and when two models are separated beyond the spread over seeds."""

from __future__ import annotations

import math

from ..data import lagged_recall
from ..experiments.mqar.report import best_by_cell, compare
from .checking import Case, Exercise, call


def best_reader(tokens: list[int], t: int, value_start: int) -> int | None:
    """The value of the latest binding of key ``tokens[t]`` before position ``t``: a slot ``(2s, 2s + 1)`` ending
    before ``t`` whose first token is the key and whose second token is a value (``>= value_start``)."""
    for s in range(t - 2, -1, -2):
        if tokens[s] == tokens[t] and tokens[s + 1] >= value_start:
            return tokens[s + 1]
    return None


def _first_binding(tokens: list[int], t: int, value_start: int) -> int | None:
    for s in range(0, t - 1, 2):
        if tokens[s] == tokens[t] and tokens[s + 1] >= value_start:
            return tokens[s + 1]
    return None


def _any_slot(tokens: list[int], t: int, value_start: int) -> int | None:
    for s in range(t - 2, -1, -2):
        if tokens[s] == tokens[t]:
            return tokens[s + 1]
    return None


def _reader_cases(rng):
    for seq_len, keys, queries, vocab in [(16, 2, 3, 16), (32, 3, 6, 16), (64, 4, 12, 32), (256, 32, 16, 8192)]:
        seed = rng.randrange(2**31)
        yield Case((lagged_recall(40, seq_len, keys, queries, vocab, seed=seed),),
                   f"40 lagged-recall sequences, T={seq_len}, {keys} keys, {queries} queries, vocabulary {vocab}")


def _read_every_query(fn, recall_set):
    value_start = recall_set.info["vocab_size"] // 2
    return {(n, t): call(fn, recall_set.inputs[n].tolist(), t, value_start)
            for n in range(len(recall_set)) for t in recall_set.query_positions[n].tolist()}


def _labels(recall_set):
    return {(n, t): recall_set.labels[n, t].item()
            for n in range(len(recall_set)) for t in recall_set.query_positions[n].tolist()}


BEST_READER = Exercise(
    name="recall.best_reader",
    chapter=11,
    signature="best_reader(tokens, t, value_start) -> int",
    task="Lagged recall is made of slots of two tokens. Write the best possible reader: given one sequence "
         "`tokens` (a list of ints), a query position `t` and the first value token `value_start`, return the value "
         "the key `tokens[t]` was last bound to before `t`, reading `tokens[:t + 1]` only. A slot `(key, value)` "
         "binds; a query slot's second token is never a value. It must answer every query of the generated sets.",
    solution=best_reader,
    cases=_reader_cases,
    driver=_read_every_query,
    reference=_labels,
    mistakes=(
        (_first_binding, "keys are bound again and again: the answer is the latest binding before the query, "
                         "so scan backwards from t."),
        (_any_slot, "a slot binds only when its second token is a value (>= value_start); after a query the "
                    "second token is filler."),
    ),
)


def choose_rate(finals: list[dict]) -> float:
    """The learning rate whose final validation accuracy is highest; ties go to the lowest rate."""
    best = None
    for line in sorted(finals, key=lambda line: line["lr"]):
        if best is None or line["validation_accuracy"] > best["validation_accuracy"]:
            best = line
    return best["lr"]


def _by_test(finals: list[dict]) -> float:
    return max(sorted(finals, key=lambda line: line["lr"]), key=lambda line: line["test_accuracy"])["lr"]


def _ties_to_the_highest_rate(finals: list[dict]) -> float:
    return max(sorted(finals, key=lambda line: -line["lr"]), key=lambda line: line["validation_accuracy"])["lr"]


def _rate_cases(rng):
    rates = [1e-3, 10**-2.5, 1e-2, 10**-1.5]
    for draw, what in ((rng.random, "distinct accuracies"), (lambda: rng.choice([0.0, 0.5, 1.0]), "tied accuracies")):
        sweeps = [[dict(lr=lr, validation_accuracy=draw(), test_accuracy=draw()) for lr in rng.sample(rates, 4)]
                  for _ in range(30)]
        yield Case((sweeps,), f"30 sweeps of Zoology's four rates in random order, {what}")


def _package_choice(sweeps):
    """The rate the package's report chooses for each sweep (:func:`best_by_cell` on a job record)."""
    out = {}
    for i, sweep in enumerate(sweeps):
        final = [dict(seed=0, lr=s["lr"], step=1, accuracy=s["test_accuracy"], query_accuracy=s["test_accuracy"],
                      accuracy_by_set={}, accuracy_by_level={}, validation=dict(accuracy=s["validation_accuracy"]))
                 for s in sweep]
        record = dict(name="job", model_name="m", width=1, members=[dict(seed=0, lr=s["lr"]) for s in sweep],
                      final=final, complete=True)
        out[i] = best_by_cell([record])[0]["lr"]
    return out


CHOOSE_RATE = Exercise(
    name="recall.choose_rate",
    chapter=11,
    signature="choose_rate(finals) -> float",
    task="Each item of `finals` is one learning rate's end of training for one model, width and seed: "
         "`dict(lr, validation_accuracy, test_accuracy)`. Return the learning rate that model selection picks, as "
         "this chapter's protocol does (ties: the lowest rate).",
    solution=choose_rate,
    cases=_rate_cases,
    driver=lambda fn, sweeps: {i: call(fn, [dict(s) for s in sweep]) for i, sweep in enumerate(sweeps)},
    reference=_package_choice,
    mistakes=(
        (_by_test, "choose on the validation accuracy: the test set answers the final question only, and a rate "
                   "picked on it makes the reported accuracy optimistic."),
        (_ties_to_the_highest_rate, "on a tie, keep the lowest rate."),
    ),
)


def separated(a: list[float], b: list[float]) -> bool:
    """Do two models' accuracies (points, one per seed) differ by more than two standard errors of the difference
    of their means, ``sqrt(s_a²/n_a + s_b²/n_b)`` with sample standard deviations, and by more than one point?"""
    def mean_var(x):
        m = sum(x) / len(x)
        return m, sum((v - m) ** 2 for v in x) / (len(x) - 1)

    (ma, va), (mb, vb) = mean_var(a), mean_var(b)
    return abs(ma - mb) > max(2 * math.sqrt(va / len(a) + vb / len(b)), 1.0)


def _population_deviation(a: list[float], b: list[float]) -> bool:
    def mean_var(x):
        m = sum(x) / len(x)
        return m, sum((v - m) ** 2 for v in x) / len(x)

    (ma, va), (mb, vb) = mean_var(a), mean_var(b)
    return abs(ma - mb) > max(2 * math.sqrt(va / len(a) + vb / len(b)), 1.0)


def _no_floor(a: list[float], b: list[float]) -> bool:
    def mean_var(x):
        m = sum(x) / len(x)
        return m, sum((v - m) ** 2 for v in x) / (len(x) - 1)

    (ma, va), (mb, vb) = mean_var(a), mean_var(b)
    return abs(ma - mb) > 2 * math.sqrt(va / len(a) + vb / len(b))


def _pair_cases(rng):
    for spreads in ((1.0, 3.0, 10.0), (0.05, 0.1, 0.3)):
        pairs = []
        for _ in range(150):
            n_a, n_b, spread = rng.randint(2, 5), rng.randint(2, 5), rng.choice(spreads)
            centre, gap = rng.uniform(20, 80), rng.uniform(0, 3) * spread + rng.uniform(0, 1.5)
            pairs.append(([centre + gap + rng.gauss(0, spread) for _ in range(n_a)],
                          [centre + rng.gauss(0, spread) for _ in range(n_b)]))
        yield Case((pairs,), f"150 pairs of 2-5 seeds each, spreads of {', '.join(map(str, spreads))} points")


def _package_separation(pairs):
    out = {}
    for i, (a, b) in enumerate(pairs):
        best = [dict(model="a", width=1, accuracy=x / 100) for x in a] + [dict(model="b", width=1, accuracy=x / 100)
                                                                         for x in b]
        out[i] = bool(compare(dict(best=best), "a", "b", 1)["separated"])
    return out


SEPARATED = Exercise(
    name="recall.separated",
    chapter=11,
    signature="separated(a, b) -> bool",
    task="`a` and `b` are two models' test accuracies in points, one per seed. Return whether the difference of "
         "their means exceeds both two standard errors of that difference, `sqrt(s_a²/n_a + s_b²/n_b)` with "
         "sample standard deviations, and one point of accuracy.",
    solution=separated,
    cases=_pair_cases,
    driver=lambda fn, pairs: {i: call(fn, list(a), list(b)) for i, (a, b) in enumerate(pairs)},
    reference=_package_separation,
    mistakes=(
        (_population_deviation, "use the sample standard deviation (divide by n - 1): with three seeds the "
                                "population one is 18 % too small."),
        (_no_floor, "with seeds that agree to a hair, a tiny difference is 'significant' but says nothing: "
                    "also ask for more than one point."),
    ),
)

EXERCISES = (BEST_READER, CHOOSE_RATE, SEPARATED)
