// The aiayn attention explorer: renders one inspection record (aiayn.inspect.record) with no outside code.
"use strict";

const KIND_NAMES = { encoder: "encoder self-attention", decoder: "decoder self-attention", cross: "cross-attention" };
const HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];
let record = null;
const state = { headsOn: [], enlarged: null, chosen: false, sampling: { t: "1", k: "0", p: "1" }, busy: false };

function $(id) { return document.getElementById(id); }
function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
function svgEl(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}
function fill(select, values, labels) {
  const keep = select.value;
  select.replaceChildren(...values.map((v, i) => { const o = el("option", { value: v }, labels ? labels[i] : v); return o; }));
  if (values.map(String).includes(keep)) select.value = keep;
}
function headColour(h) { return HEAD_COLOURS[h % HEAD_COLOURS.length]; }
// a token as the page shows it: line breaks as ↵, spaces as ␣, a word-start marker (Ġ, ▁) as _
function show(token) {
  return token.replace(/\n/g, "\u21b5").replace(/^[\u0120\u2581]/, "_").replace(/ /g, "\u2423");
}

// viridis-like colour scale, value in [0, 1]
const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function colour(v) {
  v = Math.max(0, Math.min(1, v));
  const x = v * (STOPS.length - 1), i = Math.min(STOPS.length - 2, Math.floor(x)), f = x - i;
  const c = STOPS[i].map((a, j) => Math.round(a + f * (STOPS[i + 1][j] - a)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}
function diverging(v, max) {  // blue (negative) - white - red (positive)
  const f = max > 0 ? Math.max(-1, Math.min(1, v / max)) : 0;
  const r = f > 0 ? 255 : Math.round(255 * (1 + f)), b = f < 0 ? 255 : Math.round(255 * (1 - f));
  const g = Math.round(255 * (1 - Math.abs(f)));
  return `rgb(${r},${g},${b})`;
}

function formatCount(n) {
  return n >= 1e9 ? `${(n / 1e9).toFixed(2)} B` : n >= 1e6 ? `${(n / 1e6).toFixed(2)} M` :
    n >= 1e3 ? `${(n / 1e3).toFixed(1)} k` : String(n);
}

function kinds() { return Object.keys(record.attention); }
function queryTokens(kind) { return kind === "encoder" ? record.tokens.encoder : record.tokens.decoder; }
function keyTokens(kind) { return kind === "decoder" ? record.tokens.decoder : record.tokens.encoder; }

function fmt(v) {
  if (v === null || v === undefined) return "\u2013";
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e4) ? v.toExponential(2) : v.toFixed(a < 1 ? 4 : a < 100 ? 3 : 1);
}

// A colour legend: a bar of the scale with its end values (and 0 for a diverging one), and a caption.
function legend(lo, hi, opts) {
  opts = opts || {};
  const box = el("div", { class: "legend", role: "img",
    "aria-label": `colour scale from ${fmt(lo)} to ${fmt(hi)}${opts.caption ? ": " + opts.caption : ""}` });
  const bar = el("span", { class: "legend-bar" });
  const stops = [];
  for (let i = 0; i <= 10; i++) {
    const f = i / 10;
    stops.push(opts.diverging ? diverging(2 * f - 1, 1) : colour(f));
  }
  bar.style.background = `linear-gradient(to right, ${stops.join(", ")})`;
  box.appendChild(el("span", { class: "legend-lo" }, opts.loText || fmt(lo)));
  box.appendChild(bar);
  box.appendChild(el("span", { class: "legend-hi" }, opts.hiText || fmt(hi)));
  if (opts.diverging) box.appendChild(el("span", { class: "legend-mid" }, "white: 0"));
  if (opts.caption) box.appendChild(el("span", { class: "legend-caption" }, opts.caption));
  return box;
}

function maxAbs(values) { return values.reduce((m, v) => v === null ? m : Math.max(m, Math.abs(v)), 0); }

// A labelled heatmap as a grid of cells (each cell's title holds its value), with its colour legend.
function heatmap(matrix, rows, cols, opts) {
  opts = opts || {};
  const grid = el("div", { class: "heatmap" + (opts.cls ? " " + opts.cls : "") });
  const size = opts.cell || 18, every = opts.labelEvery || 1;
  grid.style.gridTemplateColumns = `max-content repeat(${cols.length}, ${size}px)`;
  grid.appendChild(el("div"));
  cols.forEach((c, j) => grid.appendChild(el("div", { class: "col", "data-j": j }, j % every ? "" : show(c))));
  const max = opts.max !== undefined ? opts.max : 1;
  const box = el("div", { class: "heatmap-box" });
  if (!opts.noLegend) {
    box.appendChild(opts.diverging ? legend(-max, max, { diverging: true, caption: opts.caption })
      : legend(0, max, { caption: opts.caption, loText: opts.loText, hiText: opts.hiText }));
  }
  box.appendChild(grid);
  matrix.forEach((row, i) => {
    const label = el("div", { class: "row", "data-i": i }, i % every ? "" : show(rows[i]));
    label.style.height = label.style.lineHeight = `${size}px`;
    grid.appendChild(label);
    row.forEach((v, j) => {
      const cell = el("div", { class: "cell", title: `${show(rows[i])} \u2192 ${show(cols[j])}: ${v.toFixed(4)}`,
        "data-value": v });
      cell.style.width = cell.style.height = `${size}px`;
      cell.style.background = opts.diverging ? diverging(v, max) : colour(max > 0 ? v / max : 0);
      grid.appendChild(cell);
    });
  });
  return box;
}

function figure(title, node) {
  const box = el("div", { class: "figure" });
  box.appendChild(el("h3", {}, title));
  box.appendChild(node);
  return box;
}

// ---- header, input, output
function renderHeader() {
  const m = record.model;
  const layers = m.arch === "encoder-decoder" ? `${m.encoder_layers} + ${m.n_layers} layers` :
    `${m.arch === "decoder" ? m.n_layers : m.encoder_layers} layers`;
  const size = m.parameters === undefined ? "" : ` \u00b7 ${formatCount(m.parameters)} parameters`;
  const ffn = m.d_ff === undefined ? "" : ` \u00b7 d_ff ${m.d_ff}`;
  const design = m.name ? ` (${m.name})` : m.design ? ` (${m.design}'s design at this size)` : "";
  $("model-info").textContent = `${m.arch}${design} \u00b7 task ${m.task} \u00b7 ${layers} \u00b7 ${m.n_heads} heads ` +
    `\u00b7 d_model ${m.d_model}${ffn}${size} \u00b7 positions ${m.position}` +
    (m.norm_position ? ` \u00b7 ${m.norm_position}-norm` : "");
  $("input-shown").textContent = `Input: ${record.input}`;
  const translation = record.output && record.output.kind === "translation";
  $("beam-label").hidden = !translation || document.body.dataset.served !== "1";
  if (translation && !$("beam").value) $("beam").value = record.output.beam || 1;
  if (!$("input-text").value) $("input-text").value = record.input;
  const notes = $("notes");
  notes.replaceChildren(...(record.notes || []).map(n => el("p", { class: "note" }, n)));
  if (record.cut) {
    const kept = el("p", { class: "note kept", id: "kept-text" });
    kept.appendChild(el("b", {}, `What the model read (its ${record.cut.kept} ${record.cut.limit} tokens): `));
    kept.appendChild(el("span", {}, record.cut.kept_text));
    notes.appendChild(kept);
  }
}

function renderOutput() {
  const out = record.output, box = $("output");
  box.replaceChildren();
  if (out.kind === "translation") {
    const p = el("p", { class: "translation" });
    p.appendChild(el("b", {}, "Output: "));
    p.appendChild(el("span", { id: "translation-text" }, out.text));
    p.appendChild(el("span", { class: "hint" }, `  (${out.method}, score ${out.score.toFixed(3)})`));
    box.appendChild(p);
  } else if (out.kind === "classification") {
    box.appendChild(el("p", { id: "prediction" }, `Prediction: ${out.prediction} (p = ${out.probability.toFixed(3)})`));
    const bars = el("div", { class: "bars" });
    out.labels.forEach((label, i) => {
      bars.appendChild(el("span", {}, label));
      const holder = el("div");
      const bar = el("div", { class: "bar" + (label === out.prediction ? " chosen" : "") });
      bar.style.width = `${Math.round(260 * out.probs[i])}px`;
      holder.appendChild(bar);
      bars.appendChild(holder);
      bars.appendChild(el("span", {}, out.probs[i].toFixed(3)));
    });
    box.appendChild(bars);
  } else if (out.kind === "next_token") {
    renderNextToken(box);
  } else if (out.kind === "masked_lm") {
    box.appendChild(el("p", {}, "Most likely token at each position: " + out.predicted.map(show).join(" ")));
  }
}

function renderNextToken(box) {
  const out = record.output;
  box.appendChild(el("h3", {}, "Next token"));
  const controls = el("div", { class: "sampling" });
  const keep = state.sampling;  // the controls keep their values from one input to the next
  controls.innerHTML = `<label>temperature <input id="temperature" type="range" min="0.05" max="2" step="0.05" value="${keep.t}">
    <span id="temperature-value">1.00</span></label>
    <label>top-k <input id="top-k" type="number" min="0" max="${out.ids.length}" value="${keep.k}" style="width:5em"></label>
    <label>top-p <input id="top-p" type="range" min="0.05" max="1" step="0.05" value="${keep.p}"> <span id="top-p-value">1.00</span></label>`;
  box.appendChild(controls);
  box.appendChild(el("div", { id: "next-bars", class: "bars" }));
  box.appendChild(el("p", { class: "hint" }, `Probabilities among the ${out.ids.length} most likely of ` +
    `${out.vocab_size} tokens (at temperature 1, with no top-k or top-p, they are the model's exact ones).`));
  for (const id of ["temperature", "top-k", "top-p"]) $(id).addEventListener("input", drawNextToken);
  drawNextToken();
}

// softmax(logits / T) among the kept candidates, then top-k and top-p, renormalised
function sampling(logits, logZ, temperature, topK, topP) {
  let probs;
  if (Math.abs(temperature - 1) < 1e-9) probs = logits.map(l => Math.exp(l - logZ));
  else {
    const m = Math.max(...logits) / temperature;
    const e = logits.map(l => Math.exp(l / temperature - m));
    const z = e.reduce((a, b) => a + b, 0);
    probs = e.map(x => x / z);
  }
  const keep = probs.map(() => true);
  if (topK > 0) probs.forEach((_, i) => { if (i >= topK) keep[i] = false; });
  if (topP < 1) {
    let mass = 0;
    probs.forEach((p, i) => { if (mass >= topP) keep[i] = false; mass += p; });
  }
  const total = probs.reduce((a, p, i) => a + (keep[i] ? p : 0), 0);
  const filtered = topK > 0 || topP < 1;
  return probs.map((p, i) => keep[i] ? (filtered ? p / total : p) : 0);
}

function drawNextToken() {
  const out = record.output;
  state.sampling = { t: $("temperature").value, k: $("top-k").value || "0", p: $("top-p").value };
  const t = parseFloat($("temperature").value), k = parseInt($("top-k").value || "0", 10), p = parseFloat($("top-p").value);
  $("temperature-value").textContent = t.toFixed(2);
  $("top-p-value").textContent = p.toFixed(2);
  const probs = sampling(out.logits, out.log_z, t, k, p);
  const bars = $("next-bars");
  bars.replaceChildren();
  probs.slice(0, 15).forEach((q, i) => {
    bars.appendChild(el("span", { class: "next-token" }, show(out.tokens[i])));
    const holder = el("div");
    const bar = el("div", { class: "bar" + (i === 0 ? " chosen" : "") });
    bar.style.width = `${Math.round(260 * q)}px`;
    holder.appendChild(bar);
    bars.appendChild(holder);
    bars.appendChild(el("span", { class: "next-prob" }, q.toFixed(4)));
  });
}

// ---- head view: lines from each query token to the key tokens, one colour per head
function renderHeadView() {
  const kind = $("head-kind").value, layer = parseInt($("head-layer").value, 10);
  const weights = record.attention[kind][layer];  // [H][T][S]
  const q = queryTokens(kind), k = keyTokens(kind), nHeads = weights.length;
  if (state.headsOn.length !== nHeads) state.headsOn = Array(nHeads).fill(true);
  const swatches = $("head-swatches");
  swatches.replaceChildren(...weights.map((_, h) => {
    const s = el("span", { class: "swatch" + (state.headsOn[h] ? "" : " off"), "data-head": h, title: `head ${h}`,
      tabindex: 0, role: "button", "aria-pressed": String(state.headsOn[h]), "aria-label": `head ${h}` });
    s.style.background = headColour(h);
    s.appendChild(el("span", { class: "swatch-label" }, String(h)));
    const toggle = () => { state.headsOn[h] = !state.headsOn[h]; renderHeadView(); focusSwatch(h); };
    const alone = () => { state.headsOn = state.headsOn.map((_, i) => i === h); renderHeadView(); focusSwatch(h); };
    s.addEventListener("click", toggle);
    s.addEventListener("dblclick", alone);
    s.addEventListener("keydown", e => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); (e.shiftKey ? alone : toggle)(); }
      else if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
        e.preventDefault(); focusSwatch((h + (e.key === "ArrowRight" ? 1 : nHeads - 1)) % nHeads);
      }
    });
    return s;
  }));
  const svg = $("head-svg"), rowH = 24, width = 620, top = 40;
  const leftX = 150, rightX = width - 150;
  svg.setAttribute("width", width);
  svg.setAttribute("height", top + rowH * Math.max(q.length, k.length) + 10);
  svg.replaceChildren();
  svg.appendChild(svgEl("text", { x: leftX, y: 12, "text-anchor": "end", class: "caption" })).textContent = "queries";
  svg.appendChild(svgEl("text", { x: rightX, y: 12, class: "caption" })).textContent = "keys";
  const lines = svgEl("g", { id: "head-lines" });
  svg.appendChild(lines);
  const shown = state.headsOn.filter(Boolean).length;
  let slot = 0;
  weights.forEach((rows, h) => {
    if (!state.headsOn[h]) return;
    const dy = shown > 1 ? (slot++ - (shown - 1) / 2) * Math.min(3, 12 / shown) : 0;  // heads side by side, not blended
    rows.forEach((row, i) => row.forEach((w, j) => {
      if (w < 0.01) return;
      lines.appendChild(svgEl("line", { x1: leftX + 6, y1: top + i * rowH + dy, x2: rightX - 6, y2: top + j * rowH + dy,
        stroke: headColour(h), "stroke-width": 2, "stroke-opacity": Math.min(1, w).toFixed(3),
        "data-i": i, "data-j": j, "data-head": h }));
    }));
  });
  const hover = (side, index, on) => {
    svg.querySelectorAll("line").forEach(line => {
      line.classList.toggle("dim", on && line.getAttribute(side === "left" ? "data-i" : "data-j") !== String(index));
    });
    svg.querySelectorAll(`text.${side}`).forEach(t => t.classList.toggle("hl", on && t.dataset.index === String(index)));
  };
  const token = (side, tok, index, n) => {
    const t = svgEl("text", side === "left" ? { x: leftX, y: top + index * rowH, "text-anchor": "end",
      class: "token left", "data-index": index } : { x: rightX, y: top + index * rowH, class: "token right",
      "data-index": index });
    t.setAttribute("tabindex", "0");
    t.setAttribute("aria-label", `${side === "left" ? "query" : "key"} ${index}: ${tok}`);
    t.textContent = show(tok);
    t.addEventListener("mouseenter", () => hover(side, index, true));
    t.addEventListener("mouseleave", () => hover(side, index, false));
    t.addEventListener("focus", () => hover(side, index, true));
    t.addEventListener("blur", () => hover(side, index, false));
    t.addEventListener("keydown", e => {
      const step = { ArrowDown: 1, ArrowUp: -1 }[e.key];
      const other = { ArrowRight: "right", ArrowLeft: "left" }[e.key];
      let next = null;
      if (step) next = svg.querySelector(`text.${side}[data-index="${(index + step + n) % n}"]`);
      if (other && other !== side) next = svg.querySelector(`text.${other}[data-index="0"]`);
      if (next) { e.preventDefault(); next.focus(); }
    });
    svg.appendChild(t);
  };
  q.forEach((tok, i) => token("left", tok, i, q.length));
  k.forEach((tok, j) => token("right", tok, j, k.length));
}

