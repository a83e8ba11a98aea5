"""A simulated NCCL process group: `init_process_group("nccl")` works on virtual GPUs.

torch's CPU build has no NCCL, and _new_process_group_helper has a hard-coded NCCL branch, so
SimProcessGroup replaces distributed_c10d.ProcessGroupNCCL (notes/torch-interposition.md).
Rendezvous uses the real c10d store (env:// with MASTER_ADDR/PORT as torchrun sets them).
Each collective is reported to the simulator, which matches it across ranks, times it on the
simulated network and answers once every member has joined; tensor contents are not moved
(tensors are fake). Work.wait() makes the caller's current stream wait for the collective,
like ProcessGroupNCCL's; works the caller never waits on explicitly (DDP's reducer waits on
their futures in C++) are waited for at the end of the backward pass that issued them.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import sysconfig
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.futures import Future

from interpose.distributed import collective_checks as check
from interpose.device import cuda_graphs
from interpose.host.python_work import own_source_dirs
from interpose.values import policy as values
from interpose.ops.observer import current_stream_id
from phantora import protocol as P
from phantora.roles import ENV as RanksEnv, RankRoles

_transport_tls = threading.local()


@contextlib.contextmanager
def userbuffers_transport() -> Iterator[None]:
    """Collectives called inside stand for Transformer Engine's userbuffers: the same bytes between
    the same ranks, moved by copies and kernels its C++ issues (engine/collectives.py
    CollectiveCall.transport), not by NCCL."""
    before = getattr(_transport_tls, "name", None)
    _transport_tls.name = "userbuffers"
    try:
        yield
    finally:
        _transport_tls.name = before


def _transport() -> dict[str, str]:
    name = getattr(_transport_tls, "name", None)
    return {"transport": name} if name else {}


_rt: Any = None
SIMULATED_NCCL_VERSION = (2, 27, 5)  # what torch.cuda.nccl.version() reports under phantora
_groups: dict[str, "SimProcessGroup"] = {}  # group name -> its simulated backend
_live_works: dict[int, "SimWork"] = {}  # work id -> work, until waited (oldest dropped past the cap)
_MAX_LIVE_WORKS = 100_000
# torch and phantora (interpose/ and phantora/ as imported and as resolved): never a call site
_SKIP_DIRS = (os.path.dirname(torch.__file__) + os.sep, *own_source_dirs())
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _roles() -> RankRoles:
    """Which ranks run as processes (phantora/roles.py); every rank unless --ranks chose."""
    world = dist.get_world_size()
    cached = getattr(_roles, "cached", None)
    if cached is None or cached.world_size != world:
        cached = _roles.cached = RankRoles.from_env(world)  # type: ignore[attr-defined]
    return cached


def _source(rank: int, members: tuple[int, ...] | list[int], me: int) -> int:
    """The process whose post stands for what `rank` contributes to an exchange of values or
    objects among `members`: the rank itself if it runs; its representative, when that is a
    member too (a mirrored rank's contribution is taken to be its representative's,
    phantora/roles.py); else this rank `me` (nobody posts for it in this group: the mirror of
    another group's representative is taken to hold what this rank holds)."""
    roles = _roles()
    if roles.runs(rank):
        return rank
    rep = roles.representative(rank)
    return rep if rep in members else me


def _processes(members: tuple[int, ...] | list[int]) -> int:
    """How many of `members` run as processes (the readers of an exchange)."""
    roles = _roles()
    return sum(1 for r in members if roles.runs(r))


def _installed(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def call_site() -> str:
    """Where the program issued this collective: the innermost frame of its own files, outside
    torch, phantora and the standard library; for a program run from an installed framework
    (`torchrun -m torchtitan.train`), the innermost installed frame outside those."""
    installed_site = None
    f = sys._getframe(1)
    while f is not None:
        path = f.f_code.co_filename
        if not (path.startswith(_SKIP_DIRS) or path.startswith("<")):
            installed = _installed(path)
            if installed or not path.startswith(_STDLIB):  # a pyenv's site-packages lies inside its stdlib
                where = f"{path}:{f.f_lineno} in {f.f_code.co_name}"
                if not installed:
                    return where
                installed_site = installed_site or where
        f = f.f_back
    return installed_site or "<torch internals>"


def _reduce_name(op: Any) -> str:
    if op is None:
        return "sum"
    name = str(getattr(op, "op", op)).rsplit(".", 1)[-1].lower()
    return {"band": "sum", "bor": "sum", "bxor": "sum"}.get(name, name)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _device(tensors: list[torch.Tensor]) -> int:
    for t in tensors:
        if t.device.type == "cuda":
            return t.device.index or 0
    return torch.cuda.current_device()


@dataclass
class _Held:
    """What a member contributes to a collective's values: its shadow (real data) if it has
    one, and its value (interpose/values/policy.py)."""
    shadow: torch.Tensor | None
    value: Any


def _held(t: torch.Tensor) -> _Held:
    shadow = values.shadow_of(t)
    return _Held(None if shadow is None else shadow.clone(), values.value_of(t))


def _write_shadow(t: torch.Tensor, value: torch.Tensor | None) -> None:
    """A collective wrote into t: its shadow (shared with views of it) takes the value."""
    shadow = values.shadow_of(t)
    if value is not None and shadow is not None and shadow.shape == value.shape:
        shadow.copy_(value)
    else:
        values.set_shadow(t, None if value is None else value.clone())


def _rows(t: torch.Tensor, splits: list[int] | None, n: int) -> list[int]:
    """Rows of t per member: the split sizes given, else t's first dimension split evenly."""
    if splits:
        return [int(x) for x in splits]
    rows = t.shape[0] if t.dim() else 1
    return [rows // n] * n


def _row_bytes(t: torch.Tensor) -> int:
    """Bytes of one row (one index of the first dimension) of t."""
    per_row = 1
    for d in t.shape[1:]:
        per_row *= d
    return per_row * t.element_size()


def _write_concatenated(t: torch.Tensor, parts: list[_Held]) -> None:
    """t holds the members' parts one after another (all_gather_into_tensor, an all_to_all's
    output): their shadows concatenated where every part has one that fits, else the first
    part's value in every element."""
    shadows = [h.shadow for h in parts]
    if all(x is not None for x in shadows) and sum(x.numel() for x in shadows) == t.numel():
        _write_shadow(t, torch.cat([x.reshape(-1) for x in shadows]).reshape(t.shape))
        values.set_value(t, None)
    else:
        _write_held(t, _Held(None, parts[0].value))


def _write_held(t: torch.Tensor, held: _Held) -> None:
    _write_shadow(t, held.shadow if held.shadow is not None and held.shadow.shape == t.shape else None)
    values.set_value(t, held.value)


def _reduce_held(t: torch.Tensor, parts: list[_Held], reduce_op: str) -> None:
    """All-reduce: on the members' shadows when every member has one, else on their values."""
    shadows = [p.shadow for p in parts]
    if all(s is not None and s.shape == t.shape for s in shadows):
        combined = values.combine(shadows, reduce_op)  # type: ignore[arg-type]
        if combined is not None:
            _write_shadow(t, combined)
            values.set_value(t, None)
            return
    _write_shadow(t, None)
    values.note_collective_value(t, [p.value for p in parts], reduce_op)


class SimWork(dist._Work):
    def __init__(self, work_id: int, device: int, result: list[torch.Tensor], host_blocks: bool = False) -> None:
        super().__init__()
        self.work_id, self.device, self._result, self.host_blocks = work_id, device, result, host_blocks
        self.waited = False
        self.captured = False  # called during a CUDA graph capture: recorded into the graph, not run
        # C++ holders (a boxed Work, DDP's reducer) call our overrides only while this Python
        # object lives; without it c10d's default Work.wait() blocks forever.
        _live_works[work_id] = self
        if len(_live_works) > _MAX_LIVE_WORKS:
            del _live_works[next(iter(_live_works))]

    def wait(self, timeout: Any = None) -> bool:
        _live_works.pop(self.work_id, None)
        _unwaited.pending.pop(self.work_id, None)
        self.waited = True
        _record_wait(self.work_id, self.device, self.host_blocks)
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Future:
        fut: Future = Future()
        fut.set_result(self._result)
        return fut


def _record_wait(work_id: int, device: int, host_blocks: bool) -> None:
    _rt.client.record([P.R_WORK_WAIT, work_id, device, current_stream_id(device), int(host_blocks)])
    if host_blocks:
        # A barrier holds the process until every member is in (scripts rely on it, e.g.
        # rank 0 writes a file the others read): the clock call is answered only then.
        _rt.client.call(P.C_NOW)


class _Unwaited:
    """Works issued inside a backward pass and not waited on by the end of it. Kept by id, not
    by the work: a work holds its tensors, and one the program waited on and dropped must free
    them then, as on a GPU (FSDP's all-gather and reduce-scatter buffers and an expert-parallel
    all-to-all's outputs, a layer at a time), not at the end of the backward."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[int, bool]] = {}  # work id -> (device, host_blocks)
        self.callback_queued = False

    def add(self, work: SimWork) -> None:
        self.pending[work.work_id] = (work.device, work.host_blocks)
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.flush)

    def flush(self) -> None:
        pending, self.pending, self.callback_queued = self.pending, {}, False
        for work_id, (device, host_blocks) in pending.items():
            work = _live_works.get(work_id)
            if work is not None:
                work.wait()
            else:  # dropped by the program (or past _MAX_LIVE_WORKS) without a wait
                _record_wait(work_id, device, host_blocks)


_unwaited = _Unwaited()


class SimProcessGroup(dist.ProcessGroup):
    """Stands in for ProcessGroupNCCL (same constructor and Options), reporting collectives."""

    class Options:
        def __init__(self, is_high_priority_stream: bool = False) -> None:
            self.is_high_priority_stream = is_high_priority_stream
            self._timeout = timedelta(minutes=10)
            self.global_ranks_in_group: list[int] = []
            self.group_name = ""
            self.split_from = None
            self.split_color = 0
            self.config = None

    def __init__(self, store: Any, rank: int, size: int, options: Any = None) -> None:
        super().__init__(rank, size)
        self.options = options or SimProcessGroup.Options()
        ranks = list(getattr(self.options, "global_ranks_in_group", []) or [])
        self.global_ranks = tuple(ranks) if ranks else tuple(range(size))
        self._group_name = getattr(self.options, "group_name", "") or ""
        self._seq = 0
        self._p2p_seq: dict[tuple[int, int], int] = {}
        _groups[self._group_name] = self
        if c10d.GroupMember.WORLD is None and not ranks:
            # the default group, built by init_process_group from the rank its rendezvous
            # settled: from here on the process is that rank, before any collective it calls
            _rt.identify(rank, size)
            _keep_hosted_store(store, rank)

    # --- what c10d asks of a backend ----------------------------------------------------------
    def _set_sequence_number_for_group(self) -> None:
        pass

    @property
    def group_name(self) -> str:
        return self._group_name

    def getBackendName(self) -> str:
        return "nccl"

    @property
    def supports_splitting(self) -> bool:
        return False

    def eager_connect_single_device(self, device: Any) -> None:
        pass

    def _get_backend(self, device: Any) -> "SimProcessGroup":
        # c10d returns a ProcessGroup subclass as the group itself, without registering it as a
        # backend of any device; torch >= 2.14 asks every group for its backend (e.g.
        # batch_isend_irecv checks supports_coalescing), which would raise "No backend type
        # associated with device type cuda". Like ProcessGroupNCCL, this group is its own backend.
        return self

    # --- reporting ----------------------------------------------------------------------------
    def _next_seq(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def _captured(self, op: str, device: int, stream: int, next_seq: Any) -> bool:
        """Is the collective called on a stream capturing a CUDA graph? Then it is recorded into
        the graph and consumes no sequence number now: each replay of the graph launches it again
        and takes one then (next_seq), on every member alike (interpose/device/cuda_graphs.py). Values
        are not exchanged: a captured collective computes nothing until a replay, and a replay
        runs no Python."""
        cap = cuda_graphs.capture_of(device, stream)
        if cap is None:
            return False
        cuda_graphs.note_captured_collective(cap, op, next_seq)
        return True

    def _collective(self, op: str, tensors: list[torch.Tensor], nbytes: int, *, reduce_op: Any = None,
                    root: int | None = None, host_blocks: bool = False,
                    splits: tuple[list[int], list[int]] | None = None) -> SimWork:
        """Report a collective; `splits`: an all_to_all's (send, receive) bytes per member."""
        device = _device(tensors)
        stream = current_stream_id(device)
        captured = self._captured(op, device, stream, self._next_seq)
        payload = {
            "op": op, "group": list(self.global_ranks), "seq": -1 if captured else self._next_seq(),
            "nbytes": int(nbytes), "dtype": _dtype(tensors[0]) if tensors else "",
            "reduce_op": _reduce_name(reduce_op) if reduce_op is not None
            or op in ("all_reduce", "reduce_scatter", "reduce") else "",
            "root": None if root is None else self.global_ranks[root], "device": device,
            "stream": stream, "site": call_site(), "group_name": self._group_name, **_transport(),
        }
        if splits is not None:
            payload["send_splits"], payload["recv_splits"] = splits
        work = self._submit(payload, device, tensors, host_blocks)
        work.captured = captured
        if op in ("all_reduce", "broadcast") and tensors and not captured:
            with values.real_cpu():  # shadows are real tensors; this may run inside a dispatch
                if all(values.exchanges_values(t) for t in tensors):
                    self._carry_values(op, tensors, payload["seq"], payload["reduce_op"], payload["root"])
                elif op == "all_reduce":
                    # Too large to exchange: every member is taken to hold the same value as this one
                    # (the same program computed it), so SUM over N members of 1 reads N.
                    for t in tensors:
                        _write_shadow(t, None)
                        values.note_collective_value(t, [values.value_of(t)] * self.size(), payload["reduce_op"])
        return work

    def _p2p(self, op: str, tensors: list[torch.Tensor], peer: int, nbytes: int | None = None) -> SimWork:
        me, other = self.global_ranks[self.rank()], self.global_ranks[peer]
        pair = (me, other) if op == "send" else (other, me)

        def next_seq() -> int:
            seq = self._p2p_seq.get(pair, 0)
            self._p2p_seq[pair] = seq + 1
            return seq

        device = _device(tensors)
        stream = current_stream_id(device)
        captured = self._captured(op, device, stream, next_seq)
        seq = -1 if captured else next_seq()
        nbytes = sum(t.nbytes for t in tensors) if nbytes is None else nbytes
        payload = {"op": op, "group": list(pair), "seq": seq, "nbytes": nbytes,
                   "dtype": _dtype(tensors[0]) if tensors else "uint8", "device": device,
                   "stream": stream, "site": call_site(), "group_name": self._group_name, **_transport()}
        work = self._submit(payload, device, tensors, False)
        work.captured = captured
        # A mirrored peer has no process to post or read values (phantora/roles.py): what this
        # rank receives from one keeps its own value, as a tensor too large to exchange does.
        if tensors and not captured and all(values.exchanges_values(t) for t in tensors) and _roles().runs(other):
            key = f"phantora/values/p2p/{pair[0]}->{pair[1]}/{seq}"
            store = c10d._get_default_store()
            if op == "send":
                with values.real_cpu():
                    store.set(key, pickle.dumps([_held(t) for t in tensors]))
            else:
                def receive() -> None:
                    with values.real_cpu():
                        for t, held in zip(tensors, self._collect(key, [key], 1, [[_held(t) for t in tensors]])[0]):
                            _write_held(t, held)

                self._resolve_when_used(tensors, receive, [key])
        return work

    def _carry_values(self, op: str, tensors: list[torch.Tensor], seq: int, reduce_op: str, root: int | None) -> None:
        """Tensors up to values.COPY_SHADOW_MAX_NUMEL carry their shadows and values
        (interpose/values/policy.py) through all_reduce and broadcast, exchanged via the c10d store:
        this rank's contribution now, the others' when the result is first used."""
        key = self._values_key(seq)
        me = self.global_ranks[self.rank()]
        mine = [_held(t) for t in tensors]
        if op == "broadcast":
            if me == _source(root, self.global_ranks, me):  # the root, its stand-in, or nobody: keep mine
                if _roles().runs(root) or _roles().representative(root) in self.global_ranks:
                    self._post(key, mine)
                return

            def receive() -> None:
                with values.real_cpu():
                    for t, held in zip(tensors, self._collect(key, [key], _processes(self.global_ranks) - 1, [mine])[0]):
                        _write_held(t, held)

            self._resolve_when_used(tensors, receive, [key])
            return
        keys, everyone = self._exchange(seq, mine)

        def reduce() -> None:
            with values.real_cpu():
                members = everyone()
                for i, t in enumerate(tensors):
                    _reduce_held(t, [member[i] for member in members], reduce_op)

        self._resolve_when_used(tensors, reduce, keys)

    def _resolve_when_used(self, tensors: list[torch.Tensor], resolve: Any, keys: list[str]) -> None:
        """Resolve now if every contribution is already in the store (no wait), else when the
        result is first used (values.defer)."""
        once = values.defer(tensors, resolve)
        with values.real_cpu():
            if c10d._get_default_store().check(list(dict.fromkeys(keys))):
                once()

    def _values_key(self, seq: int) -> str:
        return f"phantora/values/{self._group_name}/{seq}"

    def _exchange(self, seq: int, mine: list[_Held]) -> tuple[list[str], Callable[[], list[list[_Held]]]]:
        """Post this member's contribution to collective `seq`: the keys every member's is read
        from (in group order; a mirrored member's is its representative's), and the reader of
        them all, to call when the result is first used."""
        key = self._values_key(seq)
        me = self.global_ranks[self.rank()]
        self._post(f"{key}/{me}", mine)
        keys = [f"{key}/{_source(r, self.global_ranks, me)}" for r in self.global_ranks]
        return keys, lambda: self._collect(key, keys, _processes(self.global_ranks), [mine] * len(keys))

    # Values carried through the store are phantora's work, not the program's: on a GPU they are
    # simply in the tensors. Pickling them runs torch's Python (and what a framework put in its
    # place: Megatron-Core's torch.storage._load_from_bytes is a torch.load, ~30,000 instructions a
    # tensor), which the counted host must not charge to the program. Whether a value is read at
    # the collective or at its first use depends on when the other ranks posted, so charging it
    # made runs differ. _post and _collect run in phantora's bracket (python_time.own_work).

    def _post(self, key: str, mine: list[_Held]) -> None:
        with _rt.python_time.own_work, values.real_cpu():
            c10d._get_default_store().set(key, pickle.dumps(mine))

    def _collect(self, key: str, keys: list[str], readers: int, fallback: list[list[_Held]]) -> list[list[_Held]]:
        """The contributions posted under `keys`. The last of `readers` to read them deletes
        them, so the store does not grow with the steps. Read after rank 0, which hosts the
        store, has exited (a value first used at the end of a script), the store is gone:
        every member is then taken to have contributed what this one did (`fallback`)."""
        store = c10d._get_default_store()
        try:
            with _rt.python_time.own_work:
                unique = list(dict.fromkeys(keys))  # mirrored members share their representative's key
                # unpickled once a key: its mirrored members read the same contribution (the
                # writers copy from it, as from the fallback's shared list). Once a member, an
                # expert-parallel token-count exchange of 63 mirrors unpickled its
                # representative's tensors 63 times: a third of a rank's CPU in the 671B at 256 GPUs.
                posted = {k: pickle.loads(store.get(k)) for k in unique}
                blobs = [posted[k] for k in keys]
                _read_by(store, key, unique, readers)
        except RuntimeError:  # torch.distributed.DistNetworkError: the store's host has exited
            return fallback
        return blobs

    def _gather_values(self, seq: int, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> None:
        """all_gather: output j of member r takes member r's input j (shadow and value)."""
        with values.real_cpu():
            if not all(values.exchanges_values(t) for t in inputs):
                for per_input, t in zip(outputs, inputs):
                    for o in per_input:
                        _write_held(o, _Held(None, values.value_of(t)))
                return
        keys, everyone = self._exchange(seq, [_held(t) for t in inputs])

        def gather() -> None:
            with values.real_cpu():
                members = everyone()
                for j, per_input in enumerate(outputs):
                    for r, o in enumerate(per_input):
                        if r < len(members):
                            _write_held(o, members[r][j])

        self._resolve_when_used([o for per_input in outputs for o in per_input], gather, keys)

    def _gather_base_values(self, seq: int, output: torch.Tensor, input: torch.Tensor) -> None:
        """all_gather_into_tensor: the output holds the members' inputs one after another
        (Accelerate's gather of a per-rank count, e.g. Trainer's num_items_in_batch). With every
        member's shadow the output's shadow is their concatenation; else it reads as member 0's
        value (one value stands for every element)."""
        with values.real_cpu():
            if not (values.exchanges_values(input) and values.exchanges_values(output)):
                _write_held(output, _Held(None, values.value_of(input)))
                return
        with values.real_cpu():  # the shadow's clone is phantora's bookkeeping, not the script's op
            mine = [_held(input)]
        keys, everyone = self._exchange(seq, mine)

        def gather() -> None:
            with values.real_cpu():
                _write_concatenated(output, [member[0] for member in everyone()])

        self._resolve_when_used([output], gather, keys)

    def next_p2p_seq(self, src: int, dst: int) -> int:
        """The sequence number the next send from global rank src to dst will carry."""
        return self._p2p_seq.get((src, dst), 0)

    def _submit(self, payload: dict[str, Any], device: int, tensors: list[torch.Tensor], host_blocks: bool) -> SimWork:
        work_id = _rt.client.call(P.C_COLLECTIVE, payload)
        work = SimWork(int(work_id), device, tensors, host_blocks)
        if torch._C._current_autograd_node() is not None:
            _unwaited.add(work)
        return work

    # --- collectives --------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        check.one_tensor(tensors)
        return self._collective("all_reduce", tensors, sum(t.nbytes for t in tensors),
                                reduce_op=getattr(opts, "reduceOp", None))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        check.same_device(tensors)
        return self._collective("all_reduce", tensors, sum(t.nbytes for t in tensors),
                                reduce_op=getattr(opts, "reduceOp", None))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        check.one_tensor(tensors)
        return self._collective("broadcast", tensors, sum(t.nbytes for t in tensors), root=getattr(opts, "rootRank", 0))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        check.one_tensor(tensors)
        return self._collective("reduce", tensors, sum(t.nbytes for t in tensors), root=getattr(opts, "rootRank", 0),
                                reduce_op=getattr(opts, "reduceOp", None))

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        mine = check.one_tensor(inputs)
        check.list_against_own(mine, output_lists[-1] if output_lists else [], self.rank(), "_broadcast_oop")
        outs = [t for lst in output_lists for t in lst]
        seq = self._seq
        # NCCL moves the input from every member, whatever the output list holds.
        work = self._collective("all_gather", outs, mine.nbytes * self.size())
        if inputs and len(output_lists) == len(inputs) and not work.captured:
            self._gather_values(seq, output_lists, inputs)
        return work

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        check.allgather_base(output, input, self.size())
        seq = self._seq
        work = self._collective("all_gather", [output], output.nbytes)
        if not work.captured:
            self._gather_base_values(seq, output, input)
        return work

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> SimWork:
        return self._collective("all_gather", outputs, sum(t.nbytes for t in outputs))

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> SimWork:
        mine = check.one_tensor(outputs)
        check.list_against_own(mine, input_lists[-1] if input_lists else [], self.rank(), "_reduce_oop")
        return self._collective("reduce_scatter", outputs, mine.nbytes * self.size(),
                                reduce_op=getattr(opts, "reduceOp", None))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        check.reduce_scatter_base(output, input, self.size())
        return self._collective("reduce_scatter", [output], input.nbytes, reduce_op=getattr(opts, "reduceOp", None))

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> SimWork:
        return self._collective("reduce_scatter", outputs, sum(t.nbytes for t in inputs),
                                reduce_op=getattr(opts, "reduceOp", None))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> SimWork:
        check.alltoall_base(output, input, output_split_sizes, input_split_sizes, self.size())
        return self._all_to_all_rows(output, input, output_split_sizes, input_split_sizes)

    def _all_to_all_rows(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None,
                         input_split_sizes: list[int] | None) -> SimWork:
        """all_to_all_single (c10d's and the functional one): rows of `input` go to the members in
        the input split sizes, rows from them fill `output` in the output split sizes (even
        splits where none are given). Expert parallelism's token exchange: sizes differ per rank."""
        n = self.size()
        ins, outs = _rows(input, input_split_sizes, n), _rows(output, output_split_sizes, n)
        splits = ([r * _row_bytes(input) for r in ins], [r * _row_bytes(output) for r in outs])
        seq = self._seq
        work = self._collective("all_to_all", [output], input.nbytes, splits=splits)
        if not work.captured:
            with values.real_cpu():
                shadow = values.shadow_of(input)
                chunks = list(shadow.reshape(input.shape).split(ins)) if shadow is not None and input.dim() \
                    else [None] * n
                mine = [_Held(None if c is None else c.clone(), values.value_of(input)) for c in chunks]
            self._all_to_all_values(seq, mine, [output], [input, output])
        return work

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        check.alltoall(outputs, inputs)
        splits = ([t.nbytes for t in inputs], [t.nbytes for t in outputs])
        seq = self._seq
        work = self._collective("all_to_all", outputs, sum(t.nbytes for t in inputs), splits=splits)
        if not work.captured and len(inputs) == len(outputs) == self.size():
            with values.real_cpu():
                mine = [_held(t) for t in inputs]
            self._all_to_all_values(seq, mine, outputs, [*inputs, *outputs])
        return work

    def _all_to_all_values(self, seq: int, mine: list[_Held], outputs: list[torch.Tensor],
                           tensors: list[torch.Tensor]) -> None:
        """An all_to_all's data: output chunk j of this member is member j's chunk for this one
        (`mine[i]`: this member's chunk for member i). One output tensor holds the chunks one
        after another; a list holds one each. Exchanged for tensors up to
        values.COPY_SHADOW_MAX_NUMEL (the per-expert counts an expert-parallel dispatcher
        exchanges, which decide the split sizes of its token exchange); larger outputs read as
        this member's value."""
        if not all(values.exchanges_values(t) for t in tensors):
            with values.real_cpu():
                for o in outputs:
                    _write_held(o, _Held(None, mine[0].value if mine else values.value_of(o)))
            return
        pos = self.rank()
        keys, everyone = self._exchange(seq, mine)

        def exchange() -> None:
            with values.real_cpu():
                got = [member[pos] for member in everyone()]
                if len(outputs) > 1:
                    for o, h in zip(outputs, got):
                        _write_held(o, h)
                    return
                _write_concatenated(outputs[0], got)

        self._resolve_when_used(outputs, exchange, keys)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        # NCCL gathers with point-to-point sends to the root; as traffic it is an all-to-all
        # in which only the root receives. Modelled as a reduce of the same size.
        check.gather(output_lists, inputs, getattr(opts, "rootRank", 0), self.rank(), self.size())
        return self._collective("reduce", inputs, sum(t.nbytes for t in inputs) * self.size(),
                                root=getattr(opts, "rootRank", 0), reduce_op="sum")

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> SimWork:
        check.scatter(outputs, input_lists, getattr(opts, "rootRank", 0), self.rank(), self.size())
        return self._collective("broadcast", outputs, sum(t.nbytes for t in outputs) * self.size(),
                                root=getattr(opts, "rootRank", 0))

    def barrier(self, opts: Any = None) -> SimWork:
        # ProcessGroupNCCL's barrier is a 1-element all-reduce the host then waits for.
        device = torch.cuda.current_device()
        stream = current_stream_id(device)
        cuda_graphs.check_sync_allowed("dist.barrier()", device, stream)
        payload = {"op": "barrier", "group": list(self.global_ranks), "seq": self._next_seq(), "nbytes": 4,
                   "dtype": "float32", "device": device, "stream": stream, "site": call_site(),
                   "group_name": self._group_name}
        return self._submit(payload, device, [], True)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> SimWork:
        check.one_tensor(tensors, p2p=True)
        return self._p2p("send", tensors, dst)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> SimWork:
        check.one_tensor(tensors, p2p=True)
        return self._p2p("recv", tensors, src)


def install_distributed(rt: Any) -> None:
    global _rt
    _rt = rt
    c10d.ProcessGroupNCCL = SimProcessGroup
    if not isinstance(c10d.default_pg_nccl_timeout, timedelta):
        c10d.default_pg_nccl_timeout = timedelta(minutes=10)  # ProcessGroupNCCL's default
    c10d._NCCL_AVAILABLE = True
    c10d.is_nccl_available = lambda: True
    dist.is_nccl_available = c10d.is_nccl_available
    # c10d's exception logger asks for the NCCL version when a collective raises; on a CPU
    # build that is an AttributeError that would hide the real error.
    import torch.cuda.nccl

    torch.cuda.nccl.version = lambda: SIMULATED_NCCL_VERSION
    _patch_ddp()
    _store_counts_processes()
    _report_groups()
    _identify_at_init()
    _read_owed_values_before_leaving()
    install_object_collectives()
    if os.environ.get(RanksEnv):  # mirrored ranks: their checkpoint save plans are derived
        from interpose.distributed import checkpoint_plans

        checkpoint_plans.install()
    from interpose.ops import observer

    observer._SPECIAL.update(collective_op_handlers())


def _store_counts_processes() -> None:
    """With mirrored ranks (--ranks), the job's TCPStore is told of the processes that exist:
    its host (rank 0) waits for that many to connect, not for the whole world."""
    rendezvous = sys.modules["torch.distributed.rendezvous"]  # the module (torch.distributed.rendezvous is a function)

    original = rendezvous._create_c10d_store

    def _create_c10d_store(hostname: str, port: int, rank: int, world_size: int, *args: Any, **kwargs: Any) -> Any:
        if world_size is not None and world_size > 0:
            world_size = len(RankRoles.from_env(world_size).representatives)
        return original(hostname, port, rank, world_size, *args, **kwargs)

    _create_c10d_store.__wrapped__ = original  # type: ignore[attr-defined]
    rendezvous._create_c10d_store = _create_c10d_store


def _report_groups() -> None:
    """With mirrored ranks (--ranks), the simulator learns every process group the program
    creates, including those this rank is not in: a mirrored rank joins its representative's
    collectives on the group of the same family that contains it (phantora/engine/mirrors.py).
    c10d calls _new_process_group_helper on every rank for every group (with [] for the default
    group)."""
    from phantora.roles import ENV

    if not os.environ.get(ENV):
        return
    original = c10d._new_process_group_helper

    def _new_process_group_helper(group_size: int, group_rank: int, global_ranks_in_group: list[int], backend: Any,
                                  store: Any, group_name: str, *args: Any, **kwargs: Any) -> Any:
        ranks = list(global_ranks_in_group) or list(range(group_size))
        _rt.client.note_record([P.R_GROUP, str(group_name), ranks, str(backend).lower()])
        if str(backend).lower() == "gloo" and _has_mirrored_member(ranks):
            _warn_gloo_simulated(ranks, group_name)
            backend = "nccl"  # phantora's simulated backend (SimProcessGroup), which mirrors ranks
        return original(group_size, group_rank, global_ranks_in_group, backend, store, group_name, *args, **kwargs)

    _new_process_group_helper.__wrapped__ = original  # type: ignore[attr-defined]
    c10d._new_process_group_helper = _new_process_group_helper


def _has_mirrored_member(ranks: list[int]) -> bool:
    from phantora.roles import RankRoles

    running = set(RankRoles.from_env(dist.get_world_size()).representatives)
    return any(r not in running for r in ranks)


def _warn_gloo_simulated(ranks: list[int], group_name: Any) -> None:
    """A gloo group connects every member's process to every other through the store when it
    is created; a mirrored rank has no process, so creating one would wait out gloo's 30-minute
    timeout. Megatron-Core's distributed optimizer needs its gloo data-parallel groups to exist
    (for checkpointing), so such a group is made by phantora's simulated backend instead, as an
    NCCL group is, and the user is told once."""
    if getattr(_warn_gloo_simulated, "told", False):
        return
    _warn_gloo_simulated.told = True  # type: ignore[attr-defined]
    print(f"phantora: rank {dist.get_rank()}: new_group(backend='gloo') over ranks {ranks[:8]}"
          f"{' ...' if len(ranks) > 8 else ''} (group {group_name}) includes ranks phantora mirrors (--ranks), which "
          "have no process for gloo to connect: such groups are simulated by phantora's NCCL stand-in (their "
          "collectives timed as NCCL's); --ranks all runs gloo itself", file=sys.stderr, flush=True)


def _identify_at_init() -> None:
    """The rank a process passes to init_process_group (or the one its rendezvous settles) is
    its identity for torch, whatever the environment said: Lightning's launcher and mp.spawn
    pass it as an argument. Any backend: gloo or nccl."""
    original = c10d.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        _rt.identify(dist.get_rank(), dist.get_world_size())

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


def _keep_hosted_store(store: Any, rank: int) -> None:
    """Rank 0 hosts the job's c10d store where no agent does (workers phantora starts itself,
    which torchrun's own launch gives an agent store; env:// or tcp:// by hand). The store's
    server lives as long as the store object, so the program's destroy_process_group() stopped
    it; on a GPU the ranks leave together, but here they run at their own wall speed, and a
    pipeline's last stage, minutes behind rank 0, failed its next store read with "Broken
    pipe". phantora keeps the store and tells the simulator, which answers this process's
    goodbye once every other rank process is done (phantora/simulator/server.py)."""
    base = store
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if rank == 0 and isinstance(base, dist.TCPStore) and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        _rt.hosted_store = store
        _rt.client.exit_info["hosts_store"] = True


def _read_owed_values() -> None:
    """Leave the default process group with nothing owed to this rank left in the store.

    Values and objects travel through the c10d store; a real job needs it only at start-up,
    phantora until the last rank has read what other ranks sent it. So a rank reads everything
    still owed to it before destroy_process_group() takes the store away. Where rank 0 hosts
    the store, phantora keeps it until the other processes end (_keep_hosted_store)."""
    if getattr(_read_owed_values, "done", False) or not dist.is_initialized():
        return
    _read_owed_values.done = True  # type: ignore[attr-defined]
    try:
        with values.real_cpu():
            values.settle_all()
    except Exception:  # a peer died or the store is gone: nothing left to read
        pass


def _read_owed_values_before_leaving() -> None:
    """At destroy_process_group() of the default group, and at exit for scripts that never call
    it (see _read_owed_values); not at the exit of a script that raised, whose peers may never
    send what it is owed."""
    import atexit

    original = c10d.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        if group is None or group is c10d.GroupMember.WORLD:
            _read_owed_values()
        original(group)

    destroy_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    destroy_process_group.__doc__ = original.__doc__
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group

    failing: list[BaseException] = []
    stock_hook = sys.excepthook

    def excepthook(kind: Any, value: BaseException, tb: Any) -> None:
        failing.append(value)
        # a store host that fails must not wait at its goodbye for the others: its exit is what
        # makes the launcher stop them, as torchrun's agent does (phantora/simulator/server.py)
        _rt.client.exit_info["failed"] = True
        stock_hook(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(lambda: failing or _read_owed_values())


def _patch_ddp() -> None:
    """DDP checks parameter shapes across ranks by reading tensor data, and its C++ logger
    asserts on CUDA timers a virtual GPU does not have; neither changes what runs."""
    import torch.nn.parallel.distributed as ddp_mod

    def verify_param_shape_across_processes(process_group: Any, tensors: Any, logger: Any = None) -> None:
        return None

    ddp_mod._verify_param_shape_across_processes = verify_param_shape_across_processes
    original_init = ddp_mod.DistributedDataParallel.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        logger = getattr(self, "logger", None)
        if logger is not None:
            self.logger = _QuietLogger(logger)

    ddp_mod.DistributedDataParallel.__init__ = __init__


class _QuietLogger:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def set_runtime_stats_and_log(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# --- collectives that never reach the process group --------------------------------------------
# Under FakeTensorMode, c10d's _allgather_base_ / _reduce_scatter_base_ (all_gather_into_tensor,
# reduce_scatter_tensor; FSDP2 uses them) and the functional collectives DTensor uses
# (_c10d_functional.*) run their fake kernels instead of the backend. The observer hands them
# here: report them through the group's SimProcessGroup, and return our Work so wait() works.

def _sim_pg(pg_or_name: Any) -> SimProcessGroup:
    if isinstance(pg_or_name, str):
        name = pg_or_name
    else:
        pg = pg_or_name if isinstance(pg_or_name, dist.ProcessGroup) else dist.ProcessGroup.unbox(pg_or_name)
        name = pg.group_name
    backend = _groups.get(name)
    if backend is None:
        raise RuntimeError(f"phantora: collective on process group {name!r}, which is not an 'nccl' group; only "
                           "'nccl' groups are simulated (use init_process_group('nccl') or new_group(backend='nccl'))")
    return backend


_functional_works: dict[int, SimWork] = {}  # id(output tensor) -> its collective, until wait_tensor


def _c10d_allgather_base(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    out = func(*args, **kwargs)
    work = _sim_pg(args[2])._allgather_base(args[0], args[1])
    return out[0], work.boxed()


def _c10d_reduce_scatter_base(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    out = func(*args, **kwargs)
    op = args[3] if len(args) > 3 else None
    try:
        op = dist.ReduceOp.unbox(op) if op is not None and not isinstance(op, dist.ReduceOp) else op
    except Exception:
        op = None
    pg = _sim_pg(args[2])
    check.reduce_scatter_base(args[0], args[1], pg.size())
    work = pg._collective("reduce_scatter", [args[0]], args[1].nbytes, reduce_op=op)
    return out[0], work.boxed()


def _functional(kind: str) -> Any:
    def handler(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        a = dict(zip((x.name for x in func._schema.arguments), args), **kwargs)
        pg = _sim_pg(a["group_name"])
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        ins = a["input"] if isinstance(a["input"], (list, tuple)) else [a["input"]]
        if kind in ("all_reduce", "broadcast", "all_gather"):
            _seed_values(ins, outs, whole=kind != "all_gather")
        if kind == "all_reduce":
            work = pg._collective("all_reduce", outs, sum(t.nbytes for t in ins), reduce_op=a.get("reduce_op", "sum"))
        elif kind == "all_gather":
            work = pg._collective("all_gather", outs, sum(t.nbytes for t in outs))
        elif kind == "reduce_scatter":
            work = pg._collective("reduce_scatter", outs, sum(t.nbytes for t in ins), reduce_op=a.get("reduce_op", "sum"))
        elif kind == "all_to_all":
            work = pg._all_to_all_rows(outs[0], ins[0], a.get("output_split_sizes"), a.get("input_split_sizes"))
        else:  # broadcast
            src = int(a.get("src", 0))
            work = pg._collective("broadcast", outs, sum(t.nbytes for t in ins), root=pg.global_ranks.index(src)
                                  if src in pg.global_ranks else 0)
        for t in outs:
            _functional_works[id(t)] = work
        return out
    return handler


def _seed_values(ins: list[torch.Tensor], outs: list[torch.Tensor], whole: bool) -> None:
    """A functional collective's outputs are new tensors: they start from their inputs' data
    (shadow and value, interpose/values/policy.py), which the collective then combines across ranks.
    An all_gather's output (the members' inputs side by side) starts from the input's value."""
    with values.real_cpu():
        for i, o in zip(ins, outs):
            shadow = values.shadow_of(i) if whole else None
            values.set_shadow(o, None if shadow is None or shadow.shape != o.shape else shadow.clone())
            values.set_value(o, values.value_of(i))


def _wait_tensor(obs: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    out = func(*args, **kwargs)
    work = _functional_works.pop(id(args[0]), None)
    if work is not None:
        work.wait()
    if out is not args[0] and isinstance(out, torch.Tensor):
        _seed_values([args[0]], [out], whole=True)
    return out


def collective_op_handlers() -> dict[Any, Any]:
    """Dispatch-level handlers the observer uses for these ops (observer.py _SPECIAL)."""
    c10d_ops, fc = torch.ops.c10d, torch.ops._c10d_functional
    handlers = {
        c10d_ops._allgather_base_.default: _c10d_allgather_base,
        c10d_ops._reduce_scatter_base_.default: _c10d_reduce_scatter_base,
        fc.wait_tensor.default: _wait_tensor,
    }
    for name, kind in (("all_reduce", "all_reduce"), ("all_reduce_coalesced", "all_reduce"),
                       ("all_gather_into_tensor", "all_gather"), ("all_gather_into_tensor_coalesced", "all_gather"),
                       ("reduce_scatter_tensor", "reduce_scatter"), ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
                       ("all_to_all_single", "all_to_all"), ("broadcast", "broadcast")):
        op = getattr(fc, name, None)
        if op is not None:
            handlers[op.default] = _functional(kind)
    return handlers


# --- object collectives -------------------------------------------------------------------------
# all_gather_object / broadcast_object_list pickle objects into tensors and move them with
# NCCL; fake tensors carry no bytes, so the objects travel through the real c10d store instead.
# The collective is still reported (with the pickled size), so its time is simulated.

def _object_exchange(group: Any, kind: str, payload: bytes | None, root: int | None, obj: Any = None) -> list[bytes]:
    """Exchange pickled objects through the store; report the collective NCCL would run.

    kind: "all_gather" (every member's blob, in group order), "broadcast" (the root's blob),
    "gather" (every member's blob, read by the root only; others get []). root: a global rank.
    obj: what `payload` pickles (all_gather, gather), from which the contributions of ranks
    this process stands for are derived where they differ (checkpoint_plans.py); the others'
    derived contributions are posted under `{key}/{source}/mirrors` before the source's own."""
    pg = group or c10d._get_default_group()
    sim = _sim_pg(pg)
    store = c10d._get_default_store()
    members = sim.global_ranks
    me = dist.get_rank()
    key = f"phantora/objects/{sim.group_name}/{sim._seq}"
    derived: dict[int, bytes] = {}
    if kind != "broadcast" and obj is not None:
        derived = _derived_contributions(obj, [r for r in members if r != me and _source(r, members, me) == me])
        mine = {r: blob for r, blob in derived.items() if _roles().representative(r) == me}
        if mine:  # before this member's own post: a reader that sees it finds them too
            store.set(f"{key}/{me}/mirrors", pickle.dumps(mine))
    if payload is not None:
        store.set(f"{key}/{me}", payload)
    placeholder = torch.empty(0, device="cuda")
    # Members must agree on the size to match: report the sizes NCCL would move, padded as
    # torch pads them (to the largest member's), which only the store knows after the exchange.
    # A member takes its own blob from its hand, not from the store: rank 0 hosts the store
    # (env:// rendezvous) and may already have exited when the last member reads.
    if kind == "broadcast":
        source = _source(root, members, me)
        blobs = [payload if me == source and payload is not None else store.get(f"{key}/{source}")]
        nbytes = len(blobs[0])
        work = sim._collective("broadcast", [placeholder], nbytes, root=members.index(root))
    else:
        posted = {s: payload if s == me and payload is not None else store.get(f"{key}/{s}")
                  for s in dict.fromkeys(_source(r, members, me) for r in members)}
        mirrored = _roles().mirrored  # else nobody posts for others
        stood_for = {s: derived if s == me else pickle.loads(store.get(f"{key}/{s}/mirrors"))
                     if mirrored and store.check([f"{key}/{s}/mirrors"]) else {} for s in posted}
        everyone = [stood_for[s].get(r, posted[s]) for r, s in ((r, _source(r, members, me)) for r in members)]
        nbytes = max(len(b) for b in everyone) * len(members)
        if kind == "all_gather":
            work = sim._collective("all_gather", [placeholder], nbytes)
        else:  # NCCL gathers with sends to the root; timed like ProcessGroup.gather, as a reduce
            work = sim._collective("reduce", [placeholder], nbytes, root=members.index(root), reduce_op="sum")
        blobs = everyone if kind == "all_gather" or me == root else []
    work.wait()
    try:  # the keys of every member, posted or not (a member posts its mirrors' only when it has some)
        _read_by(store, key, [f"{key}/{r}{m}" for r in members for m in ("", "/mirrors")], _processes(members))
    except RuntimeError:  # torch.distributed.DistNetworkError: rank 0, the store's host, has exited
        pass
    return blobs


def _read_by(store: Any, key: str, keys: list[str], readers: int) -> None:
    """Counts this reader of an exchange through the store; the last of `readers` deletes `keys`
    and the count, so the store does not grow with the calls."""
    if store.add(f"{key}/read", 1) >= readers:
        for k in [*keys, f"{key}/read"]:
            store.delete_key(k)


def _derived_contributions(obj: Any, ranks: list[int]) -> dict[int, bytes]:
    """What `ranks` (mirrored ranks this process stands for) contribute to a gather where this
    process contributes `obj`, for those whose object differs from it: a distributed
    checkpoint's save plan (checkpoint_plans.py). phantora's work: a mirror plans on its own host."""
    from interpose.distributed import checkpoint_plans

    checkpoint_plans.local_plan_posted(obj)
    if not ranks:
        return {}
    timer = getattr(_rt, "python_time", None)
    with timer.own_work if timer is not None else contextlib.nullcontext():
        return {r: pickle.dumps(o) for r, o in checkpoint_plans.mirrors_plans(obj, ranks).items()}


def _all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    blobs = _object_exchange(group, "all_gather", pickle.dumps(obj), None, obj)
    for i, b in enumerate(blobs):
        object_list[i] = pickle.loads(b)


def _global_rank(group: Any, rank: int | None, group_rank: int | None) -> int:
    if rank is not None:
        return rank
    return dist.get_global_rank(group or c10d._get_default_group(), group_rank or 0)


def _broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                           device: Any = None, group_src: int | None = None) -> None:
    src = _global_rank(group, src, group_src)
    members = _sim_pg(group or c10d._get_default_group()).global_ranks
    payload = pickle.dumps(list(object_list)) if dist.get_rank() == _source(src, members, dist.get_rank()) else None
    [blob] = _object_exchange(group, "broadcast", payload, src)
    object_list[:] = pickle.loads(blob)


def _gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None,
                   group: Any = None, group_dst: int | None = None) -> None:
    dst = _global_rank(group, dst, group_dst)
    blobs = _object_exchange(group, "gather", pickle.dumps(obj), dst, obj)
    if dist.get_rank() == dst:
        if object_gather_list is None:
            raise ValueError("gather_object: the destination rank must pass object_gather_list")
        for i, b in enumerate(blobs):
            object_gather_list[i] = pickle.loads(b)


def _scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list: list[Any] | None = None,
                         src: int | None = None, group: Any = None, group_src: int | None = None) -> None:
    # NCCL scatters the root's list; every member receives its own element. As traffic this
    # is close to a broadcast of the whole list, which is how it is timed.
    src = _global_rank(group, src, group_src)
    me = dist.get_rank()
    members = _sim_pg(group or c10d._get_default_group()).global_ranks
    payload = pickle.dumps(list(scatter_object_input_list or [])) if me == _source(src, members, me) else None
    [blob] = _object_exchange(group, "broadcast", payload, src)
    scattered = pickle.loads(blob)
    from interpose.distributed import checkpoint_plans

    # a mirror's share is executed by no process: its representative takes what it can (a save plan's writes)
    mirrors = [scattered[i] for i, r in enumerate(members)
               if r != me and _roles().representative(r) == me and i < len(scattered)]
    scatter_object_output_list[0] = checkpoint_plans.with_mirrors_writes(scattered[members.index(me)], mirrors)


def _send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None, device: Any = None,
                      group_dst: int | None = None, use_batch: bool = False) -> None:
    dst = _global_rank(group, dst, group_dst)
    sim = _sim_pg(group or c10d._get_default_group())
    me = dist.get_rank()
    blob = pickle.dumps(list(object_list))
    c10d._get_default_store().set(f"phantora/p2p_objects/{me}->{dst}/{sim.next_p2p_seq(me, dst)}", blob)
    # torch sends the sizes, then the pickled bytes
    sim._p2p("send", [], sim.global_ranks.index(dst), nbytes=8 * len(object_list) + len(blob)).wait()


def _recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None,
                      group_src: int | None = None, use_batch: bool = False) -> int:
    if src is None and group_src is None:
        raise RuntimeError("phantora: recv_object_list from any source is not supported; pass src= or group_src=")
    src = _global_rank(group, src, group_src)
    sim = _sim_pg(group or c10d._get_default_group())
    me = dist.get_rank()
    sender, receiver = src, me
    if not _roles().runs(src):
        # A mirrored sender sends what its representative sent to the rank placed as this one
        # is (e.g. a witness of the last pipeline stage receives what stage 2's representative
        # sent to stage 3's).
        sender = _roles().representative(src)
        receiver = me - (src - sender)
        if not (0 <= receiver < dist.get_world_size() and _roles().runs(receiver)):
            raise RuntimeError(f"phantora: rank {me} receives objects from rank {src}, which is mirrored from rank "
                               f"{sender} (--ranks {_roles().env_value()}), and no running rank received its "
                               f"counterpart. Make rank {src} a representative (--ranks) or run every rank (--ranks all).")
    key = f"phantora/p2p_objects/{sender}->{receiver}/{sim.next_p2p_seq(src, me)}"
    blob = c10d._get_default_store().get(key)
    if not _roles().mirrored:  # with mirrored ranks, a witness may read it after its receiver
        c10d._get_default_store().delete_key(key)
    received = pickle.loads(blob)
    sim._p2p("recv", [], sim.global_ranks.index(src), nbytes=8 * len(received) + len(blob)).wait()
    object_list[:len(received)] = received
    return src


def install_object_collectives() -> None:
    for name, fn in (("all_gather_object", _all_gather_object), ("broadcast_object_list", _broadcast_object_list),
                     ("gather_object", _gather_object), ("scatter_object_list", _scatter_object_list),
                     ("send_object_list", _send_object_list), ("recv_object_list", _recv_object_list)):
        setattr(c10d, name, fn)
        setattr(dist, name, fn)
