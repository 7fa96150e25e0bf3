"""Explorers that compute in the browser: live on the static website, where no kernel runs.

Each function returns an ``IPython.display.HTML`` holding a ``<div>``, a small stylesheet and a ``<script>`` with
the whole of ``explorers.js`` (shipped as package data): the levels, ``M^S``, ``M^H``, their product, the decoding
state and the chunk scan's stages are computed by that JavaScript when a control moves. Nothing is fetched from the
network, so the page works offline. The ipywidgets explorers of :mod:`.explore` need a kernel; these do not.
"""

from __future__ import annotations

import json
import uuid
from functools import lru_cache
from importlib import resources

from matplotlib import colormaps
from matplotlib.colors import to_hex

from ..fenwick import num_levels
from .figures import LEVEL_COLORS

MAX_LEN = 64
CHUNK_SIZES = (2, 4, 8, 16)

_STYLE = """
.loglin-explorer { font: 14px/1.4 system-ui, sans-serif; margin: 0.5em 0; max-width: 100%; overflow: hidden; }
.loglin-explorer .loglin-controls { display: flex; flex-wrap: wrap; gap: 0.2em 1.2em; margin: 0.3em 0; }
.loglin-explorer .loglin-control { display: inline-flex; align-items: center; gap: 0.4em; white-space: nowrap; }
.loglin-explorer .loglin-control input[type=range] { width: 8em; }
.loglin-explorer .loglin-control output { min-width: 2.5em; font-variant-numeric: tabular-nums; }
.loglin-explorer .loglin-panels { display: flex; flex-wrap: wrap; gap: 0.8em; align-items: flex-start; }
.loglin-explorer figure.loglin-panel { margin: 0.3em 0; max-width: 100%; }
.loglin-explorer figure.loglin-panel canvas { display: block; max-width: 100%; height: auto;
  image-rendering: pixelated; }
.loglin-explorer figcaption { font-size: 0.85em; color: #555; }
.loglin-explorer .loglin-text { margin: 0.4em 0; }
.loglin-explorer ol.loglin-levels { list-style: none; padding: 0; margin: 0.3em 0; font-size: 0.9em; }
.loglin-explorer ol.loglin-levels li { border-left: 0.8em solid #ddd; padding: 0.1em 0.5em; margin: 0.15em 0; }
.loglin-explorer ol.loglin-levels li.empty { color: #999; }
.loglin-explorer ol.loglin-levels li.merged { font-weight: bold; }
"""


@lru_cache(maxsize=1)
def explorer_script() -> str:
    """The JavaScript of every browser explorer (``loglin_edu/viz/explorers.js``, installed with the package)."""
    return resources.files(__package__).joinpath("explorers.js").read_text(encoding="utf-8")


def _viridis(stops: int = 17) -> list[str]:
    cmap = colormaps["viridis"]
    return [to_hex(cmap(i / (stops - 1))) for i in range(stops)]


def _check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _explorer(kind: str, settings: dict):
    """One explorer: a container, the style, the script, and the call that builds the explorer in the container."""
    from IPython.display import HTML

    node_id = f"loglin-{kind}-{uuid.uuid4().hex[:12]}"
    settings = {**settings, "levelColours": list(LEVEL_COLORS), "viridis": _viridis()}
    html = (
        f'<div class="loglin-explorer" id="{node_id}" data-explorer="{kind}">'
        "<noscript>This explorer needs JavaScript.</noscript></div>\n"
        f"<style>{_STYLE}</style>\n"
        f"<script>\n{explorer_script()}\n"
        f'loglinExplorers.mount("{kind}", document.getElementById("{node_id}"), {json.dumps(settings)});\n'
        "</script>"
    )
    return HTML(html)


def bucket_explorer(seq_len: int = 16, query: int = 13):
    """Sliders for ``T`` and the query ``t``: the level table with that row, its buckets, its lowest-set-bit strips."""
    _check_int("seq_len", seq_len, 2, MAX_LEN)
    _check_int("query", query, 0, seq_len - 1)
    return _explorer("buckets", {"maxLen": MAX_LEN, "seqLen": seq_len, "query": query})


def mask_explorer(seq_len: int = 16, query: int = 11, chunk_size: int = 4, log_decay: float = -0.05, lambdas=None):
    """Sliders for ``T``, ``t``, ``C``, the decay ``g`` and one ``λ`` per level: ``M^H``, ``M^S``, ``M^S ⊙ M^H``.

    lambdas: one value in ``[0, 2]`` per level of ``T = 64`` (default all 1: ``M^H`` is the causal mask).
    """
    _check_int("seq_len", seq_len, 2, MAX_LEN)
    _check_int("query", query, 0, seq_len - 1)
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size}")
    if not -1.0 <= log_decay <= 0.0:
        raise ValueError(f"log_decay must be in [-1, 0], got {log_decay}")
    levels = num_levels(MAX_LEN)
    lambdas = [1.0] * levels if lambdas is None else [float(x) for x in lambdas]
    if len(lambdas) != levels or not all(0.0 <= x <= 2.0 for x in lambdas):
        raise ValueError(f"lambdas must be {levels} values in [0, 2], got {lambdas}")
    return _explorer(
        "masks",
        {"maxLen": MAX_LEN, "seqLen": seq_len, "query": query, "chunkSize": chunk_size, "logDecay": log_decay,
         "lambdas": lambdas},
    )


def decoding_explorer(seq_len: int = 32, query: int = 12):
    """A slider for the token ``t``: which Fenwick levels the decoding state holds after ``t``, and what merged."""
    _check_int("seq_len", seq_len, 2, MAX_LEN)
    _check_int("query", query, 0, seq_len - 1)
    return _explorer("decoding", {"seqLen": seq_len, "query": query})


def scan_explorer(seq_len: int = 64, chunk_size: int = 8, query: int = 45, upto: int = 0):
    """Sliders for ``T``, ``C``, the stages shown and a query: which chunk-scan stage computes each pair ``(t, s)``."""
    _check_int("seq_len", seq_len, 4, 2 * MAX_LEN)
    _check_int("query", query, 0, seq_len - 1)
    _check_int("upto", upto, 0, 8)
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size}")
    return _explorer(
        "scan", {"maxLen": 2 * MAX_LEN, "seqLen": seq_len, "chunkSize": chunk_size, "query": query, "upto": upto}
    )
