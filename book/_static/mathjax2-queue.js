/* The Jupyter widget manager typesets widget labels with MathJax 2's `MathJax.Hub.Queue(["Typeset", MathJax.Hub,
 * element])`; the book loads MathJax 3, which has no `Hub`. This gives MathJax 3 that one call, so widget pages
 * typeset their labels instead of logging a TypeError. It is installed once MathJax 3 has replaced its configuration
 * object (the defer-loaded MathJax runs before DOMContentLoaded; the widgets render on the window's load event). */
(function () {
  "use strict";
  function typeset(element) {
    const mathjax = window.MathJax;
    const ready = mathjax.startup && mathjax.startup.promise ? mathjax.startup.promise : Promise.resolve();
    return ready.then(() => (mathjax.typesetPromise ? mathjax.typesetPromise(element ? [element] : undefined) : null));
  }
  function install() {
    const mathjax = window.MathJax;
    if (!mathjax || mathjax.Hub) return;
    mathjax.Hub = {
      Queue: function () {
        for (const job of arguments) {
          if (Array.isArray(job) && job[0] === "Typeset") typeset(job[2]);
          else if (typeof job === "function") job();
        }
      },
    };
  }
  document.addEventListener("DOMContentLoaded", install);
  window.addEventListener("load", install);
})();
