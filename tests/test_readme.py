"""The README's Python example runs as written."""

import pathlib
import re

import pytest


@pytest.mark.slow
def test_readme_python_example_runs():
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
