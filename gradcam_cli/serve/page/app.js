// gradcam serve's page. Every text from the server is set with textContent (never innerHTML); maps arrive once as
// 16-bit values packed in a PNG (red: high byte, green: low byte) and are coloured and blended here, so colormap and
// opacity change without a request.
"use strict";
const $ = (id) => document.getElementById(id);
const state = { info: null, image: null, photo: null, map: null, values: null, answer: null, offset: 0, total: 0,
  inputOffset: 0, inputTotal: 0, asked: null, word: null };
const PAGE = 25;
const INPUTS_PAGE = 50;  // inputs listed (and thumbnails shown) at a time

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

// A file name as the console and the gallery show it (io/display.py's displayable): control characters and line
// separators escaped, so that a tab or a newline in a name reads \t, \n (the server already escaped bytes that
// are not UTF-8, \xNN).
const ESCAPES = { "\t": "\\t", "\n": "\\n", "\r": "\\r", "\u2028": "\\u2028", "\u2029": "\\u2029" };
function shownName(name) {
  return String(name).replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g,
    (c) => ESCAPES[c] || "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
}

function say(text) { $("status").textContent = text; }

async function api(url, options) {
  const response = await fetch(url, options);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function loadImage(url) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("cannot load " + url));
    img.src = url;
  });
}

function pixelsOf(img) {
  const c = document.createElement("canvas");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext("2d");
  ctx.drawImage(img, 0, 0);
  return ctx.getImageData(0, 0, c.width, c.height);
}

function unpack(data) {  // the packed PNG's 16-bit values, as floats in [0, 1]
  const n = data.width * data.height, out = new Float32Array(n), d = data.data;
  for (let i = 0; i < n; i++) out[i] = (d[4 * i] * 256 + d[4 * i + 1]) / 65535;
  return out;
}

function paint(canvas, photo, values, boxes) {
  const table = state.info.colormaps[$("colormap").value];
  const alpha = parseFloat($("alpha").value);
  canvas.width = photo.width; canvas.height = photo.height;
  const ctx = canvas.getContext("2d");
  const out = ctx.createImageData(photo.width, photo.height);
  const p = photo.data, o = out.data;
  for (let i = 0; i < values.length; i++) {
    const c = table[Math.round(values[i] * 255)];
    for (let ch = 0; ch < 3; ch++) o[4 * i + ch] = Math.round((1 - alpha) * p[4 * i + ch] + alpha * c[ch]);
    o[4 * i + 3] = 255;
  }
  ctx.putImageData(out, 0, 0);
  ctx.lineWidth = 2; ctx.strokeStyle = "#fff";
  for (const box of boxes || []) ctx.strokeRect(box[0], box[1], box[2] - box[0], box[3] - box[1]);
}

function redraw() {
  if (!state.values) return;
  const a = state.answer;
  const boxes = (a.rank === null) ? [] : (a.rank === 0 ? a.predictions.map((p) => p.box) : [a.target.box]);
  paint($("view"), state.photo, state.values, boxes.filter(Boolean));
  for (const fig of $("compare").children) paint(fig.firstChild, state.photo, fig.values, []);
}

function setSelect(select, items, chosen) {
  select.replaceChildren();
  for (const [value, label] of items) {
    const option = el("option", label, { value });
    if (value === chosen) option.selected = true;
    select.append(option);
  }
}

async function explain(params) {
  if (!state.image) return;
  const model = state.info.model;
  const q = new URLSearchParams({ image: state.image, layer: $("layer").value, method: $("method").value });
  for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  say("explaining...");
  try {
    await showMap(await api("/api/map?" + q));
    showPredictions(state.answer, model);
  } catch (error) { say("error: " + error.message); }
}

