"""NCCL's cost model: per-step latencies, protocol overheads, and how it picks an algorithm.

The constants are NCCL's own (src/graph/tuning.cc, 2.2x): base latency per algorithm and
protocol, hardware latency per step on NVLink / PCIe / network, the bandwidth factors of the
LL and LL128 protocols and of trees, the NVLS efficiency, the LL bandwidth ceilings, the tree
correction by message size and the ring latency "plateau".

Two uses, kept apart on purpose:
- Choice. NCCL predicts `time = latency + bytes / bandwidth` for every (algorithm, protocol)
  pair from its own coarse bandwidth figures and runs the fastest. To run what NCCL would
  run we repeat that prediction with the same figures (predicted_time_us), including where
  they are off: e.g. for two nodes NCCL rates rings by their NVLink bandwidth, so it keeps
  the ring on 2x DGX A100 even though a tree would move less data through the NICs.
- Cost. The chosen algorithm is then simulated as flows on the real topology; only the
  latency terms (and the empirical tree correction) of NCCL's model are charged as they are.

NCCL_ALGO / NCCL_PROTO syntax is accepted for overrides: "ring", "ring,tree", "^nvls",
"ring;allreduce:tree" (per-function lists after a ';'), case-insensitive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree")  # NCCL's enum order: ties go to the first
PROTOCOLS = ("LL", "LL128", "Simple")
P2P = "p2p"  # send/recv and all-to-all are grouped point-to-point transfers, not an algorithm
USERBUFFERS = "userbuffers"  # TE's comm+GEMM overlap transfers, not NCCL's (collectives.userbuffers_plan)

_ALGO_ALIASES = {"tree": "tree", "ring": "ring", "nvls": "nvls", "nvlstree": "nvls_tree",
                 "nvls_tree": "nvls_tree"}
_PROTO_ALIASES = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
_FUNC_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather",
                 "reducescatter": "reduce_scatter", "broadcast": "broadcast", "reduce": "reduce"}
SELECTABLE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def _default_base_latency() -> dict[tuple[str, str], float]:
    return {("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 8.4,
            ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4,
            ("nvls", "Simple"): 0.0, ("nvls_tree", "Simple"): 0.0}


def _default_hw_latency() -> dict[str, dict[tuple[str, str], float]]:
    return {
        "nvlink": {("tree", "LL"): 0.6, ("tree", "LL128"): 1.25, ("tree", "Simple"): 4.0,
                   ("ring", "LL"): 0.6, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4,
                   ("nvls", "Simple"): 25.0, ("nvls_tree", "Simple"): 25.0},
        "pcie": {("tree", "LL"): 1.0, ("tree", "LL128"): 1.9, ("tree", "Simple"): 4.0,
                 ("ring", "LL"): 1.0, ("ring", "LL128"): 2.5, ("ring", "Simple"): 5.7},
        "net": {("tree", "LL"): 5.0, ("tree", "LL128"): 8.5, ("tree", "Simple"): 14.0,
                ("ring", "LL"): 2.7, ("ring", "LL128"): 4.0, ("ring", "Simple"): 14.0,
                ("nvls", "Simple"): 18.0, ("nvls_tree", "Simple"): 14.0},
    }


@dataclass(frozen=True)
class NcclConstants:
    """Latencies in microseconds, bandwidths in GB/s, as in NCCL's tuning.cc."""

    base_latency_us: dict[tuple[str, str], float] = field(default_factory=_default_base_latency)
    hw_latency_us: dict[str, dict[tuple[str, str], float]] = field(
        default_factory=_default_hw_latency)
    # A network post costs ~1 us of CPU (x3 for Simple, which also flushes); every step of a
    # multi-node ring pays at least that.
    net_overhead_us: float = 1.0
    # Fraction of link bandwidth each protocol delivers: LL sends a 4-byte flag with every
    # 4 bytes of data; LL128 one 8-byte flag per 128-byte line (NCCL uses 0.92).
    ring_ll_efficiency: float = 0.5
    ll128_efficiency: float = 0.92
    tree_efficiency: float = 0.92  # NCCL's tree refinement (reduce + forward in one step)
    tree_ll_efficiency: float = 0.92 / 3.8
    tree_ll128_efficiency: float = 0.92 * 120.0 / 128.0
    # NVLS: the share of NVLink bandwidth multimem loads/stores achieve on Hopper; with the
    # (n+1)/n bytes per byte NVLS moves (see collectives.py) this gives the ~480 GB/s bus
    # bandwidth measured on 8x H100.
    nvls_efficiency: float = 0.85
    # LL bus-bandwidth ceilings: one node by GPU generation (compute capability major),
    # several nodes by node count (NCCL's Intel-CPU figures).
    ll_max_busbw_single_node: dict[int, float] = field(
        default_factory=lambda: {7: 39.0, 8: 87.7, 9: 141.0, 10: 282.0})
    ll_max_busbw_two_nodes: float = 39.0
    ll_max_busbw_many_nodes: float = 20.4
    # Point-to-point transfers up to this size use LL (NCCL_P2P_LL_THRESHOLD).
    p2p_ll_threshold: int = 16384
    # Channels NCCL typically runs on NVSwitch nodes (ring, tree and NVLS alike).
    channels: int = 16
    # Multi-node ring all-reduce with Simple: latency x1.4 once messages are large (x1.9
    # before Ampere), NCCL's "plateau effect of ring".
    ring_plateau: float = 1.4
    # Trees fall short of the model for medium sizes; NCCL scales their bandwidth by these
    # (index: log2(bytes / 64), 64 B .. 256 MB; larger messages get 1.0).
    tree_correction: dict[str, tuple[float, ...]] = field(default_factory=lambda: {
        "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
               1.0, 1.0, 1.0, 1.0),
        "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9,
                  .9, .9, .9, 1.0, 1.0),
        "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7,
                   .7, .8, .9, .9),
    })

    def ll_max_busbw(self, n_nodes: int, compute_capability_major: int) -> float:
        if n_nodes == 1:
            return self.ll_max_busbw_single_node.get(compute_capability_major, 39.0)
        return self.ll_max_busbw_two_nodes if n_nodes == 2 else self.ll_max_busbw_many_nodes

    def link_factor(self, algorithm: str, protocol: str) -> float:
        """Bytes a protocol puts on a link per byte of payload."""
        if algorithm == "ring" or algorithm == P2P:
            eff = {"LL": self.ring_ll_efficiency, "LL128": self.ll128_efficiency,
                   "Simple": 1.0}[protocol]
        elif algorithm == "tree":
            eff = {"LL": self.tree_ll_efficiency, "LL128": self.tree_ll128_efficiency,
                   "Simple": self.tree_efficiency}[protocol]
        else:  # nvls, nvls_tree: the NVSwitch part; their network part runs at full rate
            eff = self.nvls_efficiency
        return 1.0 / eff


    def tree_factor(self, protocol: str, nbytes: int) -> float:
        index = log2i(nbytes >> 6) if nbytes >= 64 else -1
        table = self.tree_correction[protocol]
        return table[index] if 0 <= index < len(table) else 1.0


