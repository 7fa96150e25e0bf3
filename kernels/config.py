"""How the kernels are launched: tile widths, the precision ladder of 16-bit calls, and :class:`LaunchConfig`.

Nothing here changes what a kernel computes, only how: every choice below gives the same function to the
accuracy its dtype allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


MAX_BLOCK = 128  # widest K or V tile one program holds; wider heads are split by the wrappers


def block(n: int, minimum: int = 16) -> int:
    """Tile width for a dimension of size ``n``: the next power of two, at least ``minimum`` (16 is
    ``tl.dot``'s minimum)."""
    return max(minimum, 1 << (n - 1).bit_length())


def head_block(n: int, dtype: torch.dtype | None = None) -> int:
    """Tile width of a key or value dimension (``K`` or ``V``, the operands of the state products) of a call
    with ``dtype`` inputs (``None``: any).

    At least 64 on a GPU for 16-bit inputs (and when the caller does not say): with 16- or 32-wide tiles, the
    fp16/bf16 state-reading kernels compiled by Triton 3.6 for Hopper give wrong outputs (NaN, or errors of
    30-100 %) while the interpreter is exact; the GPU tests cover narrow heads. fp32 and fp64 calls keep narrow
    tiles, as the interpreter does: correct there (the GPU tests check them) and, for narrow heads, up to four
    times less work.
    """
    from . import interpreted

    narrow = interpreted() or dtype in (torch.float32, torch.float64)
    return block(n, 16 if narrow else 64)


PRECISIONS = ("fast", "split", "fp32", "exact")
"""The precision ladder of 16-bit calls (``LaunchConfig.precision``), each rung adding one thing:

- ``"fast"``: states stored in the input's 16-bit type (bf16; fp16 calls always keep fp32 states), their
  fp32 products in tf32;
- ``"split"``: each chunk's leaf ``K̃ᵀ V`` from K̃ split into two 16-bit parts (two products), so the
  forward's states carry no rounding of the decayed keys;
- ``"fp32"``: and states stored in fp32, their products in tf32;
- ``"exact"``: and those products in tf32x3 (three tf32 passes, about fp32 accuracy).

fp32 and fp64 calls ignore it: their products are exact (``"ieee"``; fp32 in tf32 while PyTorch's
``allow_tf32`` is set, :func:`dot_precision`) and their states keep their type.
Every rung meets the bf16 bound of 1e-2 on o and every gradient up to T = 65,536, so the default is the
fastest; the book's chapter 9 shows the measured time and errors of each rung
(``python -m loglin_edu.bench --precision``).
"""


def check_precision(precision: str) -> None:
    """``precision`` must name a rung of :data:`PRECISIONS`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def dot_precision(dtype: torch.dtype, precision: str = "fast") -> str:
    """``tl.dot`` precision: for fp64 inputs exact (``"ieee"``); for fp32 inputs exact too, or tf32 while
    ``torch.backends.cuda.matmul.allow_tf32`` is set — the switch under which ``torch.matmul`` multiplies fp32 in
    tf32, so a kernel call rounds as the PyTorch forms beside it do; for fp16/bf16 inputs the 16-bit dots
    ignore it and the fp32 dots (those with a state) run in tf32, or in tf32x3 at ``precision="exact"``."""
    if dtype == torch.float64:
        return "ieee"
    if dtype == torch.float32:
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    return "tf32x3" if precision == "exact" else "tf32"


def state_dtype(dtype: torch.dtype, precision: str = "fast") -> torch.dtype:
    """Storage type of the ``K × V`` states kernels write to memory. They are always accumulated in
    fp32 registers; bf16 calls store them in bf16 (half the traffic, bf16's range) at precisions
    ``"fast"`` and ``"split"``; fp16 calls keep fp32, since a state can outgrow fp16's range; fp32/fp64
    calls keep their own type."""
    if dtype == torch.bfloat16 and precision in ("fast", "split"):
        return torch.bfloat16
    return accumulator_dtype(dtype)


def split_leaf(dtype: torch.dtype, precision: str = "fast") -> bool:
    """Whether the tree kernel forms the leaf from K̃ split into two 16-bit parts (precision ladder)."""
    return dtype in (torch.float16, torch.bfloat16) and precision != "fast"


def partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """Storage type of per-head (or per-block) shares of dq, dk that the host sums afterwards: the input's own
    type for 16-bit inputs (half the traffic of the sum; each share is rounded once, and the sum of ``H``
    shares is accumulated in fp32), the accumulator type otherwise."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else accumulator_dtype(dtype)


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Registers accumulate in fp32 (fp64 for fp64 inputs, which only the interpreter's checks use)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class LaunchConfig:
    """Knobs of the log-linear kernels (steps 3-4); every value computes the same function.

    head_group: heads one program of the per-chunk kernels handles in a loop (with q, k shared by all
        heads, ``Q Kᵀ`` is then computed once per chunk for the group, and dq, dk are summed in registers);
    block_levels: ``m`` — one program of the tree kernels owns ``2^m`` chunks and the levels inside them;
    num_warps: warps per program of the per-chunk kernels; tree_warps: of the tree kernels;
    exact_node_grads: form and store the backward's node gradients in fp32 (tf32 products on a GPU)
        rather than the state dtype: d log_decay in bf16 needs it (:mod:`.step4_tree_backward`).
    precision: the rung of :data:`PRECISIONS` for fp16/bf16 calls (all meet the bf16 bound; see there).
    tree_registers: the forward's tree keeps a block's pending left nodes in registers and loads the next
        chunk while it merges (:func:`~.step3_chunk_tree.fenwick_block_kernel`), the levels above the blocks
        merge the fp32 block roots, and the nodes' 16-bit residuals are stored only when a backward will read
        them; ``False``: every merge reads its left node back from memory (:func:`~.step3_chunk_tree.fenwick_tree_kernel`).
    tree_prefetch: with ``tree_registers``, load the next chunk's keys and values before this chunk's product
        (twice the tiles in registers) rather than when the chunk begins;
    tree_key_split: programs per head and block of the tree kernel, each owning ``K / tree_key_split`` rows of
        the states (at most what keeps a tile :func:`head_block` wide, :meth:`key_split`);
    tree_block_levels: ``m`` of the forward's tree alone (``None``: ``block_levels``);
    tree_max_registers: registers per thread the tree kernel may use (Triton's ``maxnreg``; ``None``: the
        compiler's choice): fewer let more programs share a multiprocessor, at the risk of spilling;
    upper_row_split: programs per head of the kernel above the blocks, each owning that share of a state's rows;
    grad_head_group: ``head_group`` of the backward's per-chunk kernels (``None``: ``head_group``); with q, k
        shared and one group of every head, dq and dk leave the kernels summed;
    grad_sums_in_kernels: ``d log_decay``'s reverse cumulative sum by kernels, in two levels (inside each chunk in
        the dq kernel, over the chunks' totals in a last kernel), and with q, k shared also dk's per-group shares
        summed inside the dq kernel and dq's in that last kernel, rather than by PyTorch after the launches;
    decay_sums_in_kernels: the forward's decay sums ``gc``, ``gend`` by two small kernels
        (:func:`~.inputs.chunk_decay`) rather than PyTorch's scans and copies;
    grad_warps: warps per program of the backward's per-chunk kernels (dk/dv, dq; ``None``: ``num_warps``);
    node_grad_warps: warps per program of the backward's node-gradient kernel (``None``: ``tree_warps``);
    grad_stages: software-pipelining stages of the backward's kernels (``None``: Triton's default);
    fused_grads: one program per chunk (and head group) computes dk, dv and dq, dλ, loading the chunk's tiles
        and forming ``Q Kᵀ`` and ``dO Vᵀ`` once (:func:`~.step4_tree_backward.chunk_grads_kernel`), rather than
        two kernels that each do; the node gradients then stay alive next to dq's buffers, and with
        ``grad_sums_in_kernels`` dk's per-group shares are summed in the last kernel, as dq's are.
    node_grads_in_blocks: the gradients of the nodes inside each block of ``2^m`` chunks are formed by the program
        that then computes dk, dv of the block's chunks (:func:`~.step4_tree_backward.block_dkdv_kernel`), one
        program per block rather than per chunk; the node-gradient kernel keeps only the nodes above the blocks.
    """

    head_group: int = 1
    block_levels: int = 4
    num_warps: int = 4
    tree_warps: int = 4
    exact_node_grads: bool = True
    precision: str = "fast"
    tree_registers: bool = False
    tree_prefetch: bool = True
    tree_key_split: int = 1
    tree_block_levels: int | None = None
    tree_max_registers: int | None = None
    upper_row_split: int = 1
    grad_head_group: int | None = None
    grad_sums_in_kernels: bool = False
    decay_sums_in_kernels: bool = False
    grad_warps: int | None = None
    node_grad_warps: int | None = None
    grad_stages: int | None = None
    fused_grads: bool = False
    node_grads_in_blocks: bool = False

    def __post_init__(self) -> None:
        check_precision(self.precision)
        for name in ("fused_grads", "node_grads_in_blocks"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.fused_grads and self.node_grads_in_blocks:
            raise ValueError("fused_grads and node_grads_in_blocks are two ways to arrange the backward's launches; "
                             "choose one")
        for name in ("grad_warps", "node_grad_warps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1 or value & (value - 1)):
                raise ValueError(f"{name} must be None or a power of two >= 1, got {value!r}")
        if self.grad_stages is not None and (not isinstance(self.grad_stages, int) or self.grad_stages < 1):
            raise ValueError(f"grad_stages must be None or an integer >= 1, got {self.grad_stages!r}")
        for name in ("tree_key_split", "upper_row_split"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 1, got {value!r}")
        if self.tree_registers and self.tree_levels() > MAX_REGISTER_LEVELS:
            raise ValueError(f"tree_registers holds at most {MAX_REGISTER_LEVELS} levels of a block in registers, "
                             f"got tree levels {self.tree_levels()}")

    def group(self, heads: int) -> int:
        """The largest divisor of ``heads`` not above ``head_group``."""
        return largest_divisor(heads, self.head_group)

    def grad_group(self, heads: int) -> int:
        """The largest divisor of ``heads`` not above ``grad_head_group`` (``head_group`` when it is ``None``)."""
        return largest_divisor(heads, self.head_group if self.grad_head_group is None else self.grad_head_group)

    def tree_levels(self) -> int:
        """``m`` of the forward's tree: ``tree_block_levels``, or ``block_levels`` when it is ``None``."""
        return self.block_levels if self.tree_block_levels is None else self.tree_block_levels

    def key_split(self, key_block: int) -> int:
        """Programs per head and block of the tree kernel: the largest power of two up to ``tree_key_split`` that
        leaves each program a tile of ``key_block / split`` rows no narrower than :func:`head_block` allows."""
        split = self.tree_key_split
        while split > 1 and key_block // split < head_block(1):
            split //= 2
        return split

    def grad_launch(self, node_grads: bool = False) -> dict:
        """Triton launch options of a backward kernel: its warps (``node_grads``: the node-gradient kernel's) and,
        when set, its pipelining stages."""
        warps = (self.node_grad_warps or self.tree_warps) if node_grads else (self.grad_warps or self.num_warps)
        return {"num_warps": warps, **({} if self.grad_stages is None else {"num_stages": self.grad_stages})}

    def row_split(self, key_block: int) -> int:
        """Programs per head of the kernel above the blocks: ``upper_row_split``, at most ``key_block``."""
        return min(self.upper_row_split, key_block)


MAX_REGISTER_LEVELS = 6
"""The deepest block whose pending left nodes :func:`~.step3_chunk_tree.fenwick_block_kernel` holds in registers
(one ``[K, V]`` fp32 state per level; the kernel names them one by one)."""


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` not above ``at_most`` (at least 1)."""
    return max(d for d in range(1, min(at_most, n) + 1) if n % d == 0)


@dataclass(frozen=True)
class LinearLaunchConfig:
    """Knobs of the chunk-parallel linear Mamba-2 kernels (step 1b); every value computes the same function.

    block_chunks: ``W``, the chunks one program walks (a block); states pass between blocks by a scan;
    key_split: key columns one program of the backward's dq and dk walks carries (its rows of the state; at
        least :func:`head_block` allows, :meth:`key_columns`);
    num_warps: warps per program of every walk; num_stages: software-pipelining stages of the walks (2: the
        next chunk's tiles load while this one computes).
    """

    block_chunks: int = 16
    key_split: int = 64
    num_warps: int = 8
    num_stages: int = 2

    def __post_init__(self) -> None:
        if self.block_chunks < 1:
            raise ValueError(f"block_chunks must be >= 1, got {self.block_chunks}")
        if self.key_split < 16 or self.key_split & (self.key_split - 1):
            raise ValueError(f"key_split must be a power of two >= 16, got {self.key_split}")

    def key_columns(self, key_block: int) -> int:
        """Key columns per program of the dq and dk walks: ``key_split``, at most ``key_block`` and at least the
        narrowest tile :func:`head_block` allows (narrower state tiles compile wrong in 16 bits on Hopper)."""
        return min(key_block, max(self.key_split, head_block(1)))


FACTOR_DTYPES = (None, "float32", "bfloat16", "float16")
"""The values of ``DeltaLaunchConfig.factor_dtype`` (``None``: chosen by the call, :meth:`DeltaLaunchConfig.factor_storage`)."""

DELTA_PRECISIONS = ("fast", "exact")
"""How the delta-rule kernels (steps 6-9) multiply fp32 blocks in 16-bit calls (``DeltaLaunchConfig.precision``):
``"fast"`` in tf32, ``"exact"`` in tf32x3 (about fp32 accuracy). Every intermediate they store (the WY factors,
the level states and their gradients) is fp32 in both, but for W and the queries carried to the chunk's start:
by default stored in the call's own 16-bit type under ``"fast"`` and in fp32 under ``"exact"``
(``DeltaLaunchConfig.factor_dtype`` sets another); the ``C × C`` triangular solve always runs in tf32x3.
fp32 calls multiply exactly (``"ieee"``; in tf32 while PyTorch's ``allow_tf32`` is set, :func:`dot_precision`) in
the level walks and the output, and in tf32x3 in the two per-chunk
kernels (the WY factors and their backward, :func:`chunk_precision`); fp64 calls multiply exactly everywhere."""

def key_tiles(K: int, widest: int = MAX_BLOCK) -> tuple[int, int]:
    """``(BK1, BK2)``: the key dimension as a first tile of at most ``widest`` columns and a second tile for
    the rest (``BK2 = 0``: one tile). ``K = 192`` gives ``(128, 64)``, ``K = 256`` gives ``(128, 128)``."""
    first = min(head_block(K), widest)
    return (first, head_block(K - first)) if K > first else (first, 0)


def solve_precision(dtype: torch.dtype) -> str:
    """Precision of the ``C × C`` products of the WY form (the triangular solve and its backward), as
    :func:`~.tiles.dot_split` takes it: well below the inputs' rounding, at a small cost (they do not grow with
    K or V).
    16-bit inputs multiply in bf16x3 on the GPU (16-bit operands, so that the solve holds its ``C × C`` blocks in
    registers without spilling; Triton's interpreter computes bf16 products wrongly, so it takes tf32x3 there),
    fp32 inputs in tf32x3 (fp32 calls need the extra bits, and exact fp32 products are unrolled multiply-adds:
    the solve's products alone, exact, make the factors' kernel, step 6, take 3.5 times longer to compile),
    fp64 exactly."""
    from . import interpreted

    if dtype == torch.float64:
        return "ieee"
    return "bf16x3" if dtype in (torch.float16, torch.bfloat16) and not interpreted() else "tf32x3"


def chunk_precision(dtype: torch.dtype, precision: str = "fast") -> str:
    """``tl.dot`` precision of the delta rule's two per-chunk kernels (the WY factors, step 6, and their
    backward, step 8): as :func:`dot_precision`, except that fp32 calls multiply in tf32x3 (about fp32 accuracy)
    rather than exactly. Exact fp32 products run as unrolled multiply-adds on the CUDA cores: these kernels,
    the largest of the ladder, then take ptxas minutes to compile (the factors at ``K = 192``, ``V = 384``:
    40 times as long as in tf32x3)."""
    return "tf32x3" if dtype == torch.float32 else dot_precision(dtype, precision)


LEVEL_GRAD_VALUE_TILE = {"fast": 64, "exact": 32}
"""The value tile of the reads' gradients (and of the level-by-level kernels, ``gram_grads=False``) by precision rung
(:data:`DELTA_PRECISIONS`). 64: the fastest of those timed on an H200 at ``K = 192``, ``V = 384`` (16 and 64; the
level-by-level kernels, a knob, spill registers there). Under ``"exact"`` tf32x3 products on 16-wide tiles make an
illegal memory access on Hopper (Triton 3.6): 32."""


@dataclass(frozen=True)
class DeltaLaunchConfig:
    """Knobs of the log-linear Gated DeltaNet kernels (steps 6-9); every value computes the same function.

    key_tile: widest tile of the key dimension (``K`` up to twice this, split by :func:`key_tiles`);
    value_tile: ``BV``, the value columns one walk program carries (``V`` is cut into tiles of it);
    grad_value_tile: the value tile of the level gradients (step 8), at most ``value_tile``; ``None`` picks
        :data:`LEVEL_GRAD_VALUE_TILE` of the precision (:meth:`level_grad_value_tile`);
    num_warps: warps per program of the per-chunk kernels; solve_warps: of the WY backward's pass over the keys
    and the triangular solve (step 8; its ``C × C`` products in tf32x3 spill registers at 4 warps);
    walk_warps: of the level walks (forward and backward); grad_warps: of the level gradients;
    num_stages: software-pipelining stages of every loop (1: none; more prefetch the next chunk's factors but need
    shared memory for each stage); three groups of kernels can have their own (``None``: ``num_stages``):
    walk_stages: of the level walks (forward and backward);
    read_stages: of the kernels that read the level states tile by tile, one program per chunk (the output, step 7's
        ``delta_output_kernel``, and its gradient, step 8's ``level_read_grad_kernel``; with ``gram_grads=False``
        also the level-by-level gradients): 3 by default, the next state tiles load while one is multiplied;
    gram_stages: of the kernels that form and use each chunk's ``K × K`` Gram product of adjoints and states
        (``slot_gram_kernel``, ``level_gram_kernel``, ``level_gram_grads_kernel``);
    walk_max_registers, adjoint_max_registers: a cap on the registers per thread (Triton's ``maxnreg``; ``None``:
        the compiler's choice, up to 255) of the forward level walks and of the reverse walks: a lower cap spills
        more but lets more programs share a multiprocessor (168 fits three 4-warp programs where 255 fits two);
    factor_dtype: storage type of the WY factor ``W`` and of the queries carried to the chunk's start, the two
        ``[C, K]`` tiles of every chunk that the walks and the reads load again for each live level: ``"float32"``,
        ``"bfloat16"`` or ``"float16"`` (16 bits halve those loads), or ``None``, chosen by the call
        (:meth:`factor_storage`): a 16-bit call's own type under ``precision="fast"``, the accumulation type
        otherwise (fp32; fp64 for fp64 calls). They are computed in fp32 and rounded once when stored; every product
        with them still runs in fp32 (or tf32). fp16 keeps three more bits than bf16 but holds values only up to
        ±65,504, and the queries grow with q: bf16 inputs of any scale get bf16 factors;
    precision: a rung of :data:`DELTA_PRECISIONS` for fp16/bf16 calls;
    forward_walk: ``"levels"``, one walk per level and block, all at once (step 7's ``level_walk_kernel``), or
        ``"stacked"``, one walk per value tile carrying every live level at once (``level_state_walk_kernel``);
    backward_walk: ``"stacked"``, one reverse walk per value tile carrying every live level's adjoint at once (step
        8's ``level_adjoint_walk_kernel``), or ``"levels"``, one reverse walk per level and block, all at once
        (``level_walk_bwd_kernel``);
    adjoint_value_tile: the value columns one program of the stacked reverse walk carries, at most ``value_tile``
        (``None``: ``value_tile``): narrower tiles give the walk more programs and shorter steps, without changing
        the forward's walks (32 by default: on an H200 as fast as 64 with many sequences, faster with one long one);
    gram_grads: with ``backward_walk="levels"``, the level gradients of the chunk factors through one ``K × K``
        product per chunk, ``G = Σ_ℓ D_ℓ S_ℓᵀ`` (``level_gram_kernel``); ``False``: level by level
        (``level_write_grad_kernel`` and ``level_transition_grad_kernel``).
    """

    key_tile: int = MAX_BLOCK
    value_tile: int = 64
    grad_value_tile: int | None = None
    num_warps: int = 4
    solve_warps: int = 8
    walk_warps: int = 4
    grad_warps: int = 8
    num_stages: int = 1
    walk_stages: int | None = None
    read_stages: int | None = 3
    gram_stages: int | None = None
    walk_max_registers: int | None = None
    adjoint_max_registers: int | None = None
    factor_dtype: str | None = None
    precision: str = "fast"
    forward_walk: str = "levels"
    backward_walk: str = "stacked"
    adjoint_value_tile: int | None = 32
    gram_grads: bool = True

    def __post_init__(self) -> None:
        if self.precision not in DELTA_PRECISIONS:
            raise ValueError(f"precision must be one of {DELTA_PRECISIONS}, got {self.precision!r}")
        for name in ("forward_walk", "backward_walk"):
            if getattr(self, name) not in ("stacked", "levels"):
                raise ValueError(f"{name} must be 'stacked' or 'levels', got {getattr(self, name)!r}")
        for name in ("key_tile", "value_tile", "grad_value_tile", "adjoint_value_tile"):
            width = getattr(self, name)
            if width is not None and (width < 16 or width & (width - 1)):
                raise ValueError(f"{name} must be a power of two >= 16, got {width}")
        for name in ("num_stages", "walk_stages", "read_stages", "gram_stages"):
            stages = getattr(self, name)
            if (stages is not None or name == "num_stages") and (not isinstance(stages, int) or stages < 1):
                raise ValueError(f"{name} must be a positive integer{'' if name == 'num_stages' else ' or None'}, "
                                 f"got {stages!r}")
        for name in ("walk_max_registers", "adjoint_max_registers"):
            cap = getattr(self, name)
            if cap is not None and (not isinstance(cap, int) or not 24 <= cap <= 255):
                raise ValueError(f"{name} must be None or an integer in [24, 255], got {cap!r}")
        if self.factor_dtype not in FACTOR_DTYPES:
            raise ValueError(f"factor_dtype must be one of {FACTOR_DTYPES}, got {self.factor_dtype!r}")
        if self.precision == "exact" and self.grad_value_tile is not None and self.grad_value_tile < 32:
            raise ValueError(f"precision='exact' needs grad_value_tile >= 32, got {self.grad_value_tile}: the level "
                             "gradients' tf32x3 products on 16-wide value tiles make an illegal memory access on "
                             "Hopper (Triton 3.6)")

    def stages(self, group: str) -> int:
        """Pipelining stages of a group of kernels, ``"walk"``, ``"read"`` or ``"gram"``: its own field when set,
        else ``num_stages``."""
        if group not in ("walk", "read", "gram"):
            raise ValueError(f"group must be 'walk', 'read' or 'gram', got {group!r}")
        own = getattr(self, f"{group}_stages")
        return self.num_stages if own is None else own

    def factor_storage(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype W and the queries of a call with ``dtype`` inputs are stored in: ``factor_dtype`` when set;
        else ``dtype`` itself for fp16 and bf16 calls under ``precision="fast"``, and :func:`accumulator_dtype`
        of it for the rest (``"exact"``, fp32 and fp64 calls)."""
        if self.factor_dtype is not None:
            return getattr(torch, self.factor_dtype)
        if dtype in (torch.float16, torch.bfloat16) and self.precision == "fast":
            return dtype
        return accumulator_dtype(dtype)

    def walk_launch(self, reverse: bool = False) -> dict:
        """Triton launch options of the level walks (``reverse``: of the backward's): warps, stages and, when
        capped, registers per thread."""
        cap = self.adjoint_max_registers if reverse else self.walk_max_registers
        registers = {} if cap is None else {"maxnreg": cap}
        return {"num_warps": self.walk_warps, "num_stages": self.stages("walk"), **registers}

    def level_grad_value_tile(self) -> int:
        """The level gradients' value tile: ``grad_value_tile``, or :data:`LEVEL_GRAD_VALUE_TILE` of the
        precision when it is ``None``."""
        return self.grad_value_tile or LEVEL_GRAD_VALUE_TILE[self.precision]
