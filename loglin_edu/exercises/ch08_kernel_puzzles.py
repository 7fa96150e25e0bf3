"""Chapter 8's kernel puzzles: seven small Triton kernels, the pieces of the log-linear Mamba-2 kernels.

Each puzzle gives a kernel's signature and what it must store; the reader writes it with ``@triton.jit`` and
:func:`loglin_edu.exercises.check` launches it on random inputs (one chunk of 16 or 32 tokens, heads of 16 or
32 columns), compares what it stored with a float64 reference written in PyTorch, and names the mistake when
the result matches a typical wrong kernel. On a machine without CUDA the kernels run under Triton's interpreter:
checking a puzzle sets ``TRITON_INTERPRET=1`` if no kernel has been defined yet (set it yourself before you
define yours: ``@triton.jit`` reads it when it decorates).

Importing this module needs no triton: the solutions and the typical mistakes live in
:mod:`.ch08_kernel_solutions`, imported on first use through :class:`LazyKernel`.

1. ``kernels.decay_matrix``   E[i, j] = exp(gc_i - gc_j), j <= i
2. ``kernels.level_matrix``   level(i, j) = bit_length(i XOR j) inside a chunk
3. ``kernels.intra_chunk``    o = ((Q Kᵀ) ⊙ E ⊙ Λ) V for one chunk
4. ``kernels.leaf_state``     S = K̃ᵀ V, the chunk's state decayed to its last token
5. ``kernels.tree_slots``     the Fenwick tree of chunk states, built like a binary counter
6. ``kernels.level_reads``    each chunk's output from the nodes it reads
7. ``kernels.node_gradient``  dS_e, summed over the chunks that read node e
"""

from __future__ import annotations

import inspect
import os
import sys

import torch

from .. import fenwick
from .checking import Case, Exercise, Mismatch

RTOL = 1e-2  # a kernel's tl.dot may run in tf32 on a GPU; every mistake below is off by far more
ATOL = 1e-5


def device() -> str:
    """Where the puzzles run: the GPU when there is one, else the CPU under Triton's interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"


KERNEL_MODULES = ("loglin_edu.kernels.tiles", "loglin_edu.exercises.ch08_kernel_solutions")


def prepare_triton() -> None:
    """On a CPU-only machine, ``TRITON_INTERPRET=1`` before any kernel is defined (``@triton.jit`` reads it when
    it decorates). Refuses when the package's kernels were already defined without it."""
    if device() == "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return
    if any(name in sys.modules for name in KERNEL_MODULES):
        raise RuntimeError("on a CPU the kernels run under Triton's interpreter, but they were defined without it: "
                           "set os.environ['TRITON_INTERPRET'] = '1' first thing and restart the kernel")
    os.environ["TRITON_INTERPRET"] = "1"


class LazyKernel:
    """A kernel of :mod:`.ch08_kernel_solutions` by name, imported when first launched (``kernel[grid](...)``)."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    @property
    def kernel(self):
        prepare_triton()
        from . import ch08_kernel_solutions

        return getattr(ch08_kernel_solutions, self.__name__)

    def __getitem__(self, grid):
        return self.kernel[grid]

    @property
    def source(self) -> str:
        """The kernel's source code (``@triton.jit`` included)."""
        return inspect.getsource(self.kernel.fn)

    def __repr__(self) -> str:
        return f"LazyKernel({self.__name__!r})"


def launch(fn, grid: tuple, *args, **constants) -> None:
    """``fn[grid](*args, **constants)``; a kernel left as ``raise NotImplementedError`` reads as not attempted,
    and a function without ``@triton.jit`` is named as such."""
    if not hasattr(fn, "__getitem__"):
        fn(*args, **constants)  # a plain function: `raise NotImplementedError` still reads as "not attempted"
        raise Mismatch("a puzzle's answer is a Triton kernel: decorate it with @triton.jit")
    prepare_triton()
    try:
        fn[grid](*args, **constants)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - the interpreter wraps what the kernel raised
        if "NotImplementedError" in f"{type(error.__cause__).__name__} {error}":
            raise NotImplementedError from None
        raise


