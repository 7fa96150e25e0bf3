"""What a recall run reports: the learning rate chosen per cell on the validation sets, the Transformer gate,
comparisons beyond the seed spread and a verdict per claim, the results file with its provenance, and a table.

Model selection (Zoology's protocol, made honest): for every (model, width, seed) the learning rate with the
best final **validation** accuracy is chosen; its **test** accuracy is what the tables show. A rate chosen at
the edge of the grid is flagged (the optimum may lie outside the sweep).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from ...provenance import provenance
from .settings import LABELS, PAPER_MQAR, PAPER_MQAR_AT_LEAST, ZOOLOGY_SEQUENCES, Tier, base_model, transformer_layout

GATE_ACCURACY = 0.99
STEP_TOLERANCE = 0.05  # two cells whose final steps differ by more than this were not trained alike
LEARNED = 0.05  # below this accuracy (%/100) a model has not left the initial plateau


def best_by_cell(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every (model, width, seed): the learning rate whose final validation accuracy is highest (ties: the
    lower rate), with its test accuracies. ``edge``: the chosen rate is the lowest or highest of a sweep of
    several rates; ``complete``: the job reached its planned last step (else a deadline stopped it, and its
    last evaluation is what counts). A job whose last evaluation measured no test set has no row."""
    rows = []
    for rec in records:
        rates = sorted({m["lr"] for m in rec["members"]})
        for seed in sorted({m["seed"] for m in rec["members"]}):
            finals = sorted((line for line in rec["final"] if line["seed"] == seed), key=lambda line: line["lr"])
            if not finals or any("accuracy" not in line for line in finals):
                continue
            if any("validation" not in line for line in finals):
                raise ValueError(f"{rec['name']}: final evaluations without validation accuracy; a learning rate "
                                 "chosen on the test sets would be an optimistic estimate")
            best = max(finals, key=lambda line: line["validation"]["accuracy"])  # max keeps the first of ties
            rows.append(dict(
                model=rec["model_name"], width=rec["width"], seed=seed, lr=best["lr"], step=best["step"],
                complete=rec["complete"], edge=len(rates) > 1 and best["lr"] in (rates[0], rates[-1]),
                validation_accuracy=best["validation"]["accuracy"], accuracy=best["accuracy"],
                query_accuracy=best["query_accuracy"], accuracy_by_set=best["accuracy_by_set"],
                accuracy_by_level=best["accuracy_by_level"],
                **({"level_scales": best["level_scales"]} if "level_scales" in best else {}),
            ))
    return rows


def cell_accuracies(result: dict[str, Any], model: str, width: int, metric: str = "accuracy") -> list[float]:
    """The chosen rate's final test ``metric`` of every seed of one cell (empty if the job did not finish)."""
    return [r[metric] for r in result["best"] if r["model"] == model and r["width"] == width]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def cell_summary(result: dict[str, Any], model: str, width: int) -> dict[str, Any] | None:
    """Mean ± std over seeds (in %) of both accuracies, by set, the chosen rates and how many sit at an edge."""
    rows = [r for r in result["best"] if r["model"] == model and r["width"] == width]
    if not rows:
        return None
    mean, std = mean_std([100 * r["accuracy"] for r in rows])
    query_mean, query_std = mean_std([100 * r["query_accuracy"] for r in rows])
    sets = list(rows[0]["accuracy_by_set"])
    return dict(model=model, width=width, seeds=len(rows), mean=mean, std=std, query_mean=query_mean,
                query_std=query_std, by_set={s: mean_std([100 * r["accuracy_by_set"][s] for r in rows]) for s in sets},
                lrs=[r["lr"] for r in rows], edges=sum(r["edge"] for r in rows))


def validation_curve(result: dict[str, Any], model: str, width: int) -> tuple[list[int], list[float]]:
    """Learning curve of a cell: at every evaluation, the validation accuracy (%) averaged over seeds, each seed at
    the learning rate finally chosen for it (from every job of the cell: its seeds may have trained apart)."""
    chosen = {r["seed"]: r["lr"] for r in result["best"] if r["model"] == model and r["width"] == width}
    jobs = [j for j in result["jobs"] if j["model_name"] == model and j["width"] == width]
    if not jobs or not chosen:
        return [], []
    lines = [h for job in jobs for h in job["history"] if chosen.get(h["seed"]) == h["lr"] and "validation" in h]
    steps = sorted({h["step"] for h in lines})
    means = [100 * sum(h["validation"]["accuracy"] for h in lines if h["step"] == s) /
             sum(1 for h in lines if h["step"] == s) for s in steps]
    return steps, means


def level_scales_by_level(result: dict[str, Any], model: str, width: int) -> list[list[float | None]] | None:
    """The λ a log-linear cell gives each level at the query positions (per layer, per level), averaged over its
    seeds at their chosen rates; None for a model without log-linear layers."""
    rows = [r["level_scales"] for r in result["best"]
            if r["model"] == model and r["width"] == width and "level_scales" in r]
    if not rows:
        return None
    out = []
    for layer in range(len(rows[0])):
        per_level = zip(*(r[layer] for r in rows))
        out.append([None if any(v is None for v in vs) else sum(vs) / len(vs) for vs in per_level])
    return out


