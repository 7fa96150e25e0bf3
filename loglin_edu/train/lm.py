"""Training one language model on a token stream, on one process or data-parallel over several.

One optimiser step, for a global batch of ``B`` windows of ``context + 1`` tokens (:func:`training_batch`),
split over ``W`` ranks and ``A`` accumulation steps of ``b = B / (W · A)`` windows each:

    loss_{r,a} = mean cross-entropy of micro-batch (r, a)            backward(loss_{r,a} / A) on rank r
    ∇ = mean over ranks of Σ_a ∇loss_{r,a} / A   = ∇ (mean loss of the global batch)   (DDP averages)
    clip ‖∇‖ <= grad_clip;   AdamW step with lr · schedule(step)     (:func:`~loglin_edu.train.lr_factor`)

so the run computes the same function of the data for any ``W`` and ``A``: ``torchrun --nproc_per_node N``
trains the same model as one process, up to floating-point round-off. Weights are seeded by ``seed``, batches
are pure functions of ``(seed, step)``; bf16 autocast on CUDA (``amp``), optional ``torch.compile``.

Every ``eval_every`` steps (and at the end) the validation loss is measured and one JSON line is appended to
``log.jsonl``; checkpoints (``checkpoint.pt``: weights, optimiser, step, and the tokenizer's fingerprint)
are written atomically by rank 0 at every evaluation. A run started again resumes from its checkpoint — also
on another number of ranks — and a ``deadline`` (wall clock) stops it cleanly after the step it is in.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..data.token_stream import TokenStream, check_fits, training_batch
from ..layers.model import ModelConfig, build_model, count_parameters
from . import distributed
from .checkpoint import append_log, keep_log_until, load_checkpoint, save_atomic
from .lm_measures import autocast, validation_loss
from .schedule import lr_factor, make_optimizer, set_learning_rates


@dataclass
class LMTrainConfig:
    """steps: optimiser steps; batch_size: windows per step over all ranks; micro_batch_size: windows per
    forward pass on one rank (None: ``batch_size / world size``, no accumulation); context: tokens per window;
    lr: peak learning rate; warmup_steps: linear warm-up before the cosine decay to 0; eval_every: steps between
    evaluations and checkpoints; eval_windows: validation windows (fixed, spread over the stream); amp: bf16
    autocast on CUDA; compile: ``torch.compile`` the model."""

    steps: int = 1000
    batch_size: int = 32
    micro_batch_size: int | None = None
    context: int = 512
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_windows: int = 32
    eval_batch_size: int = 8
    amp: bool = True
    compile: bool = False

    def accumulation(self, world_size: int) -> int:
        """Micro-steps per optimiser step on each of ``world_size`` ranks."""
        per_rank, rest = divmod(self.batch_size, world_size)
        micro = self.micro_batch_size or per_rank
        if rest or per_rank % micro:
            raise ValueError(f"batch_size={self.batch_size} must split into world_size={world_size} ranks × "
                             f"micro-batches of micro_batch_size={micro}")
        return per_rank // micro

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["betas"] = list(d["betas"])
        return d


def check_tokenizer(saved: dict, fingerprint: str, vocab_size: int, path: Path) -> None:
    """A checkpoint made with another tokenizer cannot continue: its ids mean other text."""
    if saved["tokenizer"] != fingerprint:
        raise ValueError(
            f"{path} was trained with tokenizer {saved['tokenizer']} (vocabulary {saved['vocab_size']}), but this "
            f"run's tokens come from tokenizer {fingerprint} (vocabulary {vocab_size}): train from the data folder "
            f"it was made with (its tokenizer.json), or give this run another output folder to start a new model"
        )


def train_lm(
    model_config: ModelConfig,
    config: LMTrainConfig,
    train_stream: TokenStream,
    validation_stream: TokenStream,
    *,
    seed: int = 0,
    out_dir: str | Path | None = None,
    name: str = "lm",
    progress: bool = True,
    deadline: float | None = None,
    stop_at: int | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Train one model (module docstring) on this process's share of every batch; returns the model (unwrapped,
    on this rank's device) and its record ``dict(name, seed, model, parameters, config, history, final,
    steps_done, complete, seconds, world_size)``.

    out_dir: where ``log.jsonl`` and ``checkpoint.pt`` go (None: nowhere, no resuming); deadline: a
    ``time.time()`` after which the run stops after its current step, evaluates and checkpoints; stop_at: stop
    after this step as if interrupted. ``model_config.vocab_size`` must equal the streams' vocabulary.
    """
    world = distributed.current()
    device = world.device
    fingerprint, vocab = train_stream.meta["tokenizer"], train_stream.vocab_size
    if model_config.vocab_size != vocab or validation_stream.meta["tokenizer"] != fingerprint:
        raise ValueError(f"the model's vocab_size={model_config.vocab_size} and both streams must share one "
                         f"tokenizer (streams: vocabulary {vocab}, {validation_stream.vocab_size})")
    if model_config.max_len < config.context:
        raise ValueError(f"context={config.context} is longer than the model's max_len={model_config.max_len}")
    check_fits(train_stream, config.context + 1, "training stream")
    check_fits(validation_stream, config.context + 1, "validation stream")
    micro_steps = config.accumulation(world.size)

    model = build_model(model_config, seed=seed).to(device)
    optimizer = make_optimizer([model], [config.lr], config.weight_decay, config.betas)
    out = Path(out_dir) if out_dir is not None else None
    log_path = out / "log.jsonl" if out else None
    ckpt_path = out / "checkpoint.pt" if out else None
    start, seconds, history = 0, 0.0, []
    loss_sum, loss_steps = torch.zeros((), device=device), 0  # training loss since the last evaluation
    state = load_checkpoint(ckpt_path, device) if ckpt_path is not None else None
    if state is not None:
        check_tokenizer(state, fingerprint, vocab, ckpt_path)
        if state["model"] != model_config.to_dict() or state["config"] != config.to_dict() or state["seed"] != seed:
            raise ValueError(f"{ckpt_path} belongs to another run (model, training settings or seed differ): "
                             f"remove it, or give this run another output folder")
        model.load_state_dict(state["model_state"])
        optimizer.load_state_dict(state["optimizer"])
        start, seconds = state["step"], state["seconds"]
        # the checkpoint holds the global sum S; every rank starting from S gives (W·S + Σ_r new_r) / W = S + new
        loss_sum, loss_steps = torch.tensor(state["loss_sum"], device=device), state["loss_steps"]
        if world.is_main:
            history = keep_log_until(log_path, start)
        distributed.barrier()
        if not world.is_main and log_path.exists():
            history = [json.loads(line) for line in log_path.read_text().splitlines() if line]
    if out is not None and world.is_main:
        out.mkdir(parents=True, exist_ok=True)

    runner, ddp = wrap(model, world, config.compile)

    def global_loss_sum() -> float:
        return distributed.all_sum(loss_sum.clone()).item() / world.size

    def checkpoint(step: int) -> None:
        total = global_loss_sum()
        if ckpt_path is not None and world.is_main:
            save_atomic(dict(step=step, seconds=seconds, seed=seed, model=model_config.to_dict(),
                             config=config.to_dict(), tokenizer=fingerprint, vocab_size=vocab,
                             model_state=model.state_dict(), optimizer=optimizer.state_dict(), loss_sum=total,
                             loss_steps=loss_steps), ckpt_path)
        distributed.barrier()

    end = config.steps if stop_at is None else min(config.steps, stop_at)
    bar = tqdm(range(start, end), desc=name, disable=not (progress and world.is_main), file=sys.stderr,
               dynamic_ncols=True)
    tick = time.perf_counter()
    tokens_per_step = config.batch_size * config.context
    model.train()
    done = start
    for step in bar:
        factor = lr_factor(step, config.warmup_steps, config.steps)
        step_loss = optimizer_step(runner, ddp, model, optimizer, train_stream, config, seed=seed, step=step,
                                   world=world, micro_steps=micro_steps, lr_scale=factor)
        loss_sum += step_loss  # this rank's; averaged over the ranks at the next evaluation
        loss_steps += 1
        done = step + 1
        if progress and world.is_main and done % 10 == 0:
            bar.set_postfix(loss=f"{loss_sum.item() / loss_steps:.3f}", refresh=False)
        out_of_time = deadline is not None and distributed.any_rank(time.time() >= deadline, device) and done < end
        if done == end and done < config.steps and not out_of_time:  # stop_at: checkpoint as if interrupted
            seconds += time.perf_counter() - tick
            checkpoint(done)
            break
        if done % config.eval_every == 0 or done == config.steps or out_of_time:
            seconds += time.perf_counter() - tick
            val = validation_loss(model, validation_stream, config.context, config.eval_windows,
                                  config.eval_batch_size, amp=config.amp)
            line = dict(run=name, seed=seed, step=done, tokens=done * tokens_per_step, lr=config.lr * factor,
                        train_loss=global_loss_sum() / loss_steps, val_loss=val["loss"],
                        val_perplexity=val["perplexity"], seconds=round(seconds, 3), world_size=world.size)
            history.append(line)
            if world.is_main:
                append_log(log_path, [line])
            loss_sum, loss_steps = torch.zeros((), device=device), 0
            checkpoint(done)
            tick = time.perf_counter()
            if out_of_time:
                break
    bar.close()
    record = dict(name=name, seed=seed, model=model_config.to_dict(), parameters=count_parameters(model),
                  config=config.to_dict(), tokenizer=fingerprint, history=history,
                  final=history[-1] if history else None, steps_done=done, complete=done >= config.steps,
                  seconds=round(seconds, 3), world_size=world.size)
    return model, record


