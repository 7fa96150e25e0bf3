"""Associative-recall experiments: five architectures trained through one code path.

    python -m loglin_edu.experiments.mqar --tier cpu                       # minutes on a laptop CPU
    python -m loglin_edu.experiments.mqar --tier gpu --task mqar --out DIR # the paper's setting, one GPU
    python -m loglin_edu.experiments.mqar --tier gpu --task lagged --out DIR

A *job* is one architecture at one width: an :class:`~loglin_edu.train.Ensemble` of every (seed, learning
rate) pair, trained together. The ``gpu`` tier runs its jobs as parallel worker processes on the one GPU
(each job is far too small to keep it busy) and writes one JSON file with every evaluation, the final
accuracies, parameter counts, the command, commit, device, library versions and date.

Tiers (:data:`TIERS`):

- ``cpu``: MQAR at T = 32 with 2 and 4 pairs, a 64-token vocabulary, width 32, one seed, 400 steps — small
  enough for the book build and CI (about a minute on two idle cores), large enough to show the learning
  curves of all five models.
- ``gpu``/``mqar``: Zoology's protocol as the paper uses it: T = 256, 4–64 pairs (one training set per
  pair count, batches drawn evenly from them), vocabulary 8192, 2 layers, widths 16/32/64.
- ``gpu``/``lagged``: lagged recall (:mod:`loglin_edu.data.lagged`) at T = 256: answers at every distance.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..data import RecallSet, lagged_recall, mqar
from ..layers.model import MIXERS, ModelConfig
from ..train import Member, TrainConfig, save_atomic, train

MODELS = tuple(MIXERS)  # transformer, mamba2, loglinear_mamba2, gated_deltanet, loglinear_gated_deltanet
LABELS = {
    "transformer": "Transformer",
    "mamba2": "Mamba-2",
    "loglinear_mamba2": "log-linear Mamba-2",
    "gated_deltanet": "Gated DeltaNet",
    "loglinear_gated_deltanet": "log-linear Gated DeltaNet",
}


# MQAR accuracy (%) as reported in the paper (Guo et al., 2025; transcribed, PAPER.md §6): T = 256, 4-64 pairs,
# 2 layers, 5 seeds, a learning-rate sweep. ">= 99" is stored as 99.0 with the flag in PAPER_MQAR_AT_LEAST.
PAPER_MQAR = {
    "transformer": {16: 99.0, 32: 99.0, 64: 99.0},
    "mamba2": {16: 46.9, 32: 75.1, 64: 89.6},
    "loglinear_mamba2": {16: 55.9, 32: 76.5, 64: 92.9},
    "gated_deltanet": {16: 38.4, 32: 79.0, 64: 99.0},
    "loglinear_gated_deltanet": {16: 40.0, 32: 84.4, 64: 99.0},
}
PAPER_MQAR_AT_LEAST = {("transformer", 16), ("transformer", 32), ("transformer", 64), ("gated_deltanet", 64),
                       ("loglinear_gated_deltanet", 64)}


@dataclass
class TaskSpec:
    """The data of an experiment. task: ``"mqar"`` (one training and test set per entry of ``sizes``, the
    number of key–value pairs) or ``"lagged"`` (``sizes`` = numbers of queries; ``num_keys`` keys)."""

    task: str = "mqar"
    seq_len: int = 256
    vocab_size: int = 8192
    sizes: tuple[int, ...] = (4, 8, 16, 32, 64)
    num_keys: int = 32
    train_examples: int = 20_000
    test_examples: int = 1_000
    data_seed: int = 0


@dataclass
class Tier:
    """Everything one tier runs: the data, the models and widths, the members of each ensemble, training."""

    data: TaskSpec
    models: tuple[str, ...] = MODELS
    widths: tuple[int, ...] = (16, 32, 64)
    seeds: tuple[int, ...] = (0, 1, 2)
    lrs: tuple[float, ...] = (1e-3, 3e-3)
    train: TrainConfig = field(default_factory=TrainConfig)
    n_layers: int = 2
    chunk_size: int = 64
    backend: str = "torch"


ZOOLOGY_LRS = (1e-3, 10**-2.5, 1e-2)  # the first three of Zoology's sweep logspace(-3, -1.5, 4)

TIERS: dict[str, Tier] = {
    "cpu": Tier(
        data=TaskSpec("mqar", seq_len=32, vocab_size=64, sizes=(2, 4), train_examples=4_000, test_examples=250),
        widths=(32,), seeds=(0,), lrs=(3e-3,), chunk_size=8,
        train=TrainConfig(steps=400, batch_size=64, warmup_steps=30, eval_every=50, eval_batch_size=250),
    ),
    "gpu/mqar": Tier(
        data=TaskSpec("mqar", seq_len=256, vocab_size=8192, sizes=(4, 8, 16, 32, 64)),
        lrs=ZOOLOGY_LRS,
        train=TrainConfig(steps=4000, batch_size=60, warmup_steps=100, eval_every=250, eval_batch_size=100),
    ),
    "gpu/lagged": Tier(
        data=TaskSpec("lagged", seq_len=256, vocab_size=8192, sizes=(16,), num_keys=32, train_examples=40_000,
                      test_examples=2_000),
        widths=(32,), lrs=ZOOLOGY_LRS,
        train=TrainConfig(steps=4000, batch_size=60, warmup_steps=100, eval_every=250, eval_batch_size=100),
    ),
}


def mixer_options(model: str, width: int, chunk_size: int, backend: str = "torch") -> dict[str, Any]:
    """Each architecture's settings at a width (state sizes in :func:`state_size`).

    Transformer: one head (as Zoology's MQAR baseline), RoPE, the dense form (T <= 256).
    Mamba-2 (both): expand 2, heads of width 16, state width N = 16, one group.
    Gated DeltaNet (both): 2 heads, key width ``width / 2``, value width ``width``.
    backend: ``"torch"`` (the PyTorch forms) or ``"auto"`` (the Triton kernel where a layer has one and the
    tensors are on CUDA: log-linear Mamba-2); the other layers run their PyTorch forms either way.
    """
    if backend not in ("torch", "auto"):
        raise ValueError(f"backend must be 'torch' or 'auto', got {backend!r}")
    if model == "transformer":
        return dict(num_heads=1, backend="torch", form="naive")
    if model in ("mamba2", "loglinear_mamba2"):
        return dict(d_state=16, head_dim=16, expand=2, backend=backend, chunk_size=chunk_size)
    return dict(num_heads=2, expand_v=2, backend="torch", chunk_size=chunk_size)


def model_config(tier: Tier, model: str, width: int) -> ModelConfig:
    return ModelConfig(
        model, vocab_size=tier.data.vocab_size, d_model=width, n_layers=tier.n_layers, max_len=tier.data.seq_len,
        mixer_options=mixer_options(model, width, tier.chunk_size, tier.backend),
    )


def state_size(config: ModelConfig) -> int:
    """Recurrent state entries per layer (per Fenwick level for the log-linear models; 0 for the Transformer,
    whose KV cache grows with T)."""
    from ..layers.model import make_mixer

    mixer = make_mixer(config)
    if config.mixer in ("mamba2", "loglinear_mamba2"):
        return mixer.num_heads * mixer.head_dim * mixer.d_state
    if config.mixer in ("gated_deltanet", "loglinear_gated_deltanet"):
        return mixer.num_heads * mixer.key_dim * mixer.value_dim
    return 0


def make_sets(spec: TaskSpec, cache: Path | None = None) -> tuple[list[RecallSet], dict[str, RecallSet]]:
    """Training sets (one per size) and test sets (named ``pairs=P`` or ``queries=Q``), disjoint seeds.

    cache: a file to load the sets from, or to write them to (atomically) when it does not exist yet.
    """
    if cache is not None and cache.exists():
        saved = torch.load(cache, weights_only=False)
        if saved["spec"] == asdict(spec):
            return saved["train"], saved["test"]
    train_sets, test_sets = [], {}
    for i, size in enumerate(spec.sizes):
        seeds = (spec.data_seed * 1000 + 2 * i, spec.data_seed * 1000 + 2 * i + 1)
        if spec.task == "mqar":
            make = lambda n, s: mqar(n, spec.seq_len, size, spec.vocab_size, seed=s)  # noqa: E731
            name = f"pairs={size}"
        elif spec.task == "lagged":
            make = lambda n, s: lagged_recall(n, spec.seq_len, spec.num_keys, size, spec.vocab_size, seed=s)  # noqa: E731
            name = f"queries={size}"
        else:
            raise ValueError(f"task must be 'mqar' or 'lagged', got {spec.task!r}")
        train_sets.append(make(spec.train_examples, seeds[0]))
        test_sets[name] = make(spec.test_examples, seeds[1])
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        save_atomic(dict(spec=asdict(spec), train=train_sets, test=test_sets), cache)
    return train_sets, test_sets


def run_job(tier: Tier, model: str, width: int, *, out_dir: Path | None, device: str, progress: bool = True,
            sets=None, stop_at: int | None = None, deadline: float | None = None,
            data_cache: Path | None = None) -> dict[str, Any]:
    """Train one ensemble (every seed and learning rate of ``tier``) of ``model`` at ``width``."""
    train_sets, test_sets = sets if sets is not None else make_sets(tier.data, data_cache)
    members = [Member(seed, lr) for seed in tier.seeds for lr in tier.lrs]
    config = model_config(tier, model, width)
    record = train(config, members, train_sets, test_sets, tier.train, out_dir=out_dir, name=f"{model}-d{width}",
                   device=device, progress=progress, stop_at=stop_at, deadline=deadline)
    record.update(model_name=model, width=width, state_size=state_size(config))
    return record


def best_by_cell(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every (model, width, seed): the final accuracy of its best learning rate (Zoology's protocol picks
    the best learning rate of each cell)."""
    rows = []
    for rec in records:
        for seed in sorted({m["seed"] for m in rec["members"]}):
            finals = [line for line in rec["final"] if line["seed"] == seed]
            if not finals:
                continue
            best = max(finals, key=lambda line: line["accuracy"])
            rows.append(dict(model=rec["model_name"], width=rec["width"], seed=seed, lr=best["lr"],
                             accuracy=best["accuracy"], accuracy_by_set=best["accuracy_by_set"],
                             accuracy_by_level=best["accuracy_by_level"]))
    return rows


def cell_accuracies(result: dict[str, Any], model: str, width: int) -> list[float]:
    """Best-learning-rate final accuracy of every seed of one cell (empty if the job did not finish)."""
    return [r["accuracy"] for r in result["best"] if r["model"] == model and r["width"] == width]


def compare(result: dict[str, Any], model: str, baseline: str, width: int) -> dict[str, Any]:
    """Is ``model`` better than ``baseline`` at ``width``, beyond the spread over seeds?

    Difference of the seed means, and its standard error ``sqrt(s_a²/n_a + s_b²/n_b)`` (sample standard
    deviations). ``separated`` when the difference exceeds two standard errors and one point of accuracy.
    """
    a = torch.tensor(cell_accuracies(result, model, width), dtype=torch.float64) * 100
    b = torch.tensor(cell_accuracies(result, baseline, width), dtype=torch.float64) * 100
    if len(a) < 2 or len(b) < 2:
        return dict(model=model, baseline=baseline, width=width, seeds=(len(a), len(b)), separated=None)
    diff = (a.mean() - b.mean()).item()
    se = (a.var() / len(a) + b.var() / len(b)).sqrt().item()
    return dict(model=model, baseline=baseline, width=width, seeds=(len(a), len(b)), mean=a.mean().item(),
                baseline_mean=b.mean().item(), difference=diff, standard_error=se,
                separated=abs(diff) > max(2 * se, 1.0), better=diff > 0)


def environment(device: str) -> dict[str, Any]:
    """Device, library versions and date, for the results file."""
    info = dict(python=platform.python_version(), torch=torch.__version__,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    try:
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    else:
        info["device"] = platform.processor() or platform.machine()
    return info


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def results_record(name: str, tier: Tier, records: list[dict[str, Any]], *, device: str, seconds: float,
                   commit: str | None, command: str | None, env: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results file of one tier: setup, provenance, every job's record and the best-lr table
    (``best`` only counts jobs that reached their last step; see each job's ``complete``)."""
    return dict(
        tier=name, command=command, commit=commit or git_commit(), environment=env or environment(device),
        seconds=round(seconds, 1), data=asdict(tier.data), train=tier.train.to_dict(), seeds=list(tier.seeds),
        lrs=list(tier.lrs), models=list(tier.models), widths=list(tier.widths), backend=tier.backend, jobs=records,
        best=best_by_cell([r for r in records if r["complete"]]),
    )


def run_tier(name: str, tier: Tier, *, out: Path | None, device: str, progress: bool = True,
             commit: str | None = None, command: str | None = None) -> dict[str, Any]:
    """Every (model, width) job of ``tier``, one after the other in this process; returns the results record
    (also written to ``out/results.json`` when ``out`` is given)."""
    start = time.perf_counter()
    sets = make_sets(tier.data)
    records = [run_job(tier, m, w, out_dir=None if out is None else out / f"{m}-d{w}", device=device,
                       progress=progress, sets=sets) for w in tier.widths for m in tier.models]
    result = results_record(name, tier, records, device=device, seconds=time.perf_counter() - start, commit=commit,
                            command=command)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1))
    return result


SLOWEST_FIRST = {"loglinear_gated_deltanet": 0, "gated_deltanet": 1, "loglinear_mamba2": 2, "mamba2": 3, "transformer": 4}


def run_parallel(tiers: dict[str, Tier], out: Path, device: str, *, jobs: int, budget_s: float | None = None,
                 calibrate_steps: int = 30, commit: str | None = None, command: str | None = None) -> dict[str, dict]:
    """Every job of several tiers, each in its own worker process, ``jobs`` at a time, on one device.

    With ``budget_s`` (and every job running at once): phase 1 trains every job for ``calibrate_steps``
    steps — inside the warm-up, where the schedule does not depend on the total — and measures the slowest
    job's seconds per step while all of them run; every tier's ``steps`` then becomes what fits in the rest of
    the budget (at most the tier's own, a multiple of its ``eval_every``), and phase 2 resumes every job
    from its checkpoint to that many steps. The estimate can be optimistic (jobs that finish their
    calibration early leave the others less contention than phase 2 has: on an H200 with ten jobs it
    measured 55 ms per step against 130 in phase 2), so phase 2 also gets a deadline, ``budget_s - 20`` s
    after the start: a job still running then stops, evaluates and records where it got
    (``complete`` False). Returns ``{tier name: results record}``; each is also written
    to ``out/<tier>/results.json``.
    """
    start, wall_start = time.perf_counter(), time.time()
    grid = sorted(((n, m, w) for n, t in tiers.items() for w in t.widths for m in t.models),
                  key=lambda job: (SLOWEST_FIRST[job[1]], -job[2]))
    for n, t in tiers.items():
        make_sets(t.data, out / _slug(n) / "data.pt")  # once, before the workers load it
    if budget_s is not None:
        for t in tiers.values():
            if calibrate_steps >= t.train.warmup_steps:
                raise ValueError(f"calibrate_steps={calibrate_steps} must stay inside the warm-up ({t.train.warmup_steps})")
        if jobs < len(grid):
            raise ValueError(f"a budget needs every job running at once: jobs={jobs} < {len(grid)} jobs")
        _run_workers(tiers, grid, out, device, jobs, stop_at=calibrate_steps)
        timed = [r["seconds_per_step"] for r in (_read_record(out, job) for job in grid) if r and r["seconds_per_step"]]
        if not timed:
            raise RuntimeError("no job finished its calibration steps: see the stdout.txt of each job")
        per_step = max(timed)
        left = budget_s - (time.perf_counter() - start)
        for n, t in tiers.items():
            fit = int(0.85 * left / per_step) // t.train.eval_every * t.train.eval_every  # 15% for evaluations
            steps = max(t.train.eval_every, min(t.train.steps, fit))
            tiers[n] = replace(t, train=replace(t.train, steps=steps))
            print(f"[{time.strftime('%H:%M:%S')}] {n}: {per_step * 1e3:.0f} ms per step with {len(grid)} jobs, "
                  f"{left:.0f} s left -> {steps} steps", flush=True)
    _run_workers(tiers, grid, out, device, jobs, deadline=None if budget_s is None else wall_start + budget_s - 20)
    seconds = time.perf_counter() - start
    results = {}
    for n, t in tiers.items():
        records = [_read_record(out, job) for job in grid if job[0] == n]
        results[n] = results_record(n, t, [r for r in records if r], device=device, seconds=seconds, commit=commit,
                                    command=command)
        (out / _slug(n) / "results.json").write_text(json.dumps(results[n], indent=1))
    return results


def assemble(name: str, tier: Tier, out: Path, **provenance) -> dict[str, Any]:
    """The results record of a tier from its job directories (for a run whose orchestrator stopped early).

    A job without a final record gets one rebuilt from its ``log.jsonl`` (``complete=False``) and the end of
    its ``stdout.txt`` as ``error``.
    """
    records = []
    for w in tier.widths:
        for m in tier.models:
            job_dir = _job_dir(out, (name, m, w))
            record = json.loads((job_dir / "record.json").read_text())
            if not record["complete"]:
                history = [json.loads(line) for line in (job_dir / "log.jsonl").read_text().splitlines() if line]
                last = max((h["step"] for h in history), default=0)
                record.update(history=history, final=[h for h in history if h["step"] == last], steps_done=last,
                              error=(job_dir / "stdout.txt").read_text().strip().splitlines()[-1])
            records.append(record)
    return results_record(name, tier, records, **provenance)


def _slug(name: str) -> str:
    return name.replace("/", "-")


def _job_dir(out: Path, job: tuple[str, str, int]) -> Path:
    return out / _slug(job[0]) / f"{job[1]}-d{job[2]}"


def _read_record(out: Path, job: tuple[str, str, int]) -> dict[str, Any] | None:
    path = _job_dir(out, job) / "record.json"
    if path.exists():
        return json.loads(path.read_text())
    tail = (_job_dir(out, job) / "stdout.txt").read_text()[-3000:]
    print(f"{job} produced no record:\n{tail}", file=sys.stderr, flush=True)
    return None


def _run_workers(tiers: dict[str, Tier], grid, out: Path, device: str, jobs: int, stop_at: int | None = None,
                 deadline: float | None = None) -> None:
    """Run each job of ``grid`` in its own worker process, ``jobs`` at a time (``stop_at``, ``deadline``: as
    :func:`~loglin_edu.train.train`'s)."""
    pending = list(grid)
    running: dict[tuple[str, str, int], subprocess.Popen] = {}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    while pending or running:
        while pending and len(running) < jobs:
            job = pending.pop(0)
            job_dir = _job_dir(out, job)
            job_dir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "loglin_edu.experiments.mqar", "--tier", "gpu", "--worker", job[1], str(job[2]),
                   "--out", str(job_dir), "--device", device, "--tier-json", json.dumps(_tier_to_dict(tiers[job[0]]))]
            if stop_at is not None:
                cmd += ["--stop-at", str(stop_at)]
            if deadline is not None:
                cmd += ["--deadline", repr(deadline)]
            with (job_dir / "stdout.txt").open("a") as log:
                running[job] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)
        for job, proc in list(running.items()):
            if proc.poll() is not None:
                del running[job]
                print(f"[{time.strftime('%H:%M:%S')}] {_slug(job[0])} {job[1]}-d{job[2]} exit {proc.returncode}", flush=True)


