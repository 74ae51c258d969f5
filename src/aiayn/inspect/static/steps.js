// The explorer's step-through and neuron views: one attention computation, stage by stage, with the numbers the
// model computed (aiayn.inspect.stepthrough). A served page asks the server (POST api/steps) for any layer, head and
// query token; an offline page or a notebook shows the one the record holds (record.steps).
"use strict";

const stepView = { data: null, asked: null, running: false };

function stepSelection() {
  return { kind: $("steps-kind").value, layer: parseInt($("steps-layer").value, 10),
    head: parseInt($("steps-head").value, 10), query: parseInt($("steps-query").value, 10) };
}
function sameSelection(a, b) {
  return !!a && !!b && a.kind === b.kind && a.layer === b.layer && a.head === b.head && a.query === b.query;
}

function fillStepOptions() {
  const kind = $("steps-kind").value, heads = record.attention[kind][0].length;
  fill($("steps-layer"), [...record.attention[kind].keys()].map(String));
  fill($("steps-head"), [...Array(heads).keys()].map(String));
  const q = queryTokens(kind);
  fill($("steps-query"), q.map((_, i) => String(i)), q.map((t, i) => `${i}: ${show(t)}`));
}

function setSelection(sel) {
  $("steps-kind").value = sel.kind;
  fillStepOptions();
  $("steps-layer").value = String(sel.layer);
  $("steps-head").value = String(sel.head);
  $("steps-query").value = String(sel.query);
}

// a new record: its selectors, and the record's own step-through if it has one
function resetSteps() {
  const available = !!record.ids;
  for (const view of ["steps", "neurons"]) {
    document.querySelector(`#tabs button[data-view="${view}"]`).disabled = !available;
  }
  stepView.data = record.steps || null;
  stepView.asked = null;
  if (!available) return;
  const kinds = Object.keys(record.attention), before = $("steps-kind").value;
  fill($("steps-kind"), kinds, kinds.map(k => KIND_NAMES[k]));
  if (record.steps) setSelection(record.steps);
  else {
    const kind = kinds.includes(before) ? before : record.attention.cross ? "cross" : kinds[0];
    $("steps-kind").value = kind;
    fillStepOptions();
    if (!$("steps-query").dataset.chosen) $("steps-query").value = String(queryTokens(kind).length - 1);
  }
  const view = document.body.dataset.view;
  if (view === "steps" || view === "neurons") showSteps();
}

function wireSteps() {
  $("steps-kind").addEventListener("change", () => { fillStepOptions(); showSteps(); });
  for (const id of ["steps-layer", "steps-head", "steps-query"]) {
    $(id).addEventListener("change", () => { $(id).dataset.chosen = "1"; showSteps(); });
  }
}

async function showSteps() {
  const sel = stepSelection(), status = $("steps-status");
  if (!record.ids) return;
  if (stepView.data && sameSelection(stepView.data, sel)) {
    stepView.asked = { ...sel, of: record };
    status.textContent = "";
    renderSteps(stepView.data);
    renderNeurons(stepView.data);
    return;
  }
  if (document.body.dataset.served !== "1") {
    const held = record.steps;
    $("steps").replaceChildren();
    $("neurons").replaceChildren();
    status.textContent = held ? `This page holds the step-through of ${KIND_NAMES[held.kind]}, layer ${held.layer}, ` +
      `head ${held.head}, query ${held.query} only; serve it with aiayn inspect to step through any other.` :
      "This page holds no step-through; serve it with aiayn inspect, or make it with inspect_text(..., steps=True).";
    if (held) {
      const back = el("button", { type: "button", id: "steps-held" }, "show it");
      back.addEventListener("click", () => { setSelection(held); showSteps(); });
      status.appendChild(back);
    }
    return;
  }
  // one request at a time: a choice made while one runs is asked for when it returns (the latest choice only)
  stepView.asked = { ...sel, of: record };
  status.textContent = "computing\u2026";
  if (stepView.running) return;
  stepView.running = true;
  try {
    for (;;) {
      const asking = stepView.asked;
      const answer = await postJSON("api/steps", { ids: asking.of.ids, kind: asking.kind, layer: asking.layer,
        head: asking.head, query: asking.query });
      const now = stepView.asked;
      if (!now || now.of !== asking.of || !sameSelection(now, asking)) {  // another choice was made meanwhile
        if (!now || (now.of === record && sameSelection(stepView.data, now))) return;  // shown already
        continue;
      }
      if (answer.error) { status.textContent = answer.error; return; }
      stepView.data = answer.body;
      status.textContent = "";
      renderSteps(answer.body);
      renderNeurons(answer.body);
      return;
    }
  } finally {
    stepView.running = false;
  }
}