async function showMap(answer) {  // a map the server computed (or kept): fetched once, coloured here
  const img = await loadImage(`/api/maps/${answer.id}.png`);
  state.answer = answer;
  state.values = unpack(pixelsOf(img));
  const cm = encodeURIComponent($("colormap").value), al = $("alpha").value;
  $("dl-overlay").href = `/api/maps/${answer.id}/overlay.png?colormap=${cm}&alpha=${al}`;
  $("dl-heatmap").href = `/api/maps/${answer.id}/heatmap.png?colormap=${cm}`;
  $("dl-npy").href = `/api/maps/${answer.id}/map.npy`;
  $("caption").textContent = `${answer.method} for ${answer.target.name} at ${answer.layer}` +
    (answer.forward ? "" : " (no forward pass)");
  $("faith-out").textContent = "";
  const m = state.info.model;  // a class's map is measured, or a vision-language model's whole answer's
  const measured = m.curves && (m.answers ? answer.spec === "answer" : answer.spec === null);
  $("faith").hidden = !measured;
  $("faith-road").parentNode.hidden = !measured || Boolean(m.answers);
  redraw();
  $("view").dataset.mapId = answer.id;
  say("");
}

// A vision-language model: a question about the image, its answer's map, then a clicked word's (the answer is kept
// on the server: a click maps it, nothing is generated again).
function showPhoto() {
  const canvas = $("view");
  canvas.width = state.photo.width; canvas.height = state.photo.height;
  canvas.getContext("2d").putImageData(state.photo, 0, 0);
}

async function ask() {
  if (!state.image) return;
  if (!$("prompt").value.trim()) { say("type a question about the image"); return; }
  say("answering...");
  try {
    const body = { image: state.image, prompt: $("prompt").value, answer: $("given").value || null,
      layer: $("layer").value, method: $("method").value };
    const asked = await api("/api/ask", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body) });
    state.asked = asked; state.word = null;
    $("answer-note").textContent = asked.note ||
      `${asked.generated ? "Answer" : "Given answer"}: ${asked.answer} (log p ${asked.logprob.toFixed(3)})`;
    const words = $("answer-words");
    words.replaceChildren(...(asked.map ? [el("button", "whole answer", { type: "button", "data-word": "" })] : []));
    asked.words.forEach((w, i) => words.append(el("button", w.text, { type: "button", "data-word": String(i) })));
    for (const button of words.children) {
      button.onclick = () => wordMap(button.dataset.word === "" ? null : Number(button.dataset.word));
    }
    markWord();
    if (asked.map) await showMap(asked.map);
    else { state.values = null; state.answer = null; showPhoto(); say(""); }
  } catch (error) { say("error: " + error.message); }
}

function markWord() {
  const chosen = state.word === null ? "" : String(state.word);
  for (const button of $("answer-words").children) button.classList.toggle("chosen", button.dataset.word === chosen);
}

async function wordMap(word) {  // null: the whole answer
  if (!state.asked || !state.asked.map) return;
  const q = new URLSearchParams({ layer: $("layer").value, method: $("method").value });
  if (word !== null) q.set("word", word);
  say("explaining...");
  try {
    const answer = await api(`/api/answers/${state.asked.id}/map?` + q);
    state.word = word; markWord();
    await showMap(answer);
  } catch (error) { say("error: " + error.message); }
}

