"""Mirrored ranks: ranks that run no process, and follow their representative's collectives.

With `--ranks` (phantora/roles.py) only representatives run the program. When a representative
joins a collective, each rank it stands for joins the same collective on *its* group: the group
of the same family that contains it. A family is one loop of new_group calls (a DeviceMesh
dimension, one of Megatron's parallel groups): groups of the same shape and backend that do not
overlap, e.g. the 128 data-parallel groups of a TP 8 x DP 128 mesh. A loop may create several
kinds of group per step (Megatron-Core: each pipeline group, then its embedding groups; each
data-parallel group, then the same ranks again as its data-parallel-with-context group and its
gloo twin), so a group joins the oldest family of its shape and backend that holds none of its
ranks, and starts a new one if every such family does. Every process of a job
creates every group, so each representative reports them all (R_GROUP).

A mirrored rank reaches its collective when its representative's stream does, so on a network
where every rank's collectives end together its timeline is its representative's exactly. Where
the network ends a mirrored rank's collective at another time than its representative's, the
difference is not carried into the mirror's later work; it is recorded (`lag_ns`) and reported,
and `--ranks all` gives the exact answer.

The trace gives each mirrored rank its own process with its steps and its collectives (no
kernels or memory, which are its representative's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collections import deque
from typing import Callable

from phantora.engine.collectives import P2P_OPS, CollectiveCall, CollectiveMismatch
from phantora.engine.ranks import CallError
from phantora.engine.trace_events import TraceEvents
from phantora.roles import RankRoles, rank_group

MIRROR_COLLECTIVES_TRACK = 3  # a mirrored rank's trace process: its collectives (steps on the step track)


class RolesRefuted(CallError):
    """The program shows that ranks chosen as mirrors do different work (e.g. pipeline stages
    that send to each other): the message says which --ranks to pass (`representatives`)."""

    def __init__(self, message: str, representatives: tuple[int, ...]) -> None:
        super().__init__(message)
        self.representatives = representatives


class RanksDiverged(CollectiveMismatch):
    """A witness and its role's representative called different collectives: the ranks are
    not alike, and mirroring the representative would be wrong."""

    def __init__(self, message: str, ranks: tuple[int, ...], other_op: str = "") -> None:
        super().__init__(message, ranks)
        self.other_op = other_op  # the op the other of the two called


class Witness:
    """Compares each witness (RankRoles.witnesses) with its role's representative as both run:
    their collectives one by one (op, bytes, dtype, reduction, group size), and the ops of each
    step. Collectives that differ stop the run; op counts that differ are a warning (rank 0
    may log or checkpoint where the others do not)."""

    def __init__(self, roles: RankRoles) -> None:
        self.pairs = {w: roles.role_of(w) for w in roles.witnesses if roles.role_of(w) != w}
        watched = {*self.pairs, *self.pairs.values()}
        self._calls: dict[int, deque[CollectiveCall]] = {r: deque() for r in watched}
        self._step_ops: dict[int, list[int]] = {r: [] for r in watched}
        self._counted: dict[int, int] = {r: 0 for r in watched}
        self._seen: dict[int, int] = {r: 0 for r in watched}

    def _partner(self, rank: int) -> int | None:
        if rank in self.pairs:
            return self.pairs[rank]
        return next((w for w, r in self.pairs.items() if r == rank), None)

    def collective(self, call: CollectiveCall) -> None:
        other = self._partner(call.rank)
        if other is None:
            return
        index = self._seen[call.rank]
        self._seen[call.rank] += 1
        theirs = self._calls[other]
        if not theirs:
            self._calls[call.rank].append(call)
            return
        them = theirs.popleft()
        if _shape(them) != _shape(call):
            rep, wit = (them, call) if call.rank in self.pairs else (call, them)
            raise RanksDiverged(
                f"ranks {rep.rank} and {wit.rank} were run as alike (rank {wit.rank} is a witness of rank {rep.rank}'s "
                f"role: --ranks auto), but their collective #{index} differs:\n  rank {rep.rank}: {rep.describe()} "
                f"on {len(rep.group)} ranks at {rep.site}\n  rank {wit.rank}: {wit.describe()} on {len(wit.group)} "
                f"ranks at {wit.site}\nRanks mirrored from rank {rep.rank} would copy it. Run every rank (--ranks all) "
                "or choose the representatives (--ranks R0,R1,...).", (rep.rank, wit.rank), them.op)

    def step(self, rank: int, ops: int, warn: Callable[[str], None]) -> None:
        other = self._partner(rank)
        if other is None:
            return
        mine = self._step_ops[rank]
        mine.append(ops - self._counted[rank])
        self._counted[rank] = ops
        theirs = self._step_ops[other]
        n = len(mine) - 1
        if n < len(theirs) and theirs[n] != mine[n]:
            warn(f"ranks {rank} and {other} (a witness and its role's representative, --ranks auto) ran {mine[n]:,} and "
                 f"{theirs[n]:,} ops in step {n}: ranks mirrored from the representative copy its host work")


def _shape(call: CollectiveCall) -> tuple:
    return call.op, call.nbytes, call.dtype, call.reduce_op, len(call.group)


@dataclass
class MirrorRank:
    rank: int
    representative: int
    node: int
    local_rank: int
    trace_pid: int
    collectives: int = 0
    lag_ns: int = 0  # largest (its collective's end - its representative's end of the same collective)


@dataclass
class GroupFamily:
    shape: tuple[int, ...]  # members minus the first member
    by_rank: dict[int, str] = field(default_factory=dict)  # member -> group name


def _mirrored_call(call: CollectiveCall, rank: int, group: tuple[int, ...], root: int | None,
                   group_name: str) -> CollectiveCall:
    """`call` as mirrored rank `rank` makes it on its own group. The constructor, not
    dataclasses.replace (twice as slow): at 4,096 GPUs each call is copied for 1,023 mirrors, and
    replace() was a fifth of the simulator's time."""
    return CollectiveCall(rank=rank, op=call.op, group=group, seq=call.seq, nbytes=call.nbytes, dtype=call.dtype,
                          reduce_op=call.reduce_op, root=root, device=call.device, stream=call.stream,
                          site=f"mirrored from rank {call.rank}", group_name=group_name, send_splits=call.send_splits,
                          recv_splits=call.recv_splits, mirrored=True, transport=call.transport)


