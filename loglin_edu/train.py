"""Training shared by every experiment: several models of one architecture trained side by side.

An :class:`Ensemble` holds ``M`` models of one :class:`~loglin_edu.layers.ModelConfig` (different seeds,
different learning rates) and runs them as one vectorised model: their weights are stacked and
:func:`torch.func.vmap` maps the forward pass over the stack. On a GPU this turns ``M`` tiny models —
each far too small to keep the device busy — into one launch sequence, at the cost of one
``torch.stack`` per weight per step. Each member keeps its own parameters, optimiser state and data order.

One step, for every member ``m`` with its own batch (same recall sets, its own random rows):

    loss_m = mean cross-entropy over the batch's query positions        (only queries are supervised)
    Σ_m loss_m  ->  backward;   clip ‖∇θ_m‖ <= grad_clip per member;   AdamW step with lr_m · schedule(step)

    schedule(step) = (step + 1) / warmup                          for step < warmup
                   = ½ (1 + cos(π (step - warmup) / (steps - warmup)))   afterwards

Runs are seeded (initial weights from the member's seed; batch ``s`` of member ``m`` from ``(seed_m, s)``),
show tqdm progress, evaluate every ``eval_every`` steps (one JSON line per member and evaluation in
``log.jsonl``), and write checkpoints atomically (``checkpoint.pt``): a run started again resumes where
the checkpoint left off, bit-exactly on the CPU.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap
from tqdm import tqdm

from .data.recall import RecallSet
from .layers.model import ModelConfig, build_model, count_parameters


@dataclass(frozen=True)
class Member:
    """One model of an ensemble: its seed (initial weights and data order) and peak learning rate."""

    seed: int
    lr: float


@dataclass
class TrainConfig:
    """steps: optimiser steps; batch_size: sequences per step and member, split evenly over the training
    sets; warmup_steps: linear warm-up before the cosine decay; eval_every: steps between evaluations
    (and at the end); checkpoint_every: steps between checkpoints (None: only at the end); amp: bf16
    autocast on CUDA (the attention operators themselves always run in float32)."""

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Ensemble(nn.Module):
    """``M`` models of one architecture run as one: ``forward`` returns ``[M, ...]`` (module docstring).

    models: a list of models with identical structure (tied weights tied alike).
    """

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)
        # the module whose code runs with the stacked weights (unregistered: its own weights are never used)
        object.__setattr__(self, "_template", copy.deepcopy(models[0]))

    def stacked_state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Every parameter and buffer stacked over the members: ``name -> [M, ...]`` (differentiable)."""
        params = [dict(m.named_parameters()) for m in self.members]
        buffers = [dict(m.named_buffers()) for m in self.members]
        return (
            {name: torch.stack([p[name] for p in params]) for name in params[0]},
            {name: torch.stack([b[name] for b in buffers]) for name in buffers[0]},
        )

    def forward(self, *args: torch.Tensor, shared_inputs: bool = False) -> torch.Tensor:
        """Run every member. args: the model's inputs with a leading member dimension ``M`` (or without
        it when ``shared_inputs``: every member gets the same inputs). Returns ``[M, ...]``."""
        params, buffers = self.stacked_state()

        def one(p, b, *inputs):
            return functional_call(self._template, (p, b), inputs)

        in_dims = (0, 0) + (None if shared_inputs else 0,) * len(args)
        return vmap(one, in_dims=in_dims)(params, buffers, *args)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total`` (module docstring)."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def make_optimizer(ensemble: Ensemble, members: list[Member], config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with two groups per member: matrices (weight decay) and vectors (norm gains, biases, A, D, λ
    weights: no decay). ``group["base_lr"]`` is the member's peak learning rate."""
    groups = []
    for model, member in zip(ensemble.members, members):
        params = list(model.parameters())
        for decay in (True, False):
            chosen = [p for p in params if (p.dim() >= 2) == decay]
            groups.append(dict(params=chosen, weight_decay=config.weight_decay if decay else 0.0,
                               lr=member.lr, base_lr=member.lr))
    return torch.optim.AdamW(groups, betas=config.betas, foreach=True)