function showPredictions(answer, model) {
  const ranked = model.per_detection;  // a detector's: per detection, and every detection combined
  const list = $("predictions");
  list.replaceChildren();
  const kind = state.info.model.kind;  // classify, embed (no classes: no list) or clip (its prompts ranked)
  $("pred-title").textContent = kind === "clip" ? "Prompts" : kind === "embed" ? "" : model.listed;
  for (const spec of state.info.model.targets) {  // the command's --target defaults, one click each
    const button = el("button", spec, { type: "button", "data-spec": spec });
    if (answer.spec === spec) button.classList.add("chosen");
    button.onclick = () => { $("target").value = spec; explain({ target: spec }); };
    const item = el("li"); item.append(button); list.append(item);
  }
  if (ranked) {
    const all = el("button", "all detections", { type: "button", "data-rank": "0" });
    if (answer.rank === 0) all.classList.add("chosen");
    all.onclick = () => explain({ rank: 0 });
    list.append(el("li")); list.lastChild.append(all);
  }
  answer.predictions.forEach((p, i) => {
    let text = `${p.name} ${(100 * p.probability).toFixed(1)}%`;
    if (p.share !== undefined) text += ` on ${(100 * p.share).toFixed(1)}% of the pixels`;
    const button = el("button", text, { type: "button", "data-index": p.index });
    const chosen = ranked ? answer.rank === i + 1 : !answer.spec && answer.target.index === p.index;
    if (chosen) button.classList.add("chosen");
    button.onclick = () => (ranked ? explain({ rank: i + 1 }) : explain({ target: String(p.index) }));
    const item = el("li"); item.append(button); list.append(item);
  });
}

function markChosen(id) {
  for (const button of $("strip").children) button.classList.toggle("chosen", button.dataset.id === id);
  if ([...$("inputs").options].some((o) => o.value === id)) $("inputs").value = id;
}

async function chooseImage(id) {
  state.image = id;
  markChosen(id);
  try {
    state.photo = pixelsOf(await loadImage(`/api/images/${id}.png`));
  } catch (error) {  // e.g. a run row whose input is not where the run record says: the server's own message
    state.values = null; state.answer = null;
    $("view").width = 1; $("view").height = 1; $("caption").textContent = "";
    try { await api(`/api/images/${id}.png`); say("error: cannot show this image"); } catch (e) { say("error: " + e.message); }
    return;
  }
  $("compare").replaceChildren();
  const model = state.info.model;
  if (model && model.answers) {  // asked again about the new image, if a question is typed
    state.values = null; state.answer = null; state.asked = null;
    $("answer-words").replaceChildren(); $("answer-note").textContent = ""; $("caption").textContent = "";
    showPhoto();
    if ($("prompt").value.trim()) await ask(); else say("ask a question about the image");
    return;
  }
  if (model && model.kind === "embed" && !model.targets.length) {  // no classes: the target field asks for maps
    if ($("target").value.includes(":")) await explain({ target: $("target").value });
    else { state.values = null; state.answer = null; say("this model embeds images: type a target, e.g. similar:NAME (a served input or an upload)"); }
    return;
  }
  await explain({});
}

async function upload(file) {
  say("uploading...");
  try {
    const body = await api("/api/upload?name=" + encodeURIComponent(file.name), { method: "POST", body: file });
    const known = [...$("inputs").options].find((o) => o.value === body.id);
    if (known) known.textContent = shownName(body.name);
    else { $("inputs").append(el("option", shownName(body.name), { value: body.id })); $("strip").append(thumbnail(body)); }
    await chooseImage(body.id);
  } catch (error) { say("error: " + error.message); }
}

function thumbnail(image) {
  const button = el("button", null, { type: "button", "data-id": image.id, title: shownName(image.name) });
  button.append(el("img", null, { src: `/api/images/${image.id}.png?thumb=1`, alt: shownName(image.name), loading: "lazy" }));
  button.onclick = () => chooseImage(image.id);
  return button;
}

// The served inputs (then the uploads kept), a page at a time, searched on the server; the strip shows them.
async function loadInputs() {
  const q = new URLSearchParams({ offset: state.inputOffset, limit: INPUTS_PAGE });
  if ($("input-q").value) q.set("q", $("input-q").value);
  const page = await api("/api/images?" + q);
  state.inputTotal = page.total;
  setSelect($("inputs"), [["", "(choose)"], ...page.images.map((i) => [i.id, shownName(i.name)])], "");
  $("strip").replaceChildren(...page.images.map(thumbnail));
  const last = Math.min(state.inputOffset + INPUTS_PAGE, page.total);
  $("inputs-label").textContent = `${page.total ? state.inputOffset + 1 : 0}-${last} of ${page.total}`;
  if (state.image) markChosen(state.image);
  return page.images;
}

