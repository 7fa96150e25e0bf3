"""Several small models of one architecture run as one: their weights stacked, the forward pass vmapped.

On a GPU this turns ``M`` tiny models — each far too small to keep the device busy — into one launch
sequence, at the cost of one ``torch.stack`` per weight per step. Each member keeps its own parameters,
optimiser state and data order.

The gradient of a stacked weight reaches the members as its ``M`` slices. A slice is handed to the member's
parameter as it is only if it is laid out as the parameter is (contiguous); otherwise autograd copies it, one
small copy per member and weight: about two hundred launches a step for two layers of Gated DeltaNet in a
dozen members, whose weight gradients come out of their matrix products transposed. So the stacked weight's
gradient is made contiguous first (:class:`ContiguousGradient`): one copy per weight for all members, which
``torch.compile`` fuses into the kernel that writes the gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap


class ContiguousGradient(torch.autograd.Function):
    """``y = x``; its backward passes the gradient on contiguous (module docstring). x: any tensor."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


@dataclass(frozen=True)
class Member:
    """One model of an ensemble: its seed (initial weights and data order) and peak learning rate."""

    seed: int
    lr: float


class Ensemble(nn.Module):
    """``M`` models of one architecture run as one: ``forward`` returns ``[M, ...]``.

    models: a list of models with identical structure (tied weights tied alike). The first member's
    module runs every member's weights (:func:`torch.func.functional_call` swaps them in for the call).
    """

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)

    def stacked_state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Every parameter and buffer stacked over the members: ``name -> [M, ...]`` (differentiable; the
        parameters' gradients come back contiguous, :class:`ContiguousGradient`)."""
        params = [dict(m.named_parameters()) for m in self.members]
        buffers = [dict(m.named_buffers()) for m in self.members]
        return (
            {name: ContiguousGradient.apply(torch.stack([p[name] for p in params])) for name in params[0]},
            {name: torch.stack([b[name] for b in buffers]) for name in buffers[0]},
        )

    def forward(self, *args: torch.Tensor, shared_inputs: bool = False) -> torch.Tensor:
        """Run every member. args: the model's inputs with a leading member dimension ``M`` (or without
        it when ``shared_inputs``: every member gets the same inputs). Returns ``[M, ...]``."""
        params, buffers = self.stacked_state()
        template = self.members[0]

        def one(p, b, *inputs):
            return functional_call(template, (p, b), inputs)

        in_dims = (0, 0) + (None if shared_inputs else 0,) * len(args)
        return vmap(one, in_dims=in_dims)(params, buffers, *args)