function focusSwatch(h) {
  const s = document.querySelector(`#head-swatches .swatch[data-head="${h}"]`);
  if (s) s.focus();
}

// ---- model view: every layer x head as a small heatmap
function drawCanvas(canvas, matrix, size, max) {
  const t = matrix.length, s = matrix[0].length, cell = Math.max(1, Math.floor(size / Math.max(t, s)));
  canvas.width = s * cell; canvas.height = t * cell;
  const ctx = canvas.getContext("2d");
  matrix.forEach((row, i) => row.forEach((v, j) => {
    ctx.fillStyle = colour(max > 0 ? v / max : 0); ctx.fillRect(j * cell, i * cell, cell, cell);
  }));
}

// the colour scale's top for one head's weights: its own largest weight, or 1 for every head
function scaleMax(matrix) {
  return $("model-scale").value === "shared" ? 1 : Math.max(1e-9, ...matrix.map(r => Math.max(...r)));
}

function renderModelView() {
  const kind = $("model-kind").value, layers = record.attention[kind], grid = $("model-grid");
  const nHeads = layers[0].length, nLayers = layers.length;
  const shared = $("model-scale").value === "shared";
  $("model-legend").replaceChildren(shared ? legend(0, 1, { caption: "every head on one scale: weight 0 to 1" })
    : legend(0, 1, { hiText: "its largest", loText: "0",
      caption: "each head on its own scale, from 0 to its largest weight (shown on hover), so that diffuse heads show too" }));
  grid.style.gridTemplateColumns = `max-content repeat(${nHeads}, max-content)`;
  grid.replaceChildren(el("div"));
  for (let h = 0; h < nHeads; h++) grid.appendChild(el("div", { class: "label" }, `head ${h}`));
  layers.forEach((heads, l) => {
    grid.appendChild(el("div", { class: "label" }, `layer ${l}`));
    heads.forEach((matrix, h) => {
      const max = scaleMax(matrix);
      const canvas = el("canvas", { class: "cell-view", "data-layer": l, "data-head": h, "data-max": max, tabindex: 0,
        role: "button", title: `layer ${l}, head ${h} (colour scale 0 to ${fmt(max)})`,
        "aria-label": `layer ${l}, head ${h}` });
      drawCanvas(canvas, matrix, 72, max);
      canvas.addEventListener("click", () => { state.enlarged = [kind, l, h]; renderEnlarged(); });
      canvas.addEventListener("keydown", e => {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); state.enlarged = [kind, l, h]; renderEnlarged(); return; }
        const move = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] }[e.key];
        if (!move) return;
        e.preventDefault();
        const next = document.querySelector(`#model-grid canvas[data-layer="${(l + move[0] + nLayers) % nLayers}"]` +
          `[data-head="${(h + move[1] + nHeads) % nHeads}"]`);
        if (next) next.focus();
      });
      grid.appendChild(canvas);
    });
  });
  renderEnlarged();
}

