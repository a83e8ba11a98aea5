"""Mirrored ranks' distributed-checkpoint save plans: what a mirrored rank would have planned.

torch.distributed.checkpoint (DCP) saves in two rounds of object collectives: every rank plans
its writes (a SavePlan: one WriteItem per tensor it holds, a DTensor's being its own shard's
offsets and sizes), the coordinator gathers the plans (gather_object), checks that the shards
of every tensor tile it exactly (default_planner._validate_global_plan), and scatters each rank
its share. With mirrored ranks (--ranks, phantora/roles.py) a mirror has no process, and an
object it contributes is taken to be its representative's: the coordinator saw the
representative's shards once per mirror and rejected the plan ("Failed to validate global
plan ... invalid fill").

A mirror's plan differs from its representative's only where the plan depends on the rank:
a DTensor's shard, which torch computes from the tensor's global shape, its mesh's shape, its
placements and the rank's coordinate in the mesh (`_compute_local_shape_and_global_offset`). So
this module records, as DCP plans a DTensor's write, the shape, mesh and placements behind the
WriteItem, and derives a mirror's plan from its representative's by computing each shard again
with the mirror's coordinate: its place in the mesh of the same family (the mesh's layout over
all ranks, as DeviceMesh keeps it) that contains it. Everything else in the plan (plain
tensors, bytes, a Replicate() placement's whole tensor) is what every rank of the role plans.

Not covered: ShardedTensor (pre-DTensor sharding), a DTensor on a mesh whose family does not
hold the mirror (kept as the representative's), and planners other than DCP's own WriteItems
for DTensors (a custom planner's per-rank data is the representative's). Keys the program
names after its rank (TorchTitan's dataloader state, `dp_rank_N`) are the representative's.

Writes: only processes write files. A representative writes what the coordinator assigns it
and, of what it assigns a mirror, the items the representative holds itself (replicated
tensors and bytes, which the coordinator gives to the least loaded plan), so that every item
the running processes hold is in the checkpoint; a mirror's own shards are in the metadata but
in no file (docs/scale.md).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

_PLANNER = "torch.distributed.checkpoint.planner"
_HELPERS = "torch.distributed.checkpoint.planner_helpers"

# (fqn, shard offsets) -> (global shape, mesh, placements) of the DTensors this process planned
_dtensor_writes: dict[tuple[str, tuple[int, ...] | None], tuple[tuple[int, ...], Any, tuple[Any, ...]]] = {}
# (fqn, offsets) of the writes in this process's last local save plan: what it holds itself
_own_writes: set[tuple[str, tuple[int, ...] | None]] = set()


def install() -> None:
    """Record each DTensor write DCP plans (when torch.distributed.checkpoint is imported)."""
    from interpose.on_import import patch_when_imported

    patch_when_imported(_HELPERS, _record_dtensor_writes)


def _record_dtensor_writes(helpers: Any) -> None:
    original = helpers._create_write_items_for_dtensor
    if getattr(original, "__wrapped__", None) is not None:
        return

    def _create_write_items_for_dtensor(fqn: str, tensor: Any) -> Any:
        item = original(fqn, tensor)
        _dtensor_writes[(fqn, tuple(item.index.offset))] = (tuple(tensor.shape), tensor.device_mesh,
                                                            tuple(tensor.placements))
        return item

    _create_write_items_for_dtensor.__wrapped__ = original  # type: ignore[attr-defined]
    helpers._create_write_items_for_dtensor = _create_write_items_for_dtensor


def _is_save_plan(obj: Any) -> bool:
    planner = sys.modules.get(_PLANNER)
    return planner is not None and isinstance(obj, planner.SavePlan)


def _key(item: Any) -> tuple[str, tuple[int, ...] | None]:
    offset = item.index.offset  # None for bytes
    return item.index.fqn, None if offset is None else tuple(offset)


def local_plan_posted(obj: Any) -> None:
    """This process contributes `obj` to a gather: if it is a save plan, remember what it holds."""
    if _is_save_plan(obj) and obj.usable:
        _own_writes.clear()
        _own_writes.update(_key(item) for item in obj.items)


def mirrors_plans(obj: Any, ranks: list[int]) -> dict[int, Any]:
    """The save plans `ranks` would have contributed where this process's contribution is
    `obj`, for those whose plan differs from it; empty unless `obj` is a save plan."""
    if not ranks or not _is_save_plan(obj) or not any(_key(item) in _dtensor_writes for item in obj.items):
        return {}
    coordinates = _Coordinates()
    plans = {}
    for rank in ranks:
        items = [_shard_of(item, rank, coordinates) for item in obj.items]
        if any(new is not old for new, old in zip(items, obj.items)):
            plans[rank] = dataclasses.replace(obj, items=items)
    return plans


def _shard_of(item: Any, rank: int, coordinates: "_Coordinates") -> Any:
    """`item` as `rank` plans it: a DTensor's shard computed at rank's coordinate in the mesh."""
    recorded = _dtensor_writes.get(_key(item))
    if recorded is None or item.tensor_data is None:
        return item
    shape, mesh, placements = recorded
    coordinate = coordinates.of(mesh, rank)
    if coordinate is None:
        return item
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    sizes, offsets = _compute_local_shape_and_global_offset(shape, mesh.shape, coordinate, placements)
    if tuple(offsets) == tuple(item.index.offset) and tuple(sizes) == tuple(item.tensor_data.chunk.sizes):
        return item
    import torch

    sizes, offsets = torch.Size(sizes), torch.Size(offsets)
    chunk = dataclasses.replace(item.tensor_data.chunk, offsets=offsets, sizes=sizes)
    return dataclasses.replace(item, index=dataclasses.replace(item.index, offset=offsets, index=None),
                               tensor_data=dataclasses.replace(item.tensor_data, chunk=chunk))


class _Coordinates:
    """Ranks' coordinates in meshes, each mesh's family read once."""

    def __init__(self) -> None:
        self._by_mesh: dict[int, tuple[Any, dict[int, list[int]]]] = {}

    def of(self, mesh: Any, rank: int) -> list[int] | None:
        """rank's coordinate in the mesh of `mesh`'s family that contains it (None: none does)."""
        known = self._by_mesh.get(id(mesh))
        if known is None:
            known = self._by_mesh[id(mesh)] = (mesh, self._family(mesh))
        return known[1].get(rank)

    @staticmethod
    def _family(mesh: Any) -> dict[int, list[int]]:
        layout, rank_map = getattr(mesh, "_layout", None), getattr(mesh, "_rank_map", None)
        # every mesh of the family, one per leading index (DeviceMesh.mesh picks the caller's)
        full = layout.remap_to_tensor(rank_map) if layout is not None and rank_map is not None else mesh.mesh[None]
        full = full.reshape(-1, *mesh.shape)
        coordinates: dict[int, list[int]] = {}
        for submesh in full:
            for flat, rank in enumerate(submesh.reshape(-1).tolist()):
                coordinate, rest = [], flat
                for size in reversed(mesh.shape):
                    rest, index = divmod(rest, size)
                    coordinate.append(index)
                coordinates[rank] = coordinate[::-1]
        return coordinates


def with_mirrors_writes(mine: Any, mirrors: list[Any]) -> Any:
    """The central plan this process executes: its own (`mine`) and, of its mirrors' (which no
    process executes), the items it holds itself, so that the checkpoint has them."""
    if not _is_save_plan(mine) or not mirrors:
        return mine
    have = {_key(item) for item in mine.items}
    extra = []
    for plan in mirrors:
        if not _is_save_plan(plan):
            continue
        for item in plan.items:
            key = _key(item)
            if key in _own_writes and key not in have:
                have.add(key)
                extra.append(item)
    return dataclasses.replace(mine, items=[*mine.items, *extra]) if extra else mine