def wrap(model: nn.Module, world: distributed.World,
         compile_model: bool) -> tuple[nn.Module, DistributedDataParallel | None]:
    """What runs the forward pass — the model, or its DDP wrapper when there are several ranks, compiled when
    asked — and the DDP wrapper (None on one rank)."""
    ddp = None
    if world.parallel:
        device_ids = [world.device.index] if world.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids)
    runner = ddp if ddp is not None else model
    return (torch.compile(runner) if compile_model else runner), ddp


def optimizer_step(runner: nn.Module, ddp: DistributedDataParallel | None, model: nn.Module,
                   optimizer: torch.optim.Optimizer, stream: TokenStream, config: LMTrainConfig, *, seed: int,
                   step: int, world: distributed.World, micro_steps: int, lr_scale: float) -> torch.Tensor:
    """One optimiser step on this rank's share of the global batch of ``step`` (module docstring); returns this
    rank's mean loss (detached). runner: what runs the forward pass (the model, its DDP wrapper, or either
    compiled); ddp: the DDP wrapper or None; lr_scale: the schedule's factor."""
    set_learning_rates(optimizer, lr_scale)
    optimizer.zero_grad(set_to_none=True)
    step_loss = torch.zeros((), device=world.device)
    for micro in range(micro_steps):
        inputs, targets = training_batch(stream, seed=seed, step=step, batch_size=config.batch_size,
                                         context=config.context, rank=world.rank, world_size=world.size,
                                         micro_step=micro, micro_steps=micro_steps)
        inputs, targets = inputs.to(world.device, non_blocking=True), targets.to(world.device, non_blocking=True)
        last = micro == micro_steps - 1
        with ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext():  # reduce once per step
            with autocast(world.device, config.amp):
                logits = runner(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) / micro_steps
            loss.backward()
        step_loss += loss.detach()
    nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=True)
    optimizer.step()
    return step_loss