function addCompare() {
  if (!state.values) return;
  if ($("compare").children.length >= 4) $("compare").firstChild.remove();
  const fig = el("figure"); const canvas = el("canvas");
  fig.values = state.values;
  fig.append(canvas, el("figcaption", $("caption").textContent));
  $("compare").append(fig);
  redraw();
}

async function faithfulness() {
  if (!state.answer) return;
  say("measuring...");
  try {
    const road = $("faith-road").checked ? "?road=1" : "";
    const f = await api(`/api/maps/${state.answer.id}/faithfulness${road}`);
    $("faith-out").textContent = `deletion AUC ${f.deletion_auc.toFixed(3)}  insertion AUC ${f.insertion_auc.toFixed(3)}` +
      (f.road !== undefined ? `  ROAD ${f.road.toFixed(3)}` : "");
    say("");
  } catch (error) { say("error: " + error.message); }
}

// The run view: a page of rows at a time, filtered and sorted on the server.
function runQuery() {
  const q = new URLSearchParams({ offset: state.offset, limit: PAGE, sort: $("f-sort").value });
  if ($("f-desc").checked) q.set("order", "desc");
  for (const [key, id] of [["q", "f-q"], ["predicted", "f-predicted"], ["target", "f-target"], ["status", "f-status"],
    ["drift", "f-drift"]]) {
    if ($(id).value) q.set(key, $(id).value);
  }
  for (const [key, id] of [["pmin", "f-pmin"], ["pmax", "f-pmax"]]) {  // typed in percent, as the table shows them
    const text = $(id).value.trim().replace(/%$/, "");
    if (!text) continue;
    const value = Number(text);
    if (!Number.isFinite(value) || value < 0 || value > 100) throw new Error(`p: ${$(id).value} is not a percentage (0-100)`);
    q.set(key, String(value / 100));
  }
  return q;
}

async function loadRows() {
  try {
    const page = await api("/api/run/rows?" + runQuery());  // runQuery's own mistakes are said as the server's
    state.total = page.total;
    const body = $("rows-body");
    body.replaceChildren();
    for (const row of page.rows) {
      const tr = el("tr", null, { "data-row": row.row });
      if (row.status === "error") tr.classList.add("failed");
      const prob = row.probability === null ? "" : (100 * row.probability).toFixed(1) + "%";
      for (const cell of [row.row, shownName(row.input), row.status, row.error || "", row.method || "", row.target_name || "",
        prob, row.predicted_name || "", row.drift || ""]) tr.append(el("td", cell));
      tr.onclick = () => showRow(row);
      body.append(tr);
    }
    const last = Math.min(state.offset + PAGE, state.total);
    $("page-label").textContent = `${state.total ? state.offset + 1 : 0}-${last} of ${state.total}`;
    say("");  // an earlier filter's error is over
  } catch (error) { say("error: " + error.message); }
}

// A clip row's overlay video, a frame at a time (decoded on the server): a slider over its frames.
const VIDEO = /\.(mp4|avi|mov|mkv|webm)$/i;
function scrubber(row) {
  const box = el("div", null, { id: "scrubber" });
  const img = el("img", null, { id: "frame-view", alt: "overlay frame" });
  const range = el("input", null, { id: "frame-scrub", type: "range", min: "0", max: "0", step: "1", value: "0",
    "aria-label": "frame" });
  const label = el("span", "", { id: "frame-label" });
  box.append(el("div", null, {}), img);
  box.firstChild.append(el("label", "Frame "), range, label);
  let fps = 0, total = 0;
  const show = () => {
    const f = Number(range.value);
    label.textContent = `${f + 1} of ${total}` + (fps ? ` (${(f / fps).toFixed(2)} s)` : "");
    img.src = `/api/run/rows/${row.row}/frames/${f}.jpg`;
    img.dataset.frame = String(f);
  };
  range.oninput = show;
  api(`/api/run/rows/${row.row}/frames`).then((facts) => {
    fps = facts.fps; total = facts.frames;
    range.max = String(Math.max(0, total - 1));
    show();
  }).catch((error) => say("error: " + error.message));
  return box;
}