@dataclass(frozen=True)
class GroupShape:
    """What NCCL's model needs to know about a communicator."""

    n_ranks: int
    n_nodes: int
    ppn: int  # ranks per node (NCCL's nRanks / nNodes, integer)
    intra_hw: str  # "nvlink" or "pcie"
    intra_bw: float = 0.0  # GB/s one rank can send inside its node (NCCL's bwIntra x channels)
    inter_bw: float = 0.0  # GB/s a node can send through the NICs its ranks use


def ring_plateau_applies(op: str, protocol: str, shape: GroupShape, nbytes: int,
                         const: NcclConstants) -> bool:
    return (op == "all_reduce" and protocol == "Simple" and shape.n_nodes > 1
            and nbytes / (const.channels * shape.n_ranks) >= 64)


def predicted_time_us(op: str, algorithm: str, protocol: str, shape: GroupShape, nbytes: int,
                      latency_us: float, const: NcclConstants, compute_capability: int) -> float:
    """NCCL's own prediction for one (algorithm, protocol), used to choose like NCCL."""
    n, nodes, ch = shape.n_ranks, shape.n_nodes, const.channels
    if algorithm in ("ring", "tree"):
        busbw = shape.intra_bw if nodes <= 2 else min(shape.intra_bw, shape.inter_bw)
    else:
        scale = 2.0 if op == "all_reduce" else (shape.ppn - 1) / shape.ppn
        busbw = shape.intra_bw * const.nvls_efficiency * (ch - 1) / ch * scale
        if algorithm == "nvls_tree":
            busbw = min(busbw, shape.inter_bw * (2 if nodes <= 2 else 1))
    ll_cap = const.ll_max_busbw(nodes, compute_capability)
    if algorithm == "ring" and protocol == "LL":
        busbw = min(ll_cap, busbw * 0.5)
    elif algorithm == "ring" and protocol == "LL128":
        busbw *= const.ll128_efficiency
    elif algorithm == "tree":
        busbw *= const.tree_efficiency
        if protocol == "LL":
            busbw = min(busbw / 3.8, ll_cap)
        elif protocol == "LL128":
            busbw *= 7.0 / 9.0 if nodes == 1 else 120.0 / 128.0
    if algorithm == "tree":
        algbw = busbw * 0.5 * const.tree_factor(protocol, nbytes)
    else:
        steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1}.get(op, n)
        algbw = busbw * n / steps
    if algorithm == "ring" and ring_plateau_applies(op, protocol, shape, nbytes, const):
        latency_us *= const.ring_plateau
    return latency_us + nbytes / (1e3 * algbw) if algbw > 0 else float("inf")