function renderEnlarged() {
  const box = $("model-enlarged");
  box.replaceChildren();
  document.querySelectorAll("#model-grid canvas").forEach(c => c.classList.remove("selected"));
  if (!state.enlarged || state.enlarged[0] !== $("model-kind").value) return;
  const [kind, l, h] = state.enlarged;
  const sel = document.querySelector(`#model-grid canvas[data-layer="${l}"][data-head="${h}"]`);
  if (sel) sel.classList.add("selected");
  const matrix = record.attention[kind][l][h];
  box.appendChild(figure(`${KIND_NAMES[kind]}, layer ${l}, head ${h}`,
    heatmap(matrix, queryTokens(kind), keyTokens(kind), { cls: "enlarged", max: scaleMax(matrix),
      caption: "attention weight: rows are queries, columns keys" })));
}

// ---- alignment, masks, positions, statistics
function meanOverHeads(heads) {
  return heads[0].map((row, i) => row.map((_, j) => heads.reduce((a, m) => a + m[i][j], 0) / heads.length));
}

function renderAlignment() {
  const box = $("alignment");
  box.replaceChildren();
  if (!record.attention.cross) return;
  const l = parseInt($("alignment-layer").value, 10);
  const matrix = meanOverHeads(record.attention.cross[l]);
  box.appendChild(figure(`target (rows) over source (columns), layer ${l}, mean of heads`,
    heatmap(matrix, record.tokens.decoder, record.tokens.encoder, { cls: "alignment",
      caption: "mean attention weight" })));
}

