"""Data parallelism for language-model training: which rank this process is, and the few collectives used.

``torchrun --nproc_per_node N ...`` starts ``N`` processes with ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` in
their environment; :func:`setup` joins them into one process group (NCCL on CUDA, gloo on the CPU) and
gives each its device. A plain ``python -m ...`` is a world of one, and every collective is the identity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's place: ``rank`` of ``size`` processes, on ``device``."""

    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.size > 1


_CHOSEN: list[World] = []  # the world :func:`setup` chose for this process


def setup(device: str | None = None) -> World:
    """Join the process group ``torchrun`` describes in the environment (if any) and pick this rank's device;
    :func:`current` returns the same world from then on.

    device: ``"cuda"``, ``"cpu"`` or None (CUDA when available). Under torchrun on CUDA, rank ``r`` of a node
    takes ``cuda:LOCAL_RANK``.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if size == 1 and not dist.is_initialized():
        return choose(World(0, 1, torch.device(kind)))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if kind.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return choose(World(dist.get_rank(), dist.get_world_size(), dev))


def choose(world: World) -> World:
    """Record ``world`` as this process's (what :func:`current` returns) and return it."""
    _CHOSEN[:] = [world]
    return world


def current() -> World:
    """The world :func:`setup` chose; without it, the process group's (a world of one on the CPU when no group
    exists)."""
    if _CHOSEN and _CHOSEN[0].parallel == (dist.is_initialized() and dist.get_world_size() > 1):
        return _CHOSEN[0]
    if not dist.is_initialized():
        return World()
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return World(dist.get_rank(), dist.get_world_size(), dev)


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the ranks (in place; ``x`` itself in a world of one)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def any_rank(flag: bool, device: torch.device) -> bool:
    """True when ``flag`` is true on any rank (every rank gets the same answer)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def teardown() -> None:
    """Leave the process group (if any) and forget the chosen world."""
    _CHOSEN.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
