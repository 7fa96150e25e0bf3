"""Running the recall experiments. A *job* is one architecture at one width: an ensemble of every (seed, learning
rate) pair, trained together. Jobs run one after the other in one process (the CPU tier), or as worker processes
side by side on one GPU, each writing its own results file; one command merges them.

A run folder ``out`` holds, per tier, its data and one folder per job::

    out/<tier>/data.pt                  training, validation and test sets (made once, read by every worker)
    out/<tier>/<model>-d<width>/        checkpoint.pt, log.jsonl, record.json (the job's results file, rewritten
                                        after every evaluation), plan.json (its total steps), timing.json, stdout.txt

A *piece* is one call with a wall-clock budget: every job of the piece starts, or resumes from its checkpoint, and
stops at the piece's deadline (evaluating there and checkpointing) unless it finishes first. A job whose total
steps are not fixed yet is planned: it reports its measured step time after its first steps (still in the
warm-up, whose schedule does not depend on the total), and the piece gives every new job the same total

    steps = ⌊ 0.75 · (seconds left) / Σ_jobs (seconds per step of job j) ⌋

— the jobs share one device, so a step of all of them costs about the sum of their step times. The plan is kept
in the job's folder: a later piece on the same folder continues toward the same total. A job killed at any
moment loses at most the steps since its last evaluation (its record, log and checkpoint are written there).

On a host of several GPUs, one piece per GPU shares one run folder: each piece names its own models
(``CUDA_VISIBLE_DEVICES=i ... --models A,B``), all write into the same ``out`` (the data cache is written
atomically, so pieces that make it at once leave one whole file), and one ``--merge`` reads every job. Give the
pieces a fixed ``--steps`` when a comparison needs the same total for every model: each piece plans only its own jobs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ...provenance import device_name, git_commit, library_versions, provenance, write_json
from ...train import Member, TrainConfig, train
from .report import results_record
from .settings import TaskSpec, Tier, base_model, make_sets, model_config, state_size

PLAN_SHARE = 0.75  # of the seconds left, for training steps (evaluations and contention take the rest)
FINISH_S = 60.0  # before the budget's end: the jobs' last evaluations (side by side), checkpoints, results
PLAN_WAIT_S = 0.5  # a worker's polling interval for its plan
SLOWEST_FIRST = {"loglinear_gated_deltanet": 0, "gated_deltanet": 1, "loglinear_mamba2": 2, "mamba2": 3,
                 "transformer": 4}


class FilePlanner:
    """A job's side of the plan (:class:`~loglin_edu.train.loop.Planner`): its step time goes to
    ``timing.json``, its total steps come from ``plan.json`` in its folder."""

    def __init__(self, job_dir: Path, give_up_s: float = 600.0) -> None:
        self.job_dir, self.give_up = job_dir, time.time() + give_up_s

    def report(self, seconds_per_step: float) -> None:
        write_json(self.job_dir / "timing.json", dict(seconds_per_step=seconds_per_step))

    def steps(self, wait: bool) -> int | None:
        path = self.job_dir / "plan.json"
        while True:
            if path.exists():
                return json.loads(path.read_text())["steps"]
            if not wait or time.time() > self.give_up:
                return None
            time.sleep(PLAN_WAIT_S)


def job_name(model: str, width: int, seeds: tuple[int, ...] | None = None) -> str:
    """``model-dWIDTH``, or ``model-dWIDTH-s0-1`` for a job of only the seeds named (a cell's seeds can be
    trained as several jobs, each short enough for the time one machine is held; a merge joins them)."""
    return f"{model}-d{width}" + ("" if seeds is None else "-s" + "-".join(str(s) for s in seeds))


def job_label(job: tuple) -> str:
    """``tier/model-dWIDTH[-sSEEDS]`` of a job ``(tier name, model, width[, seeds])``."""
    return f"{slug(job[0])}/{job_name(*job[1:])}"


def run_job(tier: Tier, model: str, width: int, *, out_dir: Path | None, device: str, progress: bool = True,
            sets=None, stop_at: int | None = None, deadline: float | None = None, data_cache: Path | None = None,
            planner=None, name: str | None = None) -> dict[str, Any]:
    """Train one ensemble (every seed and learning rate of ``tier``) of ``model`` at ``width``; with ``out_dir``
    its results file ``record.json`` is rewritten after every evaluation. The record names the machine it trained
    on (``trained_on``: device, commit, library versions), which a merge on another machine keeps; ``name``: the
    record's (default :func:`job_name` of model and width)."""
    train_sets, validation_sets, test_sets = sets if sets is not None else make_sets(tier.data, data_cache)
    members = [Member(seed, lr) for seed in tier.seeds for lr in tier.lrs]
    config = model_config(tier, model, width)
    extra = dict(model_name=model, width=width, state_size=state_size(config),
                 trained_on=dict(device=device_name(device), commit=git_commit(), versions=library_versions()))

    def save(record: dict[str, Any]) -> None:
        write_json(out_dir / "record.json", {**record, **extra})

    record = train(config, members, train_sets, test_sets, tier.train, out_dir=out_dir,
                   name=name or job_name(model, width), device=device, progress=progress, stop_at=stop_at,
                   deadline=deadline, validation_sets=validation_sets, planner=planner,
                   on_evaluation=save if out_dir is not None else None)
    record.update(extra)
    return record