def output(*shape: int, dtype=torch.float32) -> torch.Tensor:
    """An output buffer on the puzzles' device, filled with a value no kernel should leave there."""
    fill = -(2**30) if dtype == torch.int32 else float("nan")
    return torch.full(shape, fill, dtype=dtype, device=device())


def stored(out: torch.Tensor, name: str) -> torch.Tensor:
    """``out`` back on the CPU in float64 (int64 for integers), after checking the kernel stored into it."""
    untouched = out.isnan() if out.is_floating_point() else out == -(2**30)
    if untouched.all():
        raise Mismatch(f"your kernel stored nothing into {name} (a tl.store is missing, or its offsets miss the buffer)")
    return out.cpu().double() if out.is_floating_point() else out.cpu().long()


def on_device(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.to(device=device(), dtype=torch.float32).contiguous() for x in xs]


def cumulative_decay(gen: torch.Generator, n: int, scale: float = 0.3) -> torch.Tensor:
    """``Σ_{r <= t} g_r`` for ``n`` log decays ``g`` in ``(-scale, 0]``, float64."""
    return (-scale * torch.rand(n, generator=gen, dtype=torch.float64)).cumsum(0)


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def levels(C: int) -> torch.Tensor:
    """``bit_length(i ^ j)`` for ``i, j < C``: ``[C, C]`` int64."""
    i = torch.arange(C)
    return fenwick.bit_length(i[:, None] ^ i[None, :])


def level_scale_matrix(lam: torch.Tensor) -> torch.Tensor:
    """``Λ[i, j] = λ[i, level(i, j)]`` for ``j <= i``, 0 above. lam: ``[C, L]`` -> ``[C, C]``."""
    C = lam.shape[0]
    return torch.gather(lam, 1, levels(C)).tril()


def decay_matrix(gc: torch.Tensor) -> torch.Tensor:
    """``E[i, j] = exp(gc_i - gc_j)`` for ``j <= i``, 0 above. gc: ``[C]`` -> ``[C, C]``."""
    return (gc[:, None] - gc[None, :]).tril().exp().tril()


def power_of_two_above(n: int) -> int:
    return 1 << (n - 1).bit_length()


# ---------------------------------------------------------------- 1. the decay matrix


def _decay_cases(rng):
    for C in (4, 16, 32):
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        yield Case((cumulative_decay(gen, C),), f"C={C}")


def _decay_driver(fn, gc):
    C = gc.shape[0]
    out = output(C, C)
    launch(fn, (1,), *on_device(gc), out, C=C)
    return stored(out, "out_ptr")


DECAY_MATRIX = Exercise(
    name="kernels.decay_matrix",
    chapter=8,
    signature="decay_matrix_kernel(gc_ptr, out_ptr, C: tl.constexpr)",
    task="One program. `gc_ptr` points to `C` floats, the chunk's cumulative log decay `gc[i] = g_0 + ... + g_i`. "
         "Store into `out_ptr` (a `[C, C]` row-major matrix) the chunk's block of the decay mask: "
         "`out[i, j] = exp(gc[i] - gc[j])` for `j <= i` and 0 above the diagonal.",
    solution=LazyKernel("decay_matrix_kernel"),
    cases=_decay_cases,
    driver=_decay_driver,
    reference=decay_matrix,
    mistakes=(
        (LazyKernel("decay_matrix_transposed"), "row i is the query: the decay from key j to query i is "
                                                "exp(gc[i] - gc[j]), which is <= 1 below the diagonal."),
        (LazyKernel("decay_matrix_unmasked"), "keys after the query must not count: zero the entries above the "
                                              "diagonal with tl.where(i[:, None] >= i[None, :], ..., 0.0)."),
        (LazyKernel("decay_matrix_strict"), "the diagonal is the query's own key, decayed by nothing: "
                                            "out[i, i] = 1, so the mask is j <= i, not j < i."),
    ),
    rtol=1e-6,
    atol=1e-7,
)


# ---------------------------------------------------------------- 2. the level matrix


def _level_cases(rng):
    for C in (2, 8, 32):
        yield Case((C,), f"C={C}")


def _level_driver(fn, C):
    out = output(C, C, dtype=torch.int32)
    launch(fn, (1,), out, C=C, C_LOG=C.bit_length() - 1)
    return stored(out, "out_ptr")


