"""Running the recall experiments: one job is one architecture at one width, an ensemble of every (seed,
learning rate) pair trained together; jobs run one after the other or as parallel worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ...provenance import write_json
from ...train import Member, TrainConfig, train
from .report import results_record
from .settings import TaskSpec, Tier, make_sets, model_config, state_size


def run_job(tier: Tier, model: str, width: int, *, out_dir: Path | None, device: str, progress: bool = True,
            sets=None, stop_at: int | None = None, deadline: float | None = None,
            data_cache: Path | None = None) -> dict[str, Any]:
    """Train one ensemble (every seed and learning rate of ``tier``) of ``model`` at ``width``."""
    train_sets, validation_sets, test_sets = sets if sets is not None else make_sets(tier.data, data_cache)
    members = [Member(seed, lr) for seed in tier.seeds for lr in tier.lrs]
    config = model_config(tier, model, width)
    record = train(config, members, train_sets, test_sets, tier.train, out_dir=out_dir, name=f"{model}-d{width}",
                   device=device, progress=progress, stop_at=stop_at, deadline=deadline,
                   validation_sets=validation_sets)
    record.update(model_name=model, width=width, state_size=state_size(config))
    return record


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
        write_json(out / "results.json", result)
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
        make_sets(t.data, out / slug(n) / "data.pt")  # once, before the workers load it
    if budget_s is not None:
        for t in tiers.values():
            if calibrate_steps >= t.train.warmup_steps:
                raise ValueError(f"calibrate_steps={calibrate_steps} must stay inside the warm-up ({t.train.warmup_steps})")
        if jobs < len(grid):
            raise ValueError(f"a budget needs every job running at once: jobs={jobs} < {len(grid)} jobs")
        run_workers(tiers, grid, out, device, jobs, stop_at=calibrate_steps)
        timed = [r["seconds_per_step"] for r in (read_record(out, job) for job in grid) if r and r["seconds_per_step"]]
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
    run_workers(tiers, grid, out, device, jobs, deadline=None if budget_s is None else wall_start + budget_s - 20)
    seconds = time.perf_counter() - start
    results = {}
    for n, t in tiers.items():
        records = [read_record(out, job) for job in grid if job[0] == n]
        results[n] = results_record(n, t, [r for r in records if r], device=device, seconds=seconds, commit=commit,
                                    command=command)
        write_json(out / slug(n) / "results.json", results[n])
    return results


def assemble(name: str, tier: Tier, out: Path, **provenance) -> dict[str, Any]:
    """The results record of a tier from its job directories (for a run whose orchestrator stopped early).

    A job without a final record gets one rebuilt from its ``log.jsonl`` (``complete=False``) and the end of
    its ``stdout.txt`` as ``error``.
    """
    records = []
    for w in tier.widths:
        for m in tier.models:
            job_dir = job_folder(out, (name, m, w))
            record = json.loads((job_dir / "record.json").read_text())
            if not record["complete"]:
                history = [json.loads(line) for line in (job_dir / "log.jsonl").read_text().splitlines() if line]
                last = max((h["step"] for h in history), default=0)
                record.update(history=history, final=[h for h in history if h["step"] == last], steps_done=last,
                              error=(job_dir / "stdout.txt").read_text().strip().splitlines()[-1])
            records.append(record)
    return results_record(name, tier, records, **provenance)


def slug(name: str) -> str:
    return name.replace("/", "-")


def job_folder(out: Path, job: tuple[str, str, int]) -> Path:
    return out / slug(job[0]) / f"{job[1]}-d{job[2]}"


def read_record(out: Path, job: tuple[str, str, int]) -> dict[str, Any] | None:
    path = job_folder(out, job) / "record.json"
    if path.exists():
        return json.loads(path.read_text())
    tail = (job_folder(out, job) / "stdout.txt").read_text()[-3000:]
    print(f"{job} produced no record:\n{tail}", file=sys.stderr, flush=True)
    return None


def run_workers(tiers: dict[str, Tier], grid, out: Path, device: str, jobs: int, stop_at: int | None = None,
                 deadline: float | None = None) -> None:
    """Run each job of ``grid`` in its own worker process, ``jobs`` at a time (``stop_at``, ``deadline``: as
    :func:`~loglin_edu.train.train`'s)."""
    pending = list(grid)
    running: dict[tuple[str, str, int], subprocess.Popen] = {}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    while pending or running:
        while pending and len(running) < jobs:
            job = pending.pop(0)
            job_dir = job_folder(out, job)
            job_dir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "loglin_edu.experiments.mqar", "--tier", "gpu", "--worker", job[1], str(job[2]),
                   "--out", str(job_dir), "--device", device, "--tier-json", json.dumps(tier_to_dict(tiers[job[0]]))]
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
                print(f"[{time.strftime('%H:%M:%S')}] {slug(job[0])} {job[1]}-d{job[2]} exit {proc.returncode}", flush=True)


def tier_to_dict(tier: Tier) -> dict[str, Any]:
    d = asdict(tier)
    d["train"]["betas"] = list(d["train"]["betas"])
    return d


def tier_from_dict(d: dict[str, Any]) -> Tier:
    data = TaskSpec(**{**d["data"], "sizes": tuple(d["data"]["sizes"])})
    train_cfg = TrainConfig(**{**d["train"], "betas": tuple(d["train"]["betas"])})
    lists = {name: tuple(d[name]) for name in ("models", "widths", "seeds", "lrs")}
    return Tier(**{**d, **lists, "data": data, "train": train_cfg})