function renderMasks() {
  const box = $("masks");
  box.replaceChildren();
  for (const kind of Object.keys(record.masks)) {
    box.appendChild(figure(`${KIND_NAMES[kind]}: ${record.mask_notes[kind]}`,
      heatmap(record.masks[kind], queryTokens(kind), keyTokens(kind), { cls: "mask", loText: "0: masked",
        hiText: "1: may attend" })));
  }
}

function renderPositions() {
  const kind = $("positions-kind").value, pos = record.positions[kind], box = $("positions");
  box.replaceChildren();
  $("positions-head-label").style.display = pos.bias ? "" : "none";
  if (pos.table) {
    const rows = pos.table.map((_, i) => String(i)), cols = pos.table[0].map((_, j) => String(j));
    const max = Math.max(...pos.table.flat().map(Math.abs));
    const shown = pos.table_shown;
    const part = shown ? ` (positions 0\u2013${shown.positions - 1} of ${shown.of_positions}, dimensions ` +
      `0\u2013${shown.dims - 1} of ${shown.of_dims}${shown.dims < shown.of_dims || shown.positions < shown.of_positions ?
        ": a part of the table" : ""})` : "";
    box.appendChild(figure(`${pos.scheme} position encodings: positions (rows) x dimensions (columns)${part}`,
      heatmap(pos.table, rows, cols, { diverging: true, max, cls: "positions-table", cell: 7, labelEvery: 8,
        caption: "encoding value" })));
  }
  if (pos.angles) {
    const rows = pos.angles.map((_, i) => String(i)), cols = pos.inv_freq.map(f => f.toPrecision(2));
    box.appendChild(figure("RoPE: cos(position x frequency) for each rotated pair (columns: frequency)",
      heatmap(pos.angles, rows, cols, { diverging: true, max: 1, cls: "positions-rope", cell: 9, labelEvery: 4,
        caption: "cos(position x frequency)" })));
  }
  if (pos.bias) {
    const h = parseInt($("positions-head").value || "0", 10), matrix = pos.bias[h];
    const max = Math.max(...matrix.flat().map(Math.abs));
    box.appendChild(figure(`${pos.scheme} bias added to head ${h}'s scores (queries x keys)`,
      heatmap(matrix, queryTokens(kind), keyTokens(kind), { diverging: true, max, cls: "positions-bias",
        caption: "bias added to the score" })));
  }
  if (!pos.table && !pos.angles && !pos.bias) box.appendChild(el("p", {}, `positions: ${pos.scheme}`));
}