LEVEL_MATRIX = Exercise(
    name="kernels.level_matrix",
    chapter=8,
    signature="level_matrix_kernel(out_ptr, C: tl.constexpr, C_LOG: tl.constexpr)",
    task="One program, `C = 2**C_LOG`. Store into `out_ptr` (a `[C, C]` row-major int32 matrix) the Fenwick level "
         "of every pair of in-chunk offsets, `out[i, j] = bit_length(i XOR j)` (both triangles; 0 on the "
         "diagonal). Triton has no bit_length: count, for each bit, whether `x >> bit` is still non-zero "
         "(`tl.static_range(C_LOG)` unrolls that loop).",
    solution=LazyKernel("level_matrix_kernel"),
    cases=_level_cases,
    driver=_level_driver,
    reference=levels,
    mistakes=(
        (LazyKernel("level_matrix_distance"), "use i XOR j, not the distance |i - j|: buckets are aligned to "
                                              "powers of two, so offsets at the same distance can be at different levels."),
        (LazyKernel("level_matrix_zero_based"), "bit_length counts every bit up to the highest set one: "
                                                "bit_length(1) = 1, so start the count at bit 0."),
        (LazyKernel("level_matrix_popcount"), "count the bits up to the highest one that differs "
                                              "((x >> bit) > 0), not the bits that differ ((x >> bit) & 1)."),
    ),
)


# ---------------------------------------------------------------- 3. the intra-chunk product


def _intra_cases(rng):
    for C, K, V in ((16, 16, 32), (32, 32, 16)):
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        L = power_of_two_above(C.bit_length())
        yield Case((randn(gen, C, K), randn(gen, C, K), randn(gen, C, V), cumulative_decay(gen, C),
                    0.5 + torch.rand(C, L, generator=gen, dtype=torch.float64)), f"C={C}, K={K}, V={V}, L={L}")


def _intra_driver(fn, q, k, v, gc, lam):
    (C, K), V, L = q.shape, v.shape[1], lam.shape[1]
    out = output(C, V)
    launch(fn, (1,), *on_device(q, k, v, gc, lam), out, C=C, C_LOG=C.bit_length() - 1, K=K, V=V, L=L)
    return stored(out, "o_ptr")


def _intra_reference(q, k, v, gc, lam):
    return ((q @ k.T) * decay_matrix(gc) * level_scale_matrix(lam)) @ v


INTRA_CHUNK = Exercise(
    name="kernels.intra_chunk",
    chapter=8,
    signature="intra_chunk_kernel(q_ptr, k_ptr, v_ptr, gc_ptr, lam_ptr, o_ptr, C: tl.constexpr, "
              "C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr)",
    task="One program, one chunk of `C = 2**C_LOG` tokens: q, k `[C, K]`, v `[C, V]`, the cumulative log decay "
         "gc `[C]` and the level scales lam `[C, L]` (`L >= C_LOG + 1` columns, one per level), all row-major. "
         "Store `o = ((Q Kᵀ) ⊙ E ⊙ Λ) V` (`[C, V]`) with `E` the decay matrix of puzzle 1 and "
         "`Λ[i, j] = lam[i, level(i, j)]` — the query's weight of the pair's level (puzzle 2). Two `tl.dot`s; "
         "the package's `tiles.decay_matrix`, `tiles.fenwick_levels` and `tiles.level_scale_matrix` are "
         "@triton.jit helpers you may call.",
    solution=LazyKernel("intra_chunk_kernel"),
    cases=_intra_cases,
    driver=_intra_driver,
    reference=_intra_reference,
    mistakes=(
        (LazyKernel("intra_chunk_key_scales"), "λ belongs to the query: Λ[i, j] = lam[i, level(i, j)] reads row i "
                                               "(the query's row), not row j."),
        (LazyKernel("intra_chunk_without_levels"), "that is Mamba-2's chunk (λ ≡ 1): multiply the scores by Λ as "
                                                   "well as by the decay E."),
        (LazyKernel("intra_chunk_without_decay"), "the pairs decay too: multiply the scores by E = exp(gc_i - gc_j) "
                                                  "as well as by Λ."),
    ),
    rtol=RTOL,
    atol=ATOL,
)


