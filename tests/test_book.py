"""The book: every chapter executes (nbmake), the book builds with -W, and a headless Chromium reads every page.

Chapters are found by glob (``book/NN_*.ipynb`` and the appendices ``book/appendix_*.ipynb``), so chapters
added later are tested too. Each executed chapter
is stored in the book's jupyter-cache, so the build that follows reuses it instead of executing it again.
The browser test needs Debian's ``chromium`` (``apt-get install chromium``) and the npm assets of
``make book-assets``; it never downloads a browser.
"""

from __future__ import annotations

import functools
import http.server
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "book").glob("appendix_*.ipynb"))
PART_ONE = [c for c in CHAPTERS if c.name[:2].isdigit() and int(c.name[:2]) <= 7]
CACHE = ROOT / "_build" / ".jupyter_cache"
HTML = ROOT / "_build" / "html"
CHROMIUM = "/usr/bin/chromium"
COLAB = "https://colab.research.google.com/github/loglin-edu/loglin-edu/blob/main/"
EXECUTION_SECONDS: dict[str, float] = {}


def ids(paths):
    return [p.stem for p in paths]


def config():
    return yaml.safe_load((ROOT / "_config.yml").read_text())


# ---------------------------------------------------------------- the sources


def test_every_chapter_is_in_the_toc():
    toc = (ROOT / "_toc.yml").read_text()
    listed = set(re.findall(r"^\s*-\s*file:\s*(\S+)", toc, flags=re.M))
    missing = [c.stem for c in CHAPTERS if f"book/{c.stem}" not in listed]
    assert not missing, f"chapters missing from _toc.yml (they would not be built): {missing}"
    assert len(PART_ONE) == 7


def test_config_macros_are_the_package_macros():
    from loglin_edu.viz import MACROS

    macros = config()["sphinx"]["config"]["mathjax3_config"]["tex"]["macros"]
    assert macros == MACROS


@pytest.mark.parametrize("chapter", CHAPTERS, ids=ids(CHAPTERS))
def test_chapter_is_committed_without_outputs(chapter):
    nb = nbformat.read(chapter, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} carry outputs or execution counts"


