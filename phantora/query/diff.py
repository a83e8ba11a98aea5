"""`phantora diff`: two traces' summaries side by side (step time, GPU time breakdown, MFU, peak
memory per rank, and the kernels that take the most time in either).

Figures are per step wherever both traces have steps (the steady state `summarize` reports:
steps after the first), so runs of different lengths compare: a 3-step run against a 5-step one
no longer shows 2.2x the compute. Without steps in both, they are totals over the whole run."""

from __future__ import annotations

from dataclasses import dataclass

from phantora.query.summary import TraceSummary


@dataclass
class Compared:
    """One figure of both traces; delta = b - a, ratio = b / a (None where undefined)."""

    what: str
    a: float | None
    b: float | None
    delta: float | None
    ratio: float | None

    @classmethod
    def of(cls, what: str, a: float | None, b: float | None) -> Compared:
        delta = b - a if a is not None and b is not None else None
        ratio = b / a if a and b is not None else None
        return cls(what, a, b, delta, ratio)


@dataclass
class KernelCompared:
    """Counts and times per step (per_step) or over the whole run."""

    name: str
    count_a: float
    count_b: float
    total_a_ns: float
    total_b_ns: float
    delta_ns: float
    ratio: float | None  # b / a; None when a has none of it


@dataclass
class TraceDiff:
    a: str
    b: str
    step_source_a: str
    step_source_b: str
    figures: list[Compared]  # step time and per-GPU breakdown (means over GPUs), in ns; MFU; memory
    kernels: list[KernelCompared]  # union of both top-N, by the larger of the two totals
    per_step: bool = False  # breakdown and kernels are per step (else whole-run totals)


def _per_gpu(s: TraceSummary, attr: str) -> float | None:
    """The mean over the trace's GPUs."""
    if not s.gpus:
        return None
    return sum(getattr(g, attr) for g in s.gpus) / len(s.gpus)


def _scaled(x: float | None, steps: int) -> float | None:
    return None if x is None else x / steps


def diff(a: TraceSummary, b: TraceSummary, top: int = 10) -> TraceDiff:
    """Compare two summaries; they should hold every kernel (summarize(db, top=None)) so a
    kernel in one's top N gets its real total on the other side."""
    per_step = a.window_steps > 0 and b.window_steps > 0
    na, nb = (a.window_steps, b.window_steps) if per_step else (1, 1)
    unit = "per GPU per step" if per_step else "per GPU (whole run)"
    figures = [
        Compared.of("mean step time ns", a.steps.stats.mean_ns if a.steps.stats else None,
                    b.steps.stats.mean_ns if b.steps.stats else None),
        Compared.of("steps", len(a.steps.overall_ns), len(b.steps.overall_ns)),
    ]
    for attr in ("span_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns"):
        what = attr.removesuffix("_ns").replace("_", " ")
        figures.append(Compared.of(f"{what} {unit} ns", _scaled(_per_gpu(a, attr), na),
                                   _scaled(_per_gpu(b, attr), nb)))
    figures.append(Compared.of("comm overlapped by compute", a.overall.overlap_fraction if a.overall else None,
                               b.overall.overlap_fraction if b.overall else None))
    figures.append(Compared.of("achieved TFLOP/s (all GPUs)", a.overall.tflops if a.overall else None,
                               b.overall.tflops if b.overall else None))
    figures.append(Compared.of("MFU", a.overall.mfu if a.overall else None, b.overall.mfu if b.overall else None))
    mem_a = {(m.rank, m.device): m.allocated_bytes for m in a.memory}
    mem_b = {(m.rank, m.device): m.allocated_bytes for m in b.memory}
    for rank, device in sorted(set(mem_a) | set(mem_b)):
        figures.append(Compared.of(f"peak allocated rank {rank} cuda:{device} bytes", mem_a.get((rank, device)),
                                   mem_b.get((rank, device))))

    ka = {k.name: k for k in a.top_kernels}
    kb = {k.name: k for k in b.top_kernels}
    names = [k.name for k in a.top_kernels[:top]] + [k.name for k in b.top_kernels[:top]]
    kernels = []
    for name in dict.fromkeys(names):
        x, y = ka.get(name), kb.get(name)
        ta, tb = (x.total_ns / na if x else 0), (y.total_ns / nb if y else 0)
        kernels.append(KernelCompared(name, x.count / na if x else 0, y.count / nb if y else 0, ta, tb, tb - ta,
                                      tb / ta if ta else None))
    kernels.sort(key=lambda k: -max(k.total_a_ns, k.total_b_ns))
    return TraceDiff(a.trace, b.trace, a.steps.source, b.steps.source, figures, kernels, per_step)
