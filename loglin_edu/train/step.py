"""One optimiser step of an ensemble, three ways: eager, compiled (``torch.compile``), captured (a CUDA graph).

The step, for every member ``m`` with its own batch (same recall sets, its own random rows):

    loss_m = mean cross-entropy over the batch's query positions        (only queries are supervised)
    Σ_m loss_m  ->  backward;   clip ‖∇θ_m‖ <= grad_clip per member;   AdamW step with lr_m · schedule(step)

Small models make this step a sequence of thousands of small kernels. Eager mode launches each from Python.
``compile`` lets ``torch.compile`` fuse the loss's forward and backward into fewer, larger kernels.
``graphs`` (CUDA only) records the whole step — batch gather, forward, backward, clipping, AdamW — once into a
CUDA graph and replays it: what changes from step to step (the batch's rows, the learning rates) is copied into
fixed buffers first, and the optimiser keeps its step counts and learning rates on the device
(``AdamW(capturable=True)``). The arithmetic is the same in every mode; only the launching differs (the tests
check that the modes agree to float32 rounding).

Each step's rows and learning-rate factor are pure functions of the step (:func:`~loglin_edu.train.batches.batch_rows`,
:func:`~loglin_edu.train.schedule.lr_factor`); they are prepared for a window of steps at a time and moved to the
device in one copy, so no step waits for the host.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data.recall import RecallSet
from .batches import batch_rows, gather_batch
from .ensemble import Ensemble
from .evaluate import autocast
from .schedule import lr_factor, set_learning_rates

if TYPE_CHECKING:
    from .loop import Run, TrainConfig

EAGER_STEPS_BEFORE_CAPTURE = 3  # CUDA graphs: optimiser state, cuBLAS workspaces and compiled kernels exist first


def member_losses(ensemble: Ensemble, train_sets: list[RecallSet], rows: list[torch.Tensor], amp: bool = False,
                  cast_cache: bool = True) -> torch.Tensor:
    """``[M]``: every member's mean cross-entropy at the queries of its batch; ``rows[i]``: ``[M, b_i]`` rows of
    ``train_sets[i]`` for each member."""
    tokens, positions, answers = gather_batch(train_sets, rows)  # [M, B, T], [M, N], [M, N]
    with autocast(tokens.device, amp, cast_cache):
        logits = ensemble(tokens, positions)  # [M, N, V]
    losses = F.cross_entropy(logits.float().flatten(0, 1), answers.flatten(), reduction="none")
    return losses.view(len(ensemble.members), -1).mean(1)


def clip_member_gradients(models: list[nn.Module], max_norm: float) -> torch.Tensor:
    """Clip every member's gradient to norm ``max_norm``, as ``clip_grad_norm_`` per member, in one pass:

        n_m = ‖(‖∇θ_{m,1}‖, ‖∇θ_{m,2}‖, ...)‖,   ∇θ_m <- ∇θ_m · min(1, max_norm / (n_m + 1e-6))

    models: members of one structure (each has the same parameters with gradients). The norms of all members'
    gradients are taken by one ``foreach`` call instead of one per member. Returns ``[M]``: the norms before."""
    grads = [[p.grad for p in model.parameters() if p.grad is not None] for model in models]
    norms = torch.stack(torch._foreach_norm([g for member in grads for g in member])).view(len(models), -1)
    total = torch.linalg.vector_norm(norms, dim=1)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for member, factor in zip(grads, scale.unbind()):
        torch._foreach_mul_(member, factor)
    return total


@contextmanager
def tf32_matmuls(enabled: bool):
    """Inside, CUDA float32 matrix products run in TF32 when ``enabled`` (``torch.backends.cuda.matmul.allow_tf32``);
    the setting before is restored on leaving. A captured step keeps the precision it was recorded with."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled or before
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def step_mode(config: "TrainConfig") -> str:
    """``"eager"``, ``"compiled"``, ``"graphs"`` or ``"compiled+graphs"``."""
    return {(False, False): "eager", (True, False): "compiled", (False, True): "graphs",
            (True, True): "compiled+graphs"}[(config.compile, config.graphs)]