def _tier_to_dict(tier: Tier) -> dict[str, Any]:
    d = asdict(tier)
    d["train"]["betas"] = list(d["train"]["betas"])
    return d


def _tier_from_dict(d: dict[str, Any]) -> Tier:
    data = TaskSpec(**{**d["data"], "sizes": tuple(d["data"]["sizes"])})
    train_cfg = TrainConfig(**{**d["train"], "betas": tuple(d["train"]["betas"])})
    return Tier(data=data, models=tuple(d["models"]), widths=tuple(d["widths"]), seeds=tuple(d["seeds"]),
                lrs=tuple(d["lrs"]), train=train_cfg, n_layers=d["n_layers"], chunk_size=d["chunk_size"],
                backend=d.get("backend", "torch"))


def choose_tier(args: argparse.Namespace, task: str) -> tuple[str, Tier]:
    """The tier the command line names, with its overrides applied."""
    name = "cpu" if args.tier == "cpu" else f"gpu/{task}"
    tier = TIERS[name]
    changes = {}
    if args.models:
        changes["models"] = tuple(args.models.split(","))
    if args.widths:
        changes["widths"] = tuple(int(w) for w in args.widths.split(","))
    if args.seeds:
        changes["seeds"] = tuple(int(s) for s in args.seeds.split(","))
    if args.lrs:
        changes["lrs"] = tuple(float(x) for x in args.lrs.split(","))
    if args.backend:
        changes["backend"] = args.backend
    train_changes = {k: v for k, v in dict(steps=args.steps, batch_size=args.batch_size, eval_every=args.eval_every,
                                           amp=args.amp or None).items() if v is not None}
    if train_changes:
        changes["train"] = replace(tier.train, **train_changes)
    return name, replace(tier, **changes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.experiments.mqar", description=__doc__.split("\n")[0])
    parser.add_argument("--tier", choices=["cpu", "gpu"], required=True)
    parser.add_argument("--task", choices=["mqar", "lagged", "both"], default="mqar", help="gpu tier: which recall task")
    parser.add_argument("--out", type=Path, default=None, help="directory for logs, checkpoints and results.json")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--jobs", type=int, default=1, help="parallel worker processes (gpu tier)")
    parser.add_argument("--budget-s", type=float, help="gpu tier: fit the number of steps into this many seconds")
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--models", help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--widths", help="comma-separated model widths")
    parser.add_argument("--seeds", help="comma-separated seeds")
    parser.add_argument("--lrs", help="comma-separated peak learning rates")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--eval-every", type=int)
    parser.add_argument("--amp", action="store_true", help="bf16 autocast on CUDA (operators stay float32)")
    parser.add_argument("--backend", choices=["torch", "auto"],
                        help="'auto': the Triton kernel for log-linear Mamba-2 on CUDA (default: torch)")
    parser.add_argument("--commit", help="commit hash to record (default: git rev-parse HEAD)")
    parser.add_argument("--results", type=Path, help="also write each results file into this directory (e.g. book/results)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "WIDTH"), help=argparse.SUPPRESS)
    parser.add_argument("--tier-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # comparisons stay in true float32
    if args.worker:
        tier = _tier_from_dict(json.loads(args.tier_json))
        record = run_job(tier, args.worker[0], int(args.worker[1]), out_dir=args.out, device=device, progress=False,
                         data_cache=args.out.parent / "data.pt", stop_at=args.stop_at, deadline=args.deadline)
        (args.out / "record.json").write_text(json.dumps(record))
        return
    command = "python -m loglin_edu.experiments.mqar " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.tier == "cpu":
        name, tier = choose_tier(args, "mqar")
        results = {name: run_tier(name, tier, out=args.out, device=device, progress=not args.no_progress,
                                  commit=args.commit, command=command)}
    else:
        if args.out is None:
            parser.error("the gpu tier needs --out")
        tasks = ["mqar", "lagged"] if args.task == "both" else [args.task]
        tiers = dict(choose_tier(args, task) for task in tasks)
        results = run_parallel(tiers, args.out, device, jobs=args.jobs, budget_s=args.budget_s, commit=args.commit,
                               command=command)
    for name, result in results.items():
        if args.results:
            args.results.mkdir(parents=True, exist_ok=True)
            (args.results / f"mqar_{_slug(name)}.json").write_text(json.dumps(result, indent=1))
        print(name)
        for row in summary_table(result):
            print(row)


def summary_table(result: dict[str, Any]) -> list[str]:
    """Mean ± std over seeds of the best-learning-rate accuracy, one line per model, one column per width."""
    lines = [f"{'model':<28}" + "".join(f"{'d=' + str(w):>16}" for w in result["widths"])]
    for model in result["models"]:
        cells = []
        for w in result["widths"]:
            accs = torch.tensor([r["accuracy"] for r in result["best"] if r["model"] == model and r["width"] == w])
            if len(accs) == 0:
                cells.append("-")
            else:
                cells.append(f"{100 * accs.mean():6.1f} ± {100 * accs.std():4.1f}" if len(accs) > 1 else f"{100 * accs.mean():6.1f}")
        lines.append(f"{LABELS[model]:<28}" + "".join(f"{c:>16}" for c in cells))
    return lines


if __name__ == "__main__":
    main()
