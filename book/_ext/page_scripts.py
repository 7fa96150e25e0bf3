"""Sphinx extension of the book: every page loads each script once, and none that the book does not use.

Jupyter Book registers some inline scripts twice (sphinx-thebe's ``const THEBE_JS_URL = ...`` among them: a
second ``const`` is a SyntaxError in the console of every page). The book offers no Thebe live-code button, so
sphinx-thebe's scripts, which would fetch Thebe from a CDN, are dropped altogether.
"""

from __future__ import annotations

UNUSED = ("sphinx-thebe.js", "THEBE_JS_URL")


def _is_unused(script) -> bool:
    text = f"{getattr(script, 'filename', '')} {getattr(script, 'attributes', {}).get('body', '')}"
    return any(marker in text for marker in UNUSED)


def keep_each_script_once(app, pagename, templatename, context, doctree):
    """Drop repeated and unused entries of the page's ``script_files`` (first occurrence kept, order unchanged)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for script in scripts:
        filename = str(getattr(script, "filename", script) or "")  # inline scripts: None or ""
        key = (filename, tuple(sorted(getattr(script, "attributes", {}).items())))
        if key in seen or _is_unused(script):
            continue
        seen.add(key)
        kept.append(script)
    scripts[:] = kept


def setup(app):
    app.connect("html-page-context", keep_each_script_once, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