function renderStats() {
  const kind = $("stats-kind").value, metric = $("stats-metric").value, layers = record.stats[kind], box = $("stats");
  const table = el("table", { class: "stats" }), head = el("tr");
  head.appendChild(el("th", {}, "layer \\ head"));
  layers[0].forEach((_, h) => head.appendChild(el("th", {}, String(h))));
  table.appendChild(head);
  const values = layers.flat().map(s => s[metric]).filter(v => v !== null);
  const max = Math.max(1e-9, ...values);
  layers.forEach((heads, l) => {
    const tr = el("tr");
    tr.appendChild(el("th", {}, String(l)));
    heads.forEach(s => {
      const v = s[metric], td = el("td", { class: "stat" }, v === null ? "\u2013" : v.toFixed(3));
      if (v !== null) { td.style.background = colour(v / max); td.style.color = v / max > 0.6 ? "#000" : "#fff"; }
      tr.appendChild(td);
    });
    table.appendChild(tr);
  });
  const unit = { entropy: "bits", distance: "positions", first: "weight", punctuation: "weight" }[metric];
  box.replaceChildren(legend(0, max, { caption: `${metric} (${unit}); the colours run from 0 to the table's largest value` }),
    table);
}

// ---- wiring
function renderAll() {
  renderHeader();
  renderOutput();
  const ks = kinds();
  for (const id of ["head-kind", "model-kind", "stats-kind"]) {
    fill($(id), ks, ks.map(k => KIND_NAMES[k]));
    if (record.attention.cross && !state.chosen) $(id).value = "cross";  // a translation opens on cross-attention
  }
  state.chosen = true;
  const nLayers = record.attention[$("head-kind").value].length;
  fill($("head-layer"), [...Array(nLayers).keys()].map(String));
  if (record.attention.cross) {
    fill($("alignment-layer"), [...record.attention.cross.keys()].map(String));
    $("alignment-layer").value = String(record.attention.cross.length - 1);  // the last layer first
  }
  fill($("positions-kind"), Object.keys(record.positions));
  const anyBias = Object.values(record.positions).find(p => p.bias);
  fill($("positions-head"), anyBias ? [...anyBias.bias.keys()].map(String) : ["0"]);
  document.querySelector('#tabs button[data-view="alignment"]').disabled = !record.attention.cross;
  state.headsOn = [];
  renderHeadView(); renderModelView(); renderAlignment(); renderMasks(); renderPositions(); renderStats();
  resetSteps();
}

