"""Max-min fair rates by progressive filling.

A flow here is one rate variable that loads a set of links, each by a coefficient (bytes put
on the link per byte the flow delivers): 1 for a plain transfer, k for a collective that
crosses the link k times, a fraction for adaptive routing that splits traffic over equal
paths, more than 1 where a protocol spends link bandwidth on flags or headers.

Progressive filling: raise every unfrozen flow's rate together; when a link fills up (or a
flow reaches its own cap), the flows on it are frozen at that level; repeat with what is left.
Each round costs O(nonzeros) in numpy and there are at most as many rounds as distinct
bottleneck levels.

The result depends only on the inputs' values and order, never on hashing or timing: callers
pass flows in a canonical order so that the same set of flows always gives bit-identical
rates (the rollback invariant in fluid.py depends on it).
"""

from __future__ import annotations

import numpy as np

_TIE = 1e-12  # relative: links within this of the bottleneck level fill up in the same round
_SMALL = 64  # up to this many (flow, link) pairs, plain Python beats numpy's call overhead
_MARK_ABOVE = 4096  # ids: from this many, unique_ids marks an array rather than sorting


def max_min_rates(links: list[np.ndarray], coefs: list[np.ndarray], caps: np.ndarray,
                  capacity: np.ndarray) -> np.ndarray:
    """Rates (bytes/ns) of flows whose i-th loads links[i] (unique link ids) by coefs[i],
    each at most caps[i], on links of the given capacity (bytes/ns)."""
    n = len(links)
    if n == 1:
        # One flow alone: its rate is its tightest link (or its cap).
        rate = float(np.min(capacity[links[0]] / coefs[0])) if len(links[0]) else np.inf
        return np.array([min(rate, float(caps[0]))])
    lengths = np.fromiter((len(x) for x in links), dtype=np.int64, count=n)
    if int(lengths.sum()) <= _SMALL:
        return _max_min_small(links, coefs, caps, capacity)
    owner = np.repeat(np.arange(n), lengths)
    used, local = unique_inverse(np.concatenate(links), len(capacity))
    weight = np.concatenate(coefs)
    residual = capacity[used].astype(np.float64, copy=True)
    n_links = len(used)
    rate = np.full(n, np.inf)
    frozen = np.zeros(n, dtype=bool)
    while not frozen.all():
        live = ~frozen[owner]
        demand = np.bincount(local[live], weights=weight[live], minlength=n_links)
        loaded = demand > 0
        headroom = np.full(n_links, np.inf)
        headroom[loaded] = residual[loaded] / demand[loaded]
        level = min(float(headroom.min()) if n_links else np.inf, float(caps[~frozen].min()))
        if not np.isfinite(level):
            frozen[:] = True  # flows on no link and without a cap: unbounded
            break
        full = loaded & (headroom <= level * (1 + _TIE))
        newly = ~frozen & (caps <= level * (1 + _TIE))
        newly[owner[live & full[local]]] = True
        rate[newly] = level
        taken = newly[owner]
        residual -= np.bincount(local[taken], weights=weight[taken] * level, minlength=n_links)
        frozen |= newly
    return rate


def _max_min_small(links, coefs, caps, capacity) -> np.ndarray:
    """The same progressive filling on Python lists, for components of a few small flows."""
    n = len(links)
    users: dict[int, list[tuple[int, float]]] = {}
    for i in range(n):
        for link, coef in zip(links[i].tolist(), coefs[i].tolist()):
            users.setdefault(link, []).append((i, coef))
    residual = {link: float(capacity[link]) for link in users}
    caps = [float(c) for c in caps]
    rate = [np.inf] * n
    frozen = [False] * n
    left = n
    while left:
        level = min((caps[i] for i in range(n) if not frozen[i]), default=np.inf)
        headroom = {}
        for link, us in users.items():
            demand = 0.0
            for i, coef in us:
                if not frozen[i]:
                    demand += coef
            if demand > 0:
                headroom[link] = h = residual[link] / demand
                if h < level:
                    level = h
        if not np.isfinite(level):
            break
        newly = [i for i in range(n) if not frozen[i] and caps[i] <= level * (1 + _TIE)]
        for link, h in headroom.items():
            if h <= level * (1 + _TIE):
                newly.extend(i for i, _ in users[link] if not frozen[i])
        for i in set(newly):
            frozen[i] = True
            rate[i] = level
            left -= 1
            for link, coef in zip(links[i].tolist(), coefs[i].tolist()):
                residual[link] -= coef * level
    return np.array(rate)


def unique_ids(ids: np.ndarray, bound: int) -> np.ndarray:
    """np.unique(ids) for ids in [0, bound): by marking rather than sorting once there are many,
    or many for the bound (a round of a 1,024-GPU all-to-all loads hundreds of thousands of
    (flow, link) pairs, and the sort was 8% of its simulation)."""
    if len(ids) < _MARK_ABOVE and len(ids) * 16 < bound:
        return np.unique(ids)
    mark = np.zeros(bound, dtype=bool)
    mark[ids] = True
    return np.flatnonzero(mark)


def unique_inverse(ids: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(ids, return_inverse=True) for ids in [0, bound), the same arrays (unique_ids)."""
    if len(ids) < _MARK_ABOVE:
        return np.unique(ids, return_inverse=True)
    used = unique_ids(ids, bound)
    position = np.empty(bound, dtype=np.int64)
    position[used] = np.arange(len(used))
    return used, position[ids]
