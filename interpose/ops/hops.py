"""Higher-order operators (HOPs) run eagerly on virtual GPUs.

A HOP (torch.ops.higher_order.*: flex_attention, cond, while_loop, invoke_subgraph, map_impl,
scan, auto_functionalized, ...) takes functions or graphs as arguments. Eager torch dispatches one
on the Python key to the top TorchDispatchMode's rule for that HOP, looked up by the mode's exact
class (HigherOrderOperator.dispatch: `type(mode) in hop.python_key_table`), and raises
"There was no rule registered for HigherOrderOperator ..." when there is none. Two things follow:

* VirtualCudaFakeMode, a FakeTensorMode subclass, has none of FakeTensorMode's rules. Every HOP's
  rule table (those that exist now and those created later) resolves VirtualCudaFakeMode to the
  FakeTensorMode rule (`_InheritingRules`).
* The op observer has no rules either. It declares `supports_higher_order_operators`, so torch
  hands it every HOP through __torch_dispatch__, and `dispatch_hop` below either
    - reports the HOP as the one fused kernel a GPU runs (FUSED: flex_attention and its
      backward; the kernel that torch.compile generates), running it below the observer for its
      outputs, or
    - runs the HOP's own eager (dense) implementation with the observer active, so the ops of
      its body are reported one by one as a GPU would run them (cond takes the branch its
      predicate reads as under interpose/values/policy.py's policy, while_loop iterates while its
      predicate reads true, invoke_subgraph / map / scan / auto_functionalized run their bodies).

torch's eager `flex_attention(q, k, v, block_mask=...)` wraps the HOP in
torch.compile(fullgraph=True, backend="eager"). While the observer is on the mode stack Dynamo
skips that frame ("non-infra torch dispatch mode present") and then raises "torch.compile with
fullgraph=True found no compiled frames". Here flex_attention calls the HOP directly (torch's own
`_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG` path; with the eager backend the compiled wrapper does
nothing else). The observer stays a non-infra mode: making Dynamo trace through it is the
torch.compile question, not this module's.

`create_block_mask` evaluates the mask_mod over every (q, kv) position on the device; on a
virtual GPU that yields no data, so the mask's sparsity would be unknown. The same call is
repeated for real on the CPU when mask_mod is a function of the indices alone (causal, sliding
window, prefix-LM, ...; in slices of query rows, up to REAL_MASK_MAX_CELLS), and the CPU result
becomes the real "shadow" of the virtual BlockMask's tensors (interpose/values/policy.py): its
sparsity() is the real one, and the flex-attention kernels are costed with its real block
count. A mask_mod that reads tensors on a virtual GPU (TorchTitan's document ids, made on the GPU
from the batch's positions) reads their shadows in that evaluation, where phantora knows their
values; one that reads a tensor without data has nothing to evaluate: its block count is unknown
and the kernel is costed as if every block were visited (an upper bound). The evaluation is
phantora's work: its Python is not the program's host time, and Dynamo does not compile it.

The eager kernels of several HOPs assert that no dispatch mode is active; see _hide_own_modes.
torch.cond's backward needs branch functions returning tuples; see _branches_return_tuples.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree
from torch._ops import HigherOrderOperator
from torch.overrides import TorchFunctionMode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

from interpose.values import policy as values

DispatchKey = torch._C.DispatchKey

# HOPs that a GPU runs as one fused kernel (costed by phantora/cost/attention.py).
FUSED = frozenset({"flex_attention", "flex_attention_backward"})

# Block masks up to this many (batch, head, q, kv) cells are evaluated for real on the CPU, in
# slices of query rows (32k x 32k tokens: 1.5-5 s of CPU per distinct mask here); larger ones are
# not (their kernels are costed as visiting every block).
REAL_MASK_MAX_CELLS = 1 << 30

# Mode classes that use another mode class's HOP rules: {subclass: base}.
_RULES_FROM: dict[type, type] = {}


class _InheritingRules(dict):
    """A HOP's python_key_table in which a mode class registered in _RULES_FROM finds its base
    class's rule when it has none of its own."""

    def _key(self, k: Any) -> Any:
        if dict.__contains__(self, k):
            return k
        base = _RULES_FROM.get(k)
        return base if base is not None and dict.__contains__(self, base) else k

    def __contains__(self, k: object) -> bool:
        return dict.__contains__(self, self._key(k))

    def __getitem__(self, k: Any) -> Any:
        return dict.__getitem__(self, self._key(k))

    def get(self, k: Any, default: Any = None) -> Any:
        return dict.get(self, self._key(k), default)


