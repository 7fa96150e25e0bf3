"""The training loop of the recall experiments: an ensemble of small models, trained side by side.

Runs are seeded (initial weights from the member's seed; batch ``s`` of member ``m`` from ``(seed_m, s)``),
show tqdm progress, evaluate every ``eval_every`` steps (one JSON line per member and evaluation in
``log.jsonl``), and write checkpoints atomically (``checkpoint.pt``): a run started again resumes where
the checkpoint left off, bit-exactly on the CPU. :func:`train` is these named steps: :func:`start_run`
(build or resume), the :class:`~loglin_edu.train.step.TrainingStep` (eager, compiled or captured in a CUDA
graph), :func:`evaluation` and :func:`Run.checkpoint`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
from tqdm import tqdm

from ..data.recall import RecallSet
from ..layers.model import ModelConfig, build_model, count_parameters
from .checkpoint import append_log, keep_log_until, load_checkpoint, save_atomic
from .ensemble import Ensemble, Member
from .evaluate import evaluate, level_scales_at_queries
from .schedule import make_optimizer
from .step import EAGER_STEPS_BEFORE_CAPTURE, TrainingStep


@dataclass
class TrainConfig:
    """steps: optimiser steps; batch_size: sequences per step and member, split evenly over the training
    sets; warmup_steps: linear warm-up before the cosine decay; eval_every: steps between evaluations
    (and at the end); checkpoint_every: steps between checkpoints (None: only at the end); amp: bf16
    autocast on CUDA (the attention operators themselves always run in float32); tf32: the training step's float32
    matrix products on CUDA in TF32 (10-bit mantissas, the tensor cores' float32 path; evaluation stays float32);
    compile: the loss's forward and backward through ``torch.compile``; graphs: the whole step captured in a CUDA
    graph and replayed (CUDA only). Both change how the step is launched, not what it computes (:mod:`~loglin_edu.train.step`)."""

    steps: int = 1000
    batch_size: int = 64
    warmup_steps: int = 50
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batch_size: int = 256
    checkpoint_every: int | None = None
    amp: bool = False
    tf32: bool = False
    compile: bool = False
    graphs: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Run:
    """The state of one training run: the ensemble, its optimiser, where it stands and where it writes."""

    model_config: ModelConfig
    members: list[Member]
    ensemble: Ensemble
    optimizer: torch.optim.Optimizer
    out: Path | None
    step: int = 0
    seconds: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    loss_sum: torch.Tensor | None = None  # training loss per member since the last evaluation
    loss_steps: int = 0

    @property
    def log_path(self) -> Path | None:
        return None if self.out is None else self.out / "log.jsonl"

    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.out is None else self.out / "checkpoint.pt"

    def checkpoint(self) -> None:
        """Write the run's state atomically (nothing without an output folder)."""
        if self.checkpoint_path is not None:
            save_atomic(dict(step=self.step, seconds=self.seconds, model=self.model_config.to_dict(),
                             members=[asdict(m) for m in self.members],
                             models=[m.state_dict() for m in self.ensemble.members],
                             optimizer=self.optimizer.state_dict(), loss_sum=self.loss_sum,
                             loss_steps=self.loss_steps), self.checkpoint_path)


def follow_step_mode(optimizer: torch.optim.Optimizer, capturable: bool, fused: bool = False) -> None:
    """A checkpoint written in another step mode or optimiser form: its groups' ``capturable`` and ``fused`` flags and
    step counts (on the device for a captured step or the fused form, on the CPU otherwise) follow this run's."""
    for group in optimizer.param_groups:
        group["capturable"], group["fused"] = capturable, fused
        group["foreach"] = not fused
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if "step" in state:
                state["step"] = state["step"].to(p.device if capturable or fused else "cpu", torch.float32)


def start_run(model_config: ModelConfig, members: list[Member], config: TrainConfig, out: Path | None,
              device: torch.device) -> Run:
    """A new run, or the one whose checkpoint is in ``out`` (a checkpoint of another run is refused)."""
    ensemble = Ensemble([build_model(model_config, seed=m.seed) for m in members]).to(device)
    optimizer = make_optimizer(list(ensemble.members), [m.lr for m in members], config.weight_decay, config.betas,
                               capturable=config.graphs)
    run = Run(model_config, members, ensemble, optimizer, out, loss_sum=torch.zeros(len(members), device=device))
    state = load_checkpoint(run.checkpoint_path, device) if out is not None else None
    if state is not None:
        if state["model"] != model_config.to_dict() or state["members"] != [asdict(m) for m in members]:
            raise ValueError(f"{run.checkpoint_path} belongs to another run (different model or members): "
                             "remove it to start over")
        for model, weights in zip(ensemble.members, state["models"]):
            model.load_state_dict(weights)
        fused = bool(optimizer.param_groups[0].get("fused"))  # this run's form, before the checkpoint's replaces it
        optimizer.load_state_dict(state["optimizer"])
        follow_step_mode(optimizer, config.graphs, fused)
        run.step, run.seconds = state["step"], state["seconds"]
        run.loss_sum, run.loss_steps = state["loss_sum"], state["loss_steps"]
        run.history = keep_log_until(run.log_path, run.step)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    return run


def evaluation(run: Run, test_sets: dict[str, RecallSet], config: TrainConfig, name: str,
               validation_sets: dict[str, RecallSet] | None = None, final: bool = False) -> list[dict[str, Any]]:
    """Evaluate every member at the current step, log one line per member and reset the running loss.

    With validation sets, every evaluation measures them (under ``"validation"``: what model selection and the
    learning curves read) and only the ``final`` one the test sets, which are read once; without, every
    evaluation measures the test sets. ``final`` also records the λ each member's log-linear layers give the
    levels (:func:`~loglin_edu.train.evaluate.level_scales_at_queries`, on the last test set).
    """
    M = len(run.members)
    results = evaluate(run.ensemble, test_sets, config.eval_batch_size, config.amp) if final or not validation_sets \
        else [{} for _ in range(M)]
    if validation_sets:
        checks = evaluate(run.ensemble, validation_sets, config.eval_batch_size, config.amp)
        for result, check in zip(results, checks):
            result["validation"] = {k: check[k] for k in ("accuracy", "query_accuracy", "accuracy_by_set")}
    if final:
        last = list(test_sets.values())[-1]
        for result, model in zip(results, run.ensemble.members):
            scales = level_scales_at_queries(model, last)
            if scales is not None:
                result["level_scales"] = scales
    train_loss = (run.loss_sum / run.loss_steps).tolist()
    lines = [
        dict(run=name, member=i, seed=m.seed, lr=m.lr, step=run.step, train_loss=train_loss[i],
             seconds=round(run.seconds, 3), **results[i])
        for i, m in enumerate(run.members)
    ]
    run.history.extend(lines)
    append_log(run.log_path, lines)
    run.loss_sum.zero_()
    run.loss_steps = 0
    return lines


class Planner(Protocol):
    """Decides a run's total steps once its step time is known (a budget shared by jobs running side by side).

    ``report(seconds_per_step)`` is called once, after :data:`CALIBRATION_STEPS` timed steps; ``steps(wait)``
    then returns the total, or None while it is not decided (``wait=True``: block until it is — the warm-up,
    whose schedule does not depend on the total, is over).
    """

    def report(self, seconds_per_step: float) -> None: ...

    def steps(self, wait: bool) -> int | None: ...


CALIBRATION_STEPS = 10  # timed steps after the first EAGER_STEPS_BEFORE_CAPTURE + 2 (compilation, capture)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA step returns before its kernels finish)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(
    model_config: ModelConfig,
    members: list[Member],
    train_sets: list[RecallSet],
    test_sets: dict[str, RecallSet],
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    name: str = "run",
    device: str | torch.device = "cpu",
    progress: bool = True,
    stop_at: int | None = None,
    deadline: float | None = None,
    validation_sets: dict[str, RecallSet] | None = None,
    planner: Planner | None = None,
    on_evaluation: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train one ensemble (module docstring) and return its record.

    model_config: the architecture every member shares; members: seeds and learning rates; train_sets:
    the recall sets each batch draws from (``batch_size / len(train_sets)`` rows from each); test_sets:
    name -> set, evaluated every ``eval_every`` steps; validation_sets: name -> set, evaluated with them (under
    ``"validation"`` in each line: what model selection reads); out_dir: where ``log.jsonl`` and ``checkpoint.pt``
    go (None: nowhere, no resuming); stop_at: stop after this step as if interrupted (the checkpoint
    then lets a later call finish the run); deadline: a ``time.time()`` after which the run stops at the end
    of the step it is in, evaluates there and checkpoints (``complete`` False: a budget ran out); planner: sets
    ``config.steps`` from the measured step time (:class:`Planner`); on_evaluation: called with the record so
    far after every evaluation (a job's results file stays current). Returns ``dict(name, model, parameters,
    members, config, history, final, seconds, complete, steps_done, seconds_per_step, step_mode,
    capture_error, compile_error, stopped_by_deadline)``; ``history`` holds the evaluation lines; ``seconds_per_step`` is
    measured between two device synchronisations over the last stretch of steps without an evaluation.
    """
    device = torch.device(device)
    config = replace(config)  # a planner may change its steps
    if config.batch_size % len(train_sets):
        raise ValueError(f"batch_size={config.batch_size} must split evenly over {len(train_sets)} training sets")
    per_set = config.batch_size // len(train_sets)
    train_sets = [s.to(device) for s in train_sets]
    test_sets = {n: s.to(device) for n, s in test_sets.items()}
    validation_sets = {n: s.to(device) for n, s in (validation_sets or {}).items()}
    run = start_run(model_config, members, config, Path(out_dir) if out_dir is not None else None, device)
    step = TrainingStep(run, train_sets, per_set, config)
    start = run.step
    calibrate_from = start + EAGER_STEPS_BEFORE_CAPTURE + 2
    planned = planner is None
    bar = tqdm(total=max(0, config.steps - start), desc=name, disable=not progress, file=sys.stderr, dynamic_ncols=True)
    tick = time.perf_counter()
    timing = dict(since=None, from_step=run.step, seconds_per_step=None)
    stopped_by_deadline = False

    def record(complete: bool) -> dict[str, Any]:
        history = run.history
        final = [line for line in history if line["step"] == history[-1]["step"]] if history else []
        return dict(
            name=name, model=model_config.to_dict(), parameters=count_parameters(run.ensemble.members[0]),
            members=[asdict(m) for m in members], config=config.to_dict(), history=history, final=final,
            seconds=round(run.seconds, 3), complete=complete, steps_done=run.step,
            seconds_per_step=timing["seconds_per_step"], step_mode=step.mode, capture_error=step.capture_error,
            compile_error=step.compile_error, stopped_by_deadline=stopped_by_deadline,
        )

    def mark() -> None:  # the clock after the device has caught up, at a step boundary
        synchronize(device)
        now = time.perf_counter()
        if timing["since"] is not None and run.step > timing["from_step"]:
            timing["seconds_per_step"] = (now - timing["since"]) / (run.step - timing["from_step"])
        timing["since"], timing["from_step"] = now, run.step

    while run.step < config.steps and (stop_at is None or run.step < stop_at):
        if run.step == calibrate_from:
            mark()
        step()
        bar.update(1)
        if not planned:
            if run.step == calibrate_from + CALIBRATION_STEPS:
                mark()
                planner.report(timing["seconds_per_step"])
            if run.step > calibrate_from + CALIBRATION_STEPS:
                steps = planner.steps(wait=run.step >= config.warmup_steps)
                if steps is not None:
                    config.steps, planned = max(run.step, steps), True
                    bar.total = config.steps - start
        out_of_time = deadline is not None and time.time() >= deadline and run.step < config.steps
        if run.step % config.eval_every == 0 or run.step == config.steps or out_of_time:
            mark()
            run.seconds += time.perf_counter() - tick
            lines = evaluation(run, test_sets, config, name, validation_sets,
                               final=run.step == config.steps or out_of_time)
            bar.set_postfix(loss=f"{min(x['train_loss'] for x in lines):.3f}",
                            acc=f"{max(x.get('validation', x).get('accuracy', 0.0) for x in lines):.3f}")
            if on_evaluation is not None:
                on_evaluation(record(run.step == config.steps))
            tick = time.perf_counter()
            timing["since"], timing["from_step"] = tick, run.step
        last = run.step == config.steps or run.step == stop_at or out_of_time  # checkpointed after the loop
        if config.checkpoint_every and run.step % config.checkpoint_every == 0 and not last:
            run.checkpoint()
        if out_of_time:
            stopped_by_deadline = True
            break
    bar.close()
    run.seconds += time.perf_counter() - tick
    if run.step > start:
        run.checkpoint()
    result = record(run.step == config.steps)
    if on_evaluation is not None and run.step > start:
        on_evaluation(result)
    return result
