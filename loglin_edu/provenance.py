"""Where a result came from: the commit, library versions, device, command and date, and one atomic writer.

Every program that writes results (benchmarks, experiments) records :func:`provenance` beside its numbers
and writes through :func:`write_json`, so a reader of a results file can rerun exactly what made it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

LIBRARIES = ("triton", "numpy", "fla-core")


def git_commit() -> str:
    """``LOGLIN_COMMIT`` when set (a copy of the tree whose ``.git`` is missing or stale), else the commit of
    the checkout holding this package (``git rev-parse HEAD``), else ``"unknown"``."""
    if os.environ.get("LOGLIN_COMMIT"):
        return os.environ["LOGLIN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def library_versions() -> dict[str, str]:
    """Python, torch and :data:`LIBRARIES` (read from package metadata: importing some changes process state),
    CUDA's version and the GPU's name when there is one."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        out["device"] = torch.cuda.get_device_name()
    return out


def device_name(device: torch.device | str = "cpu") -> str:
    """The GPU's name for a CUDA device, else the CPU's (``platform.processor()`` or the machine type)."""
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def device_slug(device: torch.device | str = "cuda") -> str:
    """A short name for results files: ``h200``, ``h100``, ``a100``, ... or ``cpu``."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    for known in ("h200", "h100", "a100", "l40s", "l4", "t4"):
        if known in name:
            return known
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def provenance(command: str | None = None, device: torch.device | str = "cpu") -> dict[str, Any]:
    """``command`` (default: this process's command line), ``commit``, ``date`` (UTC), ``device`` and ``versions``."""
    if command is None:
        command = "python -m " + Path(sys.argv[0]).stem + " " + " ".join(sys.argv[1:])
    return dict(command=command, commit=git_commit(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=device_name(device), versions=library_versions())


def temporary_path(path: str | Path) -> Path:
    """A temporary file beside ``path`` for an atomic write (write it, then ``os.replace`` it onto ``path``), named
    for this process: processes that write the same file at once (jobs of one run folder on several GPUs, say)
    never write into one temporary file, so the file a reader finds is always one process's whole write."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as JSON through a temporary file and a rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)
    return path


DEFAULT_RESULTS = Path("book") / "results"
"""Where the command-line programs write by default: the book's results folder, relative to the directory
they are run from (the repository's root). Library functions take their paths from the caller."""
