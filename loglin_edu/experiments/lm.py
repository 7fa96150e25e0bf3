"""Language modelling on real text: the five mixers as small language models, trained and measured.

    python -m loglin_edu.experiments.lm --tier cpu --out DIR               # end to end on a CPU, about a minute
    python -m loglin_edu.experiments.lm --tier gpu --out DIR --prepare     # corpus -> tokenizer -> token streams
    python -m loglin_edu.experiments.lm --tier gpu --out DIR --max-minutes 9 --models mamba2 --seeds 0
    python -m loglin_edu.experiments.lm --tier gpu --out DIR --max-minutes 9 --jobs 5   # 5 runs at once, one GPU
    torchrun --nproc_per_node 2 -m loglin_edu.experiments.lm --tier gpu --out DIR    # the same runs, DDP
    python -m loglin_edu.experiments.lm --tier gpu --out DIR --merge --results book/results
    torchrun --nproc_per_node 2 -m loglin_edu.experiments.lm --tier gpu --out DIR --throughput --results book/results

A *run* is one architecture and one seed: :func:`~loglin_edu.train.lm.train_lm` on the prepared data, then
the measurements of :mod:`loglin_edu.train.lm_measures` (validation perplexity, loss by position up to twice the
training context, needle-in-a-haystack with one key and with several, learned λ by level, a sample). Each run
has a folder ``DIR/runs/<model>-s<seed>`` (checkpoint, ``log.jsonl``, ``record.json`` once measured);
``--max-minutes`` stops training in time for the measurements and checkpoints, so a later call with the same
arguments resumes: long runs go in pieces. ``--merge`` gathers the records into one results file
(``lm_<tier>.json``, with the command, commit, device, library versions and date); ``--throughput`` measures
training tokens per second on one GPU and on every GPU of the ``torchrun`` group (``lm_ddp_scaling.json``).
A prepared ``DIR/data`` is all the other steps read: prepare it where the corpus packages are installed, and
a machine without them trains from a copy of the folder.

Models (:func:`mixer_settings`): one block for all — pre-norm, MLP, RMSNorm, tied embeddings — with the
parameter counts matched within 5 %: softmax attention (heads of 64, RoPE; 4·d² projection weights) has an
MLP of 4·d, the recurrent mixers (about 6·d² projection weights) an MLP of 3·d. Mamba-2: expand 2, one
group; Gated DeltaNet: key width ¾·d over all heads, value width twice that. Every model accepts twice the
training context (``max_len``), for the loss-by-position and needle measurements beyond it.

Tiers (:data:`TIERS`):

- ``cpu``: the first 8,000 characters of each of the 108 documents, BPE of 4,096 tokens, width 128, 2 layers
  (about 0.93 M parameters, more than half of them the embedding), context 128, 100 steps of 8 windows, one
  seed. It shows the whole pipeline; at this size the models learn spelling and common words, not recall.
- ``gpu``: the whole King James Bible and Shakespeare (2.2 M training tokens with a BPE of 8,192), width 512,
  6 layers (23–24 M parameters), context 2,048, 600 steps of 8 windows (9.8 M tokens, about 4.4 passes over
  the training split), seeds 0, 1, 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..data.lm_data import TextData, TextSpec, prepare_text
from ..data.token_stream import evaluation_starts
from ..layers.model import MIXERS, ModelConfig, build_model, count_parameters
from ..ops import layer_backend
from ..provenance import provenance, write_json
from ..train import distributed
from ..train.lm import LMTrainConfig, measure_throughput, train_lm
from ..train.lm_measures import level_weights, needle_scores, per_position_loss, validation_loss
from .mqar import LABELS, state_size

MODELS = tuple(MIXERS)  # transformer, mamba2, loglinear_mamba2, gated_deltanet, loglinear_gated_deltanet
PAIRS = (("mamba2", "loglinear_mamba2"), ("gated_deltanet", "loglinear_gated_deltanet"))

# WikiText perplexity as reported in the paper (Guo et al., 2025; transcribed, PAPER.md §6): 50B tokens, context
# 16K, about 800M parameters, 21 layers (the Transformer also with 24 layers: 21.13).
PAPER_WIKITEXT_PPL = {"transformer": 21.56, "mamba2": 22.44, "loglinear_mamba2": 22.11, "gated_deltanet": 21.73,
                      "loglinear_gated_deltanet": 21.45}


@dataclass
class EvalSpec:
    """The measurements after training. windows: validation windows of one context; position_windows:
    windows of twice the context for the loss by position; needle_*: the needle grid (lengths in tokens,
    depths in [0, 1], prompts per cell, candidates for the choice score); multikey: needles in the multi-key
    task; level_windows: windows of one context over which λ is averaged; sample_tokens: length of the sample."""

    windows: int = 64
    position_windows: int = 64
    needle_lengths: tuple[int, ...] = (512, 1024, 2048, 4096)
    needle_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    needle_samples: int = 4
    needle_choices: int = 10
    multikey: int = 4
    level_windows: int = 4
    batch_size: int = 8
    sample_tokens: int = 48


@dataclass
class LMTier:
    """Everything one tier runs: data, model shape, training, measurements, which models and seeds.

    d_state, head_dim: Mamba-2's state width and head width; gdn_heads: Gated DeltaNet's heads; chunk_size:
    of the chunkwise forms; backend: ``"auto"`` (the fused or Triton kernels on CUDA where a layer takes them by
    default), ``"triton"`` (the Triton kernels of every recurrent mixer; :func:`~loglin_edu.ops.layer_backend`) or
    ``"torch"``; eval_reserve_s: seconds ``--max-minutes`` keeps for the measurements after training.
    """

    text: TextSpec
    train: LMTrainConfig
    eval: EvalSpec
    d_model: int
    n_layers: int
    d_state: int
    head_dim: int
    gdn_heads: int
    models: tuple[str, ...] = MODELS
    seeds: tuple[int, ...] = (0,)
    chunk_size: int = 64
    backend: str = "auto"
    eval_reserve_s: float = 60.0


TIERS: dict[str, LMTier] = {
    "cpu": LMTier(
        text=TextSpec(vocab_size=4096, max_document_chars=8000),
        train=LMTrainConfig(steps=100, batch_size=8, context=128, lr=3e-3, warmup_steps=10, eval_every=20,
                            eval_windows=16, eval_batch_size=8, amp=False),
        eval=EvalSpec(windows=32, position_windows=96, needle_lengths=(256,), needle_depths=(0.0, 0.5, 1.0),
                      needle_samples=2, needle_choices=4, multikey=3, level_windows=4, sample_tokens=32),
        d_model=128, n_layers=2, d_state=8, head_dim=64, gdn_heads=2, chunk_size=32, eval_reserve_s=10.0,
    ),
    "gpu": LMTier(
        text=TextSpec(vocab_size=8192),
        train=LMTrainConfig(steps=600, batch_size=8, context=2048, lr=1.5e-3, warmup_steps=60, eval_every=100,
                            eval_windows=32, eval_batch_size=8, amp=True),
        eval=EvalSpec(),
        d_model=512, n_layers=6, d_state=64, head_dim=128, gdn_heads=4, seeds=(0, 1, 2), eval_reserve_s=120.0,
    ),
}


def mixer_settings(model: str, tier: LMTier) -> tuple[dict[str, Any], int]:
    """The mixer options and MLP ratio of ``model`` in ``tier`` (module docstring)."""
    d = tier.d_model
    if model == "transformer":
        return dict(num_heads=max(1, d // 64), backend=layer_backend(tier.backend, kernel=False),
                    form="chunkwise", chunk_size=tier.chunk_size), 4
    if model in ("mamba2", "loglinear_mamba2"):
        return dict(d_state=tier.d_state, head_dim=tier.head_dim, expand=2,
                    backend=layer_backend(tier.backend, kernel=True), chunk_size=tier.chunk_size), 3
    if model in ("gated_deltanet", "loglinear_gated_deltanet"):
        key_width = 3 * d // 4
        if key_width % tier.gdn_heads:
            raise ValueError(f"¾·d_model={key_width} must split into gdn_heads={tier.gdn_heads} heads")
        return dict(num_heads=tier.gdn_heads, key_dim=key_width // tier.gdn_heads, expand_v=2,
                    backend=layer_backend(tier.backend, kernel=True), chunk_size=tier.chunk_size), 3
    raise ValueError(f"model must be one of {MODELS}, got {model!r}")


def model_config(tier: LMTier, model: str, vocab_size: int) -> ModelConfig:
    """The :class:`ModelConfig` of ``model`` in ``tier``; ``max_len`` is twice the training context."""
    options, ratio = mixer_settings(model, tier)
    return ModelConfig(model, vocab_size=vocab_size, d_model=tier.d_model, n_layers=tier.n_layers,
                       max_len=2 * tier.train.context, mlp=True, mlp_ratio=ratio, mixer_options=options)


def prepare(tier: LMTier, out: Path) -> TextData:
    """The data folder ``out/data`` of ``tier`` (made by rank 0, then read by every rank)."""
    world = distributed.current()
    if world.is_main:
        data = prepare_text(tier.text, out / "data")
    distributed.barrier()
    if not world.is_main:
        data = prepare_text(tier.text, out / "data")
    return data


def run_dir(out: Path, model: str, seed: int) -> Path:
    return out / "runs" / f"{model}-s{seed}"


def measure(model: torch.nn.Module, tier: LMTier, data: TextData) -> dict[str, Any]:
    """The measurements of :mod:`loglin_edu.train.lm_measures` on a trained model (``tier.eval``); the validation
    and position losses are shared over the ranks, the rest runs on rank 0 (the others get an empty dict)."""
    spec, context, amp = tier.eval, tier.train.context, tier.train.amp
    start = time.perf_counter()
    val = validation_loss(model, data.validation, context, spec.windows, spec.batch_size, amp=amp)
    positions = per_position_loss(model, data.validation, 2 * context, spec.position_windows, spec.batch_size, amp=amp)
    if not distributed.current().is_main:
        return {}
    grid = dict(lengths=spec.needle_lengths, depths=spec.needle_depths, samples=spec.needle_samples,
                choices=spec.needle_choices, amp=amp)
    single = needle_scores(model, data.tokenizer, data.validation, num_keys=1, **grid)
    multi = needle_scores(model, data.tokenizer, data.validation, num_keys=spec.multikey, **grid)
    windows = data.validation.windows(evaluation_starts(data.validation, context, spec.level_windows), context)
    levels = level_weights(model, windows.to(next(model.parameters()).device), amp=amp)
    prompt = data.validation.window(0, 32).to(next(model.parameters()).device)
    sample = model.generate(prompt, spec.sample_tokens, temperature=0.8, seed=0)[len(prompt):].tolist()
    prompt = prompt.tolist()
    return dict(validation=val, loss_by_position=[round(x, 5) for x in positions.tolist()], needle_single=single,
                needle_multikey=multi, level_weights=levels, sample=dict(prompt=data.tokenizer.decode(prompt),
                                                                          continuation=data.tokenizer.decode(sample)),
                seconds=round(time.perf_counter() - start, 1))


def run_one(tier: LMTier, model: str, seed: int, data: TextData, out: Path, *, deadline: float | None = None,
            progress: bool = True) -> dict[str, Any]:
    """Train (or resume) and measure one run; its record is also written to ``record.json`` of its folder
    (``complete`` False when the deadline stopped training first: call again to go on)."""
    folder = run_dir(out, model, seed)
    record_path = folder / "record.json"
    if record_path.exists():
        saved = json.loads(record_path.read_text())
        if saved["complete"] and "evaluation" in saved:
            return saved
    config = model_config(tier, model, data.tokenizer.vocab_size)
    train_deadline = None if deadline is None else deadline - tier.eval_reserve_s
    trained, record = train_lm(config, tier.train, data.train, data.validation, seed=seed, out_dir=folder,
                               name=f"{model}-s{seed}", progress=progress, deadline=train_deadline)
    record.update(model_name=model, state_size=state_size(config))
    record.update({k: v for k, v in record_provenance(None, str(distributed.current().device)).items()
                   if k in ("commit", "date", "device", "versions")})
    if record["complete"]:
        record["evaluation"] = measure(trained, tier, data)
    if distributed.current().is_main:
        folder.mkdir(parents=True, exist_ok=True)
        write_json(record_path, record)
    distributed.barrier()
    return record


def run_all(tier: LMTier, data: TextData, out: Path, *, deadline: float | None = None, progress: bool = True) -> bool:
    """Every (model, seed) run of ``tier``, one after the other, in this process (or this torchrun group: each
    run data-parallel). Returns True when runs remain because the deadline came first (call again to resume)."""
    for model in tier.models:
        for seed in tier.seeds:
            if deadline is not None and time.time() > deadline - tier.eval_reserve_s:
                return True
            record = run_one(tier, model, seed, data, out, deadline=deadline, progress=progress)
            if not record["complete"]:
                return True
    return False


def run_tier(name: str, tier: LMTier, out: Path, *, progress: bool = True, max_minutes: float | None = None,
             results: Path | None = None, command: str | None = None) -> dict[str, Any] | None:
    """Prepare the data, train and measure every run of ``tier`` (:func:`run_all`), and return the merged results
    (:func:`merge`; None on ranks other than 0)."""
    deadline = None if max_minutes is None else time.time() + 60 * max_minutes
    data = prepare(tier, out)
    run_all(tier, data, out, deadline=deadline, progress=progress)
    if not distributed.current().is_main:
        return None
    return merge(name, tier, out, results=results, command=command)


def read_records(out: Path) -> list[dict[str, Any]]:
    """The ``record.json`` of every run folder under ``out/runs``."""
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/record.json"))]


def record_provenance(command: str | None, device: str) -> dict[str, Any]:
    """:func:`~loglin_edu.provenance.provenance` (command, commit, date, device, versions), with the tokenizer
    library's version."""
    found = provenance(command, device)
    try:
        found["versions"]["tokenizers"] = importlib.metadata.version("tokenizers")
    except importlib.metadata.PackageNotFoundError:
        found["versions"]["tokenizers"] = "not installed"
    return found


