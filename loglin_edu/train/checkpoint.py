"""Checkpoints written atomically, and a JSON-lines log kept consistent with them.

A run that stops (killed, out of time) resumes from its last checkpoint; log lines written after that
checkpoint describe work the checkpoint does not hold, so they are dropped on resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ..provenance import temporary_path


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file, then rename: a reader never sees a half-written checkpoint."""
    path = Path(path)
    tmp = temporary_path(path)
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, device: torch.device) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (tensors on ``device``), or None when there is none."""
    if not path.exists():
        return None
    return torch.load(path, map_location=device, weights_only=False)


def keep_log_until(log_path: Path, step: int) -> list[dict[str, Any]]:
    """Drop the lines of ``log_path`` written after ``step``; return the lines kept."""
    if not log_path.exists():
        return []
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line]
    kept = [line for line in lines if line["step"] <= step]
    log_path.write_text("".join(json.dumps(line) + "\n" for line in kept))
    return kept


def append_log(log_path: Path | None, lines: list[dict[str, Any]]) -> None:
    """Append one JSON line per entry of ``lines`` (nothing without a path)."""
    if log_path is not None:
        with log_path.open("a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