def measure_throughput(model_config: ModelConfig, config: LMTrainConfig, stream: TokenStream, *, steps: int = 20,
                       warmup: int = 5, parallel: bool = True, seed: int = 0) -> dict[str, Any]:
    """Training tokens per second of ``model_config`` (optimiser steps of ``config``, timed after ``warmup``
    steps). parallel: DDP over every rank of the process group (``config.batch_size`` is then the global
    batch); False: this process alone, as a world of one. Returns ``dict(tokens_per_second,
    seconds_per_step, world_size, batch_size, context)``."""
    group = distributed.current()
    world = group if parallel else distributed.World(0, 1, group.device)
    micro_steps = config.accumulation(world.size)
    model = build_model(model_config, seed=seed).to(world.device)
    optimizer = make_optimizer([model], [config.lr], config.weight_decay, config.betas)
    runner, ddp = wrap(model, world, config.compile)

    def sync() -> None:
        if world.device.type == "cuda":
            torch.cuda.synchronize(world.device)

    for step in range(warmup + steps):
        if step == warmup:
            sync()
            if world.parallel:
                distributed.barrier()
            tick = time.perf_counter()
        optimizer_step(runner, ddp, model, optimizer, stream, config, seed=seed, step=step, world=world,
                       micro_steps=micro_steps, lr_scale=1.0)
    sync()
    elapsed = time.perf_counter() - tick
    return dict(tokens_per_second=steps * config.batch_size * config.context / elapsed,
                seconds_per_step=elapsed / steps, world_size=world.size, batch_size=config.batch_size,
                context=config.context)
