// The phantora dashboard: reads /api/summary.json (the same TraceSummary `phantora summary`
// prints, reshaped for display) and /api/series.json (counters over time), and draws them.
// Every figure shown is the server's number, formatted; nothing is recomputed here.

import { PALETTE, groupedBars, heatStrips, legend, stackedRows, stepLines, timeMarks } from './charts.js';
import { openInPerfetto, perfettoOrigin } from './perfetto.js';

const COMPUTE = '#4e79a7';
const COMM = '#f28e2b';
const IDLE = '#cfd3da';

const $ = (id) => document.getElementById(id);

export const fmt = {
  ms: (v) => (v == null ? '–' : v >= 100 ? v.toFixed(1) : v >= 10 ? v.toFixed(2) : v.toFixed(3)),
  pct: (v) => (v == null ? '–' : `${(v * 100).toFixed(1)}%`),
  gib: (b) => (b == null ? '–' : `${(b / 2 ** 30).toFixed(2)} GiB`),
  bytes: (b) => (b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(2)} GiB` : b >= 2 ** 20 ? `${(b / 2 ** 20).toFixed(1)} MiB`
    : `${(b / 1024).toFixed(0)} KiB`),
  tflops: (v) => (v == null ? '–' : v.toFixed(1)),
  int: (v) => (v == null ? '–' : v.toLocaleString('en-US')),
};

function timeAxisFormat(spanMs) {
  return spanMs >= 2000 ? (v) => `${(v / 1000).toFixed(1)} s` : (v) => `${+v.toFixed(1)} ms`;
}

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') node.className = v;
    else if (k.startsWith('data-')) node.setAttribute(k, v);
    else node[k] = v;
  }
  node.append(...children.filter((c) => c != null));
  return node;
}

function card(labelText, valueText, note, key, raw) {
  const [number, ...unit] = valueText.split(' ');
  return h('div', { class: 'card', 'data-key': key, 'data-value': raw == null ? '' : String(raw) },
    h('div', { class: 'label' }, labelText),
    h('div', { class: 'value' }, number, unit.length ? h('span', { class: 'unit' }, unit.join(' ')) : null),
    note ? h('div', { class: 'note' }, note) : null);
}

function rankColor(rank) {
  return PALETTE[rank % PALETTE.length];
}

function renderCards(s) {
  const peakAlloc = s.memory.length ? Math.max(...s.memory.map((m) => m.allocated_bytes ?? 0)) : null;
  const st = s.steps;
  const stale = s.rollbacks.stale_replies == null ? 'stale replies not recorded' : `${fmt.int(s.rollbacks.stale_replies)} stale replies`;
  const cards = [
    card('Step time', `${fmt.ms(st.mean_ms)} ms`,
      st.count ? `mean of ${st.steady_count} of ${st.count} steps${st.count > st.steady_count ? ' (first is warm-up)' : ''}` : 'no steps found',
      'step-mean-ms', st.mean_ms),
    card('Throughput', `${fmt.tflops(s.throughput.tflops)} TFLOP/s`, `${s.throughput.gpus} GPU(s) together`, 'tflops', s.throughput.tflops),
    card('MFU', fmt.pct(s.throughput.mfu), `of ${s.throughput.peak}`, 'mfu', s.throughput.mfu),
    card('Peak memory', fmt.gib(peakAlloc), 'allocated, busiest GPU', 'peak-allocated', peakAlloc),
    card('Simulated time', `${fmt.ms(s.run.simulated_ms)} ms`, s.run.wall_seconds != null ? `in ${s.run.wall_seconds} s wall` : '',
      'simulated-ms', s.run.simulated_ms),
    card('Ranks', String(s.run.ranks), s.run.gpu ?? '', 'ranks', s.run.ranks),
    card('Rollbacks', fmt.int(s.rollbacks.count), stale, 'rollbacks', s.rollbacks.count),
    card('Unknown ops', fmt.int(s.unknown_ops.length), s.unknown_ops.length ? 'costed as zero' : 'every op estimated',
      'unknown-ops', s.unknown_ops.length),
  ];
  $('cards').replaceChildren(...cards);
  const r = s.run;
  $('run-line').textContent = [r.gpu && `GPU ${r.gpu}`, r.cluster && `cluster ${r.cluster}`, r.nodes && `${r.nodes} node(s)`,
    r.estimator && `estimator ${r.estimator}`, r.exit_code != null && `exit code ${r.exit_code}`, r.command && `command: ${r.command}`]
    .filter(Boolean).join(' · ');
}

function renderSteps(s) {
  $('step-source').textContent = s.steps.source !== 'none' ? `from ${s.steps.detail}` : '';
  const nSteps = Math.max(0, ...s.ranks.map((r) => r.step_ms.length));
  const warmup = s.steps.count > s.steps.steady_count;
  if (!nSteps) {
    $('step-chart').replaceChildren(h('p', { class: 'empty' }, `No steps found in this trace (${s.steps.detail}).`));
    $('step-table').replaceChildren();
    return;
  }
  const groups = [];
  for (let i = 0; i < nSteps; i++) {
    groups.push({
      label: `step ${i}`,
      bars: s.ranks.filter((r) => i < r.step_ms.length).map((r) => ({
        value: r.step_ms[i], color: rankColor(r.rank), faded: i === 0 && warmup,
        title: `rank ${r.rank}, step ${i}: ${fmt.ms(r.step_ms[i])} ms${i === 0 && warmup ? ' (warm-up, left out of the means)' : ''}`,
        attrs: { 'data-rank': r.rank, 'data-step': i, 'data-ms': r.step_ms[i] },
      })),
    });
  }
  const chart = $('step-chart');
  groupedBars(chart, { groups, yFormat: (v) => `${+v.toFixed(2)} ms` });
  chart.prepend(legend(s.ranks.map((r) => ({ label: `rank ${r.rank}`, color: rankColor(r.rank) }))));

  const head = h('tr', {}, h('th', {}, 'rank'), h('th', {}, 'mean step (ms)'),
    ...Array.from({ length: nSteps }, (_, i) => h('th', {}, `step ${i}`)));
  const rows = s.ranks.map((r) => h('tr', { 'data-rank': String(r.rank), 'data-mean-step-ms': String(r.mean_step_ms ?? '') },
    h('td', {}, r.label), h('td', { class: 'mean' }, fmt.ms(r.mean_step_ms)),
    ...Array.from({ length: nSteps }, (_, i) => h('td', {}, i < r.step_ms.length ? fmt.ms(r.step_ms[i]) : ''))));
  rows.push(h('tr', { class: 'overall', 'data-overall': '1', 'data-mean-step-ms': String(s.steps.mean_ms ?? '') },
    h('td', {}, 'step (slowest rank)'), h('td', { class: 'mean' }, fmt.ms(s.steps.mean_ms)),
    ...Array.from({ length: nSteps }, (_, i) => h('td', {}, i < s.steps.step_ms.length ? fmt.ms(s.steps.step_ms[i]) : ''))));
  $('step-table').replaceChildren(h('thead', {}, head), h('tbody', {}, ...rows));
}

function renderBreakdown(s) {
  const chart = $('breakdown-chart');
  if (!s.gpus.length) {
    chart.replaceChildren(h('p', { class: 'empty' }, 'No GPU work in this trace.'));
    return;
  }
  const rows = s.gpus.map((g) => {
    const share = (v) => fmt.pct(g.span_ms ? v / g.span_ms : null);
    const seg = (name, value, color, dark = false) => ({
      value, color, dark, text: `${name} ${share(value)}`,
      title: `rank ${g.rank} cuda:${g.device} ${name}: ${fmt.ms(value)} ms (${share(value)} of ${fmt.ms(g.span_ms)} ms)`,
      attrs: { 'data-part': name.replace(' ', '-'), 'data-ms': value },
    });
    return {
      label: `rank ${g.rank}` + (s.gpus.some((o) => o.rank === g.rank && o.device !== g.device) ? ` cuda:${g.device}` : ''),
      attrs: { 'data-rank': g.rank, 'data-device': g.device, 'data-span-ms': g.span_ms },
      segments: [seg('compute', g.compute_ms, COMPUTE), seg('exposed comm', g.exposed_comm_ms, COMM), seg('idle', g.idle_ms, IDLE, true)],
    };
  });
  stackedRows(chart, { rows, xFormat: (v) => `${+v.toFixed(1)} ms` });
  chart.prepend(legend([{ label: 'compute', color: COMPUTE }, { label: 'communication not overlapped by compute', color: COMM },
    { label: 'idle', color: IDLE }]));
  const head = h('tr', {}, h('th', {}, 'GPU'), h('th', {}, 'span (ms)'), h('th', {}, 'compute (ms)'), h('th', {}, 'comm (ms)'),
    h('th', {}, 'exposed comm (ms)'), h('th', {}, 'idle (ms)'), h('th', {}, 'comm overlapped'), h('th', {}, 'TFLOP/s'), h('th', {}, 'MFU'));
  const body = s.gpus.map((g) => h('tr', { 'data-rank': String(g.rank), 'data-device': String(g.device) },
    h('td', {}, `rank ${g.rank} cuda:${g.device}`), h('td', {}, fmt.ms(g.span_ms)), h('td', {}, fmt.ms(g.compute_ms)),
    h('td', {}, fmt.ms(g.comm_ms)), h('td', {}, fmt.ms(g.exposed_comm_ms)), h('td', {}, fmt.ms(g.idle_ms)),
    h('td', {}, fmt.pct(g.overlap_fraction)), h('td', {}, fmt.tflops(g.tflops)), h('td', { class: 'mfu' }, fmt.pct(g.mfu))));
  chart.append(h('table', { class: 'data', id: 'breakdown-table' }, h('thead', {}, head), h('tbody', {}, ...body)));
}

function renderMemory(s, series) {
  const chart = $('memory-chart');
  if (!series.memory.length) {
    chart.replaceChildren(h('p', { class: 'empty' }, 'No memory counters in this trace.'));
    return;
  }
  const gib = (points) => points.map(([t, b]) => [t, b / 2 ** 30]);
  const lines = series.memory.flatMap((m) => [
    { label: `rank ${m.rank} cuda:${m.device} allocated`, color: rankColor(m.rank), points: gib(m.allocated),
      attrs: { 'data-rank': m.rank, 'data-device': m.device, 'data-kind': 'allocated', 'data-points': m.allocated.length } },
    { label: `rank ${m.rank} cuda:${m.device} reserved`, color: rankColor(m.rank), dashed: true, points: gib(m.reserved),
      attrs: { 'data-rank': m.rank, 'data-device': m.device, 'data-kind': 'reserved', 'data-points': m.reserved.length } },
  ]);
  stepLines(chart, { series: lines, xMax: series.span_ms, xFormat: timeAxisFormat(series.span_ms),
    yFormat: (v) => `${+v.toFixed(2)} GiB` });
  chart.prepend(legend(s.memory.map((m) => ({
    label: `rank ${m.rank} cuda:${m.device}: peak ${fmt.gib(m.allocated_bytes)} allocated, ${fmt.gib(m.reserved_bytes)} reserved`,
    color: rankColor(m.rank),
  }))));
}

function loadColor(v) {
  // white -> orange -> dark red as the link fills up
  const t = Math.max(0, Math.min(1, v));
  const r = Math.round(255 - 60 * t);
  const g = Math.round(220 - 190 * t);
  const b = Math.round(170 - 150 * t);
  return `rgb(${r},${g},${b})`;
}

function renderNetwork(series) {
  const chart = $('network-chart');
  if (!series.links.length) {
    chart.replaceChildren(h('p', { class: 'empty' }, 'No network link counters in this trace (single GPU, or no collectives).'));
    return;
  }
  const rows = series.links.map((l) => ({
    label: l.name,
    points: l.points.map((p) => [p[0], p[1]]),
    attrs: { 'data-link': l.name, 'data-peak-utilization': Math.max(...l.points.map((p) => p[1])) },
    gbps: l.points.map((p) => p[2]),
  }));
  heatStrips(chart, {
    rows, xMax: series.span_ms, xFormat: timeAxisFormat(series.span_ms), color: loadColor,
    valueText: (v) => `${fmt.pct(v)} busy`,
  });
  chart.prepend(legend([{ label: 'idle', color: '#f3f4f6' }, { label: '50% busy', color: loadColor(0.5) },
    { label: '100% busy', color: loadColor(1) }]));
}

function renderKernels(s) {
  const head = h('tr', {}, h('th', {}, 'kernel'), h('th', {}, 'count'), h('th', {}, 'total (ms)'), h('th', {}, 'share'));
  const maxShare = Math.max(1e-9, ...s.top_kernels.map((k) => k.share));
  const rows = s.top_kernels.map((k) => {
    const bar = h('span', { class: `sharebar${k.name.startsWith('nccl') ? ' comm' : ''}` });
    bar.style.width = `${Math.round(60 * k.share / maxShare)}px`;
    return h('tr', { 'data-kernel': k.name, 'data-total-ms': String(k.total_ms), 'data-count': String(k.count) },
      h('td', { class: 'name', title: k.name }, k.name), h('td', {}, fmt.int(k.count)),
      h('td', {}, fmt.ms(k.total_ms)), h('td', {}, fmt.pct(k.share), bar));
  });
  $('kernel-table').replaceChildren(h('thead', {}, head), h('tbody', {}, ...rows));
}

function renderRollbacks(s, series) {
  const box = $('rollbacks');
  const text = h('p', { 'data-rollbacks': String(s.rollbacks.count) },
    s.rollbacks.count
      ? `${fmt.int(s.rollbacks.count)} rollback(s) of the network simulation`
        + (s.rollbacks.stale_replies == null ? '.' : `; ${fmt.int(s.rollbacks.stale_replies)} reply(ies) already given to a rank were stale.`)
      : 'No rollbacks: every flow arrived in time order.');
  box.replaceChildren(text);
  if (series.rollbacks.length) {
    const strip = h('div', { class: 'chart' });
    box.append(strip);
    timeMarks(strip, {
      marks: series.rollbacks.map((r) => ({ x: r.ms, title: `${r.name} at ${fmt.ms(r.ms)} ms` })),
      xMax: series.span_ms, xFormat: timeAxisFormat(series.span_ms),
    });
  }
  const unknown = $('unknown-ops');
  if (!s.unknown_ops.length) {
    unknown.replaceChildren(h('p', { class: 'empty' }, 'None: every op that launched GPU work got an estimate.'));
  } else {
    unknown.replaceChildren(h('table', { class: 'data' },
      h('thead', {}, h('tr', {}, h('th', {}, 'op'), h('th', {}, 'count'))),
      h('tbody', {}, ...s.unknown_ops.map((u) => h('tr', { 'data-op': u.name }, h('td', { class: 'name' }, u.name),
        h('td', {}, fmt.int(u.count)))))));
  }
}

function renderAll(s, series) {
  renderCards(s);
  renderSteps(s);
  renderBreakdown(s);
  renderMemory(s, series);
  renderNetwork(series);
  renderKernels(s);
  renderRollbacks(s, series);
}

function setupPerfettoButton(s) {
  const button = $('open-perfetto');
  const status = $('perfetto-status');
  let origin;
  try {
    origin = perfettoOrigin(window.location.search);
  } catch (e) {
    status.textContent = e.message;
    status.className = 'status bad';
    return;
  }
  button.disabled = false;
  button.title = `Opens ${origin} and sends it this trace (${fmt.bytes(s.trace_bytes)})`;
  button.addEventListener('click', async () => {
    button.disabled = true;
    status.className = 'status';
    try {
      const sent = await openInPerfetto({
        origin, traceUrl: s.trace_url, title: `phantora: ${s.file}`, fileName: s.file,
        onStatus: (t) => { status.textContent = t; },
      });
      status.textContent = `Sent ${fmt.bytes(sent)} to ${origin}.`;
      status.className = 'status ok';
    } catch (e) {
      status.textContent = `Could not open the Perfetto UI: ${e.message}`;
      status.className = 'status bad';
    } finally {
      button.disabled = false;
    }
  });
}

async function getJson(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

async function main() {
  try {
    const [summary, series] = await Promise.all([getJson('/api/summary.json'), getJson('/api/series.json')]);
    document.title = `${summary.file} · phantora dashboard`;
    $('file-name').textContent = `${summary.file} (${fmt.bytes(summary.trace_bytes)})`;
    const download = $('download-trace');
    download.href = summary.trace_url;
    download.setAttribute('download', summary.file);
    $('dashboard').hidden = false;
    if (summary.warnings && summary.warnings.length) {
      $('error').textContent = summary.warnings.join(' ');
      $('error').hidden = false;
    }
    renderAll(summary, series);
    setupPerfettoButton(summary);
    let pending;
    window.addEventListener('resize', () => {
      clearTimeout(pending);
      pending = setTimeout(() => renderAll(summary, series), 150);
    });
    document.documentElement.dataset.state = 'ready';
  } catch (e) {
    const err = $('error');
    err.hidden = false;
    err.textContent = `Could not load the dashboard data: ${e.message}`;
    document.documentElement.dataset.state = 'error';
  }
}

main();
