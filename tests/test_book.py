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
EXECUTION_SECONDS: dict[str, float] = {}
CDN_HOSTS = ("unpkg.com", "cdn.jsdelivr.net", "cdnjs.cloudflare.com", "code.jquery.com", "fonts.googleapis.com")


def ids(paths):
    return [p.stem for p in paths]


def config():
    return yaml.safe_load((ROOT / "_config.yml").read_text())


REPOSITORY = config()["repository"]  # the repository's URL is set once, in _config.yml
COLAB = (
    "https://colab.research.google.com/github/"
    + REPOSITORY["url"].removeprefix("https://github.com/").rstrip("/")
    + f"/blob/{REPOSITORY['branch']}/"
)


# ---------------------------------------------------------------- the sources


def test_every_chapter_is_in_the_toc():
    toc = (ROOT / "_toc.yml").read_text()
    listed = set(re.findall(r"^\s*-\s*file:\s*(\S+)", toc, flags=re.M))
    missing = [c.stem for c in CHAPTERS if f"book/{c.stem}" not in listed]
    assert not missing, f"chapters missing from _toc.yml (they would not be built): {missing}"
    assert len(PART_ONE) == 7


def test_chapters_install_the_package_from_the_configured_repository():
    """The hidden setup cell of a chapter (Colab, Binder) installs from _config.yml's repository.url, nowhere else."""
    for chapter in CHAPTERS:
        setup = next(c for c in nbformat.read(chapter, as_version=4).cells if c.cell_type == "code")
        urls = set(re.findall(r"git\+(https://[^\s\"'@]+)", setup.source))
        assert urls <= {REPOSITORY["url"]}, f"{chapter.stem} installs from {urls}, not {REPOSITORY['url']}"


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


def open_page(browser, path, width=1280):
    """Load ``path`` in a window ``width`` px wide and return (page, problems): failed, refused (4xx/5xx) and
    external requests, console errors and uncaught exceptions.
    """
    chromium, base = browser
    page = chromium.new_page(viewport={"width": width, "height": 900})
    problems = []
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    page.on("request", lambda r: r.url.startswith((base, "data:", "blob:")) or problems.append(f"external: {r.url}"))
    page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
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
        prose = page.evaluate(
            "() => { const m = document.querySelector('main').cloneNode(true);"
            " m.querySelectorAll('pre, code, script, style, mjx-container').forEach(e => e.remove()); return m.innerText; }"
        )
        dollars = re.findall(r"\$[^$\s][^$\n]{0,40}\$", prose)
        assert not dollars, f"math left as $...$ in the prose (a glued Markdown string?): {dollars[:5]}"
        broken = page.evaluate("[...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 100))")
        assert not broken, f"images that did not load: {broken}"
        if Path(path).stem in ids(PART_ONE):
            assert page.locator("main img").count() > 0 and page.locator("main .math").count() > 0
        if Path(path).stem != "intro":
            colab = page.locator("a[href*='colab.research.google.com']").first.get_attribute("href")
            assert colab == f"{COLAB}book/{Path(path).stem}.ipynb"
        if page.locator("script[type='application/vnd.jupyter.widget-view+json']").count():
            page.wait_for_selector(".widget-slider, .jupyter-widgets", timeout=15_000)
        page.wait_for_timeout(500)  # errors logged by scripts that run after the load event
        assert not problems, problems
    finally:
        page.close()


def test_static_slider_moves_through_frames(browser):
    """A precomputed-frame player (to_jshtml) works without a kernel: moving its slider changes the frame."""
    path = next(p for p in PAGES if "hierarchical" in p)
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


