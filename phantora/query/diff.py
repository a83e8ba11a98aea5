"""`phantora diff`: two traces' summaries side by side (step time, GPU time breakdown, MFU, and
the kernels that take the most time in either)."""

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
    name: str
    count_a: int
    count_b: int
    total_a_ns: int
    total_b_ns: int
    delta_ns: int
    ratio: float | None  # b / a; None when a has none of it


@dataclass
class TraceDiff:
    a: str
    b: str
    step_source_a: str
    step_source_b: str
    figures: list[Compared]  # step time and per-GPU breakdown (means over GPUs), in ns; MFU
    kernels: list[KernelCompared]  # union of both top-N, by the larger of the two totals


def _per_gpu(s: TraceSummary, attr: str) -> float | None:
    """The mean over the trace's GPUs."""
    if not s.gpus:
        return None
    return sum(getattr(g, attr) for g in s.gpus) / len(s.gpus)


def diff(a: TraceSummary, b: TraceSummary, top: int = 10) -> TraceDiff:
    """Compare two summaries; they should hold every kernel (summarize(db, top=None)) so a
    kernel in one's top N gets its real total on the other side."""
    figures = [
        Compared.of("mean step time ns", a.steps.stats.mean_ns if a.steps.stats else None,
                    b.steps.stats.mean_ns if b.steps.stats else None),
        Compared.of("steps", len(a.steps.overall_ns), len(b.steps.overall_ns)),
    ]
    for attr in ("span_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns"):
        what = attr.removesuffix("_ns").replace("_", " ")
        figures.append(Compared.of(f"{what} per GPU ns", _per_gpu(a, attr), _per_gpu(b, attr)))
    figures.append(Compared.of("comm overlapped by compute", a.overall.overlap_fraction if a.overall else None,
                               b.overall.overlap_fraction if b.overall else None))
    figures.append(Compared.of("achieved TFLOP/s (all GPUs)", a.overall.tflops if a.overall else None,
                               b.overall.tflops if b.overall else None))
    figures.append(Compared.of("MFU", a.overall.mfu if a.overall else None, b.overall.mfu if b.overall else None))

    ka = {k.name: k for k in a.top_kernels}
    kb = {k.name: k for k in b.top_kernels}
    names = [k.name for k in a.top_kernels[:top]] + [k.name for k in b.top_kernels[:top]]
    kernels = []
    for name in dict.fromkeys(names):
        x, y = ka.get(name), kb.get(name)
        ta, tb = x.total_ns if x else 0, y.total_ns if y else 0
        kernels.append(KernelCompared(name, x.count if x else 0, y.count if y else 0, ta, tb, tb - ta,
                                      tb / ta if ta else None))
    kernels.sort(key=lambda k: -max(k.total_a_ns, k.total_b_ns))
    return TraceDiff(a.trace, b.trace, a.steps.source, b.steps.source, figures, kernels)