function select(view) {
  document.querySelectorAll("#tabs button").forEach(b => {
    b.classList.toggle("active", b.dataset.view === view);
    b.setAttribute("aria-selected", String(b.dataset.view === view));
  });
  document.querySelectorAll(".view").forEach(v => v.classList.toggle("active", v.id === `view-${view}`));
  document.body.dataset.view = view;
  if (view === "steps" || view === "neurons") showSteps();
}

function wire() {
  document.querySelectorAll("#tabs button").forEach(b => b.addEventListener("click", () => select(b.dataset.view)));
  $("head-kind").addEventListener("change", () => {
    fill($("head-layer"), [...Array(record.attention[$("head-kind").value].length).keys()].map(String));
    state.headsOn = [];
    renderHeadView();
  });
  $("head-layer").addEventListener("change", renderHeadView);
  $("model-kind").addEventListener("change", renderModelView);
  $("model-scale").addEventListener("change", renderModelView);
  wireSteps();
  $("alignment-layer").addEventListener("change", renderAlignment);
  $("positions-kind").addEventListener("change", renderPositions);
  $("positions-head").addEventListener("change", renderPositions);
  $("stats-kind").addEventListener("change", renderStats);
  $("stats-metric").addEventListener("change", renderStats);
  $("input-form").addEventListener("submit", async event => {
    event.preventDefault();
    if (state.busy) return;  // one input at a time from this page
    const status = $("status"), button = $("inspect-button");
    const request = { text: $("input-text").value };
    if (!$("beam-label").hidden && $("beam").value) request.beam = parseInt($("beam").value, 10);
    state.busy = true;
    button.disabled = true;
    status.textContent = "running\u2026";
    try {
      const answer = await postJSON("api/inspect", request);
      if (answer.error) { status.textContent = answer.error; return; }
      record = answer.body;
      status.textContent = "";
      renderAll();
    } finally {
      state.busy = false;
      button.disabled = false;
    }
  });
}

// POST a JSON body; {body} or {error: a sentence}, whatever the server (or the network) answered
async function postJSON(url, body) {
  let response;
  try {
    response = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body) });
  } catch (e) {
    return { error: `the server did not answer (${e.message || e}); is aiayn inspect still running?` };
  }
  const text = await response.text();
  let parsed = null;
  try { parsed = JSON.parse(text); } catch (e) { parsed = null; }
  if (response.ok && parsed) return { body: parsed };
  const retry = response.headers.get("Retry-After");
  const why = parsed && parsed.error ? parsed.error : `the server answered ${response.status} ${response.statusText}`;
  return { error: why + (response.status === 429 && retry && !(parsed && parsed.error) ? `; try again in ${retry} s` : "") };
}

record = JSON.parse($("record").textContent);
wire();
renderAll();
document.body.dataset.ready = "1";