class TrainingStep:
    """Calling it makes one optimiser step of ``run`` (module docstring) in the mode ``config`` asks for.

    run: a :class:`~loglin_edu.train.loop.Run` (its optimiser made with ``capturable=config.graphs``);
    train_sets: the sets on the run's device; per_set: rows of each set per member and step; window: steps whose
    rows and learning rates are prepared at once. ``mode`` says how steps run; with graphs, the first
    :data:`EAGER_STEPS_BEFORE_CAPTURE` steps run eagerly on a side stream, then the step is captured, and
    ``capture_error`` holds the reason if capturing failed (steps then stay eager); ``compile_error`` the reason
    if compiling failed at the first step (the loss then runs uncompiled, and ``mode`` says so).
    """

    def __init__(self, run: "Run", train_sets: list[RecallSet], per_set: int, config: "TrainConfig",
                 window: int = 32) -> None:
        self.run, self.train_sets, self.per_set, self.config, self.window = run, train_sets, per_set, config, window
        self.device = run.loss_sum.device
        self.mode = step_mode(config)
        if config.graphs and self.device.type != "cuda":
            raise ValueError(f"graphs=True captures the step in a CUDA graph: it needs a CUDA device, "
                             f"got {self.device}")
        if config.graphs and not all(g.get("capturable") for g in run.optimizer.param_groups):
            raise ValueError("graphs=True needs an optimiser made with capturable=True "
                             "(make_optimizer(capturable=...))")
        self.losses = torch.compile(self.uncompiled_losses, dynamic=False) if config.compile else self.uncompiled_losses
        self.capture_error: str | None = None
        self.compile_error: str | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0
        self.prepared: dict[str, Any] = {}
        M = len(run.members)
        self.rows = [torch.zeros(M, per_set, dtype=torch.long, device=self.device) for _ in train_sets]
        if config.graphs:  # every group reads its learning rate from one device buffer
            groups = run.optimizer.param_groups
            self.base_lrs = torch.tensor([g["base_lr"] for g in groups], dtype=torch.float64)
            self.lrs = torch.zeros(len(groups), dtype=torch.float32, device=self.device)
            for i, group in enumerate(groups):
                group["lr"] = self.lrs[i]
            self.side_stream = torch.cuda.Stream(self.device)

    def uncompiled_losses(self, rows: list[torch.Tensor]) -> torch.Tensor:
        return member_losses(self.run.ensemble, self.train_sets, rows, self.config.amp,
                             cast_cache=not self.config.graphs)

    # ------------------------------------------------------------------ the inputs of a step

    def prepare(self, step: int) -> None:
        """Rows and learning-rate factors of steps ``step .. step + window - 1`` (not past the end), on the device."""
        steps = range(step, min(step + self.window, max(self.config.steps, step + 1)))
        rows = [torch.stack([torch.stack([batch_rows(m.seed, i, s, len(ts), self.per_set) for m in self.run.members])
                             for s in steps]) for i, ts in enumerate(self.train_sets)]  # per set: [W, M, b]
        factors = torch.tensor([lr_factor(s, self.config.warmup_steps, self.config.steps) for s in steps],
                               dtype=torch.float64)
        pin = self.device.type == "cuda"
        self.prepared = dict(first=step, total=self.config.steps, factors=factors,
                             rows=[(r.pin_memory() if pin else r).to(self.device, non_blocking=True) for r in rows])
        if self.config.graphs:
            lrs = (factors[:, None] * self.base_lrs[None]).float()  # [W, groups]
            self.prepared["lrs"] = (lrs.pin_memory()).to(self.device, non_blocking=True)

    def load_inputs(self, step: int) -> None:
        """Copy step ``step``'s rows (and, with graphs, learning rates) into the step's fixed buffers."""
        p = self.prepared
        if not p or not p["first"] <= step < p["first"] + len(p["factors"]) or p["total"] != self.config.steps:
            self.prepare(step)
            p = self.prepared
        j = step - p["first"]
        for buffer, rows in zip(self.rows, p["rows"]):
            buffer.copy_(rows[j], non_blocking=True)
        if self.config.graphs:
            self.lrs.copy_(p["lrs"][j], non_blocking=True)
        else:
            set_learning_rates(self.run.optimizer, float(p["factors"][j]))

    # ------------------------------------------------------------------ the step itself

    def body(self) -> None:
        """Forward, backward, clipping, AdamW and the running loss: the part a CUDA graph records."""
        losses = self.losses(self.rows)
        losses.sum().backward()
        clip_member_gradients(list(self.run.ensemble.members), self.config.grad_clip)
        self.run.optimizer.step()
        self.run.loss_sum += losses.detach()

    def eager(self) -> None:
        self.run.optimizer.zero_grad(set_to_none=True)
        try:
            with tf32_matmuls(self.config.tf32):
                self.body()
        except Exception as error:  # noqa: BLE001 - compilation failed: the run goes on uncompiled and says why
            if not self.config.compile or self.compile_error is not None or self.eager_steps > 0:
                raise
            self.compile_error = f"{type(error).__name__}: {error}"
            print(f"torch.compile failed, the loss runs uncompiled: {self.compile_error}", file=sys.stderr, flush=True)
            self.losses, self.mode = self.uncompiled_losses, self.mode.replace("compiled+", "").replace("compiled", "eager")
            self.run.optimizer.zero_grad(set_to_none=True)
            with tf32_matmuls(self.config.tf32):
                self.body()
        self.eager_steps += 1

    def capture(self) -> None:
        """Record :meth:`body` into a CUDA graph (gradients are then written, not accumulated, at every replay).

        The memory the eager steps left cached goes back to the device first: the graph keeps its own pool, and
        jobs that share one GPU should not hold both."""
        self.run.optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"), tf32_matmuls(self.config.tf32):
                self.body()
        except Exception as error:  # noqa: BLE001 - the run goes on eagerly and says why
            self.capture_error = f"{type(error).__name__}: {error}"
            print(f"CUDA graph capture failed, steps stay eager: {self.capture_error}", file=sys.stderr, flush=True)
            return
        self.graph = graph

    def __call__(self) -> None:
        run = self.run
        if not self.config.graphs:
            self.load_inputs(run.step)
            self.eager()
        elif self.graph is None and self.capture_error is None and self.eager_steps >= EAGER_STEPS_BEFORE_CAPTURE:
            self.load_inputs(run.step)
            self.capture()  # records only: the replay below makes this step
            if self.graph is not None:
                self.graph.replay()
            else:
                self.eager()
        elif self.graph is not None:
            self.load_inputs(run.step)
            self.graph.replay()
        else:  # before the capture, or after it failed: eagerly, on a side stream as capturing asks
            self.side_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side_stream):
                self.load_inputs(run.step)
                self.eager()
            torch.cuda.current_stream(self.device).wait_stream(self.side_stream)
        run.step += 1
        run.loss_steps += 1