def training_scale(result: dict[str, Any]) -> dict[str, Any]:
    """How much a run trained: steps done (fewest and most over jobs, and the most at each width), sequences per
    model, the fraction of Zoology's training that is, seeds, rates, and the jobs that stopped before their
    planned last step (not those never started)."""
    done = [j["steps_done"] for j in result["jobs"] if j.get("steps_done")]
    batch = result["train"]["batch_size"]
    most = max(done, default=0)
    by_width = {w: max((j.get("steps_done") or 0 for j in result["jobs"] if j.get("width") == w), default=0)
                for w in result["widths"]}
    return dict(steps_min=min(done, default=0), steps_max=most, steps_by_width=by_width, batch_size=batch,
                sequences=most * batch,
                zoology_sequences=ZOOLOGY_SEQUENCES, zoology_fraction=most * batch / ZOOLOGY_SEQUENCES,
                seeds=len(result["seeds"]), lrs=result["lrs"], widths=result["widths"],
                jobs=len(result["jobs"]),
                incomplete=[j["name"] for j in result["jobs"] if not j["complete"] and not j.get("not_run")],
                edge_choices=sum(r["edge"] for r in result["best"]), choices=len(result["best"]))


def compare(result: dict[str, Any], model: str, baseline: str, width: int) -> dict[str, Any]:
    """Is ``model`` better than ``baseline`` at ``width``, beyond the spread over seeds?

    Difference of the seed means (in points of accuracy), and its standard error ``sqrt(s_a²/n_a + s_b²/n_b)``
    (sample standard deviations). ``separated`` when the difference exceeds two standard errors and one point.
    """
    a = [100 * x for x in cell_accuracies(result, model, width)]
    b = [100 * x for x in cell_accuracies(result, baseline, width)]
    if len(a) < 2 or len(b) < 2:
        return dict(model=model, baseline=baseline, width=width, seeds=(len(a), len(b)), separated=None)
    (mean_a, std_a), (mean_b, std_b) = mean_std(a), mean_std(b)
    diff = mean_a - mean_b
    se = math.sqrt(std_a**2 / len(a) + std_b**2 / len(b))
    return dict(model=model, baseline=baseline, width=width, seeds=(len(a), len(b)), mean=mean_a,
                baseline_mean=mean_b, difference=diff, standard_error=se,
                separated=abs(diff) > max(2 * se, 1.0), better=diff > 0)


def transformer_gate(result: dict[str, Any], threshold: float = GATE_ACCURACY) -> dict[str, Any]:
    """Zoology's sanity check before any comparison: the Transformer's test accuracy (mean over seeds, each seed
    at its selected learning rate) reaches ``threshold`` at every width of the run.

    Returns ``dict(threshold, by_width={width: mean or None}, passed)``; a width whose Transformer did not
    finish counts as failed, and a run without Transformer jobs does not pass.
    """
    by_width = {}
    for w in result["widths"]:
        accs = cell_accuracies(result, "transformer", w)
        by_width[str(w)] = sum(accs) / len(accs) if accs else None
    passed = bool(by_width) and all(a is not None and a >= threshold for a in by_width.values())
    return dict(threshold=threshold, by_width=by_width, passed=passed)


SAME, NOT_AT_SCALE, CONTRADICTED = "same direction", "not at this scale", "contradicted"


def verdict(result: dict[str, Any], model: str, baseline: str, width: int) -> dict[str, Any]:
    """The verdict on the claim "``model`` is at least as good as ``baseline``" at ``width``.

    The claim's direction is the paper's (its MQAR table, for the MQAR tier: log-linear better, or both >= 99);
    elsewhere (lagged recall, per-level against tied λ) the claim is that ``model`` is better. Ours:

    - same direction: ours is separated (:func:`compare`) in the claimed direction, or the claim is a tie at
      >= 99 % and both of ours are >= 99 %;
    - contradicted: ours is separated in the opposite direction;
    - not at this scale: anything else (within the seed spread, or neither model learned the task).

    No verdict (None) when a cell is missing or the two were not trained alike: ``equal_training`` is False when
    their final steps differ by more than :data:`STEP_TOLERANCE` (a deadline stopped one of them early), and None
    when a cell has no results to compare; ``steps`` gives each one's.
    """
    c = compare(result, model, baseline, width)
    rows = [r for r in result["best"] if r["width"] == width and r["model"] in (model, baseline)]
    steps = {m: sorted({r.get("step") for r in rows if r["model"] == m}) for m in (model, baseline)}
    done = [r["step"] for r in rows if r.get("step") is not None]
    equal_training = (None if not all(steps.values()) else
                      not done or min(done) >= (1 - STEP_TOLERANCE) * max(done))
    paper = None
    if result["data"]["task"] == "mqar" and model in PAPER_MQAR and baseline in PAPER_MQAR:
        paper = dict(model=PAPER_MQAR[model][width], baseline=PAPER_MQAR[baseline][width],
                     tie=(model, width) in PAPER_MQAR_AT_LEAST and (baseline, width) in PAPER_MQAR_AT_LEAST)
    if c["separated"] is None or not equal_training:
        label = None
    elif paper is not None and paper["tie"]:
        label = SAME if min(c["mean"], c["baseline_mean"]) >= 100 * GATE_ACCURACY else (
            CONTRADICTED if c["separated"] and not c["better"] else NOT_AT_SCALE)
    elif max(c["mean"], c["baseline_mean"]) < 100 * LEARNED or not c["separated"]:
        label = NOT_AT_SCALE
    else:
        label = SAME if c["better"] else CONTRADICTED
    return dict(claim=f"{LABELS[model]} ≥ {LABELS[baseline]}", model=model, baseline=baseline, width=width,
                paper=paper, ours=c, equal_training=equal_training, steps=steps, verdict=label)