// A scan's row: its map over the scan in three planes through the map's peak, drawn on the server a slice at a time,
// a slider per plane (slices in world order: inferior to superior, posterior to anterior, left to right) and the
// classes the run mapped for the scan (their rows), one chosen at a time.
const NIFTI = /\.nii(\.gz)?$/i;
function scanViewer(row) {
  const box = el("div", null, { id: "scan-view" });
  const choice = el("select", null, { id: "scan-class", "aria-label": "class" });
  const planes = el("div", null, { class: "planes" });
  box.append(el("label", "Class "), choice, planes);
  let shown = row.row;
  const draws = [];
  api(`/api/run/rows/${row.row}/scan`).then((facts) => {
    if (facts.missing) say(facts.missing);
    setSelect(choice, facts.classes.map((c) => [String(c.row), c.index === null ? c.name : `${c.name} (#${c.index})`]),
      String(row.row));
    for (const p of facts.planes) {
      const figure = el("figure", null, { "data-plane": p.plane });
      const img = el("img", null, { id: `scan-${p.plane}`, alt: `${p.plane} slice` });
      const range = el("input", null, { id: `scan-${p.plane}-slice`, type: "range", min: "0", max: String(p.count - 1),
        step: "1", value: String(p.backwards ? p.count - 1 - p.peak : p.peak), "aria-label": `${p.plane} slice` });
      const label = el("figcaption", "", { id: `scan-${p.plane}-label` });
      const draw = () => {
        const v = Number(range.value);
        const k = p.backwards ? p.count - 1 - v : v;
        img.src = `/api/run/rows/${shown}/scan/${p.plane}/${k}.png`;
        img.dataset.slice = String(k);
        img.dataset.row = String(shown);
        label.textContent = `${p.plane} ${p.axis}=${k} (${v + 1} of ${p.count})` + (k === p.peak ? ", the peak" : "");
      };
      range.oninput = draw;
      draws.push(draw);
      figure.append(img, range, label);
      planes.append(figure);
      draw();
    }
    choice.onchange = () => { shown = Number(choice.value); for (const draw of draws) draw(); };
  }).catch((error) => say("error: " + error.message));
  return box;
}

function showRow(row) {
  const detail = $("row-detail");
  detail.replaceChildren(el("h3", shownName(row.input)));
  if (row.error) detail.append(el("p", row.error));
  if (row.status !== "error" && row.outputs.some((out) => VIDEO.test(out))) detail.append(scrubber(row));
  if (row.status !== "error" && row.outputs.some((out) => NIFTI.test(out))) detail.append(scanViewer(row));
  row.outputs.forEach((out, k) => {
    if (/\.(png|jpe?g|webp)$/i.test(out)) detail.append(el("img", null, { src: `/api/run/rows/${row.row}/outputs/${k}`, alt: shownName(out) }));
  });
  if (state.info.model && row.status !== "error" && !row.outputs.some((out) => NIFTI.test(out))) {  // scans: not live
    const live = el("button", "explain live", { type: "button" });
    live.onclick = async () => { showView("image"); await chooseImage("r" + row.row); };
    detail.append(live);
  }
}

function showView(which) {
  $("image-view").hidden = which !== "image";
  $("run-view").hidden = which !== "run";
}