@pytest.mark.parametrize("chapter", PART_ONE, ids=ids(PART_ONE))
def test_chapter_shape(chapter):
    """Opens with what the reader will learn, installs the package when missing (hidden), shows the package's
    code, closes with a summary and 2-4 checked exercises."""
    nb = nbformat.read(chapter, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and "What you will learn" in nb.cells[0].source
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert "remove-cell" in setup.metadata.get("tags", []) and "pip install" in setup.source
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "viz.source(" in code, "the chapter shows none of the package's code"
    assert "## Summary" in text and "## Exercises" in text
    assert 2 <= len(set(re.findall(r'ex\.check\("([\w.]+)"', code))) <= 4
    assert all("hide-cell" in c.metadata.get("tags", []) for c in nb.cells if "show_solution" in c.source)


# ---------------------------------------------------------------- execution (nbmake)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=ids(CHAPTERS))
def test_chapter_executes(chapter):
    """nbmake runs the chapter on the CPU; the executed notebook goes into the book's jupyter-cache."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from nbmake.nb_run import NotebookRun

    start = time.perf_counter()
    result = NotebookRun(chapter, default_timeout=180).execute()
    EXECUTION_SECONDS[chapter.stem] = time.perf_counter() - start
    assert result.error is None, f"{result.error.summary}\n{result.error.trace}"
    # cache the outputs under the committed notebook's hash (nbclient adds timing metadata to the cells)
    executed = nbformat.read(chapter, as_version=4)
    for cell, run in zip(executed.cells, result.nb.cells):
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = run.outputs, run.execution_count
    if "widgets" in result.nb.metadata:
        executed.metadata["widgets"] = result.nb.metadata["widgets"]
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    get_cache(str(CACHE)).cache_notebook_bundle(
        CacheBundleIn(executed, str(chapter), data={"execution_seconds": EXECUTION_SECONDS[chapter.stem]}),
        check_validity=False,
        overwrite=True,
    )


# ---------------------------------------------------------------- the build


@pytest.fixture(scope="module")
def built_book():
    """``make book-html`` with this interpreter: npm assets, then ``jupyter-book build -W``."""
    done = subprocess.run(
        ["make", "-s", "book-html", f"PY={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return done.stdout + done.stderr


def test_book_builds_with_warnings_as_errors(built_book):
    for chapter in CHAPTERS:
        assert (HTML / "book" / f"{chapter.stem}.html").is_file(), chapter.stem
    assert (HTML / "book" / "intro.html").is_file()
    assert (HTML / "offline" / "mathjax" / "tex-chtml.js").is_file()
    if EXECUTION_SECONDS:  # the chapters executed above were reused, not executed again
        executed = [c.stem for c in CHAPTERS if c.stem in EXECUTION_SECONDS and f"{c}: Executing notebook" in built_book]
        assert not executed, f"the build executed again: {executed}"


# ---------------------------------------------------------------- the browser


@pytest.fixture(scope="module")
def browser(built_book):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium, f"http://127.0.0.1:{server.server_port}"
        chromium.close()
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def open_page(browser, path):
    """Load ``path`` and return (page, problems): failed, refused (4xx/5xx) and external requests."""
    chromium, base = browser
    page = chromium.new_page()
    problems = []
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    page.on("request", lambda r: r.url.startswith((base, "data:", "blob:")) or problems.append(f"external: {r.url}"))
    page.goto(f"{base}/{path}", wait_until="networkidle", timeout=90_000)
    page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=60_000)
    page.evaluate("MathJax.startup.promise")
    return page, problems


PAGES = ["book/intro.html"] + [f"book/{c.stem}.html" for c in CHAPTERS]


@pytest.mark.parametrize("path", PAGES, ids=[Path(p).stem for p in PAGES])
def test_page_renders_offline(browser, path):
    page, problems = open_page(browser, path)
    try:
        main = page.locator("main")
        if main.locator(".math").count():  # the page has math: MathJax must have typeset it
            assert page.locator("mjx-container").count() > 0, "the math on the page was not typeset"
        assert page.locator("mjx-merror").count() == 0, "MathJax could not typeset some math (unknown macro?)"
        text = main.inner_text()
        raw = re.findall(r"\\(?:frac|sum|operatorname|level|MH|MS|bigO|begin|mathcal)\b|\$\$", text)
        assert not raw, f"raw TeX on the page: {raw[:5]}"
        broken = page.evaluate("[...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 100))")
        assert not broken, f"images that did not load: {broken}"
        if Path(path).stem in ids(PART_ONE):
            assert page.locator("main img").count() > 0 and page.locator("main .math").count() > 0
        if Path(path).stem != "intro":
            colab = page.locator("a[href*='colab.research.google.com']").first.get_attribute("href")
            assert colab == f"{COLAB}book/{Path(path).stem}.ipynb"
        if page.locator("script[type='application/vnd.jupyter.widget-state+json']").count():
            page.wait_for_selector(".widget-slider, .jupyter-widgets", timeout=15_000)
        assert not problems, problems
    finally:
        page.close()


def test_static_slider_moves_through_frames(browser):
    """A precomputed-frame player (to_jshtml) works without a kernel: moving its slider changes the frame."""
    path = next(p for p in PAGES if "fenwick" in p)
    page, problems = open_page(browser, path)
    try:
        slider = page.locator("input.anim-slider").first
        image = page.locator("div.animation img").first
        before = image.get_attribute("src")
        slider.evaluate("s => { s.value = s.max; s.dispatchEvent(new Event('input')); }")
        page.wait_for_function("([img, old]) => img.src !== old", arg=[image.element_handle(), before], timeout=5_000)
        assert image.get_attribute("src") != before
        assert not problems, problems
    finally:
        page.close()