def log2i(n: int) -> int:
    return max(n, 1).bit_length() - 1


def collective_latency_us(op: str, algorithm: str, protocol: str, shape: GroupShape,
                          const: NcclConstants, intra_path_us: float,
                          inter_path_us: float) -> float:
    """NCCL's latency for one collective, plus the hardware latency of the actual routes
    (intra_path_us / inter_path_us: the slowest intra-node and inter-node hop)."""
    n, nodes = shape.n_ranks, shape.n_nodes
    hw = const.hw_latency_us
    key = (algorithm, protocol)
    base = const.base_latency_us[key]
    intra = hw[shape.intra_hw][key] + intra_path_us
    net_key = ("tree", protocol) if shape.ppn == 1 and algorithm == "ring" else key
    inter = hw["net"][net_key] + inter_path_us
    if algorithm == "ring":
        if op in ("broadcast", "reduce"):
            # A pipelined chain: the first chunk needs n-1 hops to reach the far end.
            hops, inter_hops = n - 1, nodes - 1
            return base + (hops - inter_hops) * intra + inter_hops * inter
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if op == "all_reduce" else nodes - 1)
        if nodes > 1:
            overhead = const.net_overhead_us * (3 if protocol == "Simple" else 1)
            intra = max(intra, overhead + intra_path_us)
        return base + (steps - inter_steps) * intra + inter_steps * inter
    if algorithm == "tree":
        return base + 2 * ((shape.ppn - 1) * intra + log2i(nodes) * inter)
    if algorithm == "nvls":
        return base + intra
    if algorithm == "nvls_tree":
        return base + intra + 2 * log2i(nodes) * inter
    raise ValueError(f"unknown algorithm {algorithm!r}")


def p2p_latency_us(nbytes: int, intra_node: bool, shape_intra_hw: str,
                   const: NcclConstants, path_us: float) -> tuple[str, float]:
    """(protocol, latency) of one point-to-point transfer: one ring step."""
    protocol = "LL" if nbytes <= const.p2p_ll_threshold else "Simple"
    hw = const.hw_latency_us[shape_intra_hw if intra_node else "net"][("ring", protocol)]
    return protocol, const.base_latency_us[("ring", protocol)] + hw + path_us