def run_tier(name: str, tier: Tier, *, out: Path | None, device: str, progress: bool = True,
             commit: str | None = None, command: str | None = None) -> dict[str, Any]:
    """Every (model, width) job of ``tier``, one after the other in this process; returns the results record
    (also written to ``out/results.json`` when ``out`` is given)."""
    start = time.perf_counter()
    sets = make_sets(tier.data)
    records = [run_job(tier, m, w, out_dir=None if out is None else out / job_name(m, w), device=device,
                       progress=progress, sets=sets) for w in tier.widths for m in tier.models]
    result = results_record(name, tier, records, device=device, seconds=time.perf_counter() - start, commit=commit,
                            command=command)
    if out is not None:
        write_json(out / "results.json", result)
    return result


def grid(tiers: dict[str, Tier], by_seeds: bool = False) -> list[tuple]:
    """Every job ``(tier name, model, width)`` of ``tiers``, the slowest models and widest first; ``by_seeds``: jobs
    of the tiers' seeds only, ``(tier name, model, width, seeds)``, in folders named by them (:func:`job_name`)."""
    jobs = [(n, m, w) + ((tuple(t.seeds),) if by_seeds else ()) for n, t in tiers.items() for w in t.widths
            for m in t.models]
    return sorted(jobs, key=lambda job: (SLOWEST_FIRST[base_model(job[1])], -job[2]))


def slug(name: str) -> str:
    return name.replace("/", "-")


def job_folder(out: Path, job: tuple) -> Path:
    return out / slug(job[0]) / job_name(*job[1:])