def _inherit_rules(hop: HigherOrderOperator) -> None:
    if not isinstance(hop.python_key_table, _InheritingRules):
        hop.python_key_table = _InheritingRules(hop.python_key_table)
        hop._dispatch_cache.clear()


def inherit_hop_rules(mode_cls: type, base: type) -> None:
    """Give `mode_cls` every HOP rule registered for `base`, for the HOPs that exist now and for
    those created later (a HOP's rules may also be registered after it is created)."""
    _RULES_FROM[mode_cls] = base
    for hop in list(torch._ops._higher_order_ops.values()):
        _inherit_rules(hop)
    init = HigherOrderOperator.__init__
    if getattr(init, "_phantora_inherits_rules", False):
        return

    @functools.wraps(init)
    def __init__(self: HigherOrderOperator, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _inherit_rules(self)

    __init__._phantora_inherits_rules = True  # type: ignore[attr-defined]
    HigherOrderOperator.__init__ = __init__  # type: ignore[method-assign]


# --- the observer's side -------------------------------------------------------------------------
def dispatch_hop(obs: Any, func: HigherOrderOperator, args: tuple, kwargs: dict) -> Any:
    """The observer's answer to a HOP (called from its __torch_dispatch__, the observer popped)."""
    if not obs.rt.active:
        return _run_below(func, args, kwargs)
    if func.name() in FUSED:
        if _all_real_cpu((*args, *kwargs.values())):
            # Real data on the CPU (as with any op whose inputs are all real CPU tensors): the
            # HOP's CPU kernel computes it for real.
            with unset_fake_temporarily(), torch._C._AutoDispatchBelowAutograd():
                return func(*args, **kwargs)
        out = _run_below(func, args, kwargs)
        obs._report(func, *report_args(func, args, kwargs), out)
        return out
    body = _eager_kernel(func)
    if body is None:
        # No eager implementation to decompose into (HOPs only compiled code produces): one op,
        # reported under its own name (the cost model calls it unknown).
        out = _run_below(func, args, kwargs)
        obs._report(func, *report_args(func, args, kwargs), out)
        return out
    _hide_own_modes(body)
    with obs:
        return body(*args, **kwargs)


def _all_real_cpu(args: Any) -> bool:
    tensors = [t for t in torch.utils._pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(not isinstance(t, FakeTensor) and t.device.type == "cpu" for t in tensors)


def _run_below(func: HigherOrderOperator, args: tuple, kwargs: dict) -> Any:
    """The HOP as the modes below the observer answer it (FakeTensorMode's rule: outputs with
    the right shapes, no ops reported), without going through autograd or autocast again."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

    mode = _get_current_dispatch_mode()
    if mode is not None and type(mode) in func.python_key_table:
        rule = func.python_key_table[type(mode)]
        with _pop_mode_temporarily() as popped:
            return rule(popped, *args, **kwargs)
    return func(*args, **kwargs)


def _hide_own_modes(kernel: Callable[..., Any]) -> None:
    """Several eager HOP kernels (cond, scan, invoke_subgraph, strict_mode, BaseHOP) assert that
    no dispatch mode is active ("Mode should never be enabled for CPU/CUDA key"): on a GPU they
    run below every mode. phantora's own two modes are always active, so when one of these
    kernels (and only it: the caller's code object is checked) asks for the current mode, the
    answer skips phantora's modes; a user's mode still trips the assertion. Kernels import the
    lookup at module level (cond, scan) or inside the function (invoke_subgraph, BaseHOP): both
    names are covered."""
    code = getattr(getattr(kernel, "__func__", kernel), "__code__", None)
    if code is None:
        return
    _KERNEL_CODES.add(code)
    module_globals = getattr(getattr(kernel, "__func__", kernel), "__globals__", {})
    lookup = module_globals.get("_get_current_dispatch_mode")
    if lookup is not None and not getattr(lookup, "_phantora_skips_own_modes", False):
        module_globals["_get_current_dispatch_mode"] = _skipping_own_modes(lookup)


_KERNEL_CODES: set[Any] = set()
_OWN_MODES: tuple[type, ...] = ()


def _skipping_own_modes(original: Callable[[], Any]) -> Callable[[], Any]:
    def _get_current_dispatch_mode() -> Any:
        if sys._getframe(1).f_code not in _KERNEL_CODES:
            return original()
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        for mode in reversed(_get_current_dispatch_mode_stack()):
            if not isinstance(mode, _OWN_MODES):
                return mode
        return None

    _get_current_dispatch_mode._phantora_skips_own_modes = True  # type: ignore[attr-defined]
    return _get_current_dispatch_mode


def _eager_kernel(func: HigherOrderOperator) -> Callable[..., Any] | None:
    """The implementation eager torch runs for this HOP on a CUDA tensor (the CUDA key, or the
    composite kernel it resolves to), or None when the HOP has none."""
    try:
        key = torch._ops.resolve_key(func, DispatchKey.CUDA)
    except NotImplementedError:
        return None
    kernel = func.py_kernels.get(key)
    return kernel if callable(kernel) else None


# --- what is reported --------------------------------------------------------------------------
def report_args(func: HigherOrderOperator, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The HOP's arguments as a signature can carry them: tensors and scalars as they are,
    functions and graphs by their kind, option dicts left out; flex attention adds what its
    block mask visits (`visited_blocks`, None when unknown) as the last argument."""
    flat = tuple(_plain(a) for a in (*args, *kwargs.values()))
    where = FLEX_BLOCK_MASK_ARG.get(func.name())
    if where is not None:
        flat = flat + (visited_blocks(args[where] if len(args) > where else None),)
    return flat, {}


# Where each flex HOP takes the BlockMask tuple (torch 2.13 and 2.14 agree;
# phantora/cost/attention.py reads the same positions).
FLEX_BLOCK_MASK_ARG = {"flex_attention": 4, "flex_attention_backward": 9}


def _plain(a: Any) -> Any:
    if isinstance(a, (torch.Tensor, int, float, bool, str)) or a is None:
        return a
    if isinstance(a, (tuple, list)):
        return tuple(_plain(x) for x in a)
    if isinstance(a, (torch.dtype, torch.device)):
        return a
    if isinstance(a, dict):
        return None
    if isinstance(a, torch.fx.GraphModule):
        return "GraphModule"
    return "callable" if callable(a) else type(a).__name__


def visited_blocks(block_mask: Any) -> tuple[int, int] | None:
    """(blocks the flex-attention kernel visits, partial + full, summed over the mask's batch,
    head and query-block dims; the most one query block visits), from the real values of the
    mask's block counts, or None when they hold no data. BlockMask.as_tuple() is (q_len, kv_len,
    kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, ...)."""
    if not isinstance(block_mask, tuple) or len(block_mask) < 5:
        return None
    per_row = None
    for t in (block_mask[2], block_mask[4]):
        if t is None:
            continue
        real = values.shadow_of(t) if isinstance(t, FakeTensor) else t
        if not isinstance(real, torch.Tensor) or isinstance(real, FakeTensor):
            return None
        with unset_fake_temporarily():
            per_row = real.long() if per_row is None else per_row + real.long()
    if per_row is None:
        return None
    with unset_fake_temporarily():
        return int(per_row.sum()), int(per_row.max()) if per_row.numel() else 0


# --- create_block_mask with real block counts --------------------------------------------------
def _create_block_mask_with_real_counts(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_block_mask(mask_mod: Any, B: Any, H: Any, Q_LEN: int, KV_LEN: int, device: Any = None,
                          *args: Any, **kwargs: Any) -> Any:
        mask = original(mask_mod, B, H, Q_LEN, KV_LEN, device, *args, **kwargs)
        if isinstance(mask.kv_num_blocks, FakeTensor):
            real = _evaluate_on_cpu(mask_mod, B, H, Q_LEN, KV_LEN, args, kwargs)
            if real is not None:
                _shadow_block_mask(mask, real)
        return mask

    return create_block_mask


def _evaluate_on_cpu(mask_mod: Any, B: Any, H: Any, Q_LEN: int, KV_LEN: int, args: tuple,
                     kwargs: dict) -> dict[int, torch.Tensor] | None:
    """The same block mask's tensors computed for real on the CPU, by their position in
    BlockMask.as_tuple(), or None when mask_mod needs data that only exists on a virtual GPU
    (or the mask is too large to evaluate here)."""
    cells = (B or 1) * (H or 1) * Q_LEN * KV_LEN
    shape = f"create_block_mask(B={B}, H={H}, Q_LEN={Q_LEN}, KV_LEN={KV_LEN})"
    if cells > REAL_MASK_MAX_CELLS:
        _tell_once("too large", f"{shape} has {cells:,} cells, more than the {REAL_MASK_MAX_CELLS:,} phantora "
                   "evaluates on the CPU")
        return None
    key = _mask_key(mask_mod, (B, H, Q_LEN, KV_LEN, args, tuple(sorted(kwargs.items()))))
    if key is not None and key in _real_masks:
        return _real_masks[key]
    try:
        with _own_cpu_work():
            real = _cpu_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, args, kwargs)
            tensors = {i: t for i, t in enumerate(real.as_tuple()) if isinstance(t, torch.Tensor)}
    except Exception as e:  # mask_mod reads virtual-GPU tensors without data, or cannot run on the CPU
        _tell_once("failed", f"{shape}: its mask_mod did not run on the CPU ({type(e).__name__}: "
                   f"{str(e).splitlines()[0][:160] if str(e) else ''}); most often it reads a GPU tensor whose "
                   "values phantora does not hold (docs/moe.md lists what it holds)")
        return None
    if not tensors or any(isinstance(t, FakeTensor) for t in tensors.values()):
        _tell_once("no data", f"{shape}: its mask_mod reads GPU tensors whose values phantora does not hold")
        return None
    if key is not None:
        if len(_real_masks) >= _REAL_MASKS_KEPT:
            _real_masks.pop(next(iter(_real_masks)))
        _real_masks[key] = tensors
    return tensors


_told: set[str] = set()


def _tell_once(reason: str, what: str) -> None:
    """Say once per process and reason that a block mask's blocks are unknown, and what follows."""
    if reason in _told:
        return
    _told.add(reason)
    from interpose import runtime

    print(f"phantora: rank {runtime.rank_label()}: {what}: the blocks it keeps are unknown, so the "
          "flex-attention kernels using it are costed as visiting every block (an upper bound; said once per "
          "process)", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _own_cpu_work() -> Iterator[None]:
    """The mask's evaluation on the CPU is phantora's work, which a GPU does not do: its Python
    is not the program's host time (the counter counts torch's code wherever it runs, so it is
    bracketed), and Dynamo does not compile it. Under `torch.compile(create_block_mask)` (as
    TorchTitan calls it) Dynamo skips the frames while the observer is on the mode stack, but
    the CPU evaluation runs with the modes off, and Dynamo compiled create_block_mask for the
    CPU there at every call (a mask_mod reading virtual-GPU tensors fails each time): a quarter
    of a TorchTitan pipeline rank's CPU."""
    from interpose import runtime

    rt = runtime.current()
    own = rt.python_time.own_work if rt is not None else contextlib.nullcontext()
    set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame
    with own:
        prior = set_eval_frame(None)
        try:
            yield
        finally:
            set_eval_frame(prior)


class _ShadowsForVirtualTensors(TorchFunctionMode):
    """A virtual tensor that a mask_mod reads (TorchTitan's document ids, computed on the GPU from
    the batch's positions) is read as its shadow, the CPU tensor holding its values where
    phantora knows them (interpose/values/policy.py). One without a shadow stays virtual, and
    the evaluation fails on it as before (the mask's blocks are then unknown)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        args, kwargs = pytree.tree_map_only(FakeTensor, _shadow_or_self, (args, kwargs or {}))
        return func(*args, **kwargs)


def _shadow_or_self(t: FakeTensor) -> torch.Tensor:
    shadow = values.shadow_of(t)
    return t if shadow is None else shadow


# Cells of the dense mask evaluated at once (16 MiB of bools): only its blocks are kept.
_SLICE_CELLS = 1 << 24


def _cpu_block_mask(mask_mod: Any, B: Any, H: Any, Q_LEN: int, KV_LEN: int, args: tuple, kwargs: dict) -> Any:
    """create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, "cpu", *args, **kwargs)'s BlockMask (its
    dq write order aside), from the dense mask of one slice of query rows (whole query blocks)
    at a time. The dense mask is mask_mod called once on broadcast index tensors where that
    agrees with create_mask's vmap on the first and last query blocks (every elementwise
    mask_mod: causal, document, sliding window), else create_mask itself: the vmap gathers a
    full-size index tensor for each indexing op, and create_block_mask sums each block of a
    permuted int64 copy of the mask; this takes 4-5x less CPU and a fraction of the memory."""
    from torch.nn.attention.flex_attention import BlockMask, create_mask
    from torch.utils._python_dispatch import _disable_current_modes

    block = kwargs.get("BLOCK_SIZE", args[0] if args else 128)
    q_block, kv_block = block if isinstance(block, tuple) else (block, block)
    separate_full = kwargs.get("separate_full_blocks", args[2] if len(args) > 2 else True)
    B, H = B or 1, H or 1
    rows = max(q_block, _SLICE_CELLS // (B * H * KV_LEN) // q_block * q_block)

    def vmapped(start: int, stop: int) -> torch.Tensor:
        def shifted(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return mask_mod(b, h, q_idx + start, kv_idx)

        return create_mask(shifted, B, H, stop - start, KV_LEN, "cpu")

    def broadcast(start: int, stop: int) -> torch.Tensor:
        return _broadcast_mask(mask_mod, B, H, start, stop, KV_LEN)

    with _disable_current_modes(), _ShadowsForVirtualTensors():
        form = _mask_form(mask_mod)
        key = None if form is None else (form, B, H)
        elementwise = _elementwise.get(key) if key is not None else None
        if elementwise is None:
            last = (Q_LEN - 1) // q_block * q_block
            elementwise = all(_agree(broadcast, vmapped, s, min(s + q_block, Q_LEN)) for s in {0, last})
            if key is not None:
                if len(_elementwise) >= _FORMS_KEPT:
                    _elementwise.pop(next(iter(_elementwise)))
                _elementwise[key] = elementwise
        dense = broadcast if elementwise else vmapped
        any_true, all_true = (torch.cat(parts, dim=2) for parts in zip(*(
            _blocks_any_all(dense(start, min(start + rows, Q_LEN)), q_block, kv_block)
            for start in range(0, Q_LEN, rows))))
        partial, full = (any_true & ~all_true, all_true) if separate_full else (any_true, None)
        full_ordered = _ordered(full) if full is not None else (None, None)
        return BlockMask.from_kv_blocks(*_ordered(partial), *full_ordered, BLOCK_SIZE=(q_block, kv_block),
                                        mask_mod=mask_mod, seq_lengths=(Q_LEN, KV_LEN))


# Whether a mask_mod of a form (_mask_form) agreed with create_mask's vmap: a training loop builds
# the same kind of mask from each batch's data (TorchTitan's causal document mask, and context
# parallelism's rewrite of it), and the check, vmap over two query blocks, took twice the CPU of
# the evaluation itself (6.4% of a rank's samples in TorchTitan's validation_tp_cp_pp).
_elementwise: dict[tuple, bool] = {}
_FORMS_KEPT = 64


def _mask_form(value: Any, depth: int = 0) -> Any:
    """How a mask_mod computes, apart from the values of the tensors it reads: its code and,
    recursively, what it captured (_captures: functions by their form, tensors by dtype and
    dimensions, plain values as they are, containers item by item); None when it captured
    anything else, or is a callable object or a method of one (whose state is not seen here)."""
    if depth > 16:
        return None
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.dim())
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)):
        items = tuple(_mask_form(v, depth + 1) for v in value)
        return None if any(i is None and v is not None for i, v in zip(items, value)) else (type(value), items)
    if getattr(value, "__func__", value) is not value and not isinstance(getattr(value, "__self__", None), _PLAIN):
        return None
    found = _captures(value)
    if found is None:
        return None
    code, captured, named = found
    values = captured + [v for _, v in named]
    parts = tuple(_mask_form(v, depth + 1) for v in values)
    if any(p is None and v is not None for p, v in zip(parts, values)):
        return None
    form = (code, parts, tuple(name for name, _ in named))
    try:
        hash(form)
    except TypeError:
        return None
    return form


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks per query block, their key-block indices first in ascending order), as
    create_block_mask orders them (torch's _dense_to_ordered)."""
    as_int = blocks.to(torch.int32)
    indices = torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32)
    return as_int.sum(dim=-1, dtype=torch.int32), indices