def userbuffers_latency_us(intra_hw: str, const: NcclConstants, path_us: float) -> float:
    """Latency of one Transformer Engine userbuffers transfer inside a node. Each is one step
    (userbuffers.cu): a copy-engine copy to the peer and a one-thread flag kernel (the ring
    exchange's userbuffers_send/recv), or one kernel that reads or writes every peer's buffer
    at once and then sets flags (reducescatter2/allgather2_userbuff_*). So no NCCL kernel's base
    latency and no ring's n - 1 handshakes: the hardware latency of one Simple step over the
    node's fabric, plus the route's."""
    return const.hw_latency_us[intra_hw][("ring", "Simple")] + path_us


def runnable_algorithms(op: str, n_nodes: int, min_ppn: int, nvls: bool) -> list[str]:
    """Algorithms NCCL can run for this op on this group (in NCCL's order)."""
    if op == "all_reduce":
        out = ["tree", "ring"]
        if nvls and n_nodes == 1:
            out.append("nvls")
        if nvls and n_nodes > 1 and min_ppn >= 2:
            out.append("nvls_tree")
        return out
    if op in ("all_gather", "reduce_scatter"):
        return ["ring", "nvls"] if nvls and n_nodes == 1 else ["ring"]
    if op in ("broadcast", "reduce"):
        return ["ring"]
    raise ValueError(f"{op} is not chosen by algorithm")


def default_algorithms(op: str, n_nodes: int, min_ppn: int, nvls: bool) -> list[str]:
    """What NCCL considers without NCCL_ALGO: a tree inside one node is just a chain, which
    NCCL does not pick for a single node."""
    algos = runnable_algorithms(op, n_nodes, min_ppn, nvls)
    return [a for a in algos if not (a == "tree" and n_nodes == 1)]


def runnable_protocols(algorithm: str, nvlink: bool) -> list[str]:
    if algorithm in ("nvls", "nvls_tree"):
        return ["Simple"]
    # LL128 needs NVLink inside the node (NCCL enables it only there by default).
    return ["LL", "LL128", "Simple"] if nvlink else ["LL", "Simple"]


@dataclass(frozen=True)
class Override:
    """A parsed NCCL_ALGO / NCCL_PROTO value: allowed names per op (None: no restriction)."""

    text: str | None
    per_op: dict[str, frozenset[str]]

    def allowed(self, op: str, names: list[str]) -> list[str]:
        if op not in self.per_op:
            return names
        return [x for x in names if x in self.per_op[op]]


def parse_override(text: str | None, what: str) -> Override:
    """Parse an NCCL_ALGO-style (what="algorithm") or NCCL_PROTO-style (what="protocol")
    string. Raises ValueError naming the bad token and the allowed values."""
    if text is None or not text.strip():
        return Override(None, {})
    aliases = _ALGO_ALIASES if what == "algorithm" else _PROTO_ALIASES
    names = tuple(dict.fromkeys(aliases.values()))
    per_op: dict[str, frozenset[str]] = {}
    for i, part in enumerate(text.split(";")):
        prefix, sep, items = part.partition(":")
        if not sep:
            if i:
                raise ValueError(f"{what}: {text!r}: every entry after the first needs a "
                                 f"'function:' prefix")
            ops, items = list(SELECTABLE_OPS), prefix
        else:
            op = _FUNC_ALIASES.get(prefix.strip().lower().replace("_", ""))
            if op is None:
                raise ValueError(f"{what}: unknown function {prefix.strip()!r} in {text!r} "
                                 f"(allowed: {', '.join(_FUNC_ALIASES)})")
            ops = [op]
        items = items.strip()
        negate = items.startswith("^")
        chosen = set()
        for tok in items.lstrip("^").split(","):
            name = aliases.get(tok.strip().lower())
            if name is None:
                raise ValueError(f"{what}: unknown {what} {tok.strip()!r} in {text!r} "
                                 f"(allowed: {', '.join(names)})")
            chosen.add(name)
        allowed = frozenset(set(names) - chosen if negate else chosen)
        for op in ops:
            per_op[op] = allowed
    return Override(text, per_op)