async function start() {
  const info = await api("/api/info");
  state.info = info;
  setSelect($("colormap"), Object.keys(info.colormaps).map((n) => [n, n]), info.colormap);
  $("alpha").value = info.alpha;
  $("colormap").onchange = redraw;
  $("alpha").oninput = redraw;
  if (info.model) {
    const m = info.model;
    $("model-name").textContent = `${m.model} (${m.task})`;
    const shape = (l) => (l.shape.length ? " " + JSON.stringify(l.shape) : "");
    const layers = m.layers.map((l) => [l.name, `${l.name}${shape(l)}${l.default ? " (default)" : ""}`]);
    if (!m.layers.some((l) => l.name === m.default_layer)) layers.unshift([m.default_layer, m.default_layer + " (default)"]);
    setSelect($("layer"), layers, m.default_layer);
    setSelect($("method"), m.methods.map((n) => [n, n]), m.default_method);
    const again = (a) => (a.spec !== null ? a.spec : String(a.target.index));  // the same target, at another layer
    $("layer").onchange = () => (m.answers ? wordMap(state.word) :
      explain({ target: state.answer && !m.per_detection ? again(state.answer) : "" }));
    $("method").onchange = $("layer").onchange;
    $("inputs").onchange = () => $("inputs").value && chooseImage($("inputs").value);
    $("input-q").oninput = () => { state.inputOffset = 0; loadInputs().catch((e) => say("error: " + e.message)); };
    $("inputs-prev").onclick = () => {
      state.inputOffset = Math.max(0, state.inputOffset - INPUTS_PAGE); loadInputs().catch((e) => say("error: " + e.message));
    };
    $("inputs-next").onclick = () => {
      if (state.inputOffset + INPUTS_PAGE < state.inputTotal) state.inputOffset += INPUTS_PAGE;
      loadInputs().catch((e) => say("error: " + e.message));
    };
    $("upload").onchange = () => $("upload").files[0] && upload($("upload").files[0]);
    const drop = $("drop");
    drop.ondragover = (e) => { e.preventDefault(); drop.classList.add("over"); };
    drop.ondragleave = () => drop.classList.remove("over");
    drop.ondrop = (e) => { e.preventDefault(); drop.classList.remove("over"); if (e.dataTransfer.files[0]) upload(e.dataTransfer.files[0]); };
    $("target-go").onclick = () => explain({ target: $("target").value });
    $("target").onkeydown = (e) => { if (e.key === "Enter") $("target-go").click(); };
    if (m.targets.length) $("target").value = m.targets[0];
    $("compare-add").onclick = addCompare;
    $("faith").onclick = faithfulness;
    $("faith").hidden = $("faith-road").parentNode.hidden = !m.curves || Boolean(m.answers);
    if (m.answers) {  // a question box in place of classes and targets
      $("answer-box").hidden = false;
      $("pred-title").hidden = $("predictions").hidden = $("target-label").hidden = $("target-go").hidden = true;
      $("ask").onclick = ask;
      $("prompt").onkeydown = $("given").onkeydown = (e) => { if (e.key === "Enter") ask(); };
    }
    const first = await loadInputs();
    if (first.length) await chooseImage(first[0].id);  // open on the first input
  } else {
    $("model-name").textContent = "(no model: run view only)";
    $("tab-image").disabled = true;
  }
  $("tab-image").onclick = () => showView("image");
  $("tab-run").onclick = () => showView("run");
  if (info.run) {
    for (const s of info.run.statuses) $("f-status").append(el("option", s, { value: s }));
    for (const d of info.run.drift) $("f-drift").append(el("option", d, { value: d }));
    setSelect($("f-sort"), info.run.columns.map((c) => [c, c]), "row");
    const head = $("rows-head");
    for (const h of ["#", "input", "status", "error", "method", "target", "p", "predicted", "drift"]) head.append(el("th", h));
    $("f-apply").onclick = () => { state.offset = 0; loadRows(); };
    $("prev").onclick = () => { state.offset = Math.max(0, state.offset - PAGE); loadRows(); };
    $("next").onclick = () => { if (state.offset + PAGE < state.total) { state.offset += PAGE; loadRows(); } };
    await loadRows();
    if (!info.model) showView("run");
  } else {
    $("tab-run").disabled = true;
  }
  document.body.dataset.ready = "1";
}

start().catch((error) => say("error: " + error.message));