def test_built_pages_load_nothing_from_outside():
    """No page names a CDN or loads a script, stylesheet, image or frame from another host."""
    found = []
    for page in sorted(HTML.rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        found += [f"{page.relative_to(HTML)}: {host}" for host in CDN_HOSTS if host in html]
        for tag, attr in (("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src")):
            for url in re.findall(rf"<{tag}\b[^>]*\b{attr}=[\"']([^\"']+)", html):
                if re.match(r"(https?:)?//", url) and not (tag == "link" and "canonical" in url):
                    found.append(f"{page.relative_to(HTML)}: <{tag} {attr}={url}>")
    assert not found, found[:20]


def test_each_page_runs_each_script_once():
    """No page loads a script file twice or repeats an inline script (a repeated ``const`` is a SyntaxError)."""
    repeated = {}
    for page in sorted(HTML.rglob("*.html")):
        head = page.read_text(encoding="utf-8").split("</head>")[0]
        scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", head, flags=re.S)
        keys = [re.sub(r"\?v=\w+", "", attrs) + body for attrs, body in scripts if "widget-state" not in attrs]
        twice = sorted({k[:80] for k in keys if keys.count(k) > 1})
        if twice:
            repeated[str(page.relative_to(HTML))] = twice
    assert not repeated, repeated


EXPLORERS = [("buckets", "04_"), ("masks", "05_"), ("decoding", "06_"), ("scan", "07_")]


@pytest.mark.parametrize("kind,chapter", EXPLORERS, ids=[k for k, _ in EXPLORERS])
def test_browser_explorer_redraws_when_a_slider_moves(browser, kind, chapter):
    """The explorers compute in the page: moving a slider changes the picture and the sentence under it."""
    path = next(p for p in PAGES if Path(p).name.startswith(chapter))
    page, problems = open_page(browser, path)
    try:
        explorer = page.locator(f".loglin-explorer[data-explorer='{kind}'][data-ready='true']").first
        explorer.wait_for(timeout=10_000)
        snapshot = "e => [...e.querySelectorAll('canvas')].map(c => c.toDataURL()).concat(e.textContent)"
        before = explorer.evaluate(snapshot)
        slider = explorer.locator("input[type=range]").first
        slider.evaluate(
            "s => { s.value = Number(s.value) === Number(s.min) ? s.max : s.min; s.dispatchEvent(new Event('input')); }"
        )
        after = explorer.evaluate(snapshot)
        assert after[:-1] != before[:-1], "no picture changed"
        assert after[-1] != before[-1], "the text did not change"
        assert not problems, problems
    finally:
        page.close()


def test_widget_manager_can_typeset_with_mathjax_3(browser):
    """The widget manager calls MathJax 2's ``MathJax.Hub.Queue``; the book's shim typesets with MathJax 3."""
    page, problems = open_page(browser, PAGES[1])
    try:
        page.evaluate(
            r"""() => { const e = document.createElement('p');
                       e.id = 'hub-check'; e.className = 'math'; e.textContent = '\\(x^2\\)';
                       document.querySelector('main').appendChild(e);
                       MathJax.Hub.Queue(['Typeset', MathJax.Hub, e]); }"""
        )
        page.wait_for_selector("#hub-check mjx-container", timeout=10_000)
        assert not problems, problems
    finally:
        page.close()


OVERFLOW = """() => {
  const column = document.querySelector("article.bd-article") || document.querySelector("main");
  const columnRight = column.getBoundingClientRect().right;
  const where = e => (e.closest("section[id]") || {id: "?"}).id;
  const bad = [];
  const items = document.querySelectorAll('mjx-container[display="true"], article table, main img, .loglin-explorer');
  for (const item of items) {
    let box = null;  // the scroll box the item lives in (itself included), if any, up to the column
    for (let a = item; a && a !== column; a = a.parentElement) {
      if (/(auto|scroll)/.test(getComputedStyle(a).overflowX)) { box = a; break; }
    }
    const rect = item.getBoundingClientRect();
    const right = box ? box.getBoundingClientRect().right : rect.left + Math.max(rect.width, item.scrollWidth);
    let limit = columnRight;
    for (let a = (box || item).parentElement; a && a !== document.documentElement; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") limit = Math.min(limit, a.getBoundingClientRect().right);
    }
    if (right > limit + 1) {
      bad.push(`${item.tagName.toLowerCase()} in #${where(item)}: right edge ${Math.round(right)} > ${Math.round(limit)}`);
    }
  }
  const page = document.documentElement.scrollWidth - window.innerWidth;
  if (page > 0) {  // name what widens the page: elements past the window that no scroll box holds
    for (const e of document.querySelectorAll("main *")) {
      if (e.getBoundingClientRect().right <= window.innerWidth + 1) continue;
      let held = false;
      for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
        if (getComputedStyle(a).overflowX !== "visible") { held = true; break; }
      }
      if (!held) bad.push(`${e.tagName.toLowerCase()} in #${where(e)} reaches ${Math.round(e.getBoundingClientRect().right)} px`);
    }
  }
  const wide = [...document.querySelectorAll('mjx-container[display="true"]')]
    .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => `equation in #${where(e)} scrolls`);
  return {bad, page, wide};
}"""


@pytest.mark.parametrize("width", [390, 1280])
def test_pages_fit_the_window(browser, width):
    """At a phone's 390 px and a laptop's 1280 px the page never scrolls sideways, and every display equation,
    table, image and explorer stays in its column (or scrolls inside its own box). Part I breaks its equations
    into lines that fit even a phone's column: none of them needs scrolling."""
    problems = {}
    part_one = {f"book/{c.stem}.html" for c in PART_ONE}
    for path in PAGES:
        page, _ = open_page(browser, path, width=width)
        try:
            found = page.evaluate(OVERFLOW)
            if found["page"] > 0:
                found["bad"].append(f"the page scrolls sideways by {found['page']} px")
            if path in part_one:
                found["bad"] += found["wide"]
            if found["bad"]:
                problems[path] = found["bad"][:5]
        finally:
            page.close()
    assert not problems, problems