class GroupFamilies:
    """The process groups the program created, in families (see the module docstring)."""

    def __init__(self) -> None:
        self.members: dict[str, tuple[int, ...]] = {}
        self.family: dict[str, GroupFamily] = {}
        self.added = 0  # groups added so far: what was decided from fewer may be decided again
        self._open: dict[tuple[str, tuple[int, ...]], list[GroupFamily]] = {}  # (backend, shape) -> in creation order

    def add(self, name: str, members: tuple[int, ...], backend: str = "") -> None:
        if name in self.members or not members:
            return
        shape = tuple(m - members[0] for m in members)
        candidates = self._open.setdefault((backend, shape), [])
        fam = next((f for f in candidates if not any(m in f.by_rank for m in members)), None)
        if fam is None:
            fam = GroupFamily(shape)
            candidates.append(fam)
        for m in members:
            fam.by_rank[m] = name
        self.members[name] = rank_group(members)  # the group of every mirrored call on it (counterpart)
        self.family[name] = fam
        self.added += 1

    def outermost(self, world_size: int) -> tuple[int, ...] | None:
        """Rank 0's group in the family that splits the world along its outermost dimension
        (members 0, B, 2B, ... with B x size = the world): pipeline stages in TorchTitan's,
        DeviceMesh's and Megatron-Core's layouts. None if no family does."""
        found = []
        for fam in {id(f): f for f in self.family.values()}.values():
            g = len(fam.shape)
            if 1 < g < world_size and world_size % g == 0:
                stride = world_size // g
                if fam.shape == tuple(i * stride for i in range(g)) and 0 in fam.by_rank:
                    found.append(self.members[fam.by_rank[0]])
        return max(found, key=len) if found else None

    def counterpart(self, name: str, rank: int, mirrored_from: int) -> tuple[str, tuple[int, ...]]:
        """The group of `name`'s family that contains `rank`."""
        fam = self.family.get(name)
        if fam is None:
            raise CallError(f"rank {mirrored_from} called a collective on process group {name!r}, which phantora did "
                            "not see created, so the ranks mirrored from it cannot join theirs; run every rank "
                            "(--ranks all)")
        other = fam.by_rank.get(rank)
        if other is None:
            raise CallError(f"rank {rank} is mirrored from rank {mirrored_from}, but no group of the family of process "
                            f"group {name!r} ({list(self.members[name])}) contains it; choose representatives that "
                            "cover it (--ranks) or run every rank (--ranks all)")
        return other, self.members[other]