// ---- drawing
// a vector as a strip of cells on a blue-white-red scale (its own, or opts.max), with its first numbers and legend
function vectorStrip(values, opts) {
  opts = opts || {};
  const max = opts.max !== undefined ? opts.max : maxAbs(values);
  const wrap = el("div", { class: "vector" });
  const strip = el("div", { class: "strip" });
  const width = Math.max(3, Math.min(14, Math.floor((opts.width || 520) / Math.max(1, values.length))));
  values.forEach((v, i) => {
    const cell = el("span", { class: "vcell", "data-i": i, "data-value": v, title: `${i}: ${fmt(v)}` });
    cell.style.width = `${width}px`;
    cell.style.background = diverging(v, max);
    if (opts.mark && i >= opts.mark[0] && i < opts.mark[1]) cell.classList.add("marked");
    strip.appendChild(cell);
  });
  wrap.appendChild(strip);
  if (!opts.noNumbers) {
    const shown = values.slice(0, 8).map(fmt).join("  ");
    wrap.appendChild(el("div", { class: "numbers" }, values.length > 8 ? `${shown}  \u2026 (${values.length} values)` : shown));
  }
  if (!opts.noLegend) wrap.appendChild(legend(-max, max, { diverging: true }));
  return wrap;
}

function stageHead(st) {
  const head = el("div", { class: "stage-head" });
  head.appendChild(el("b", {}, st.title));
  head.appendChild(el("code", {}, st.formula));
  if (st.shape) head.appendChild(el("span", { class: "hint" }, st.shape));
  return head;
}

function stageRow(st) {
  const row = el("div", { class: "stage", "data-id": st.id });
  row.appendChild(stageHead(st));
  const v = st.values;
  if (!v.length) return row;
  if (Array.isArray(v[0])) {
    const rows = st.rows || v.map((_, i) => String(i)), cols = v[0].map((_, j) => String(j));
    row.appendChild(heatmap(v, rows, cols, { diverging: true, max: maxAbs(v.flat()), cell: Math.min(14,
      Math.max(4, Math.floor(480 / cols.length))), labelEvery: cols.length > 32 ? 8 : 1, cls: "stage-matrix" }));
  } else {
    row.appendChild(vectorStrip(v, { mark: st.mark }));
  }
  return row;
}

const PER_KEY_HEADS = { dots: "q\u00b7k", scaled: "\u00d7 scale", bias: "+ bias", capped: "capped", scores: "score",
  allowed: "mask", masked: "masked", weights: "softmax" };

function scoresTable(stages, keys) {
  const table = el("table", { class: "scores" }), head = el("tr");
  head.appendChild(el("th", {}, "key"));
  stages.forEach(st => head.appendChild(el("th", { title: `${st.title}: ${st.formula}` }, PER_KEY_HEADS[st.id] || st.id)));
  table.appendChild(head);
  const weights = stages.find(st => st.id === "weights");
  const best = weights ? weights.values.indexOf(Math.max(...weights.values)) : -1;
  keys.forEach((key, j) => {
    const tr = el("tr", { class: j === best ? "best" : "" });
    tr.appendChild(el("th", { class: "key" }, `${j}: ${show(key)}`));
    stages.forEach(st => {
      const v = st.values[j];
      const td = el("td", { class: `num ${st.id}`, "data-stage": st.id, "data-key": j, "data-value": v === null ? "" : String(v) });
      if (st.id === "allowed") td.textContent = v ? "\u2713" : "\u2717 masked";
      else if (st.id === "masked" && v === null) td.textContent = "\u2212\u221e";
      else if (st.id === "weights") {
        const bar = el("span", { class: "wbar" });
        bar.style.width = `${Math.round(80 * v)}px`;
        td.appendChild(bar);
        td.appendChild(el("span", {}, ` ${fmt(v)}`));
      } else td.textContent = fmt(v);
      tr.appendChild(td);
    });
    table.appendChild(tr);
  });
  return table;
}