def batch_rows(seed: int, set_index: int, step: int, num_rows: int, count: int) -> torch.Tensor:
    """Rows of training set ``set_index`` that a member with ``seed`` sees at ``step`` (a pure function)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + set_index * 10_007 + step) % (2**63))
    return torch.randint(num_rows, (count,), generator=gen)


def gather_batch(sets: list[RecallSet], rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch from ``rows[i]`` of ``sets[i]`` (sets of one length T); ``rows[i]``: ``[..., b_i]``.

    Returns tokens ``[..., B, T]`` (``B = Σ b_i``), positions ``[..., N]`` (flat indices of the queries
    into ``B · T``) and answers ``[..., N]``; ``N = Σ_i b_i · Q_i`` does not depend on the data.
    """
    tokens, positions, answers, offset = [], [], [], 0
    for s, r in zip(sets, rows):
        r = r.to(s.inputs.device)
        query_positions = s.query_positions[r]  # [..., b, Q]
        tokens.append(s.inputs[r])
        answers.append(s.labels[r].gather(-1, query_positions).flatten(-2))
        row_start = (offset + torch.arange(r.shape[-1], device=r.device))[:, None] * s.seq_len
        positions.append((row_start + query_positions).flatten(-2))
        offset += r.shape[-1]
    return torch.cat(tokens, -2), torch.cat(positions, -1), torch.cat(answers, -1)