def claims(result: dict[str, Any]) -> list[tuple[str, str, int]]:
    """The (model, baseline, width) pairs a run can judge: every log-linear model against its linear parent,
    and against itself with λ tied across levels (the ablation), at every width where both ran."""
    models, pairs = result["models"], []
    for w in result["widths"]:
        for model in models:
            base = base_model(model)
            if model != base:  # a variant (λ tied) is a baseline, not a claim
                continue
            parent = {"loglinear_mamba2": "mamba2", "loglinear_gated_deltanet": "gated_deltanet"}.get(model)
            if parent in models:
                pairs.append((model, parent, w))
            for variant in models:
                if variant != model and base_model(variant) == model:
                    pairs.append((model, variant, w))
    return pairs


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A verdict per claim of :func:`claims`, or None when the Transformer gate failed (no comparison is read
    from a run whose baseline does not solve the task)."""
    if not result["gate"]["passed"]:
        return None
    return [verdict(result, *claim) for claim in claims(result)]


def training_machine(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a tier's jobs trained: each of ``device`` and ``commit`` that every job's record names alike
    (``trained_on``), and of ``versions`` the libraries every job names at one version; a field some job did not
    record, or that two jobs disagree on, is left out."""
    machines = [r.get("trained_on") or {} for r in records]
    common = {}
    for field in ("device", "commit", "versions"):
        values = [m.get(field) for m in machines]
        if not values or any(v is None for v in values):
            continue
        if field == "versions":
            agreed = {name: version for name, version in values[0].items()
                      if all(v.get(name) == version for v in values)}
            if agreed:
                common[field] = agreed
        elif all(v == values[0] for v in values):
            common[field] = values[0]
    return common


def results_record(name: str, tier: Tier, records: list[dict[str, Any]], *, device: str, seconds: float,
                   commit: str | None, command: str | None) -> dict[str, Any]:
    """The results file of one tier: setup, provenance, every job's record, the chosen-rate table (``best``, with
    each job's ``complete``), the gate and the verdicts. Device, commit and versions are those the jobs trained with
    (:func:`training_machine` of the jobs that ran) where they agree, else this process's; ``merged_on`` names this
    machine when the jobs trained on another; ``trained_commits`` names each job's commit when the jobs trained at
    different ones (the file's ``commit`` is then the merging process's)."""
    here = {**provenance(command, device), **({"commit": commit} if commit else {})}
    ran = [r for r in records if not r.get("not_run")]
    trained = training_machine(ran)
    commits = {r["name"]: (r.get("trained_on") or {}).get("commit") for r in ran}
    result = dict(
        tier=name, **{**here, **trained},
        **({"merged_on": here["device"]} if trained.get("device", here["device"]) != here["device"] else {}),
        **({"trained_commits": commits} if len(set(commits.values()) - {None}) > 1 else {}),
        seconds=round(seconds, 1), data=asdict(tier.data), train=tier.train.to_dict(), seeds=list(tier.seeds),
        lrs=list(tier.lrs), models=list(tier.models), widths=list(tier.widths), backend=tier.backend,
        transformer=transformer_layout(tier), jobs=records,
        best=best_by_cell(records),
    )
    result["gate"] = transformer_gate(result)
    result["verdicts"] = verdicts(result)
    if result["verdicts"] is None:
        result["verdicts_withheld"] = (f"the Transformer did not reach {100 * GATE_ACCURACY:.0f} % test accuracy at "
                                       "every width: no comparison of this run is reported")
    return result


def summary_table(result: dict[str, Any]) -> list[str]:
    """Mean ± std over seeds of the chosen rate's test accuracy, one line per model, one column per width."""
    lines = [f"{'model':<40}" + "".join(f"{'d=' + str(w):>16}" for w in result["widths"])]
    for model in result["models"]:
        cells = []
        for w in result["widths"]:
            s = cell_summary(result, model, w)
            cells.append("-" if s is None else f"{s['mean']:6.1f} ± {s['std']:4.1f}" + ("*" if s["edges"] else ""))
        lines.append(f"{LABELS[model]:<40}" + "".join(f"{c:>16}" for c in cells))
    gate = result["gate"]
    lines.append(f"gate (Transformer >= {100 * gate['threshold']:.0f} % at every width): "
                 + ("passed" if gate["passed"] else "FAILED, no verdicts")
                 + "; * a seed chose a rate at the grid's edge")
    return lines