# ---------------------------------------------------------------- 4. the leaf state


def _leaf_cases(rng):
    for C, K, V in ((16, 16, 32), (32, 32, 16)):
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        yield Case((randn(gen, C, K), randn(gen, C, V), cumulative_decay(gen, C)), f"C={C}, K={K}, V={V}")


def _leaf_driver(fn, k, v, gc):
    (C, K), V = k.shape, v.shape[1]
    out = output(K, V)
    launch(fn, (1,), *on_device(k, v, gc), out, C=C, K=K, V=V)
    return stored(out, "s_ptr")


def _leaf_reference(k, v, gc):
    return (k * (gc[-1] - gc).exp()[:, None]).T @ v


LEAF_STATE = Exercise(
    name="kernels.leaf_state",
    chapter=8,
    signature="leaf_state_kernel(k_ptr, v_ptr, gc_ptr, s_ptr, C: tl.constexpr, K: tl.constexpr, V: tl.constexpr)",
    task="One program, one chunk: k `[C, K]`, v `[C, V]`, gc `[C]`. Store into `s_ptr` (`[K, V]`, row-major) the "
         "chunk's state decayed to its last token, `S = Σ_j exp(gc[C-1] - gc[j]) k_j v_jᵀ = K̃ᵀ V` with "
         "`K̃ = diag(exp(gc[C-1] - gc)) K` — the leaf of the tree.",
    solution=LazyKernel("leaf_state_kernel"),
    cases=_leaf_cases,
    driver=_leaf_driver,
    reference=_leaf_reference,
    mistakes=(
        (LazyKernel("leaf_state_from_start"), "decay each key to the chunk's *end*: the factor is "
                                              "exp(gc[C-1] - gc[j]), not exp(gc[j])."),
        (LazyKernel("leaf_state_undecayed"), "a key decays from its own token to the chunk's last one: scale row j "
                                             "of K by exp(gc[C-1] - gc[j]) before the product."),
        (LazyKernel("leaf_state_sign"), "gc decreases along the chunk, so the decay to the end is "
                                        "exp(gc[C-1] - gc[j]) <= 1, not its inverse."),
    ),
    rtol=RTOL,
    atol=ATOL,
)


# ---------------------------------------------------------------- 5. the tree's slots


def _slots_cases(rng):
    for N in (1, 6, 8, 13):
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        yield Case((randn(gen, N, 16, 16), cumulative_decay(gen, N, scale=2.0)), f"N={N}, K=16, V=16")


def _slots_driver(fn, leaves, gend):
    N, K, V = leaves.shape
    out = output(N, K, V)
    launch(fn, (1,), *on_device(leaves, gend), out, N, K=K, V=V, BITS=max(N.bit_length(), 1))
    return stored(out, "node_ptr")


def _slots_reference(leaves, gend):
    nodes = torch.empty_like(leaves)
    for e in range(leaves.shape[0]):
        first = e + 1 - 2 ** fenwick.trailing_zeros(e + 1)
        nodes[e] = sum((gend[e] - gend[c]).exp() * leaves[c] for c in range(first, e + 1))
    return nodes


TREE_SLOTS = Exercise(
    name="kernels.tree_slots",
    chapter=8,
    signature="tree_slots_kernel(leaf_ptr, gend_ptr, node_ptr, N, K: tl.constexpr, V: tl.constexpr, BITS: tl.constexpr)",
    task="One program. leaf `[N, K, V]` holds each chunk's leaf state (puzzle 4) and gend `[N]` the cumulative "
         "log decay `G` at each chunk's last token. Store into slot `e` of node `[N, K, V]` the Fenwick node "
         "ending at chunk `e`: height `h` = the number of trailing zeros of `e + 1`, "
         "`node[e] = Σ_{c = e+1-2^h .. e} exp(G_e - G_c) leaf[c]`. Walk the chunks like a binary counter: chunk "
         "`c` starts from its leaf and merges with the left sibling of every height it completes "
         "(`parent = exp(G_c - G_e') · left + right`, `e'` the left sibling's slot, stored a moment earlier). "
         "`tiles.trailing_ones(c, BITS)` counts the merges; `BITS >= bit_length(N)`.",
    solution=LazyKernel("tree_slots_kernel"),
    cases=_slots_cases,
    driver=_slots_driver,
    reference=_slots_reference,
    mistakes=(
        (LazyKernel("tree_slots_undecayed"), "the left sibling ends earlier: decay it to the parent's end, "
                                             "exp(G_c - G_e') · left, before adding the right part."),
        (LazyKernel("tree_slots_right_decayed"), "the right part already ends at the parent's end; it is the left "
                                                 "sibling that needs the decay exp(G_c - G_e')."),
        (LazyKernel("tree_slots_one_merge_short"), "chunk c completes one merge per trailing one bit of c "
                                                   "(= trailing zeros of c + 1): loop over all of them."),
    ),
    rtol=RTOL,
    atol=ATOL,
)


