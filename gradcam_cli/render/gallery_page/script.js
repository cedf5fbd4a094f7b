(function () {
  "use strict";
  const parseStarted = performance.now();
  const entries = JSON.parse(document.getElementById("gallery-data").textContent);
  const parseMs = (performance.now() - parseStarted).toFixed(1);
  const cards = document.getElementById("cards");
  const count = document.getElementById("count");
  const search = document.getElementById("filter");
  const status = document.getElementById("status");
  const prev = document.getElementById("prev");
  const next = document.getElementById("next");
  const pageSize = Number(cards.dataset.pageSize) || 60;
  let page = 0;
  let shown = entries;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function pct(p) { return p === null ? "" : (100 * p).toFixed(1) + "% "; }

  // An overlay video, playing (muted, in a loop; its WebM preview where the run wrote one, which browsers play and
  // mp4v they mostly do not) beside a video model's importance over time; the link opens the full overlay.
  function clip(view, alt) {
    const box = el("div", {class: "clip"});
    const video = el("video", {class: "thumb", src: view.preview || view.href, controls: "", muted: "", loop: "",
      playsinline: "", preload: "metadata", "aria-label": alt});
    video.muted = true;  // the attribute sets the default only
    if (view.thumb) video.setAttribute("poster", view.thumb);
    box.append(video, el("a", {class: "open", href: view.href}, "video"));
    if (view.curve) {
      const link = el("a", {href: view.curve});
      link.append(el("img", {class: "curve", src: view.curve, loading: "lazy", decoding: "async",
        alt: "importance over time"}));
      box.append(link);
    }
    return box;
  }

  // A scan's map: each plane's strip of slices (one square each: inferior to superior, posterior to anterior, left
  // to right) seen through a square window that the plane's own slider moves, from the slice through the map's peak.
  function plane(shown, view, alt) {
    const box = el("div", {class: "slices", "data-plane": shown.plane});
    const count = shown.count;
    const frame = el("a", {class: "thumb window", href: view.href});
    const strip = el("img", {class: "strip", src: shown.src, loading: "lazy", decoding: "async",
      alt: alt + " " + shown.plane});
    frame.append(strip);
    const range = el("input", {type: "range", min: "0", max: String(count - 1), step: "1",
      value: String(shown.start), "aria-label": shown.plane + " slice"});
    const label = el("span", {class: "p"});
    function move() {
      const i = Number(range.value);
      strip.style.transform = "translateY(" + (-100 * i / count) + "%)";
      label.textContent = shown.plane + " slice " + (i + 1) + " of " + count;
      box.dataset.slice = String(i);
    }
    range.addEventListener("input", move);
    move();
    box.append(frame, range, label);
    return box;
  }
  function planes(view, alt) {
    const box = el("div", {class: "planes"});
    for (const shown of view.planes) box.append(plane(shown, view, alt));
    return box;
  }

  function card(entry) {
    const node = el("article", {class: "card " + entry.status, "data-status": entry.status});
    if (entry.views.some(v => v.kind === "video")) node.classList.add("wide");  // the video beside its curve
    if (entry.views.some(v => v.planes)) node.classList.add("scan");  // three planes side by side
    const head = el("h2");
    head.append(el("a", {href: entry.src}, entry.name));
    node.append(head);
    const views = el("div", {class: "views"});
    for (const view of entry.views) {
      const figure = el("figure");
      const alt = (view.method || "") + " " + (view.target ? view.target[0] : "");
      if (view.kind === "video") {
        figure.classList.add("wide");
        figure.append(clip(view, alt));
      } else if (view.planes) {
        figure.classList.add("wide");
        figure.append(planes(view, alt));
      } else {
        const link = el("a", {href: view.href});
        if (view.thumb) {
          link.append(el("img", {class: "thumb", src: view.thumb, loading: "lazy", decoding: "async", alt: alt}));
        } else {
          link.append(el("span", {class: "thumb none"}, "open"));
        }
        figure.append(link);
      }
      const caption = el("figcaption");
      caption.append(document.createTextNode((view.method || "") + " · "));
      if (view.target) {
        caption.append(document.createTextNode(view.target[0] + " "));
        caption.append(el("span", {class: "p"}, pct(view.target[1]) + (view.target[2] >= 0 ? "(#" + view.target[2] + ")" : "")));
      } else {
        caption.append(el("span", {class: "p"}, "top class per frame"));
      }
      if (view.files.length) {
        const links = el("div", {class: "links"});
        for (const [label, href] of view.files) links.append(el("a", {href: href}, label));
        caption.append(links);
      }
      figure.append(caption);
      views.append(figure);
    }
    if (entry.views.length) node.append(views);
    if (entry.files.length) {
      const files = el("div", {class: "files"}, "all views: ");
      for (const [label, href] of entry.files) files.append(el("a", {href: href}, label));
      node.append(files);
    }
    if (entry.predictions.length) {
      const list = el("ol", {class: "preds", title: "top predictions"});
      for (const [name, p, index] of entry.predictions) {
        list.append(el("li", {}, name + " " + pct(p) + (index >= 0 ? "(#" + index + ")" : "")));
      }
      node.append(list);
    }
    if (entry.error) node.append(el("p", {class: "err"}, entry.error));
    if (entry.status === "skipped") node.append(el("p", {}, "skipped: outputs from an earlier run"));
    return node;
  }

  function applyFilter() {
    const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
    const wanted = status.value;
    shown = entries.filter(function (entry) {
      if (wanted !== "all" && entry.status !== wanted) return false;
      if (!words.length) return true;
      const parts = [entry.name, ...entry.predictions.map(p => p[0])];
      for (const v of entry.views) parts.push(v.method || "", v.target ? v.target[0] : "");
      const text = parts.join(" ").toLowerCase();
      return words.every(w => text.includes(w));
    });
    page = 0;
    render();
  }

  function render() {
    const started = performance.now();
    const pages = Math.max(1, Math.ceil(shown.length / pageSize));
    page = Math.min(Math.max(page, 0), pages - 1);
    const start = page * pageSize;
    const slice = shown.slice(start, start + pageSize);
    const fragment = document.createDocumentFragment();
    for (const entry of slice) fragment.append(card(entry));
    cards.replaceChildren(fragment);
    cards.dataset.shown = String(slice.length);
    cards.dataset.total = String(shown.length);
    cards.dataset.renderMs = (performance.now() - started).toFixed(1);
    const range = (start + 1) + "\u2013" + (start + slice.length);
    count.textContent = shown.length
      ? "showing " + range + " of " + shown.length + " images (page " + (page + 1) + " of " + pages + ")"
      : "no images match";
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
    if (history.replaceState) history.replaceState(null, "", "#page=" + (page + 1));
  }

  prev.addEventListener("click", function () { page -= 1; render(); window.scrollTo(0, 0); });
  next.addEventListener("click", function () { page += 1; render(); window.scrollTo(0, 0); });
  search.addEventListener("input", applyFilter);
  status.addEventListener("change", applyFilter);
  const match = /page=(\d+)/.exec(location.hash);
  if (match) page = Number(match[1]) - 1;
  render();
  cards.dataset.parseMs = parseMs;
})();