class Mirrors:
    def __init__(self, roles: RankRoles, nproc_per_node: int, trace: TraceEvents, gpu_name: str) -> None:
        self.roles = roles
        self.trace = trace
        sink = self.sink = trace.sink
        self.groups = GroupFamilies()
        self.witness = Witness(roles)
        self._p2p_vias: dict[tuple, str] = {}  # (group name, pair, rank) -> the group carrying it (_p2p_via)
        self._rings: dict[tuple, bool] = {}  # (group name, pair) -> a ring inside a stage? (_ring_inside_a_stage)
        self._decided_with = 0  # groups.added when those two were filled (_forget_stale_decisions)
        self.ranks: dict[int, MirrorRank] = {}
        for rank in range(roles.world_size):
            rep = roles.representative(rank)
            if rep == rank:
                continue
            node, local = divmod(rank, nproc_per_node)
            m = self.ranks[rank] = MirrorRank(rank, rep, node, local, rank + 1)
            sink.process(m.trace_pid, f"rank {rank} · node {node} · GPU {local} · {gpu_name} · mirrored from rank {rep}",
                         rank)
            sink.thread(m.trace_pid, MIRROR_COLLECTIVES_TRACK, f"nccl (collectives of rank {rank}, mirrored)", 2)

    def __contains__(self, rank: int) -> bool:
        return rank in self.ranks

    # --- joining ------------------------------------------------------------------------------
    def check_witness(self, call: CollectiveCall) -> None:
        """Compare a witness's collective with its representative's (Witness). When one role
        was assumed and the declared groups have an outermost dimension (pipeline stages that
        diverge before their first point-to-point message, e.g. a last stage's larger output
        layer), the divergence refutes the choice with one representative per stage."""
        try:
            self.witness.collective(call)
        except RanksDiverged as e:
            if len(self.roles.representatives) > 1:
                raise
            stages = self.groups.outermost(self.roles.world_size)
            if stages is None and (call.op in P2P_OPS or e.other_op in P2P_OPS):
                # a point-to-point message where the witness's role sends another: its group's
                # ranks are the stages (a pipeline over the whole world: every rank)
                stages = tuple(sorted(self.groups.members.get(call.group_name, call.group)))
            if stages is None:
                raise
            raise RolesRefuted(f"{e}\nThe groups of the outermost mesh dimension ({list(stages)}) look like "
                               f"pipeline stages: run one representative per stage, --ranks "
                               f"{','.join(map(str, stages))}", tuple(stages)) from None

    def calls_for(self, call: CollectiveCall) -> list[CollectiveCall]:
        """What each rank mirrored from `call.rank` calls when it calls `call`."""
        rep = call.rank
        mirrors = self.roles.mirrors_of(rep) if self.roles.runs(rep) else []
        if not mirrors:
            return []
        if call.op in P2P_OPS:
            return self._p2p_calls(call, mirrors)
        calls = []
        for m in mirrors:
            name, group = self.groups.counterpart(call.group_name, m, rep)
            root = None if call.root is None else group[call.group.index(call.root)]
            calls.append(_mirrored_call(call, m, group, root, name))
        return calls

    def _p2p_calls(self, call: CollectiveCall, mirrors: list[int]) -> list[CollectiveCall]:
        """Each mirror's message: its representative's pair, in the mirror's group of the family
        that carries it (_p2p_via), shifted by the mirror's place in that group. The shift is 0
        for a mirror in another group at its representative's place (a pipeline's data-parallel
        peers); inside the representative's own group it makes a ring: Transformer Engine's
        userbuffers pass each GEMM's shards from tensor-parallel rank i to i + 1, and mirror i
        sends to i + 1, not the representative's peer."""
        rep = call.rank
        peer = call.group[1] if call.group[0] == rep else call.group[0]
        self._forget_stale_decisions()
        if self.roles.representative(peer) == rep and not self._ring_inside_a_stage(call):
            stages = tuple(sorted(self.groups.members.get(call.group_name, call.group)))
            raise RolesRefuted(
                f"rank {rep} {'sends to' if call.op == 'send' else 'receives from'} rank {peer}, but --ranks "
                f"{self.roles.env_value()} mirrors rank {peer} from rank {rep}: ranks that exchange point-to-point "
                f"messages (pipeline stages) do different work. Run one representative per stage, e.g. --ranks "
                f"{','.join(map(str, stages))}, or every rank (--ranks all).", stages)
        if call.group_name not in self.groups.members:
            raise CallError(f"rank {rep} called {call.op} on process group {call.group_name!r}, which phantora did not "
                            "see created; run every rank (--ranks all)")
        via = self._p2p_via(call, mirrors)
        vg = self.groups.members[via]
        positions = (vg.index(call.group[0]), vg.index(call.group[1]))
        calls = []
        for m in mirrors:
            name, _ = self.groups.counterpart(call.group_name, m, rep)
            _, group = self.groups.counterpart(via, m, rep)
            shift, n = group.index(m) - vg.index(rep), len(group)
            pair = (group[(positions[0] + shift) % n], group[(positions[1] + shift) % n])
            calls.append(_mirrored_call(call, m, pair, call.root, name))
        return calls

    def _forget_stale_decisions(self) -> None:
        """A group created after a message was carried (a pipeline's groups made late) can change
        which family carries a pair and whether it is a ring: decide again."""
        if self._decided_with != self.groups.added:
            self._rings.clear()
            self._p2p_vias.clear()
            self._decided_with = self.groups.added

    def _ring_inside_a_stage(self, call: CollectiveCall) -> bool:
        """A message from a representative to a rank it stands for is a ring among alike ranks
        (each sends to the next) when the message is on a group of its own (not the world) that
        is not along the outermost (pipeline) dimension: one representative per pipeline stage,
        or one for all ranks where there is no pipeline (TP userbuffers over data parallelism).
        Otherwise it is a pipeline boundary (a pipeline may send on the world group,
        examples/pp_train.py), and the choice of representatives is wrong (RolesRefuted). A
        pipeline that is not the outermost dimension still shows as the witness's divergence."""
        key = (call.group_name, call.group)
        ring = self._rings.get(key)
        if ring is None:
            members = self.groups.members.get(call.group_name)
            outer = self.groups.outermost(self.roles.world_size)
            if members is None or len(members) == self.roles.world_size:
                ring = False
            elif outer is None:  # no mesh to tell a ring from a pipeline by, but the stages chosen
                ring = len(self.roles.representatives) > 1
            else:
                pipeline = tuple(m - outer[0] for m in outer)
                ring = not any(call.group[0] in g and call.group[1] in g and self.groups.family[n].shape == pipeline
                               for n, g in self.groups.members.items())
            self._rings[key] = ring
        return ring

    def _p2p_via(self, call: CollectiveCall, mirrors: list[int]) -> str:
        """The group whose family carries a point-to-point pair over to the mirrors: the
        narrowest group holding both peers whose family holds every mirror. A send on the
        world group (`dist.send(t, dst)`, Megatron-LM's interleaved schedule) between stages 0
        and 4 is then carried by the pipeline group [0, 4] to [1, 5], where the world's own
        family (one group) would leave it between 0 and 4."""
        key = (call.group_name, call.group, call.rank)
        via = self._p2p_vias.get(key)
        if via is None:
            a, b = call.group
            families = self.groups.family
            holding = [n for n, members in self.groups.members.items() if a in members and b in members
                       and all(m in families[n].by_rank for m in mirrors)]
            holding.sort(key=lambda n: (len(self.groups.members[n]), n != call.group_name))
            via = self._p2p_vias[key] = holding[0] if holding else call.group_name
        return via

    # --- trace --------------------------------------------------------------------------------
    def collective(self, call: CollectiveCall, name: str, ready: int, start: int, end: int, work: int) -> None:
        m = self.ranks[call.rank]
        m.collectives += 1
        # Few arguments: 1,000 mirrored ranks write 1,000 of these per collective. Its call's
        # details are on its representative's kernel of the same collective number and seq.
        group = {"group ranks": list(call.group)} if len(call.group) <= 16 else {"group size": len(call.group)}
        self.sink.slice(m.trace_pid, MIRROR_COLLECTIVES_TRACK, name, ready, end - ready, "kernel", {
            "op": call.op, **group, "seq": call.seq, "network ns": end - start, "collective": work,
            "mirrored from rank": m.representative})

    def lag(self, rank: int, lag_ns: int) -> None:
        m = self.ranks[rank]
        m.lag_ns = max(m.lag_ns, lag_ns)

    def step(self, rep: int, step: int, begin: int, end: int) -> None:
        """The representative's optimizer step `step`: each of its mirrors takes it too."""
        for r in self.roles.mirrors_of(rep):
            self.trace.step(self.ranks[r].trace_pid, step, begin, end, mirrored_from=rep)