# ---------------------------------------------------------------- 6. the level reads


def _reads_cases(rng):
    for N in (4, 7):
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        C, K, V = 16, 16, 32
        C_LOG, LEVELS = C.bit_length() - 1, (N - 1).bit_length()
        L = power_of_two_above(C_LOG + LEVELS + 1)
        gc = torch.cat([cumulative_decay(gen, C) for _ in range(N)])
        gend = torch.cat([torch.zeros(1, dtype=torch.float64), gc.view(N, C)[:, -1]]).cumsum(0)[1:]
        yield Case((randn(gen, N * C, K), 0.5 + torch.rand(N * C, L, generator=gen, dtype=torch.float64), gc, gend,
                    randn(gen, N, K, V)), f"N={N} chunks of C={C}, K={K}, V={V}, L={L}")


def _reads_constants(q, lam, node):
    N, K, V = node.shape
    C = q.shape[0] // N
    return dict(C=C, C_LOG=C.bit_length() - 1, K=K, V=V, L=lam.shape[1], LEVELS=(N - 1).bit_length())


def _reads_driver(fn, q, lam, gc, gend, node):
    out = output(q.shape[0], node.shape[2])
    launch(fn, (node.shape[0],), *on_device(q, lam, gc, gend, node), out, **_reads_constants(q, lam, node))
    return stored(out, "o_ptr")


def level_reads_reference(q, lam, gc, gend, node):
    """The inter-chunk output of every chunk, from the definition: at chunk level ``ℓ`` chunk ``c`` reads the
    node holding the earlier chunks ``sc`` with ``chunk_level(c, sc) = ℓ``, stored in the slot of the last of
    them. Shapes as the puzzle's."""
    N = node.shape[0]
    C = q.shape[0] // N
    out = torch.zeros(q.shape[0], node.shape[2], dtype=node.dtype)
    for c in range(1, N):
        t = slice(c * C, (c + 1) * C)
        for lvl in range(1, c.bit_length() + 1):
            block = [sc for sc in range(c) if fenwick.chunk_level(c, sc) == lvl]
            if block:
                e = max(block)
                scale = lam[t, C.bit_length() - 1 + lvl] * (gc[t] + gend[c - 1] - gend[e]).exp()
                out[t] = out[t] + (q[t] * scale[:, None]) @ node[e]
    return out