@torch.no_grad()
def evaluate(ensemble: Ensemble, test_sets: dict[str, RecallSet], batch_size: int, amp: bool = False) -> list[dict]:
    """Accuracy of every member on every test set (argmax over the vocabulary at each query).

    Returns one dict per member: ``accuracy`` over all queries, ``accuracy_by_set``, ``accuracy_by_level``
    (by the Fenwick level of the answer seen from its query) and ``queries`` counted.
    """
    M = len(ensemble.members)
    device = next(ensemble.parameters()).device
    correct_by_set, count_by_set = {}, {}
    correct_by_level = torch.zeros(M, 64, device=device)
    count_by_level = torch.zeros(64, device=device)
    for name, test in test_sets.items():
        correct = torch.zeros(M, device=device)
        for start in range(0, len(test), batch_size):
            rows = torch.arange(start, min(start + batch_size, len(test)), device=test.inputs.device)
            tokens, positions, answers = gather_batch([test], [rows])
            with _autocast(device, amp):
                logits = ensemble(tokens, positions, shared_inputs=True)  # [M, N, V]
            hit = (logits.argmax(-1) == answers).float()
            correct += hit.sum(1)
            levels = test.select(rows).levels().flatten().to(device)
            correct_by_level.index_add_(1, levels, hit)
            count_by_level.index_add_(0, levels, torch.ones_like(levels, dtype=torch.float))
        correct_by_set[name] = correct
        count_by_set[name] = len(test) * test.num_queries
    total = sum(count_by_set.values())
    overall = sum(correct_by_set.values()) / total
    by_set = {name: (c / count_by_set[name]).tolist() for name, c in correct_by_set.items()}
    used = count_by_level.nonzero().flatten().tolist()
    by_level = (correct_by_level[:, used] / count_by_level[used]).tolist()
    return [
        dict(accuracy=overall[m].item(), accuracy_by_set={n: a[m] for n, a in by_set.items()},
             accuracy_by_level={str(lvl): by_level[m][i] for i, lvl in enumerate(used)}, queries=total)
        for m in range(M)
    ]


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file, then rename: a reader never sees a half-written checkpoint."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _keep_log_until(log_path: Path, step: int) -> None:
    """Drop log lines written after ``step`` (they belong to work the checkpoint does not hold)."""
    if not log_path.exists():
        return
    lines = [line for line in log_path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    log_path.write_text("".join(line + "\n" for line in lines))


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
) -> dict[str, Any]:
    """Train one ensemble (module docstring) and return its record.

    model_config: the architecture every member shares; members: seeds and learning rates; train_sets:
    the recall sets each batch draws from (``batch_size / len(train_sets)`` rows from each); test_sets:
    name -> set, evaluated every ``eval_every`` steps; out_dir: where ``log.jsonl`` and ``checkpoint.pt``
    go (None: nowhere, no resuming); stop_at: stop after this step as if interrupted (the checkpoint
    then lets a later call finish the run); deadline: a ``time.time()`` after which the run stops at the end
    of the step it is in, evaluates there and checkpoints (``complete`` False: a budget ran out). Returns
    ``dict(name, model, parameters, members, config, history, final, seconds)``; ``history`` holds the
    evaluation lines.
    """
    device = torch.device(device)
    if config.batch_size % len(train_sets):
        raise ValueError(f"batch_size={config.batch_size} must split evenly over {len(train_sets)} training sets")
    per_set = config.batch_size // len(train_sets)
    train_sets = [s.to(device) for s in train_sets]
    test_sets = {n: s.to(device) for n, s in test_sets.items()}
    ensemble = Ensemble([build_model(model_config, seed=m.seed) for m in members]).to(device)
    optimizer = make_optimizer(ensemble, members, config)
    out = Path(out_dir) if out_dir is not None else None
    log_path = out / "log.jsonl" if out else None
    ckpt_path = out / "checkpoint.pt" if out else None
    start, history, seconds = 0, [], 0.0
    loss_sum, loss_steps = torch.zeros(len(members), device=device), 0  # training loss since the last evaluation
    if ckpt_path is not None and ckpt_path.exists():
        state = torch.load(ckpt_path, map_location=device, weights_only=False)
        if state["model"] != model_config.to_dict() or state["members"] != [asdict(m) for m in members]:
            raise ValueError(f"{ckpt_path} belongs to another run (different model or members): remove it to start over")
        for model, sd in zip(ensemble.members, state["models"]):
            model.load_state_dict(sd)
        optimizer.load_state_dict(state["optimizer"])
        start, seconds = state["step"], state["seconds"]
        loss_sum, loss_steps = state["loss_sum"], state["loss_steps"]
        _keep_log_until(log_path, start)
        history = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    def checkpoint(step: int) -> None:
        if ckpt_path is not None:
            save_atomic(dict(step=step, seconds=seconds, model=model_config.to_dict(),
                             members=[asdict(m) for m in members], models=[m.state_dict() for m in ensemble.members],
                             optimizer=optimizer.state_dict(), loss_sum=loss_sum, loss_steps=loss_steps), ckpt_path)

    end = config.steps if stop_at is None else min(config.steps, stop_at)
    bar = tqdm(range(start, end), desc=name, disable=not progress, file=sys.stderr, dynamic_ncols=True)
    tick = time.perf_counter()
    step_ends = []  # wall-clock ends of the training steps since the last evaluation (for throughput)
    seconds_per_step = None
    for step in bar:
        factor = lr_factor(step, config.warmup_steps, config.steps)
        for group in optimizer.param_groups:
            group["lr"] = group["base_lr"] * factor
        rows = [
            torch.stack([batch_rows(m.seed, i, step, len(s), per_set) for m in members])  # [M, per_set]
            for i, s in enumerate(train_sets)
        ]
        tokens, positions, answers = gather_batch(train_sets, rows)  # [M, B, T], [M, N], [M, N]
        with _autocast(device, config.amp):
            logits = ensemble(tokens, positions)  # [M, N, V]
        losses = F.cross_entropy(logits.float().flatten(0, 1), answers.flatten(), reduction="none")
        losses = losses.view(len(members), -1).mean(1)
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        for model in ensemble.members:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=True)
        optimizer.step()
        loss_sum += losses.detach()
        loss_steps += 1
        step_ends = step_ends[-20:] + [time.perf_counter()]
        done = step + 1
        out_of_time = deadline is not None and time.time() >= deadline and done < end
        if done % config.eval_every == 0 or done == config.steps or out_of_time:
            seconds += time.perf_counter() - tick
            results = evaluate(ensemble, test_sets, config.eval_batch_size, config.amp)
            train_loss = (loss_sum / loss_steps).tolist()
            lines = [
                dict(run=name, member=i, seed=m.seed, lr=m.lr, step=done, train_loss=train_loss[i],
                     seconds=round(seconds, 3), **results[i])
                for i, m in enumerate(members)
            ]
            history.extend(lines)
            if log_path is not None:
                with log_path.open("a") as f:
                    f.writelines(json.dumps(line) + "\n" for line in lines)
            bar.set_postfix(loss=f"{min(train_loss):.3f}", acc=f"{max(r['accuracy'] for r in results):.3f}")
            loss_sum.zero_()
            loss_steps = 0
            tick = time.perf_counter()
            if len(step_ends) > 1:
                seconds_per_step = (step_ends[-1] - step_ends[0]) / (len(step_ends) - 1)
            step_ends = []
        if config.checkpoint_every and done % config.checkpoint_every == 0 and done < end:
            seconds += time.perf_counter() - tick
            tick = time.perf_counter()
            checkpoint(done)
        if out_of_time:
            end = done
            break
    seconds += time.perf_counter() - tick
    if end > start:
        checkpoint(end)
    final = [line for line in history if line["step"] == history[-1]["step"]] if history else []
    return dict(
        name=name, model=model_config.to_dict(), parameters=count_parameters(ensemble.members[0]),
        members=[asdict(m) for m in members], config=config.to_dict(), history=history, final=final,
        seconds=round(seconds, 3), complete=end == config.steps, steps_done=end,
        seconds_per_step=(step_ends[-1] - step_ends[0]) / (len(step_ends) - 1) if len(step_ends) > 1 else seconds_per_step,
    )
