/* The book's browser-side explorers: the Fenwick levels, the masks M^S and M^H, the decoding state and the
 * chunk scan's stages, computed in JavaScript so that they stay live on a static page (no kernel, nothing
 * fetched). loglin_edu/viz/browser.py embeds this file in a notebook output; `math` mirrors loglin_edu.fenwick
 * and loglin_edu.masks, and tests/test_viz.py checks it against them.
 *
 * Positions are 0-indexed; every matrix is indexed [t][s] (query t down, key s across), zero above the diagonal.
 */
(function (root) {
  "use strict";

  // ---------------------------------------------------------------- the mathematics

  /** bit_length(x) for 0 <= x < 2^31. */
  function bitLength(x) {
    return x > 0 ? 32 - Math.clz32(x) : 0;
  }

  /** level(t, t) = 0, level(t, s) = bit_length(t XOR s) for s < t. */
  function level(t, s) {
    if (!(0 <= s && s <= t)) throw new RangeError("level(t, s) needs 0 <= s <= t, got t=" + t + ", s=" + s);
    return bitLength(t ^ s);
  }

  /** L(T) = bit_length(T - 1) + 1 levels for a length-T sequence. */
  function numLevels(T) {
    if (!(T >= 1)) throw new RangeError("numLevels needs T >= 1, got " + T);
    return bitLength(T - 1) + 1;
  }

  /** Number of trailing zero bits of t >= 1. */
  function trailingZeros(t) {
    return 31 - Math.clz32(t & -t);
  }

  function popcount(t) {
    let n = 0;
    for (; t > 0; t &= t - 1) n++;
    return n;
  }

  /** Keys [start, stop) of query t at level l; empty ([0, 0]) when bit l-1 of t is clear. */
  function bucket(t, l) {
    if (l === 0) return [t, t + 1];
    if (!((t >> (l - 1)) & 1)) return [0, 0];
    const start = (t >> l) << l;
    return [start, start + (1 << (l - 1))];
  }

  /** The buckets of query t, levels 0..bit_length(t). */
  function buckets(t) {
    const out = [];
    for (let l = 0; l <= bitLength(t); l++) out.push(bucket(t, l));
    return out;
  }

  /** The same partition the Fenwick-tree way: strip the lowest set bit of t again and again. Each strip
   * [end - lssb(end), end) is one bucket, at level trailing_zeros(end) + 1, newest first. */
  function lssbStrips(t) {
    const strips = [];
    for (let end = t; end > 0; end -= end & -end) {
      strips.push({ start: end - (end & -end), stop: end, level: trailingZeros(end) + 1 });
    }
    return strips;
  }

  function square(T, entry) {
    const rows = [];
    for (let t = 0; t < T; t++) {
      const row = new Array(T);
      for (let s = 0; s < T; s++) row[s] = entry(t, s);
      rows.push(row);
    }
    return rows;
  }

  /** level(t, s) for s <= t, -1 above the diagonal. */
  function levelMatrix(T) {
    return square(T, (t, s) => (s <= t ? level(t, s) : -1));
  }

  /** M^H[t][s] = lambdas[level(t, s)] (one lambda per level, the same for every query). */
  function hierarchicalMask(T, lambdas) {
    if (lambdas.length < numLevels(T)) throw new RangeError("hierarchicalMask needs " + numLevels(T) + " lambdas");
    return square(T, (t, s) => (s <= t ? lambdas[level(t, s)] : 0));
  }

  /** M^S[t][s] = exp(G_t - G_s) with a constant gate g <= 0: exp(g (t - s)). */
  function decayMask(T, g) {
    return square(T, (t, s) => (s <= t ? Math.exp(g * (t - s)) : 0));
  }

  function elementwise(a, b) {
    return a.map((row, t) => row.map((x, s) => x * b[t][s]));
  }

  /** Which stage of the chunk scan computes (t, s): 0 intra-chunk, m >= 1 chunk level m, -1 above the diagonal. */
  function stageTable(T, C) {
    const c = bitLength(C) - 1;
    return square(T, (t, s) => {
      if (s > t) return -1;
      if (Math.floor(t / C) === Math.floor(s / C)) return 0;
      return level(t, s) - c;
    });
  }

  /** The decoding state after token t: keys [start, stop) held by each level (null when empty). */
  function decodingLevels(t, levels) {
    const out = [];
    for (let l = 0; l < levels; l++) {
      const [start, stop] = bucket(t, l);
      out.push(stop > start ? [start, stop] : null);
    }
    return out;
  }

  /** Step t >= 1 of the binary counter: levels 0..j of step t-1 merge into level j+1 (j = trailing zeros of t). */
  function carry(t) {
    if (t < 1) return null;
    const j = trailingZeros(t);
    return { into: j + 1, keys: [t - (1 << j), t] };
  }

  const math = {
    bitLength, level, numLevels, trailingZeros, popcount, bucket, buckets, lssbStrips, levelMatrix,
    hierarchicalMask, decayMask, elementwise, stageTable, decodingLevels, carry,
  };

  // ---------------------------------------------------------------- drawing

  function make(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of children || []) node.appendChild(child);
    return node;
  }

  function hexToRgb(hex) {
    const n = parseInt(hex.slice(1), 16);
    return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
  }

  /** A continuous colour scale from evenly spaced hex stops (the book passes matplotlib's viridis). */
  function continuousScale(stops) {
    const rgb = stops.map(hexToRgb);
    return function (x) {
      const u = Math.min(1, Math.max(0, x)) * (rgb.length - 1);
      const i = Math.min(rgb.length - 2, Math.floor(u));
      const f = u - i;
      const c = rgb[i].map((v, k) => Math.round(v + f * (rgb[i + 1][k] - v)));
      return "rgb(" + c.join(",") + ")";
    };
  }

  /** A slider with its label and readout; calls onChange on every move. */
  function slider(label, min, max, step, value, onChange, format) {
    const input = make("input", { type: "range", min: min, max: max, step: step, value: value, "aria-label": label });
    const readout = make("output", { text: (format || String)(value) });
    input.addEventListener("input", () => {
      readout.textContent = (format || String)(Number(input.value));
      onChange();
    });
    const node = make("label", { class: "loglin-control" }, [make("span", { text: label }), input, readout]);
    return {
      node,
      input,
      get value() {
        return Number(input.value);
      },
      setMax(m) {
        input.max = m;
        if (Number(input.value) > m) input.value = m;
        readout.textContent = (format || String)(Number(input.value));
      },
    };
  }

  function choice(label, options, value, onChange) {
    const input = make("select", { "aria-label": label }, options.map((o) => make("option", { value: o, text: o })));
    input.value = value;
    input.addEventListener("change", onChange);
    input.addEventListener("input", onChange);
    return {
      node: make("label", { class: "loglin-control" }, [make("span", { text: label }), input]),
      input,
      get value() {
        return Number(input.value);
      },
    };
  }

  function panel(title) {
    const canvas = make("canvas", { width: 10, height: 10 });
    const node = make("figure", { class: "loglin-panel" }, [canvas, make("figcaption", { text: title })]);
    return { node, canvas, caption: node.lastChild };
  }

  function cellSize(n, maxPx) {
    return Math.max(2, Math.floor(maxPx / n));
  }

  /** Size a canvas and fill it with one colour; returns its 2-d context. */
  function blankCanvas(canvas, width, height, background) {
    canvas.width = width;
    canvas.height = height;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = background;
    ctx.fillRect(0, 0, width, height);
    return ctx;
  }

  /** Draw a [T][T] matrix cell by cell. colour(value, t, s) returns a CSS colour or null (blank). */
  function drawMatrix(canvas, values, colour, opts) {
    const n = values.length;
    const cell = cellSize(n, opts.maxPx || 320);
    const ctx = blankCanvas(canvas, n * cell, n * cell, "#ffffff");
    for (let t = 0; t < n; t++) {
      for (let s = 0; s < n; s++) {
        const c = colour(values[t][s], t, s);
        if (c === null) continue;
        ctx.fillStyle = c;
        ctx.fillRect(s * cell, t * cell, cell, cell);
        if (opts.numbers && cell >= 12) {
          ctx.fillStyle = "#ffffff";
          ctx.font = Math.floor(cell * 0.6) + "px sans-serif";
          ctx.textAlign = "center";
          ctx.textBaseline = "middle";
          ctx.fillText(String(values[t][s]), (s + 0.5) * cell, (t + 0.5) * cell);
        }
      }
    }
    ctx.strokeStyle = "#bbbbbb";
    ctx.lineWidth = 1;
    ctx.strokeRect(0.5, 0.5, canvas.width - 1, canvas.height - 1);
    if (opts.chunk) {
      ctx.strokeStyle = "rgba(255,255,255,0.9)";
      for (let e = opts.chunk; e < n; e += opts.chunk) {
        ctx.beginPath();
        ctx.moveTo(e * cell, 0);
        ctx.lineTo(e * cell, canvas.height);
        ctx.moveTo(0, e * cell);
        ctx.lineTo(canvas.width, e * cell);
        ctx.stroke();
      }
    }
    if (opts.query !== undefined && opts.query !== null) {
      ctx.strokeStyle = opts.queryColour || "#000000";
      ctx.lineWidth = 2;
      ctx.strokeRect(1, opts.query * cell + 1, canvas.width - 2, cell - 2);
    }
  }

  /** The keys 0..T-1 of query t as one strip, coloured by their bucket's level. */
  function drawBuckets(canvas, t, T, levelColours, maxPx) {
    const cell = cellSize(T, maxPx || 640);
    const ctx = blankCanvas(canvas, T * cell, 30, "#f2f2f2");
    buckets(t).forEach(([start, stop], l) => {
      if (stop <= start) return;
      ctx.fillStyle = levelColours[l % levelColours.length];
      ctx.fillRect(start * cell, 0, (stop - start) * cell, canvas.height);
      ctx.strokeStyle = "#ffffff";
      ctx.lineWidth = 1;
      ctx.strokeRect(start * cell + 0.5, 0.5, (stop - start) * cell - 1, canvas.height - 1);
      const label = "ℓ" + l;
      ctx.font = "12px sans-serif";
      if (ctx.measureText(label).width + 4 < (stop - start) * cell) {
        ctx.fillStyle = "#ffffff";
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        ctx.fillText(label, ((start + stop) / 2) * cell, canvas.height / 2);
      }
    });
  }

  function binary(t, width) {
    return t.toString(2).padStart(width, "0");
  }

  function range(start, stop) {
    return stop - start === 1 ? "{" + start + "}" : "{" + start + "…" + (stop - 1) + "}";
  }

  // ---------------------------------------------------------------- the explorers

  /** Chapter 4: the level table with one query's row, its buckets, and the lowest-set-bit strips. */
  function bucketExplorer(node, cfg) {
    const lengths = slider("T", 2, cfg.maxLen, 1, cfg.seqLen, update);
    const query = slider("query t", 0, cfg.seqLen - 1, 1, cfg.query, update);
    const table = panel("level(t, s): one colour per level; the outlined row is query t");
    const strip = panel("keys 0…T−1 of query t, coloured by bucket");
    const text = make("p", { class: "loglin-text", "aria-live": "polite" });
    node.append(make("div", { class: "loglin-controls" }, [lengths.node, query.node]), table.node, strip.node, text);

    function update() {
      const T = lengths.value;
      query.setMax(T - 1);
      const t = query.value;
      const colours = cfg.levelColours;
      drawMatrix(table.canvas, levelMatrix(T), (v) => (v < 0 ? null : colours[v % colours.length]), {
        query: t, numbers: T <= 16,
      });
      drawBuckets(strip.canvas, t, T, colours);
      const parts = buckets(t).map(([a, b], l) => (b > a ? "level " + l + ": " + range(a, b) : null)).filter(Boolean);
      const strips = lssbStrips(t).map((s) => s.stop + " − " + (s.stop - s.start) + " = " + s.start);
      text.textContent =
        "t = " + t + " = 0b" + binary(t, 1) + ": " + (popcount(t) + 1) + " non-empty buckets — " + parts.join(", ") +
        ". Stripping the lowest set bit walks the same buckets from the newest: " +
        (strips.length ? strips.join(", then ") : "nothing to strip (t = 0)") + ".";
    }
    update();
  }

  /** Chapter 5: M^H with one λ per level, M^S with a constant decay, their product, and the query's buckets. */
  function maskExplorer(node, cfg) {
    const levels = numLevels(cfg.maxLen);
    const lengths = slider("T", 2, cfg.maxLen, 1, cfg.seqLen, update);
    const query = slider("query t", 0, cfg.seqLen - 1, 1, cfg.query, update);
    const chunk = choice("chunk C", [2, 4, 8, 16], cfg.chunkSize, update);
    const decay = slider("decay g", -1, 0, 0.01, cfg.logDecay, update, (x) => x.toFixed(2));
    const lambdas = [];
    for (let l = 0; l < levels; l++) {
      lambdas.push(slider("λ level " + l, 0, 2, 0.05, cfg.lambdas[l], update, (x) => x.toFixed(2)));
    }
    const panels = [panel("hierarchical M^H (one λ per level)"), panel("decay M^S"), panel("M = M^S ⊙ M^H")];
    const strip = panel("buckets of query t");
    const text = make("p", { class: "loglin-text", "aria-live": "polite" });
    node.append(
      make("div", { class: "loglin-controls" }, [lengths.node, query.node, chunk.node, decay.node]),
      make("div", { class: "loglin-controls" }, lambdas.map((s) => s.node)),
      make("div", { class: "loglin-panels" }, panels.map((p) => p.node)),
      strip.node,
      text
    );
    const colour = continuousScale(cfg.viridis);

    function update() {
      const T = lengths.value;
      query.setMax(T - 1);
      const t = query.value;
      const used = numLevels(T);
      lambdas.forEach((s, l) => (s.node.style.opacity = l < used ? "1" : "0.4"));
      const mh = hierarchicalMask(T, lambdas.map((s) => s.value));
      const ms = decayMask(T, decay.value);
      const m = elementwise(ms, mh);
      [mh, ms, m].forEach((matrix, i) => {
        const top = Math.max(1e-12, ...matrix.map((row) => Math.max(...row)));
        drawMatrix(panels[i].canvas, matrix, (v, r, c) => (c > r ? null : colour(v / top)), {
          query: t, queryColour: "#d62728", chunk: chunk.value, maxPx: 240,
        });
      });
      drawBuckets(strip.canvas, t, T, cfg.levelColours);
      const row = m[t].slice(0, t + 1).map((x) => x.toFixed(2));
      text.textContent =
        "Row t = " + t + " of M: [" + row.join(", ") + "]. T = " + T + " uses " + used + " levels; " +
        "every key of one bucket gets the same λ, so each off-diagonal Fenwick block of M^H is constant along its rows.";
    }
    update();
  }

  /** Chapter 6: the decoding state after token t — which levels are live, and what merged at this step. */
  function decodingExplorer(node, cfg) {
    const T = cfg.seqLen;
    const L = numLevels(T);
    const step = slider("token t", 0, T - 1, 1, cfg.query, update);
    const counter = panel("keys held per level after each token (rows: tokens, columns: levels)");
    const strip = panel("keys 0…t, coloured by the level that holds them");
    const list = make("ol", { class: "loglin-levels", start: "0" });
    const text = make("p", { class: "loglin-text", "aria-live": "polite" });
    node.append(
      make("div", { class: "loglin-controls" }, [step.node]),
      make("div", { class: "loglin-panels" }, [counter.node, make("div", { class: "loglin-state" }, [list])]),
      strip.node,
      text
    );
    const colours = cfg.levelColours;

    function update() {
      const t = step.value;
      const step_ = carry(t);
      const occupancy = [];
      for (let r = 0; r < T; r++) occupancy.push(decodingLevels(r, L).map((k) => (k ? k[1] - k[0] : 0)));
      const cell = cellSize(Math.max(L, 1), 200);
      const rowPx = Math.max(4, Math.floor(cell / 3));
      const canvas = counter.canvas;
      const ctx = blankCanvas(canvas, L * cell, T * rowPx, "#ffffff");
      for (let r = 0; r < T; r++) {
        for (let l = 0; l < L; l++) {
          if (!occupancy[r][l]) continue;
          ctx.globalAlpha = r <= t ? 1 : 0.15;
          ctx.fillStyle = colours[l % colours.length];
          ctx.fillRect(l * cell + 1, r * rowPx, cell - 2, rowPx - 1);
        }
      }
      ctx.globalAlpha = 1;
      ctx.strokeStyle = "#000000";
      ctx.lineWidth = 2;
      ctx.strokeRect(1, t * rowPx, canvas.width - 2, rowPx);

      list.replaceChildren();
      decodingLevels(t, L).forEach((keys, l) => {
        const merged = step_ && l === step_.into;
        const opened = l === 0;
        const label = keys
          ? "level " + l + ": keys " + range(keys[0], keys[1]) + " (" + (keys[1] - keys[0]) + ")" +
            (merged ? " ← merged at this step" : opened ? " ← the new token" : "")
          : "level " + l + ": empty";
        const item = make("li", { text: label, class: keys ? "live" : "empty" });
        if (keys) item.style.borderLeftColor = colours[l % colours.length];
        if (merged) item.classList.add("merged");
        list.appendChild(item);
      });
      drawBuckets(strip.canvas, t, T, colours);
      const width = bitLength(T - 1);
      let story;
      if (!step_) story = "Token 0 opens level 0.";
      else if (step_.into === 1) story = "t is odd (no trailing zero bit): level 0 of step t − 1 (key " + (t - 1) +
        ") moves into level 1, and token " + t + " opens level 0.";
      else story = "t ends in " + (step_.into - 1) + " zero bits: levels 0…" + (step_.into - 1) + " of step t − 1 " +
        "(keys " + range(step_.keys[0], step_.keys[1]) + ") merge into level " + step_.into + " — a binary-counter carry — " +
        "and token " + t + " opens level 0.";
      text.textContent = "After token t = " + t + " = 0b" + binary(t, width) + ": " + (popcount(t) + 1) +
        " live levels (popcount(t) + 1) of at most " + L + ". " + story;
    }
    update();
  }

  /** Chapter 7: which stage of the chunk scan computes each pair, stage by stage, and what one query reads. */
  function scanExplorer(node, cfg) {
    const lengths = slider("T", 4, cfg.maxLen, 1, cfg.seqLen, update);
    const chunk = choice("chunk C", [2, 4, 8, 16], cfg.chunkSize, update);
    const upto = slider("stages shown", 0, 8, 1, cfg.upto, update);
    const query = slider("query t", 0, cfg.seqLen - 1, 1, cfg.query, update);
    const table = panel("stage of each pair: grey = intra-chunk, colours = chunk levels m");
    const text = make("p", { class: "loglin-text", "aria-live": "polite" });
    node.append(make("div", { class: "loglin-controls" }, [lengths.node, chunk.node, upto.node, query.node]), table.node, text);

    function update() {
      const T = lengths.value;
      const C = chunk.value;
      query.setMax(T - 1);
      const stages = stageTable(T, C);
      const last = Math.max(0, ...stages.map((row) => Math.max(...row)));
      upto.setMax(last);
      const shown = upto.value;
      const t = query.value;
      const colours = ["#b0b0b0"].concat(cfg.levelColours.map((_, m) => cfg.levelColours[(m + 3) % cfg.levelColours.length]));
      drawMatrix(table.canvas, stages, (v) => (v < 0 || v > shown ? null : colours[v]), { query: t, chunk: C });
      const counts = new Array(last + 1).fill(0);
      stages.forEach((row) => row.forEach((v) => v >= 0 && counts[v]++));
      const tc = Math.floor(t / C);
      const reads = [];
      for (let m = 1; m <= bitLength(tc); m++) {
        const [a, b] = bucket(tc, m);
        if (b > a) reads.push("chunk level " + m + ": chunks " + range(a, b) + " = tokens " + range(a * C, b * C));
      }
      const c = bitLength(C) - 1;
      text.textContent =
        "Pairs per stage: intra-chunk " + counts[0] + counts.slice(1).map((n, m) => ", level m=" + (m + 1) + ": " + n).join("") +
        ". Query t = " + t + " lies in chunk " + tc + " = 0b" + binary(tc, 1) + ": its own chunk is a dense block " +
        "(token levels 0…" + c + ")" + (reads.length ? ", and it reads " + reads.join("; ") +
        " (token level = " + c + " + m)." : "; chunk 0 reads no state.");
    }
    update();
  }

  const explorers = { buckets: bucketExplorer, masks: maskExplorer, decoding: decodingExplorer, scan: scanExplorer };

  /** Build explorer `kind` inside `node` with the settings `cfg`. */
  function mount(kind, node, cfg) {
    if (!explorers[kind]) throw new Error("unknown explorer " + kind);
    node.replaceChildren();
    explorers[kind](node, cfg);
    node.setAttribute("data-ready", "true");
  }

  root.loglinExplorers = { math, mount, version: 1 };
})(typeof window !== "undefined" ? window : globalThis);