def _broadcast_mask(mask_mod: Any, B: int, H: int, q_start: int, q_stop: int, KV_LEN: int) -> torch.Tensor:
    """mask_mod over (B, H, q_stop - q_start, KV_LEN) positions in one call on broadcast indices
    (int64, as create_mask's)."""
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    q = torch.arange(q_start, q_stop).view(1, 1, -1, 1)
    kv = torch.arange(KV_LEN).view(1, 1, 1, KV_LEN)
    out = torch.as_tensor(mask_mod(b, h, q, kv))
    if out.dtype != torch.bool:
        raise TypeError(f"mask_mod returned {out.dtype}")
    return out.expand(B, H, q_stop - q_start, KV_LEN)


def _agree(broadcast: Callable[[int, int], torch.Tensor], vmapped: Callable[[int, int], torch.Tensor],
           start: int, stop: int) -> bool:
    try:
        return torch.equal(broadcast(start, stop), vmapped(start, stop))
    except Exception:  # noqa: BLE001 - a mask_mod that needs vmap's per-element calls
        return False


def _blocks_any_all(dense: torch.Tensor, q_block: int, kv_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether any / every position of each (query block, key block) is unmasked, the mask padded
    with False to whole blocks as create_block_mask pads it: (B, H, query blocks, key blocks)."""
    B, H, Q, KV = dense.shape
    pad_q, pad_kv = -Q % q_block, -KV % kv_block
    if pad_q or pad_kv:
        dense = torch.nn.functional.pad(dense, (0, pad_kv, 0, pad_q))
    blocks = dense.reshape(B, H, (Q + pad_q) // q_block, q_block, (KV + pad_kv) // kv_block, kv_block)
    return blocks.any(dim=(3, 5)), blocks.all(dim=(3, 5))


# Masks already evaluated on the CPU (it takes seconds for long sequences, and training loops
# often rebuild the same causal mask every step), by what decides their values.
_real_masks: dict[tuple, dict[int, torch.Tensor]] = {}
_REAL_MASKS_KEPT = 16
_PLAIN = (int, float, bool, str, type(None))


def _captures(mask_mod: Any) -> tuple[Any, list[Any], list[tuple[str, Any]]] | None:
    """A mask_mod's code, the values it captured (closure cells, then defaults) and the
    module-level names its code reads with their values (modules, functions and attribute names
    left out); None when it has no code or an empty closure cell."""
    fn = getattr(mask_mod, "__func__", mask_mod)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    try:
        captured = [c.cell_contents for c in (fn.__closure__ or ())] + list(fn.__defaults__ or ())
    except ValueError:  # an empty closure cell
        return None
    fn_globals = getattr(fn, "__globals__", {})
    named = []
    for name in code.co_names:
        value = fn_globals.get(name)
        is_code = isinstance(value, type(sys)) or callable(value) and not isinstance(value, torch.Tensor)
        if value is None or is_code:
            continue  # a module, a function, or an attribute name
        named.append((name, value))
    return code, captured, named


def _mask_key(mask_mod: Any, call: tuple) -> tuple | None:
    """What a mask_mod's values depend on, when that is its code, the plain values it captured
    (closure cells, defaults, the module-level names it reads: _captures) and the call's
    arguments; None when it reads anything else (a tensor, an object), which could change
    between calls."""
    found = _captures(mask_mod)
    if found is None:
        return None
    code, captured, named = found
    if not all(isinstance(v, _PLAIN) for v in captured + [v for _, v in named]):
        return None
    try:
        key = (code, tuple(captured), tuple(named), call)
        hash(key)
    except TypeError:
        return None
    return key


def _shadow_block_mask(mask: Any, real: dict[int, torch.Tensor]) -> None:
    for position, virtual in enumerate(mask.as_tuple()):
        cpu = real.get(position)
        if isinstance(virtual, FakeTensor) and cpu is not None and cpu.shape == virtual.shape:
            values.set_shadow(virtual, cpu)


def _branches_return_tuples() -> None:
    """torch.cond's backward builds each branch's joint graph from the branch function, and the
    joint builder needs the branch to return a tuple of outputs. On a GPU the branches reaching
    it are always Dynamo's graphs of the user's functions, whose outputs Dynamo flattened into a
    tuple; with Dynamo skipping frames under the observer the user's own functions arrive, and
    one returning a bare tensor (allowed by torch.cond) failed in backward ("object of type
    'bool' has no len()"). The branch's joint graph is built here from the same function with
    its outputs in a tuple, as Dynamo's graph would return them."""
    import importlib

    cond_module = importlib.import_module("torch._higher_order_ops.cond")  # the package re-exports cond()

    original = cond_module.create_bw_fn
    if getattr(original, "_phantora_tuple_outputs", False):
        return

    def create_bw_fn(fn: Callable[..., Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
        def as_tuple(*a: Any) -> Any:
            out = fn(*a)
            return out if isinstance(out, (tuple, list)) else (out,)

        return original(as_tuple, args, *rest, **kwargs)

    create_bw_fn._phantora_tuple_outputs = True  # type: ignore[attr-defined]
    cond_module.create_bw_fn = create_bw_fn


def install_hops(fake_mode_cls: type, observer_cls: type) -> None:
    global _OWN_MODES
    _OWN_MODES = (fake_mode_cls, observer_cls)
    import torch.utils._python_dispatch as python_dispatch

    python_dispatch._get_current_dispatch_mode = _skipping_own_modes(python_dispatch._get_current_dispatch_mode)
    inherit_hop_rules(fake_mode_cls, FakeTensorMode)
    # torch then hands every HOP to the observer's __torch_dispatch__ (dispatch_hop).
    observer_cls.supports_higher_order_operators = True
    import torch.nn.attention.flex_attention as fa

    # The eager flex_attention calls the HOP directly instead of through
    # torch.compile(fullgraph=True, backend="eager"): Dynamo skips frames while the observer is
    # active, and a fullgraph compile that compiled no frame raises. With the eager backend the
    # compiled wrapper would do nothing but call the HOP.
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    _branches_return_tuples()
    fa.create_block_mask = _create_block_mask_with_real_counts(fa.create_block_mask)
