// A small line plot in inline SVG: one polyline per series over a shared time axis (no library, no inline style).

import { s } from "./dom.js";

const COLORS = ["#2f5fd0", "#d0632f", "#067647", "#9e2fd0", "#b42318", "#667085"];
const W = 480;
const H = 200;
const PAD = { left: 48, right: 12, top: 24, bottom: 28 };

export function color(i) { return COLORS[i % COLORS.length]; }

function ticks(max) {
  if (max <= 0) return [0, 1];
  const step = 10 ** Math.floor(Math.log10(max));
  const nice = [1, 2, 5, 10].map((m) => m * step).find((st) => max / st <= 5) || step * 10;
  const out = [];
  for (let v = 0; v <= max + nice / 2; v += nice) out.push(Number(v.toPrecision(6)));
  return out;
}

function label(v) {
  if (v >= 1000) return `${(v / 1000).toPrecision(3)}k`;
  return Number.isInteger(v) ? String(v) : v.toPrecision(3);
}

/**
 * plot({id, title, unit, t0, t1, series: [{name, key, points: [[t, y], ...]}]}) -> <svg>
 * t0/t1: the time span in ms (the caller gives every minute a point, 0 where nothing happened).
 */
export function plot({ title, unit = "", t0, t1, series, id }) {
  const innerW = W - PAD.left - PAD.right;
  const innerH = H - PAD.top - PAD.bottom;
  const ymax = Math.max(0, ...series.flatMap((se) => se.points.map(([, y]) => y)));
  const yt = ticks(ymax);
  const ytop = yt[yt.length - 1] || 1;
  const span = Math.max(t1 - t0, 1);
  const x = (t) => PAD.left + ((t - t0) / span) * innerW;
  const y = (v) => PAD.top + innerH - (v / ytop) * innerH;
  const svg = s("svg", { class: "plot", viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "data-plot": id });
  svg.append(s("text", { class: "title", x: PAD.left, y: 16 }, unit ? `${title} (${unit})` : title));
  for (const v of yt) {
    svg.append(s("line", { class: "axis", x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v) }));
    svg.append(s("text", { x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end" }, label(v)));
  }
  const fmt = (t) => new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  svg.append(s("text", { x: PAD.left, y: H - 8 }, fmt(t0)));
  svg.append(s("text", { x: W - PAD.right, y: H - 8, "text-anchor": "end" }, fmt(t1)));
  series.forEach((se, i) => {
    const pts = se.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    const line = s("polyline", { points: pts, stroke: color(i), "data-series": se.key });
    line.append(s("title", {}, se.name));
    svg.append(line);
    for (const [t, v] of se.points) {
      svg.append(s("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5, fill: color(i), "data-series": se.key, "data-value": v }));
    }
    const lx = W - PAD.right - 110;
    const ly = PAD.top + 4 + i * 14;
    svg.append(s("rect", { x: lx, y: ly - 8, width: 10, height: 10, fill: color(i) }));
    svg.append(s("text", { x: lx + 14, y: ly + 1, class: "legend", "data-series": se.key }, se.name));
  });
  return svg;
}
