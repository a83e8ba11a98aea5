"""Text for the terminal: query results as aligned columns / CSV / JSON, summaries and diffs as
compact tables."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from typing import Any

import orjson

from phantora.query.db import QueryResult
from phantora.query.diff import TraceDiff
from phantora.query.summary import HOST_USES, HOST_WAITS, PYTHON_USE, HostTime, TraceSummary

FORMATS = ("table", "csv", "json")


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return repr(value) if value != int(value) or abs(value) >= 1e16 else f"{value:.1f}"
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


_NUMBER = re.compile(r"^([+-]?[\d.,]+(e[+-]?\d+)?(%|x)?|-|NULL)$")


def _blob_hex(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned text columns; columns of numbers right-aligned."""
    cells = [[v if isinstance(v, str) else _cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    numeric = [bool(cells) and all(_NUMBER.match(r[i]) for r in cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def query_result(result: QueryResult, fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps([dict(zip(result.columns, row)) for row in result.rows], default=_blob_hex,
                            option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows(["" if v is None else v for v in row] for row in result.rows)
        return buf.getvalue().rstrip("\n")
    if not result.columns:
        return "(no rows)"
    text = table(result.columns, result.rows)
    return text + f"\n({len(result.rows)} row{'s' if len(result.rows) != 1 else ''})"


def to_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


MAX_RANK_ROWS = 16  # above this many ranks, the step table lists the slowest and the spread


def host_time_lines(h: HostTime) -> list[str]:
    """Where each step's host time goes, and why the first step is long."""
    steps = "the first step" if h.steps == 1 else f"steps 2-{h.steps + 1}"
    mode = {"counted": "the program's Python counted", "measured": "the program's Python measured",
            "modelled": "host modelled per op"}.get(h.mode or "", "")
    labels = {**HOST_USES, "python": PYTHON_USE.get(h.mode or "", HOST_USES["python"])}
    out = [f"Host time per step (ms) of rank {h.rank}, mean over {steps}" + (f" ({mode})" if mode else "")
           + f": {h.bound}"]
    step = sum(h.per_step_ns.values()) or 1
    rows = [[label, _ms(h.per_step_ns[use]), _pct(h.per_step_ns[use] / step)]
            for use, label in (*labels.items(), *HOST_WAITS.items()) if h.per_step_ns.get(use)]
    out.append(table(["", "ms", "share"], rows))
    if h.first_step_startup:
        total = sum(d for _, _, d in h.first_step_startup)
        parts = ", ".join(f"{name} {_ms(d)} ms" + (f" (x{c})" if c > 1 else "") for name, c, d in h.first_step_startup[:5])
        out.append(f"Start-up costs up to the end of the first step: {_ms(total)} ms: {parts}")
    return out


def summary(s: TraceSummary) -> str:
    out = [f"trace: {s.trace}  (engine: {s.engine})",
           f"GPU: {s.gpu or 'unknown'}   ranks: {len(s.ranks)}   simulated time: "
           f"{_ms(s.simulated_ns)} ms" if s.simulated_ns is not None else
           f"GPU: {s.gpu or 'unknown'}   ranks: {len(s.ranks)}"]
    st = s.steps
    out.append("")
    out.append(f"Step times (ms) from {st.source}: {st.detail}; statistics leave out the first step, "
               "which also holds setup and warm-up")
    if st.per_rank:
        rows = []
        shown = st.per_rank
        if len(shown) > MAX_RANK_ROWS:  # at 1,000 ranks: the slowest (stragglers), then the spread
            shown = sorted(shown, key=lambda r: -(r.stats.mean_ns if r.stats else 0))[:MAX_RANK_ROWS // 2]
        for r in shown:
            x = r.stats
            later = r.durations_ns[1:]
            rows.append([f"rank {r.rank}", len(r.durations_ns), _ms(x.mean_ns) if x else "-",
                         _ms(x.median_ns) if x else "-", _ms(x.min_ns) if x else "-", _ms(x.max_ns) if x else "-",
                         _ms(r.durations_ns[0]) if r.durations_ns else "-",
                         " ".join(_ms(d) for d in later[:8]) + (" ..." if len(later) > 8 else "")])
        if len(shown) < len(st.per_rank):
            means = sorted((r.stats.mean_ns, r.rank) for r in st.per_rank if r.stats)
            if means:
                (lo, lo_rank), (hi, hi_rank) = means[0], means[-1]
                mid = means[len(means) // 2][0]
                rows.append([f"{len(st.per_rank) - len(shown)} more ranks", "", "", "", "", "", "",
                             f"(the {len(shown)} slowest by mean are shown)"])
                rows.append([f"spread of {len(means)} ranks' means", "", _ms(mid), "", _ms(lo), _ms(hi), "",
                             f"slowest rank {hi_rank}, fastest rank {lo_rank}: "
                             f"{(hi - lo) / lo * 100 if lo else 0:.2f}% apart"])
        if len(st.per_rank) > 1 and st.stats:
            x = st.stats
            rows.append(["overall", len(st.overall_ns), _ms(x.mean_ns), _ms(x.median_ns), _ms(x.min_ns),
                         _ms(x.max_ns), _ms(st.overall_ns[0]) if st.overall_ns else "-",
                         "(slowest rank of each step)"])
        out.append(table(["", "steps", "mean", "median", "min", "max", "first (with setup)", "later steps"], rows))
    if s.host is not None:
        out.append("")
        out.extend(host_time_lines(s.host))
    out.append("")
    out.append(f"GPU time (ms) over {s.window}")
    rows = [[f"rank {g.rank} cuda:{g.device}", _ms(g.span_ns), _ms(g.compute_ns), _ms(g.comm_ns),
             _ms(g.exposed_comm_ns), _ms(g.idle_ns), _pct(g.overlap_fraction),
             "-" if g.tflops is None else f"{g.tflops:.1f}", _pct(g.mfu)] for g in s.gpus]
    if s.overall and len(s.gpus) > 1:
        o = s.overall
        rows.append(["all GPUs (sum)", _ms(o.span_ns), _ms(o.compute_ns), _ms(o.comm_ns), _ms(o.exposed_comm_ns),
                     _ms(o.idle_ns), _pct(o.overlap_fraction), "-" if o.tflops is None else f"{o.tflops:.1f}",
                     _pct(o.mfu)])
    out.append(table(["", "span", "compute", "comm", "exposed comm", "idle", "comm overlapped", "TFLOP/s", "MFU"],
                     rows))
    out.append(f"MFU against {s.peak}")
    out.append("")
    out.append("Top kernels by total GPU time" + (f" in steps 2-{s.window_steps + 1}" if s.window_steps else ""))
    out.append(table(["kernel", "count", "total ms", "share"],
                     [[k.name, k.count, _ms(k.total_ns), _pct(k.share)] for k in s.top_kernels]))
    out.append("")
    out.append("Peak memory (GiB)")
    out.append(table(["", "allocated", "reserved"],
                     [[f"rank {m.rank} cuda:{m.device}", _gib(m.allocated_bytes), _gib(m.reserved_bytes)]
                      for m in s.memory]))
    out.append("")
    stale = "not recorded in this trace" if s.stale_replies is None else str(s.stale_replies)
    out.append(f"Network rollbacks: {s.rollbacks}   stale replies: {stale}"
               + (f"   (--sync {s.sync})" if s.sync else ""))
    if s.routing:
        out.append("")
        out.append(f"MoE routing: {s.routing_model or 'model not recorded'} (tokens per expert: max / mean)")
        out.append(table(["layer", "router", "experts", "top-k", "tokens", "ranks", "max/mean", "worst rank"],
                         [[r.name, r.router, r.experts, r.top_k, f"{r.tokens:,}", r.ranks, f"{r.max_over_mean:.2f}",
                           f"{r.worst_rank_max_over_mean:.2f}"] for r in s.routing]))
        out.append("")
    if s.unknown_ops:
        listed = ", ".join(f"{op} x{n}" for op, n in list(s.unknown_ops.items())[:8])
        out.append(f"Unknown ops (timed as memory-bound): {listed}")
    else:
        out.append("Unknown ops: none")
    return "\n".join(out)


def _num(x: float | None, what: str) -> str:
    if x is None:
        return "-"
    if what.endswith(" ns"):
        return _ms(x)
    if what.endswith(" bytes"):
        return _gib(x)
    if what in ("MFU", "comm overlapped by compute"):
        return _pct(x)
    return f"{x:.1f}" if isinstance(x, float) and x != int(x) else f"{x:g}"


def trace_diff(d: TraceDiff) -> str:
    out = [f"A: {d.a}  (steps from {d.step_source_a})", f"B: {d.b}  (steps from {d.step_source_b})", ""]
    rows = []
    for c in d.figures:
        what = c.what.replace(" ns", " ms").replace(" bytes", " GiB")
        delta = "-" if c.delta is None else ("+" if c.delta >= 0 else "") + _num(c.delta, c.what).lstrip("+")
        rows.append([what, _num(c.a, c.what), _num(c.b, c.what), delta,
                     "-" if c.ratio is None else f"{c.ratio:.3f}x"])
    out.append(table(["", "A", "B", "B - A", "B / A"], rows))
    out.append("")
    out.append("Kernels (top of either trace), " + ("count and ms per step (steps after the first)" if d.per_step
                                                     else "count and total ms over the whole run"))
    out.append(table(["kernel", "count A", "count B", "A", "B", "B - A", "B / A"],
                     [[k.name, f"{k.count_a:g}", f"{k.count_b:g}", _ms(k.total_a_ns), _ms(k.total_b_ns),
                       ("+" if k.delta_ns >= 0 else "") + _ms(k.delta_ns),
                       "-" if k.ratio is None else f"{k.ratio:.3f}x"] for k in d.kernels]))
    return "\n".join(out)
