// Small SVG charts for the dashboard: grouped bars, horizontal stacked bars, step lines, a
// heat strip per row and tick marks on a time axis. No library: each chart is a few dozen
// lines, sized to its container's width at render time (1 SVG unit = 1 CSS pixel).

const NS = 'http://www.w3.org/2000/svg';

export const PALETTE = ['#4e79a7', '#e15759', '#59a14f', '#b07aa1', '#76b7b2', '#edc948',
  '#ff9da7', '#9c755f', '#f28e2b', '#bab0ac'];

export function el(tag, attrs = {}, children = []) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  for (const c of children) node.append(c);
  return node;
}

function title(text) {
  const t = el('title');
  t.textContent = text;
  return t;
}

function label(x, y, text, attrs = {}) {
  const t = el('text', { x, y, ...attrs });
  t.textContent = text;
  return t;
}

/** Round tick values, about `count` of them, from lo up to the first one at or above hi. */
export function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const ticks = [];
  let v = Math.ceil(lo / step) * step;
  for (; v < hi - step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  ticks.push(+v.toPrecision(12));
  return ticks;
}

function widthOf(container, fallback = 600) {
  return Math.max(320, Math.floor(container.clientWidth || fallback));
}

function mount(container, svg) {
  container.replaceChildren(svg);
  return svg;
}

export function legend(items) {
  const div = document.createElement('div');
  div.className = 'legend';
  for (const it of items) {
    const span = document.createElement('span');
    const sw = document.createElement('span');
    sw.className = 'sw';
    sw.style.background = it.color;
    if (it.dashed) sw.style.background = `repeating-linear-gradient(90deg, ${it.color} 0 4px, transparent 4px 6px)`;
    span.append(sw, it.label);
    div.append(span);
  }
  return div;
}

function yAxis(g, ticks, y, x0, x1, fmt) {
  for (const t of ticks) {
    g.append(el('line', { x1: x0, x2: x1, y1: y(t), y2: y(t), class: 'gridline', stroke: '#eceef2' }));
    g.append(label(x0 - 6, y(t) + 4, fmt(t), { 'text-anchor': 'end' }));
  }
}

/**
 * Grouped vertical bars. groups: [{label, bars: [{value, color, title, attrs}]}].
 */
export function groupedBars(container, { groups, yFormat, yTitle, height = 220 }) {
  const W = widthOf(container);
  const m = { l: 64, r: 12, t: 10, b: 34 };
  const max = Math.max(0, ...groups.flatMap((g) => g.bars.map((b) => b.value)));
  const ticks = niceTicks(0, max || 1, 4);
  const top = ticks[ticks.length - 1];
  const y = (v) => m.t + (height - m.t - m.b) * (1 - v / top);
  const svg = el('svg', { viewBox: `0 0 ${W} ${height}`, role: 'img' });
  const g = el('g');
  yAxis(g, ticks, y, m.l, W - m.r, yFormat);
  if (yTitle) g.append(label(12, m.t + (height - m.b) / 2, yTitle, { transform: `rotate(-90 12 ${m.t + (height - m.b) / 2})`, 'text-anchor': 'middle' }));
  const gw = (W - m.l - m.r) / Math.max(1, groups.length);
  groups.forEach((grp, i) => {
    const n = grp.bars.length;
    const inner = Math.min(gw * 0.8, n * 36);
    const bw = inner / Math.max(1, n);
    const x0 = m.l + i * gw + (gw - inner) / 2;
    grp.bars.forEach((b, j) => {
      const h = Math.max(0, y(0) - y(b.value));
      g.append(el('rect', { class: 'bar', x: x0 + j * bw + 1, y: y(b.value), width: Math.max(1, bw - 2), height: h,
        fill: b.color, 'fill-opacity': b.faded ? 0.45 : 1, ...(b.attrs || {}) }, [title(b.title)]));
    });
    g.append(label(m.l + i * gw + gw / 2, height - m.b + 16, grp.label, { 'text-anchor': 'middle' }));
  });
  g.append(el('line', { x1: m.l, x2: W - m.r, y1: y(0), y2: y(0), stroke: '#b8bec8' }));
  svg.append(g);
  return mount(container, svg);
}

/**
 * Horizontal stacked bars, one row per item. rows: [{label, segments: [{value, color, title, attrs}]}].
 * All rows share one scale (the largest row total), so longer spans show as longer bars.
 */
export function stackedRows(container, { rows, xFormat, rowHeight = 26 }) {
  const W = widthOf(container);
  const m = { l: 70, r: 16, t: 6, b: 26 };
  const H = m.t + m.b + rows.length * (rowHeight + 8);
  const max = Math.max(0, ...rows.map((r) => r.segments.reduce((s, x) => s + x.value, 0)));
  // The longest row spans the full width; ticks stop inside it.
  const right = max || 1;
  const ticks = niceTicks(0, right, 6).filter((t) => t <= right);
  const x = (v) => m.l + (W - m.l - m.r) * (v / right);
  const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  for (const t of ticks) {
    svg.append(el('line', { x1: x(t), x2: x(t), y1: m.t, y2: H - m.b, stroke: '#eceef2' }));
    svg.append(label(x(t), H - m.b + 16, xFormat(t), { 'text-anchor': 'middle' }));
  }
  rows.forEach((row, i) => {
    const top = m.t + i * (rowHeight + 8) + 4;
    const g = el('g', row.attrs || {});
    g.append(label(m.l - 8, top + rowHeight / 2 + 4, row.label, { 'text-anchor': 'end', fill: '#1d2330' }));
    let acc = 0;
    for (const s of row.segments) {
      const w = x(acc + s.value) - x(acc);
      g.append(el('rect', { class: 'seg', x: x(acc), y: top, width: Math.max(0, w), height: rowHeight, fill: s.color,
        ...(s.attrs || {}) }, [title(s.title)]));
      if (w > 8 * s.text.length && s.text) {
        g.append(label(x(acc) + 6, top + rowHeight / 2 + 4, s.text, { class: s.dark ? 'on-light' : 'on-dark' }));
      }
      acc += s.value;
    }
    svg.append(g);
  });
  return mount(container, svg);
}

