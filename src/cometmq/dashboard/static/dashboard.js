/* cometmq dashboard: live line charts (inline SVG), confirmed actions, body tabs. No dependencies. */
"use strict";
(function () {
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea"];
  const NS = "http://www.w3.org/2000/svg";
  const W = 600, H = 160, PAD_L = 48, PAD_B = 18, PAD_T = 8;

  function el(name, attrs, text) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
    return a >= 10 || v === 0 ? v.toFixed(0) : v.toFixed(1);
  }

  function draw(fig, data) {
    const svg = fig.querySelector("svg");
    const names = fig.dataset.series.split(",");
    const unit = fig.dataset.unit || "";
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    let t0 = Infinity, t1 = -Infinity, vmax = 0, points = 0;
    for (const n of names) for (const [t, v] of data[n] || []) {
      t0 = Math.min(t0, t); t1 = Math.max(t1, t); vmax = Math.max(vmax, v); points++;
    }
    const legend = fig.querySelector(".legend");
    legend.textContent = "";
    if (points === 0) {
      svg.appendChild(el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, "waiting for samples…"));
      return;
    }
    if (t1 === t0) t0 = t1 - 1000;
    vmax = vmax > 0 ? vmax * 1.1 : 1;
    const x = t => PAD_L + (W - PAD_L - 4) * (t - t0) / (t1 - t0);
    const y = v => PAD_T + (H - PAD_T - PAD_B) * (1 - v / vmax);
    for (const f of [0, 0.5, 1]) {
      const v = vmax * f;
      svg.appendChild(el("line", {x1: PAD_L, x2: W - 4, y1: y(v), y2: y(v), class: "grid"}));
      svg.appendChild(el("text", {x: PAD_L - 4, y: y(v) + 4, "text-anchor": "end", class: "axis"}, fmt(v)));
    }
    const clock = t => new Date(t).toLocaleTimeString();
    svg.appendChild(el("text", {x: PAD_L, y: H - 4, class: "axis"}, clock(t0)));
    svg.appendChild(el("text", {x: W - 4, y: H - 4, "text-anchor": "end", class: "axis"}, clock(t1)));
    names.forEach((n, i) => {
      const pts = data[n] || [];
      const color = COLORS[i % COLORS.length];
      if (pts.length) {
        svg.appendChild(el("polyline", {points: pts.map(([t, v]) => x(t).toFixed(1) + "," + y(v).toFixed(1)).join(" "),
                                        fill: "none", stroke: color, "stroke-width": 1.5,
                                        "vector-effect": "non-scaling-stroke"}));
        const [lt, lv] = pts[pts.length - 1];  // the newest point (the only one, early on) as a dot
        svg.appendChild(el("circle", {cx: x(lt), cy: y(lv), r: 2.5, fill: color}));
      }
      const last = pts.length ? pts[pts.length - 1][1] : null;
      const item = document.createElement("span");
      item.style.color = color;
      item.textContent = n.split(":").slice(-1)[0] + ": " + (last === null ? "-" : fmt(last) + " " + unit);
      legend.appendChild(item);
    });
  }

  async function refresh(figs) {
    const names = new Set();
    figs.forEach(f => f.dataset.series.split(",").forEach(n => names.add(n)));
    const q = Array.from(names).map(n => "name=" + encodeURIComponent(n)).join("&");
    try {
      const r = await fetch("/api/series?" + q, {cache: "no-store"});
      const body = await r.json();
      figs.forEach(f => draw(f, body.series));
      return body.interval;
    } catch (e) {
      return 5;
    }
  }

  function charts() {
    const figs = Array.from(document.querySelectorAll("figure.chart"));
    if (!figs.length) return;
    const loop = async () => {
      const interval = await refresh(figs);
      setTimeout(loop, Math.max(1, interval || 5) * 1000);
    };
    loop();
  }

  function confirms() {
    document.querySelectorAll("form[data-confirm]").forEach(form => {
      form.addEventListener("submit", ev => {
        if (!window.confirm(form.dataset.confirm)) { ev.preventDefault(); return; }
        form.querySelector("input[name=confirm]").value = "yes";
      });
    });
  }

  function tabs() {
    document.querySelectorAll("[data-tabs]").forEach(bar => {
      const buttons = Array.from(bar.querySelectorAll("button[data-tab]"));
      const show = name => {
        buttons.forEach(b => b.classList.toggle("active", b.dataset.tab === name));
        document.querySelectorAll("[data-pane]").forEach(p => { p.hidden = p.dataset.pane !== name; });
      };
      buttons.forEach(b => b.addEventListener("click", () => show(b.dataset.tab)));
      if (buttons.length) show(buttons[0].dataset.tab);
    });
  }

  document.addEventListener("DOMContentLoaded", () => { confirms(); tabs(); charts(); });
})();
