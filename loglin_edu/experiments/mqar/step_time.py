"""Milliseconds per training step of every mixer: eager against compiled and captured steps.

    python -m loglin_edu.experiments.mqar.step_time --out book/results/mqar_step_time_h200.json

The step of the ``gpu/mqar`` tier: T = 256, a batch of 60 sequences (12 of each of 4, 8, 16, 32 and 64 pairs),
vocabulary 8192, two layers at width 64, one ensemble of every seed and learning rate (3 × 4 = 12 members).
Modes (:mod:`loglin_edu.train.step`): ``eager``; ``graphs`` (the whole step in a CUDA graph); ``compiled``
(``torch.compile`` of the loss's forward and backward); ``compiled+graphs`` (both).

Each mixer runs in its own process. The processes compile and capture side by side (the slow part), wait until
all are ready, then take turns on the device (a file lock), so every measurement has the device and the CPU to
itself. A row per mixer and mode: the median milliseconds of a step (:func:`loglin_edu.timing.median_ms`), the
seconds from building the run to its first timed step (compilation and capture included) and the peak memory.

With ``--profile`` (CUDA) each row also says where the step's device time goes: ``torch.profiler`` records
:data:`PROFILED_STEPS` steps, and every kernel's launches and device milliseconds per step are listed, the
longest first (:func:`~loglin_edu.bench.profile.device_times`), with their sum beside the measured step: a step
whose kernels sum to much less than its milliseconds waits on launches, one whose kernels fill it is bound by
them.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ...bench.profile import device_times
from ...provenance import provenance, write_json
from ...timing import median_ms
from ...train import Member
from ...train.loop import start_run, synchronize
from ...train.step import EAGER_STEPS_BEFORE_CAPTURE, TrainingStep
from .settings import MODELS, TIERS, Tier, make_sets, model_config, transformer_layout

MODES = ("eager", "graphs", "compiled", "compiled+graphs")
READY_WAIT_S = 900.0
PROFILED_STEPS = 10


def benchmark_tier(tier_name: str, train_examples: int | None, chunk_size: int | None = None,
                   backend: str | None = None, amp: bool = False, tf32: bool = False) -> Tier:
    """The tier whose step is measured, without validation and test sets (``train_examples``: training sequences
    per set; ``chunk_size``: the recurrent mixers' chunk; ``backend``: ``"torch"`` or ``"auto"``; each by default
    the tier's; ``amp``, ``tf32``: the step's bf16 autocast and TF32 products, :class:`~loglin_edu.train.TrainConfig`)."""
    tier = TIERS[tier_name]
    data = replace(tier.data, train_examples=train_examples or tier.data.train_examples, validation_examples=1,
                   test_examples=1)
    train = replace(tier.train, steps=10**9, amp=amp or tier.train.amp, tf32=tf32 or tier.train.tf32)
    return replace(tier, data=data, train=train, chunk_size=chunk_size or tier.chunk_size,
                   backend=backend or tier.backend)


def prepared_step(tier: Tier, model: str, width: int, mode: str, device: torch.device, train_sets) -> tuple[Any, float]:
    """A run of ``model`` at ``width`` with its step in ``mode``, past its eager steps, compilation and capture.

    Returns the step and ``dict(seconds, gib)``: the seconds that took, and the most device memory the run held
    (its weights, optimiser, graph and the step's transients; CUDA only)."""
    config = replace(tier.train, compile=mode.startswith("compiled"), graphs=mode.endswith("graphs"))
    members = [Member(seed, lr) for seed in tier.seeds for lr in tier.lrs]
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    run = start_run(model_config(tier, model, width), members, config, None, device)
    step = TrainingStep(run, [s.to(device) for s in train_sets], config.batch_size // len(train_sets), config)
    for _ in range(EAGER_STEPS_BEFORE_CAPTURE + 2):
        step()
    synchronize(device)
    cost = dict(seconds=time.perf_counter() - start, gib=None)
    if device.type == "cuda":
        cost["gib"] = (torch.cuda.max_memory_allocated(device) - before) / 2**30
    return step, cost


def measure(step, mode: str, model: str, width: int, cost: dict[str, Any], device: torch.device,
            profile: bool = False) -> dict[str, Any]:
    """One row: the step's median milliseconds (about 1.5 s of calls on CUDA, 5 calls on a CPU); with ``profile``
    (CUDA) also its kernels (:func:`step_kernels`)."""
    ms = median_ms(step, device=device, repeats=5, warmup=1, cuda_ms=1500.0)
    row = dict(model=model, width=width, mode=mode, ms_per_step=ms, seconds_to_first_step=round(cost["seconds"], 2),
               run_gib=cost["gib"], members=len(step.run.members), capture_error=step.capture_error,
               compile_error=step.compile_error, ran_as=step.mode)
    if profile and device.type == "cuda":
        row.update(step_kernels(step))
    return row


def step_kernels(step, steps: int = PROFILED_STEPS, times=device_times) -> dict[str, Any]:
    """Where ``steps`` calls of ``step`` spend device time: ``kernel_ms_per_step`` (every kernel's device time, summed)
    and ``kernels``, one entry per kernel name, ``[name, launches per step, ms per step]``, the longest first."""
    measured = times(lambda: [step() for _ in range(steps)])
    kernels = sorted(([name, launches / steps, ms / steps] for name, (launches, ms) in measured.items()),
                     key=lambda k: -k[2])
    return dict(kernel_ms_per_step=sum(k[2] for k in kernels), kernel_launches_per_step=sum(k[1] for k in kernels),
                kernels=kernels)


KERNEL_GROUPS = (  # (group, substrings of a kernel's name), the first group that matches takes the kernel
    ("matrix products", ("gemm", "nvjet", "cutlass", "xmma")),
    ("triangular solves", ("trsm",)),
    ("short convolutions", ("conv_depthwise",)),
    ("optimiser and clipping", ("multi_tensor_apply", "lpnorm", "NormTwoOps")),
    ("fused with a scatter (λ's gather, backward)", ("scatter_add",)),
    ("fused by torch.compile", ("triton_",)),
)
OTHER_KERNELS = "other elementwise, copies"


def kernel_groups(kernels: list[list]) -> dict[str, float]:
    """Milliseconds per step of each :data:`KERNEL_GROUPS` group (and :data:`OTHER_KERNELS`), from a row's
    ``kernels`` (:func:`step_kernels`); groups in their order, empty ones left out."""
    totals = dict.fromkeys([g for g, _ in KERNEL_GROUPS] + [OTHER_KERNELS], 0.0)
    for name, _, ms in kernels:
        group = next((g for g, marks in KERNEL_GROUPS if any(mark in name for mark in marks)), OTHER_KERNELS)
        totals[group] += ms
    return {g: ms for g, ms in totals.items() if ms > 0}


@contextmanager
def device_turn(folder: Path):
    """An exclusive turn on the device among the benchmark's processes (a lock file)."""
    with (folder / "device.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def wait_for_all(folder: Path, count: int) -> None:
    """Block until ``count`` processes have written their ``ready-*`` file (or the wait times out)."""
    give_up = time.time() + READY_WAIT_S
    while len(list(folder.glob("ready-*"))) < count and time.time() < give_up:
        time.sleep(0.5)


def worker(tier: Tier, model: str, width: int, modes: list[str], device: torch.device, folder: Path,
           count: int, profile: bool = False) -> list[dict[str, Any]]:
    """The measurements of one mixer: compiled modes prepared first (side by side with the other processes), then,
    in this process's turn on the device, every mode measured (the others prepared and freed one by one)."""
    train_sets, _, _ = make_sets(tier.data)
    prepared, failed, rows = {}, {}, []
    try:
        for mode in modes:
            if mode.startswith("compiled"):
                try:
                    prepared[mode] = prepared_step(tier, model, width, mode, device, train_sets)
                except Exception as error:  # noqa: BLE001 - a mode that fails is reported, the others measured
                    failed[mode] = f"{type(error).__name__}: {error}"
    finally:
        (folder / f"ready-{model}").touch()
    wait_for_all(folder, count)
    with device_turn(folder):
        for mode in sorted(modes, key=lambda m: m not in prepared):  # the prepared ones first, then freed
            try:
                if mode in failed:
                    raise RuntimeError(failed[mode])
                step, cost = prepared.pop(mode) if mode in prepared else prepared_step(tier, model, width, mode,
                                                                                       device, train_sets)
                rows.append(dict(measure(step, mode, model, width, cost, device, profile), chunk_size=tier.chunk_size,
                                 backend=tier.backend))
                del step
            except Exception as error:  # noqa: BLE001
                rows.append(dict(model=model, width=width, mode=mode, error=f"{type(error).__name__}: {error}"))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return sorted(rows, key=lambda r: modes.index(r["mode"]))


def speedups(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per model: eager milliseconds divided by each other mode's."""
    out, rows = {}, [r for r in rows if "ms_per_step" in r]
    for model in dict.fromkeys(r["model"] for r in rows):
        eager = next((r["ms_per_step"] for r in rows if r["model"] == model and r["mode"] == "eager"), None)
        if eager is not None:
            out[model] = {r["mode"]: eager / r["ms_per_step"] for r in rows
                          if r["model"] == model and r["mode"] != "eager"}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.experiments.mqar.step_time",
                                     description="Milliseconds per training step, eager against compiled and captured.")
    parser.add_argument("--out", type=Path, required=True, help="the results JSON")
    parser.add_argument("--tier", default="gpu/mqar", choices=list(TIERS), help="whose step (default: gpu/mqar)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=None,
                        help=f"comma-separated subset of {','.join(MODES)} (default: eager, graphs, compiled+graphs "
                             "on CUDA; eager, compiled on a CPU)")
    parser.add_argument("--train-examples", type=int, default=None,
                        help="training sequences per set (default: the tier's, so compiled kernels are the runs' own)")
    parser.add_argument("--chunk-size", type=int, default=None, help="the recurrent mixers' chunk (default: the tier's)")
    parser.add_argument("--backend", choices=["torch", "auto", "triton"], default=None,
                        help="'auto': the Triton kernel for log-linear Mamba-2 on CUDA; 'triton': the Triton kernels "
                             "of every recurrent mixer (default: the tier's, torch)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast in the step (default: the tier's, off)")
    parser.add_argument("--tf32", action="store_true", help="TF32 matrix products in the step (default: the tier's, off)")
    parser.add_argument("--profile", action="store_true",
                        help="CUDA: also record every kernel of the step, its launches and device time per step")
    parser.add_argument("--device", default=None)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # as the experiments run
    default = ("eager", "graphs", "compiled+graphs") if device.type == "cuda" else ("eager", "compiled")
    modes = args.modes.split(",") if args.modes else list(default)
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}; choose from {MODES}")
    tier = benchmark_tier(args.tier, args.train_examples, args.chunk_size, args.backend, args.amp, args.tf32)
    if args.worker:
        rows = worker(tier, args.worker, args.width, modes, device, args.folder, args.count, args.profile)
        write_json(args.folder / f"rows-{args.worker}.json", rows)
        return
    with tempfile.TemporaryDirectory(prefix="step_time-") as work:
        run_workers(args, argv, modes, tier, device, Path(work))


def run_workers(args: argparse.Namespace, argv: list[str] | None, modes: list[str], tier: Tier, device: torch.device,
                folder: Path) -> None:
    """Start one process per mixer (their ready files, lock, logs and rows go to ``folder``), and write the results
    file each time one finishes (``complete`` once all have: a benchmark stopped early keeps what it measured)."""
    models = args.models.split(",")
    start = time.perf_counter()
    processes = {}
    threads = str(max(1, (os.cpu_count() or 1) // len(models)))  # compile workers per process
    for model in models:
        cmd = [sys.executable, "-m", "loglin_edu.experiments.mqar.step_time", "--out", str(args.out),
               "--tier", args.tier, "--width", str(args.width), "--modes", ",".join(modes), "--device", str(device),
               "--worker", model, "--folder", str(folder), "--count", str(len(models))]
        for option, value in (("--train-examples", args.train_examples), ("--chunk-size", args.chunk_size),
                              ("--backend", args.backend)):
            if value:
                cmd += [option, str(value)]
        cmd += [flag for flag, on in (("--amp", args.amp), ("--tf32", args.tf32), ("--profile", args.profile)) if on]
        log = (folder / f"log-{model}.txt").open("w")
        processes[model] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(
            os.environ, OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS=threads))
    command = "python -m loglin_edu.experiments.mqar.step_time " + " ".join(argv if argv is not None else sys.argv[1:])
    members = len(tier.seeds) * len(tier.lrs)
    rows, failed, running = [], {}, dict(processes)
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped from outside: stop the workers too
    try:
        collect(args, running, rows, failed, folder, start, command, members, models, modes, tier, device)
    finally:
        signal.signal(signal.SIGTERM, before)
        for process in running.values():
            process.kill()
    for r in json.loads(args.out.read_text())["rows"] if args.out.exists() else []:
        if "error" in r:
            print(f"{r['model']:<28}{r['mode']:<18}failed: {r['error'][:200]}")
            continue
        print(f"{r['model']:<28}{r['mode']:<18}{r['ms_per_step']:9.2f} ms/step   first step after "
              f"{r['seconds_to_first_step']:6.1f} s"
              + (f"   kernels {r['kernel_ms_per_step']:.2f} ms in {r['kernel_launches_per_step']:.0f} launches"
                 if "kernels" in r else "")
              + (f"   capture failed: {r['capture_error']}" if r["capture_error"] else ""))
    for model, log in failed.items():
        print(f"{model} failed:\n{log}", file=sys.stderr)


def collect(args, running, rows, failed, folder: Path, start: float, command: str, members: int, models: list[str],
            modes: list[str], tier: Tier, device: torch.device) -> None:
    """Wait for the processes in ``running``; each time one finishes, add its rows (or its log's end to
    ``failed``) and rewrite the results file."""
    while running:
        time.sleep(0.5)
        for model, process in list(running.items()):
            if process.poll() is None:
                continue
            del running[model]
            if process.returncode == 0 and (folder / f"rows-{model}.json").exists():
                rows += json.loads((folder / f"rows-{model}.json").read_text())
            else:
                failed[model] = (folder / f"log-{model}.txt").read_text()[-2000:]
            write_json(args.out, dict(
                what=f"milliseconds per training step of the {args.tier} tier's ensembles: T = {tier.data.seq_len}, "
                     f"batch {tier.train.batch_size} per member, vocabulary {tier.data.vocab_size}, {tier.n_layers} "
                     f"layers, width {args.width}, {members} members (seeds × learning rates), chunk {tier.chunk_size}, "
                     f"backend {tier.backend}, bf16 autocast {tier.train.amp}, TF32 products {tier.train.tf32}",
                **provenance(command, device), seconds=round(time.perf_counter() - start, 1), tier=args.tier,
                width=args.width, members=members, chunk_size=tier.chunk_size, backend=tier.backend, amp=tier.train.amp,
                tf32=tier.train.tf32, batch_size=tier.train.batch_size, seq_len=tier.data.seq_len,
                transformer=transformer_layout(tier), modes=modes, rows=sorted(rows, key=lambda r: (models.index(r["model"]), modes.index(r["mode"]))),
                speedup=speedups(rows), failed=failed, complete=not running,
            ))


if __name__ == "__main__":
    main()
