"""The book's notation (MathJax macros, one definition for the website and the notebooks) and code display.

The website gets them from ``_config.yml`` (a test checks that it holds exactly :data:`MACROS`); a live notebook
gets them from :func:`define_macros`, which the hidden first cell of every chapter calls.
"""

from __future__ import annotations

MACROS: dict[str, str | list] = {
    "level": r"\operatorname{level}",
    "bitlen": r"\operatorname{bit\_length}",
    "popcount": r"\operatorname{popcount}",
    "numlevels": r"\operatorname{L}",
    "softmax": r"\operatorname{softmax}",
    "MS": r"M^{\mathrm{S}}",
    "MH": r"M^{\mathrm{H}}",
    "xor": r"\oplus",
    "bigO": r"\mathcal{O}",
    "R": r"\mathbb{R}",
}


def newcommands() -> str:
    """:data:`MACROS` as LaTeX ``\\newcommand`` lines (macros with arguments are ``[body, n]`` pairs)."""
    lines = []
    for name, body in MACROS.items():
        if isinstance(body, list):
            lines.append(rf"\newcommand{{\{name}}}[{body[1]}]{{{body[0]}}}")
        else:
            lines.append(rf"\newcommand{{\{name}}}{{{body}}}")
    return "\n".join(lines)


def define_macros():
    """Display the macros as an invisible math block so a live notebook's MathJax knows them."""
    from IPython.display import Markdown

    return Markdown("$$\n" + newcommands() + "\n$$")


def source(obj):
    """``obj``'s source code as a Markdown code block: the book shows the package's code, never a copy."""
    import inspect

    from IPython.display import Markdown

    return Markdown(f"```python\n{inspect.getsource(obj)}```")