def plan_steps(timings: dict[Any, float], fixed_seconds: float, seconds_left: float, cap: int, floor: int) -> int:
    """The total steps of the jobs being planned: ``PLAN_SHARE`` of the seconds left, after ``fixed_seconds`` of
    work of jobs whose totals are already fixed, shared by the jobs' summed step times; within ``[floor, cap]``."""
    per_step = sum(timings.values())
    fit = math.floor(PLAN_SHARE * max(0.0, seconds_left - fixed_seconds) / per_step) if per_step > 0 else cap
    return max(floor, min(cap, fit // 10 * 10))


def fix_totals(tiers: dict[str, Tier], out: Path, todo: list[tuple[str, str, int]]) -> None:
    """Write each job's total, its tier's ``train.steps``, into the job's ``plan.json`` (a piece given fixed
    totals): a later piece on the folder continues toward it. A job already planned for another total raises
    ``ValueError`` (its schedule depends on the total, so it cannot change on the way)."""
    for job in todo:
        path = job_folder(out, job) / "plan.json"
        steps = tiers[job[0]].train.steps
        if not path.exists():
            write_json(path, dict(steps=steps, fixed=True, date=time.strftime("%Y-%m-%d %H:%M:%S")))
            continue
        planned = json.loads(path.read_text())["steps"]
        if planned != steps:
            raise ValueError(f"{job_label(job)} is planned for {planned} steps, not "
                             f"{steps}: give it its own total, or start another run folder")


def run_piece(tiers: dict[str, Tier], out: Path, device: str, *, budget_s: float | None = None,
              modes: dict[str, str] | None = None, jobs: int | None = None,
              fixed: bool = False, by_seeds: bool = False) -> list[tuple]:
    """One piece: every job of ``tiers`` in its own worker process on one device (module docstring).

    budget_s: the piece's wall-clock seconds (None: no deadline, and totals are the tiers' own steps); modes:
    model -> training-step mode (``eager``, ``graphs``, ``compiled``, ``compiled+graphs``; a λ-tied variant takes
    its model's; default: the tier's);
    jobs: at most this many at once (with a budget every job must run at once); fixed: every job's total is its
    tier's ``train.steps`` (:func:`fix_totals`; nothing is planned, and a budget sets only the deadline, so
    several pieces in a row train one fixed total); by_seeds: each job trains the tiers' seeds only, in a folder
    named by them, so that other seeds of the same cells can train as other jobs (:func:`grid`). Returns the jobs
    it ran.
    """
    start = time.time()
    deadline = None if budget_s is None else start + budget_s - FINISH_S
    todo = grid(tiers, by_seeds)
    jobs = len(todo) if jobs is None else jobs
    if budget_s is not None and jobs < len(todo):
        raise ValueError(f"a budget shares the device among every job at once: jobs={jobs} < {len(todo)} jobs")
    for n, t in tiers.items():
        make_sets(t.data, out / slug(n) / "data.pt")  # once, before the workers read it
    unplanned = set()
    for job in todo:
        job_folder(out, job).mkdir(parents=True, exist_ok=True)
    if fixed:
        fix_totals(tiers, out, todo)
    for job in todo:
        folder = job_folder(out, job)
        (folder / "timing.json").unlink(missing_ok=True)
        if budget_s is not None and not (folder / "plan.json").exists():
            unplanned.add(job)
    pending, running = list(todo), {}
    planned = not unplanned
    while pending or running:
        while pending and len(running) < jobs:
            job = pending.pop(0)
            running[job] = start_worker(tiers[job[0]], job, out, device, deadline, job in unplanned,
                                        (modes or {}).get(base_model(job[1])))
        time.sleep(0.5)
        for job, proc in list(running.items()):
            if proc.poll() is not None:
                del running[job]
                print(f"[{time.strftime('%H:%M:%S')}] {job_label(job)} exit {proc.returncode}",
                      flush=True)
        if not planned:
            planned = plan_piece(tiers, out, todo, unplanned, running, deadline, waited=time.time() - start,
                                 budget_s=budget_s)
    return todo


def plan_piece(tiers, out: Path, todo, unplanned, running, deadline: float, *, waited: float, budget_s: float) -> bool:
    """Write the plan of the piece's new jobs once every running one has reported its step time (or half the
    budget has passed); returns whether the plan is written."""
    timings = {}
    for job in todo:
        path = job_folder(out, job) / "timing.json"
        if path.exists():
            timings[job] = json.loads(path.read_text())["seconds_per_step"]
    waiting = [job for job in running if job not in timings]
    if waiting and waited < budget_s / 2:
        return False
    fixed = 0.0
    for job, seconds in timings.items():
        if job not in unplanned:
            plan = json.loads((job_folder(out, job) / "plan.json").read_text())
            fixed += seconds * max(0, plan["steps"] - read_steps_done(out, job))
    new = {job: s for job, s in timings.items() if job in unplanned}
    left = deadline - time.time()
    cap = max(tiers[job[0]].train.steps for job in unplanned)
    floor = max(tiers[job[0]].train.warmup_steps for job in unplanned) + 10
    steps = plan_steps(new, fixed, left, cap, floor)
    for job in unplanned:
        write_json(job_folder(out, job) / "plan.json",
                   dict(steps=min(steps, tiers[job[0]].train.steps), seconds_left=left, fixed_seconds=fixed,
                        step_seconds={job_label(j): s for j, s in new.items()},
                        share=PLAN_SHARE, date=time.strftime("%Y-%m-%d %H:%M:%S")))
    total = sum(new.values())
    print(f"[{time.strftime('%H:%M:%S')}] plan: {len(new)} jobs, {1e3 * total:.0f} ms per step of all of them, "
          f"{left:.0f} s left -> {steps} steps each", flush=True)
    return True


def read_steps_done(out: Path, job) -> int:
    path = job_folder(out, job) / "record.json"
    return json.loads(path.read_text())["steps_done"] if path.exists() else 0


def start_worker(tier: Tier, job, out: Path, device: str, deadline: float | None, plan: bool, mode: str | None):
    """The worker process of one job (``python -m loglin_edu.experiments.mqar --worker ...``)."""
    folder = job_folder(out, job)
    if not plan and (folder / "plan.json").exists():
        tier = replace(tier, train=replace(tier.train, steps=json.loads((folder / "plan.json").read_text())["steps"]))
    if mode is not None:
        modes = dict(compile=mode.startswith("compiled"), graphs=mode.endswith("graphs"))
        tier = replace(tier, train=replace(tier.train, **modes))
    cmd = [sys.executable, "-m", "loglin_edu.experiments.mqar", "--tier", "gpu", "--worker", job[1], str(job[2]),
           "--out", str(folder), "--device", device, "--tier-json", json.dumps(tier_to_dict(tier))]
    if deadline is not None:
        cmd += ["--deadline", repr(deadline)]
    if plan:
        cmd += ["--plan"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    with (folder / "stdout.txt").open("a") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def worker(tier: Tier, model: str, width: int, job_dir: Path, device: str, *, deadline: float | None, plan: bool,
           stop_at: int | None = None) -> dict[str, Any]:
    """What a worker process runs: its job, from the tier's shared data, planned or not."""
    planner = FilePlanner(job_dir) if plan else None
    return run_job(tier, model, width, out_dir=job_dir, device=device, progress=False, name=job_dir.name,
                   data_cache=job_dir.parent / "data.pt", deadline=deadline, planner=planner, stop_at=stop_at)


def record_seeds(record: dict[str, Any]) -> set[int]:
    """The seeds a job record trained (of its members)."""
    return {m["seed"] for m in record.get("members", [])}


def included_records(name: str, paths: list[Path]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The job records of tier ``name`` in merged results files (their ``tiers[name]["jobs"]``), by
    ``(model, width)``: a cell may have several, of different seeds; a record whose seeds an earlier file (or an
    earlier record) already gave is left out, and so are records of jobs never run. Files without the tier add
    nothing."""
    records: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for path in paths:
        tier = json.loads(Path(path).read_text())["tiers"].get(name)
        for record in (tier or {}).get("jobs", []):
            cell = records.setdefault((record["model_name"], record["width"]), [])
            seeds = record_seeds(record)
            if record.get("not_run") or not seeds or any(seeds & record_seeds(r) for r in cell):
                continue
            cell.append(record)
    return records


def folder_record(folder: Path, model: str, width: int) -> dict[str, Any]:
    """The record of the job in ``folder``: its ``record.json`` (with its ``plan.json``), or, for a job that never
    reached an evaluation, a record with none and ``complete`` False. A job that stopped early and was not stopped
    by its deadline (it failed, or was killed) gets the end of its ``stdout.txt`` as ``error``."""
    path = folder / "record.json"
    stdout = folder / "stdout.txt"
    tail = stdout.read_text().strip().splitlines()[-1:] if stdout.exists() else []
    if path.exists():
        record = json.loads(path.read_text())
    else:
        record = dict(name=folder.name, model_name=model, width=width, members=[], history=[], final=[],
                      complete=False, steps_done=0)
    if not record["complete"] and not record.get("stopped_by_deadline"):
        record["error"] = tail[0] if tail else "stopped without output (killed?)"
    plan = folder / "plan.json"
    if plan.exists():
        record["plan"] = json.loads(plan.read_text())
    return record


def assemble(name: str, tier: Tier, out: Path, include: list[Path] = ()) -> list[dict[str, Any]]:
    """The records of a tier's jobs, read from their folders (a cell's job of all seeds, ``model-dWIDTH``, and its
    jobs of some seeds, ``model-dWIDTH-s...``), and, for the seeds no folder has, from the merged results files
    ``include`` (jobs trained by an earlier run, on another machine, or whose folders are gone).

    A cell's records must not share a seed (``ValueError``). A folder whose job never reached an evaluation counts
    only where nothing else gives the cell a result (:func:`folder_record`); a cell found nowhere has not been
    run: one record with ``not_run`` True."""
    earlier = included_records(name, list(include))
    records = []
    for w in tier.widths:
        for m in tier.models:
            plain = job_folder(out, (name, m, w))
            folders = [plain] + sorted(plain.parent.glob(f"{plain.name}-s*")) if plain.parent.exists() else []
            found = [folder_record(f, m, w) for f in folders if f.exists()]
            evaluated = [r for r in found if r["members"]]
            seen: set[int] = set()
            for record in evaluated:
                if seen & record_seeds(record):
                    raise ValueError(f"{name}: seeds {sorted(seen & record_seeds(record))} of {job_name(m, w)} were "
                                     "trained by two jobs of the run folder")
                seen |= record_seeds(record)
            cell = evaluated + [r for r in earlier.get((m, w), []) if not seen & record_seeds(r)]
            if not cell:
                cell = found[:1] or [dict(name=job_name(m, w), model_name=m, width=w, members=[], history=[],
                                          final=[], complete=False, steps_done=0, not_run=True)]
            records.extend(cell)
    return records


def merge(tiers: dict[str, Tier], out: Path, *, device: str, commit: str | None = None,
          command: str | None = None, include: list[Path] = ()) -> dict[str, Any]:
    """One results file for every tier of a run folder (:func:`assemble`, with the jobs of the merged files
    ``include`` that the folder lacks, then :func:`~loglin_edu.experiments.mqar.report.results_record` per tier)."""
    results = {}
    for name, tier in tiers.items():
        records = assemble(name, tier, out, include)
        steps = [r.get("plan", {}).get("steps") or r.get("config", {}).get("steps") for r in records]
        if any(steps):
            tier = replace(tier, train=replace(tier.train, steps=max(s for s in steps if s)))
        seconds = sum(r.get("seconds", 0.0) for r in records)
        results[name] = results_record(name, tier, records, device=device, seconds=seconds, commit=commit,
                                       command=command)
    made = {**provenance(command, device), **({"commit": commit} if commit else {})}
    return dict(what="associative-recall reproduction: one results record per tier", **made, tiers=results)


def tier_to_dict(tier: Tier) -> dict[str, Any]:
    d = asdict(tier)
    d["train"]["betas"] = list(d["train"]["betas"])
    return d


def tier_from_dict(d: dict[str, Any]) -> Tier:
    data = TaskSpec(**{**d["data"], "sizes": tuple(d["data"]["sizes"])})
    train_cfg = TrainConfig(**{**d["train"], "betas": tuple(d["train"]["betas"])})
    lists = {name: tuple(d[name]) for name in ("models", "widths", "seeds", "lrs")}
    return Tier(**{**d, **lists, "data": data, "train": train_cfg})