def compare_pair(runs: list[dict[str, Any]], model: str, baseline: str) -> dict[str, Any]:
    """Validation loss of ``model`` against ``baseline`` over seeds: the difference of the means and its
    standard error ``sqrt(s_a²/n_a + s_b²/n_b)``; ``separated`` when the difference exceeds two standard
    errors. Also the mean needle accuracy (choice score, both tasks) of each."""
    def losses(m):
        values = [r["evaluation"]["validation"]["loss"] for r in runs if r["model_name"] == m]
        return torch.tensor(values, dtype=torch.float64)

    def needles(m):
        cells = [x for r in runs if r["model_name"] == m for task in ("needle_single", "needle_multikey")
                 for row in r["evaluation"][task]["choice"] for x in row]
        return sum(cells) / len(cells) if cells else None

    a, b = losses(model), losses(baseline)
    row = dict(model=model, baseline=baseline, seeds=[len(a), len(b)], needle_choice=needles(model),
               baseline_needle_choice=needles(baseline))
    if len(a) == 0 or len(b) == 0:
        return row
    row.update(loss=a.mean().item(), baseline_loss=b.mean().item(), difference=(a.mean() - b.mean()).item())
    if len(a) >= 2 and len(b) >= 2:
        se = (a.var() / len(a) + b.var() / len(b)).sqrt().item()
        row.update(standard_error=se, separated=abs(row["difference"]) > 2 * se, better=row["difference"] < 0)
    return row


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model: seeds, parameters, validation loss and perplexity (mean and sample std over seeds), the loss by
    position averaged over seeds; per log-linear/linear pair: :func:`compare_pair`."""
    models = {}
    for m in MODELS:
        mine = [r for r in runs if r["model_name"] == m]
        if not mine:
            continue
        loss = torch.tensor([r["evaluation"]["validation"]["loss"] for r in mine], dtype=torch.float64)
        positions = torch.tensor([r["evaluation"]["loss_by_position"] for r in mine], dtype=torch.float64).mean(0)
        models[m] = dict(label=LABELS[m], seeds=[r["seed"] for r in mine], parameters=mine[0]["parameters"],
                         loss=loss.mean().item(), loss_std=loss.std().item() if len(loss) > 1 else None,
                         perplexity=math.exp(loss.mean().item()),
                         loss_by_position=[round(x, 5) for x in positions.tolist()])
    return dict(models=models, pairs=[compare_pair(runs, m, b) for b, m in PAIRS])


def merge(name: str, tier: LMTier, out: Path, *, results: Path | None = None, command: str | None = None,
          device: str | None = None) -> dict[str, Any]:
    """One results record from the run folders under ``out`` and the runs of an earlier ``results/lm_<name>.json``
    (a run found in both: the one under ``out``). Written to ``results/lm_<name>.json`` when ``results`` is given.
    The record's provenance is the merge's; each run keeps its own commit, date, device and versions."""
    found = {(r["model_name"], r["seed"]): r for r in read_records(out)}
    earlier_path = None if results is None else results / f"lm_{name}.json"
    earlier = json.loads(earlier_path.read_text()) if earlier_path is not None and earlier_path.exists() else None
    runs = dict(((r["model_name"], r["seed"]), r) for r in (earlier["runs"] if earlier else []))
    runs.update(found)
    done = [r for r in runs.values() if r["complete"] and "evaluation" in r]
    done.sort(key=lambda r: (MODELS.index(r["model_name"]), r["seed"]))
    data = None
    if (out / "data" / "train.json").exists():
        data = prepare_text(tier.text, out / "data").describe()
    data = data if data is not None else (earlier or {}).get("data")
    vocab = data["vocab_size"] if data else tier.text.vocab_size
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    result = dict(tier=name, **record_provenance(command, device), data=data, text=asdict(tier.text),
                  train=tier.train.to_dict(), eval=asdict(tier.eval),
                  models={m: model_config(tier, m, vocab).to_dict() for m in tier.models},
                  runs=done, incomplete=sorted(f"{m}-s{s}" for (m, s), r in runs.items() if r not in done),
                  summary=summarize(done))
    if earlier is not None and earlier.get("commit") not in (None, result["commit"]):
        result["earlier_commits"] = sorted(set(earlier.get("earlier_commits", []) + [earlier["commit"]]))
    if results is not None:
        write_json(results / f"lm_{name}.json", result)
    return result


def throughput(name: str, tier: LMTier, out: Path, *, models: tuple[str, ...], steps: int, warmup: int,
               results: Path | None, command: str | None) -> dict[str, Any] | None:
    """Training tokens per second of each model on one GPU (rank 0 alone) and on all ``N`` ranks with DDP, at the
    tier's per-GPU batch (weak scaling: the global batch grows with ``N``); ``efficiency = tps_N / (N · tps_1)``.
    Written to ``results/lm_ddp_scaling.json`` by rank 0."""
    world = distributed.current()
    data = prepare(tier, out)
    per_gpu = tier.train.micro_batch_size or tier.train.batch_size
    rows = []
    for model in models:
        config = model_config(tier, model, data.tokenizer.vocab_size)
        single = None
        if world.is_main:
            single = measure_throughput(config, replace(tier.train, batch_size=per_gpu, micro_batch_size=None),
                                        data.train, steps=steps, warmup=warmup, parallel=False)
        distributed.barrier()
        multi = measure_throughput(config, replace(tier.train, batch_size=per_gpu * world.size, micro_batch_size=None),
                                   data.train, steps=steps, warmup=warmup, parallel=True)
        if world.is_main:
            rows.append(dict(model=model, parameters=count_parameters(build_model(config))["total"],
                             tokens_per_second_1=single["tokens_per_second"],
                             tokens_per_second_n=multi["tokens_per_second"], gpus=world.size,
                             efficiency=multi["tokens_per_second"] / (world.size * single["tokens_per_second"]),
                             seconds_per_step_1=single["seconds_per_step"],
                             seconds_per_step_n=multi["seconds_per_step"]))
            print(f"{LABELS[model]:<28} 1 GPU {single['tokens_per_second']:>10,.0f} tok/s   {world.size} GPUs "
                  f"{multi['tokens_per_second']:>10,.0f} tok/s   efficiency {rows[-1]['efficiency']:.2f}", flush=True)
    if not world.is_main:
        return None
    result = dict(tier=name, **record_provenance(command, str(world.device)), gpus=world.size, per_gpu_batch=per_gpu,
                  context=tier.train.context, amp=tier.train.amp, compile=tier.train.compile, steps=steps,
                  warmup=warmup, models=rows)
    if results is not None:
        write_json(results / "lm_ddp_scaling.json", result)
    return result


def choose_tier(args: argparse.Namespace) -> LMTier:
    """The tier the command line names, with its overrides applied."""
    tier = TIERS[args.tier]
    changes: dict[str, Any] = {}
    if args.models:
        unknown = set(args.models.split(",")) - set(MODELS)
        if unknown:
            raise ValueError(f"--models must name models of {MODELS}, got {sorted(unknown)}")
        changes["models"] = tuple(args.models.split(","))
    if args.seeds:
        changes["seeds"] = tuple(int(s) for s in args.seeds.split(","))
    if args.backend:
        changes["backend"] = args.backend
    if args.corpus:
        changes["text"] = replace(tier.text, sources=args.corpus)
    train = {k: v for k, v in dict(steps=args.steps, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size,
                                   lr=args.lr, compile=args.compile or None).items() if v is not None}
    if train:
        changes["train"] = replace(tier.train, **train)
    return replace(tier, **changes)


def run_workers(argv: list[str], tier: LMTier, jobs: int, deadline: float | None) -> None:
    """Each (model, seed) run of ``tier`` in its own process (``argv`` with ``--models``/``--seeds`` narrowed),
    ``jobs`` at a time, on one device; output in each run folder's ``stdout.txt``."""
    base = [a for i, a in enumerate(argv) if a not in ("--jobs",) and (i == 0 or argv[i - 1] != "--jobs")]
    pending = [(m, s) for m in tier.models for s in tier.seeds]
    running: dict[tuple[str, int], subprocess.Popen] = {}
    out = Path(argv[argv.index("--out") + 1])
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    while pending or running:
        while pending and len(running) < jobs:
            model, seed = pending.pop(0)
            cmd = [sys.executable, "-m", "loglin_edu.experiments.lm", *base, "--models", model, "--seeds", str(seed),
                   "--no-progress", "--no-merge"]
            if deadline is not None:
                cmd += ["--deadline", repr(deadline)]
            folder = run_dir(out, model, seed)
            folder.mkdir(parents=True, exist_ok=True)
            with (folder / "stdout.txt").open("a") as log:
                running[(model, seed)] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        for job, proc in list(running.items()):
            if proc.poll() is not None:
                del running[job]
                print(f"[{time.strftime('%H:%M:%S')}] {job[0]}-s{job[1]} exit {proc.returncode}", flush=True)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m loglin_edu.experiments.lm", description=__doc__.split("\n")[0])
    parser.add_argument("--tier", choices=sorted(TIERS), required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder for the data, the run folders and results")
    parser.add_argument("--results", type=Path, help="also write lm_<tier>.json (or lm_ddp_scaling.json) here")
    parser.add_argument("--models", help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--seeds", help="comma-separated seeds (the tier's by default)")
    parser.add_argument("--max-minutes", type=float,
                        help="stop training in time to measure and checkpoint; call again to resume")
    parser.add_argument("--prepare", action="store_true",
                        help="only prepare the data folder (corpus, tokenizer, streams)")
    parser.add_argument("--merge", action="store_true", help="only merge the run folders into lm_<tier>.json")
    parser.add_argument("--throughput", action="store_true", help="measure tokens/s on 1 GPU and on the torchrun group")
    parser.add_argument("--throughput-steps", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process on the one device")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--batch-size", type=int, help="global batch of windows per step")
    parser.add_argument("--micro-batch-size", type=int, help="windows per forward pass on one GPU (accumulation)")
    parser.add_argument("--lr", type=float)
    parser.add_argument("--corpus",
                        help="corpus sources, e.g. kjv+shakespeare+austen or files:PATH (default: the tier's)")
    parser.add_argument("--backend", choices=["auto", "torch", "triton"],
                        help="'auto': fused/Triton kernels on CUDA where a layer takes them by default (default); "
                             "'triton': also log-linear Gated DeltaNet's")
    parser.add_argument("--compile", action="store_true", help="torch.compile the models")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-merge", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    tier = choose_tier(args)
    command = "python -m loglin_edu.experiments.lm " + " ".join(argv)
    world = distributed.setup(args.device)
    if world.size > 1:
        command = f"torchrun --nproc_per_node {world.size} -m loglin_edu.experiments.lm " + " ".join(argv)
    if world.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:
        if args.prepare:
            data = prepare(tier, args.out)
            if world.is_main:
                print(json.dumps(data.describe(), indent=1))
        elif args.merge:
            if world.is_main:
                result = merge(args.tier, tier, args.out, results=args.results, command=command,
                               device=str(world.device))
                print_summary(result)
        elif args.throughput:
            throughput(args.tier, tier, args.out, models=tier.models, steps=args.throughput_steps, warmup=5,
                       results=args.results, command=command)
        elif args.jobs > 1:
            if world.size > 1:
                parser.error("--jobs runs several processes on one device; do not combine it with torchrun")
            deadline = None if args.max_minutes is None else time.time() + 60 * args.max_minutes
            prepare(tier, args.out)
            run_workers(argv, tier, args.jobs, deadline)
            print_summary(merge(args.tier, tier, args.out, results=args.results, command=command,
                                device=str(world.device)))
        else:
            deadline = args.deadline
            if deadline is None and args.max_minutes is not None:
                deadline = time.time() + 60 * args.max_minutes
            remaining = run_all(tier, prepare(tier, args.out), args.out, deadline=deadline,
                                progress=not args.no_progress)
            if world.is_main:
                print("runs remain: call again with the same arguments to resume" if remaining else "every run is done")
                if not args.no_merge:
                    print_summary(merge(args.tier, tier, args.out, results=args.results, command=command,
                                        device=str(world.device)))
    finally:
        distributed.teardown()


def print_summary(result: dict[str, Any]) -> None:
    """Validation perplexity per model (mean ± std over seeds) and the pair comparisons."""
    for m, row in result["summary"]["models"].items():
        spread = f" ± {row['loss_std']:.3f}" if row["loss_std"] is not None else ""
        print(f"{row['label']:<28} seeds {len(row['seeds'])}  loss {row['loss']:.3f}{spread}  "
              f"ppl {row['perplexity']:.1f}")
    for pair in result["summary"]["pairs"]:
        if "difference" in pair:
            se = f" (se {pair['standard_error']:.3f})" if "standard_error" in pair else ""
            print(f"{LABELS[pair['model']]} - {LABELS[pair['baseline']]}: loss {pair['difference']:+.3f}{se}")
    if result["incomplete"]:
        print("incomplete:", ", ".join(result["incomplete"]))


if __name__ == "__main__":
    main()