function renderSteps(data) {
  const box = $("steps");
  box.replaceChildren();
  box.appendChild(el("p", { class: "steps-what" }, `${KIND_NAMES[data.kind]}, layer ${data.layer}, head ${data.head} ` +
    `of ${data.n_heads}, query ${data.query} (${show(data.query_token)}) over ${data.key_tokens.length} keys; d_k = ` +
    `${data.head_dim}, ${data.norm_position}-norm, positions ${data.position}`));
  let group = null, section = null, perKey = [];
  const flush = () => {
    if (perKey.length) group.appendChild(scoresTable(perKey, data.key_tokens));
    perKey = [];
  };
  for (const st of data.stages) {
    if (st.section !== section) {
      if (group) flush();
      section = st.section;
      group = el("section", { class: "stage-group", "data-section": section });
      group.appendChild(el("h3", {}, section));
      box.appendChild(group);
    }
    if (st.per_key) { perKey.push(st); continue; }
    flush();
    group.appendChild(stageRow(st));
  }
  flush();
}

function renderNeurons(data) {
  const box = $("neurons"), n = data.neurons;
  box.replaceChildren();
  box.appendChild(el("p", { class: "steps-what" }, `${KIND_NAMES[data.kind]}, layer ${data.layer}, head ${data.head}, ` +
    `query ${data.query} (${show(data.query_token)}); score = (q\u00b7k) \u00d7 ${fmt(n.scale)}` +
    (n.bias ? " + bias" : "")));
  const vecMax = maxAbs([...n.q, ...n.k.flat()]), prodMax = maxAbs(n.qk.flat());
  const legends = el("div", { class: "neuron-legends" });
  legends.appendChild(legend(-vecMax, vecMax, { diverging: true, caption: "q and k" }));
  legends.appendChild(legend(-prodMax, prodMax, { diverging: true, caption: "q \u00b7 k elementwise" }));
  box.appendChild(legends);
  const table = el("table", { class: "neurons" }), head = el("tr");
  for (const h of ["", "k (key vector)", "q \u00b7 k (elementwise)", "sum", "score", "weight"]) head.appendChild(el("th", {}, h));
  table.appendChild(head);
  const qRow = el("tr", { class: "query-row" });
  qRow.appendChild(el("th", { class: "key" }, `q: ${show(data.query_token)}`));
  const qCell = el("td", { colspan: 2 });
  qCell.appendChild(vectorStrip(n.q, { max: vecMax, noNumbers: true, noLegend: true, width: 300 }));
  qRow.appendChild(qCell);
  qRow.appendChild(el("td", { colspan: 3, class: "hint" }, "the query vector, against each key below"));
  table.appendChild(qRow);
  data.key_tokens.forEach((key, j) => {
    const tr = el("tr", { class: "key-row" + (n.allowed[j] ? "" : " masked"), "data-key": j });
    tr.appendChild(el("th", { class: "key" }, `${j}: ${show(key)}`));
    const k = el("td"), prod = el("td");
    k.appendChild(vectorStrip(n.k[j], { max: vecMax, noNumbers: true, noLegend: true, width: 300 }));
    prod.appendChild(vectorStrip(n.qk[j], { max: prodMax, noNumbers: true, noLegend: true, width: 300 }));
    tr.appendChild(k);
    tr.appendChild(prod);
    tr.appendChild(el("td", { class: "num dot", "data-value": n.dots[j] }, fmt(n.dots[j])));
    tr.appendChild(el("td", { class: "num score", "data-value": n.scores[j] }, n.allowed[j] ? fmt(n.scores[j]) : "masked"));
    const w = el("td", { class: "num weight", "data-value": n.weights[j] });
    const bar = el("span", { class: "wbar" });
    bar.style.width = `${Math.round(80 * n.weights[j])}px`;
    w.appendChild(bar);
    w.appendChild(el("span", {}, ` ${fmt(n.weights[j])}`));
    tr.appendChild(w);
    table.appendChild(tr);
  });
  box.appendChild(table);
}
