"""What the kernel tests share: gradients of a projection, NaN guard bands, and the GPU error records."""

import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def grads_of(fn, args):
    """Output and the gradients of a fixed random projection of it, for every tensor argument (None skipped)."""
    args = [None if a is None else a.detach().clone().requires_grad_(True) for a in args]
    out = fn(*args)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    return out.detach(), torch.autograd.grad((out * weights).sum(), [a for a in args if a is not None])


# --- guard bands: a read outside a tensor brings NaN in, a write outside overwrites a NaN of the pad ---------


def padded_view(shape, pad=3, fill=float("nan")):
    """A ``shape`` view into a buffer padded by ``pad`` on every side of every dimension, filled with ``fill``."""
    buffer = torch.full([s + 2 * pad for s in shape], fill, device=DEVICE)
    return buffer, buffer[tuple(slice(pad, pad + s) for s in shape)]


def padded_copy(x, pad=3):
    """``(buffer, view)``: ``x`` copied into a view of a NaN-padded buffer (:func:`padded_view`)."""
    buffer, view = padded_view(x.shape, pad)
    view.copy_(x)
    return buffer, view


def guard_intact(buffer, pad=3):
    """Whether every element of the pad around the inner view is still NaN."""
    inner = torch.zeros_like(buffer, dtype=torch.bool)
    inner[tuple(slice(pad, s - pad) for s in buffer.shape)] = True
    return bool(torch.isnan(buffer[~inner]).all())


# --- the GPU accuracy cases ------------------------------------------------------------------------------


def case_id(case) -> str:
    """``T-KxV-shared|heads-dtype-precision`` of a ``((B, T, H, Hk, K, V), dtype, precision)`` case."""
    shape, dtype, precision = case.values if hasattr(case, "values") else case
    return f"{shape[1]}-{shape[4]}x{shape[5]}-{'shared' if shape[3] == 1 else 'heads'}-{str(dtype)[6:]}-{precision or 'default'}"


def assert_errors_within(result: dict, bound: float, what: str):
    """Every relative error of an accuracy ``result`` (``result["errors"]``) at most ``bound``."""
    bad = {name: e for name, e in result["errors"].items() if not e <= bound}
    assert not bad, f"{what}: relative errors above {bound}: {bad}"


def write_recorded_errors(recorded: list, reference: str, bounds: dict) -> None:
    """With ``LOGLIN_RECORD_ERRORS=path.json``, the ``recorded`` accuracy results written there with their
    provenance, the ``reference`` they were measured against and the ``bounds`` by dtype."""
    path = os.environ.get("LOGLIN_RECORD_ERRORS")
    if path and recorded:
        import sys

        from loglin_edu.provenance import provenance, write_json

        write_json(path, {**provenance("LOGLIN_RECORD_ERRORS=... python -m pytest " + " ".join(sys.argv[1:]), "cuda"),
                          "reference": reference,
                          "bounds": {str(k).replace("torch.", ""): v for k, v in bounds.items()}, "cases": recorded})


def apply_calls(function, run, attribute="apply") -> int:
    """How many times ``run()`` calls ``function.apply`` (a ``torch.autograd.Function``), or another callable
    ``attribute`` of ``function`` (a module's operator, say)."""
    calls = []
    original = getattr(function, attribute)
    setattr(function, attribute, lambda *a: calls.append(1) or original(*a))
    try:
        run()
    finally:
        setattr(function, attribute, original)
    return len(calls)


def zero_fill_sizes(run) -> list[int]:
    """The sizes (numbers of elements) of the tensors ``run()`` zero-fills: ``zeros``, ``zeros_like``, ``fill_``
    and ``zero_`` as dispatched by PyTorch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    sizes = []
    fills = (torch.ops.aten.zeros.default, torch.ops.aten.zeros_like.default, torch.ops.aten.fill_.Scalar,
             torch.ops.aten.zero_.default)

    class ZeroFills(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in fills:
                sizes.append(out.numel())
            return out

    with ZeroFills():
        run()
    return sizes


def peak_new_bytes(run) -> int:
    """The most bytes of storage that ops under ``run()`` create and hold alive at once, as dispatched by PyTorch.

    A storage counts from the op that creates it until the last tensor (or view) of it dispatched under ``run()``
    is freed; results that alias an op's input (views, in-place ops) add nothing new. What ``run()`` returns is
    dropped at its end, so it counts until then."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    live = {}  # storage address -> [tensors alive, bytes]
    total = {"now": 0, "peak": 0}

    def release(address):
        entry = live[address]
        entry[0] -= 1
        if entry[0] == 0:
            total["now"] -= entry[1]
            del live[address]

    class Storages(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if not isinstance(t, torch.Tensor):
                    continue
                storage = t.untyped_storage()
                address = storage.data_ptr()
                if address not in live:
                    if address in inputs:
                        continue
                    live[address] = [0, storage.nbytes()]
                    total["now"] += storage.nbytes()
                    total["peak"] = max(total["peak"], total["now"])
                live[address][0] += 1
                weakref.finalize(t, release, address)
            return out

    with Storages():
        run()
    return total["peak"]
