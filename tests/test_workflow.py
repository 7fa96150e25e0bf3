"""The workflow that publishes the book: actionlint accepts it, and it builds on a CPU and deploys to GitHub Pages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"
SEARCH_PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
ACTIONLINT = shutil.which("actionlint", path=SEARCH_PATH)


def actionlint(path: Path) -> subprocess.CompletedProcess:
    assert ACTIONLINT, "actionlint is missing: it is installed by requirements.txt"
    return subprocess.run([ACTIONLINT, "-no-color", str(path)], capture_output=True, text=True, timeout=120)


def test_workflow_passes_actionlint():
    done = actionlint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_rejects_a_broken_workflow(tmp_path):
    broken = WORKFLOW.read_text().replace("needs: build", "needs: no-such-job")
    assert broken != WORKFLOW.read_text()
    path = tmp_path / "book.yml"
    path.write_text(broken)
    done = actionlint(path)
    assert done.returncode != 0 and "no-such-job" in done.stdout


def test_workflow_builds_on_a_cpu_and_deploys_to_pages():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["build"]["steps"]
    commands = "\n".join(step.get("run", "") for step in steps)
    assert "--index-url https://download.pytorch.org/whl/cpu" in commands, "torch must come from the CPU index"
    assert commands.index("whl/cpu") < commands.index("make book"), "the CPU torch goes in before the requirements"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    deploy = workflow["jobs"]["deploy"]
    assert deploy["needs"] == "build" and deploy["steps"][-1]["uses"].startswith("actions/deploy-pages@")
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