LEVEL_READS = Exercise(
    name="kernels.level_reads",
    chapter=8,
    signature="level_reads_kernel(q_ptr, lam_ptr, gc_ptr, gend_ptr, node_ptr, o_ptr, C: tl.constexpr, "
              "C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, LEVELS: tl.constexpr)",
    task="Grid `(N,)`: program `c = tl.program_id(0)` handles chunk `c` of a sequence of `N` chunks of `C` tokens. "
         "q `[N·C, K]`, lam `[N·C, L]`, gc `[N·C]` (each chunk's own cumulative log decay), gend `[N]` (`G` at "
         "each chunk's end) and the tree's slots node `[N, K, V]` (puzzle 5). Store into rows `c·C ..` of o "
         "(`[N·C, V]`) the chunk's inter-chunk output: for every chunk level `ℓ = 1 .. LEVELS` whose bit `ℓ - 1` "
         "of `c` is set, read the slot `e` ending the left half of `c`'s aligned `2^ℓ`-chunk block and add "
         "`diag(lam[:, C_LOG + ℓ] · exp(gc + G_{start-1} - G_e)) Q node[e]`, where `G_{start-1} = gend[c - 1]`.",
    solution=LazyKernel("level_reads_kernel"),
    cases=_reads_cases,
    driver=_reads_driver,
    reference=level_reads_reference,
    mistakes=(
        (LazyKernel("level_reads_next_slot"), "a node lives in the slot of its *last* chunk: the left half of c's "
                                              "aligned 2^ℓ block ends at ((c >> ℓ) << ℓ) + 2^(ℓ-1) - 1."),
        (LazyKernel("level_reads_chunk_level_column"), "lam has one column per token level: chunk level ℓ is token "
                                                       "level C_LOG + ℓ (the levels 0 .. C_LOG are inside the chunk)."),
        (LazyKernel("level_reads_no_node_decay"), "the node is decayed to its own end G_e; carry it to the token "
                                                  "with exp(gc + G_{start-1} - G_e), not only exp(gc)."),
    ),
    rtol=RTOL,
    atol=ATOL,
)


# ---------------------------------------------------------------- 7. a node's gradient


def _grad_cases(rng):
    for case in _reads_cases(rng):
        q, lam, gc, gend, node = case.args
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        yield Case((q, randn(gen, q.shape[0], node.shape[2]), lam, gc, gend, node.shape[0]), case.describe)


def _grad_driver(fn, q, do, lam, gc, gend, N):
    V = do.shape[1]
    K = q.shape[1]
    C = q.shape[0] // N
    out = output(N, K, V)
    launch(fn, (N,), *on_device(q, do, lam, gc, gend), out, N, C=C, C_LOG=C.bit_length() - 1, K=K, V=V, L=lam.shape[1])
    return stored(out, "dnode_ptr")


def _grad_reference(q, do, lam, gc, gend, N):
    node = torch.zeros(N, q.shape[1], do.shape[1], dtype=torch.float64, requires_grad=True)
    (level_reads_reference(q, lam, gc, gend, node) * do).sum().backward()
    return node.grad


NODE_GRADIENT = Exercise(
    name="kernels.node_gradient",
    chapter=8,
    signature="node_gradient_kernel(q_ptr, do_ptr, lam_ptr, gc_ptr, gend_ptr, dnode_ptr, N, C: tl.constexpr, "
              "C_LOG: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr)",
    task="The backward of puzzle 6 for the nodes. Grid `(N,)`: program `e` stores into `dnode[e]` (`[K, V]`) the "
         "gradient of slot `e`, given the output's gradient do `[N·C, V]` and puzzle 6's inputs: "
         "`dS_e = Σ_c Q̃_cᵀ dO_c` over the chunks `c` that read slot `e`. Slot `e` holds a node of height "
         "`h` = trailing ones of `e`; it is read at chunk level `h + 1` by the chunks `e + 1 .. e + 2^h` (those "
         "below `N`), with `Q̃_c = diag(lam[:, C_LOG + h + 1] · exp(gc + gend[c - 1] - gend[e])) Q_c`. A slot "
         "nobody reads gets zeros.",
    solution=LazyKernel("node_gradient_kernel"),
    cases=_grad_cases,
    driver=_grad_driver,
    reference=_grad_reference,
    mistakes=(
        (LazyKernel("node_gradient_own_chunks"), "a node's gradient comes from its *readers*, the 2^h chunks right "
                                                 "after it (e + 1 .. e + 2^h), not from the chunks it holds."),
        (LazyKernel("node_gradient_height_column"), "a node of height h is read at chunk level h + 1: its λ column "
                                                    "is C_LOG + h + 1."),
        (LazyKernel("node_gradient_undecayed"), "Q̃ carries the same decay as the forward's read: scale row t by "
                                                "exp(gc_t + gend[c - 1] - gend[e]) too."),
    ),
    rtol=RTOL,
    atol=ATOL,
)

PUZZLES = (DECAY_MATRIX, LEVEL_MATRIX, INTRA_CHUNK, LEAF_STATE, TREE_SLOTS, LEVEL_READS, NODE_GRADIENT)
EXERCISES = PUZZLES