/**
 * Step lines over time. series: [{label, color, dashed, points: [[x, y], ...]}]; each value holds
 * until the next point (counters), and the last one until xMax.
 */
export function stepLines(container, { series, xMax, xFormat, yFormat, yMax, height = 230 }) {
  const W = widthOf(container);
  const m = { l: 64, r: 14, t: 10, b: 28 };
  const top = yMax ?? Math.max(0, ...series.flatMap((s) => s.points.map((p) => p[1])));
  const yt = niceTicks(0, top || 1, 4);
  const yTop = yMax ?? yt[yt.length - 1];
  const xt = niceTicks(0, xMax || 1, 6).filter((t) => t <= xMax);
  const x = (v) => m.l + (W - m.l - m.r) * (v / (xMax || 1));
  const y = (v) => m.t + (height - m.t - m.b) * (1 - v / yTop);
  const svg = el('svg', { viewBox: `0 0 ${W} ${height}`, role: 'img' });
  yAxis(svg, yt.filter((t) => t <= yTop), y, m.l, W - m.r, yFormat);
  for (const t of xt) svg.append(label(x(t), height - m.b + 16, xFormat(t), { 'text-anchor': 'middle' }));
  svg.append(el('line', { x1: m.l, x2: W - m.r, y1: y(0), y2: y(0), stroke: '#b8bec8' }));
  for (const s of series) {
    if (!s.points.length) continue;
    let d = `M${x(s.points[0][0]).toFixed(1)},${y(s.points[0][1]).toFixed(1)}`;
    for (let i = 1; i < s.points.length; i++) {
      d += `H${x(s.points[i][0]).toFixed(1)}V${y(s.points[i][1]).toFixed(1)}`;
    }
    d += `H${x(xMax).toFixed(1)}`;
    svg.append(el('path', { d, fill: 'none', stroke: s.color, 'stroke-width': 1.6,
      'stroke-dasharray': s.dashed ? '5 3' : null, ...(s.attrs || {}) }, [title(s.label)]));
  }
  return mount(container, svg);
}

/**
 * One strip per row, coloured by a 0..1 value held from each point to the next (link load).
 * rows: [{label, points: [[x, v], ...], attrs}].
 */
export function heatStrips(container, { rows, xMax, xFormat, valueText, color, rowHeight = 16 }) {
  const W = widthOf(container);
  const labelW = Math.min(260, Math.max(90, ...rows.map((r) => r.label.length * 6.2)));
  const m = { l: labelW + 10, r: 14, t: 6, b: 28 };
  const H = m.t + m.b + rows.length * (rowHeight + 3);
  const x = (v) => m.l + (W - m.l - m.r) * (v / (xMax || 1));
  const svg = el('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  for (const t of niceTicks(0, xMax || 1, 6).filter((t) => t <= xMax)) {
    svg.append(el('line', { x1: x(t), x2: x(t), y1: m.t, y2: H - m.b, stroke: '#eceef2' }));
    svg.append(label(x(t), H - m.b + 16, xFormat(t), { 'text-anchor': 'middle' }));
  }
  rows.forEach((row, i) => {
    const top = m.t + i * (rowHeight + 3);
    const g = el('g', row.attrs || {});
    g.append(label(m.l - 8, top + rowHeight / 2 + 4, row.label, { 'text-anchor': 'end', fill: '#1d2330' }));
    g.append(el('rect', { x: m.l, y: top, width: W - m.l - m.r, height: rowHeight, fill: '#f3f4f6' }));
    row.points.forEach(([t, v], j) => {
      const end = j + 1 < row.points.length ? row.points[j + 1][0] : xMax;
      if (v <= 0 || end <= t) return;
      g.append(el('rect', { x: x(t), y: top, width: Math.max(0.8, x(end) - x(t)), height: rowHeight, fill: color(v) },
        [title(`${row.label}: ${valueText(v, j)} from ${xFormat(t)} to ${xFormat(end)}`)]));
    });
    svg.append(g);
  });
  return mount(container, svg);
}

/** Tick marks on a time axis (rollbacks). marks: [{x, title}]. */
export function timeMarks(container, { marks, xMax, xFormat, height = 54 }) {
  const W = widthOf(container);
  const m = { l: 12, r: 14, t: 8, b: 24 };
  const x = (v) => m.l + (W - m.l - m.r) * (v / (xMax || 1));
  const svg = el('svg', { viewBox: `0 0 ${W} ${height}`, role: 'img' });
  svg.append(el('line', { x1: m.l, x2: W - m.r, y1: height - m.b, y2: height - m.b, stroke: '#b8bec8' }));
  for (const t of niceTicks(0, xMax || 1, 6).filter((t) => t <= xMax)) {
    svg.append(label(x(t), height - m.b + 16, xFormat(t), { 'text-anchor': 'middle' }));
  }
  for (const mk of marks) {
    svg.append(el('line', { x1: x(mk.x), x2: x(mk.x), y1: m.t, y2: height - m.b, stroke: '#c0392b', 'stroke-width': 1.5 },
      [title(mk.title)]));
  }
  return mount(container, svg);
}
