"""A mirrored rank's distributed-checkpoint save plan (interpose/distributed/checkpoint_plans.py)
is the plan that rank makes itself: derived from rank 0's, compared with the plans DCP's own
planner makes when the process is each rank (torch's fake process group, no phantora)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings, strategies as st
from torch.distributed.checkpoint import planner_helpers
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.distributed.fake_pg import FakeStore

from interpose.distributed import checkpoint_plans

WORLD = 4


def state_dict(rows: int, cols: int) -> dict[str, Any]:
    """DTensors as FSDP2, TP and both lay them out on 4 ranks, a submesh's, a plain tensor, bytes."""
    flat = init_device_mesh("cpu", (WORLD,))
    grid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    full = torch.zeros(rows, cols)

    def on(mesh: Any, *placements: Any) -> Any:
        return distribute_tensor(full, mesh, list(placements), src_data_rank=None)

    return {
        "fsdp": on(flat, Shard(0)),
        "fsdp_cols": on(flat, Shard(1)),
        "dp_tp": on(grid, Shard(0), Shard(1)),
        "fsdp_tp_strided": on(grid, _StridedShard(0, split_factor=2), Shard(0)),
        "tp_replicated": on(grid, Shard(0), Replicate()),
        "dp_submesh": on(grid["dp"], Shard(0)),  # rank 1's is in another dp group than rank 0's
        "step": torch.tensor(3.0),
        "config": {"lr": 0.1},
    }


def plan_as(rank: int, rows: int, cols: int) -> Any:
    """The local save plan DCP makes in the process of `rank` (and that process's meshes)."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        planner = DefaultSavePlanner()
        planner.set_up_planner(state_dict(rows, cols), is_coordinator=rank == 0)
        return planner.create_local_plan()
    finally:
        dist.destroy_process_group()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_helpers, "_create_write_items_for_dtensor",
                        planner_helpers._create_write_items_for_dtensor)  # restored after the test
    checkpoint_plans._record_dtensor_writes(planner_helpers)
    checkpoint_plans._dtensor_writes.clear()


@given(rows=st.integers(1, 13), cols=st.integers(1, 9))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # the test clears what it reads
def test_mirrors_plans_are_the_plans_each_rank_makes(recorded: None, rows: int, cols: int) -> None:
    own = [plan_as(rank, rows, cols) for rank in range(WORLD)]
    checkpoint_plans._dtensor_writes.clear()
    rank0 = plan_as(0, rows, cols)  # the representative's writes are the ones recorded
    derived = checkpoint_plans.mirrors_plans(rank0, [1, 2, 3])
    for rank in (1, 2, 3):
        assert derived.get(rank, rank0).items == own[rank].items, rank
    assert rank0.items == own[0].items


def test_plans_of_other_objects_are_not_derived(recorded: None) -> None:
    assert checkpoint_plans.mirrors_plans({"not": "a plan"}, [1, 2, 3]) == {}
    plain = plan_as(0, 8, 4)
    plain_only = type(plain)([item for item in plain.items if item.index.fqn in ("step", "config.lr")])
    assert checkpoint_plans.mirrors_plans(plain_only, [1, 2, 3]) == {}  # nothing rank-dependent


def test_a_representative_takes_the_writes_it_holds_from_its_mirrors_share(recorded: None) -> None:
    """The coordinator gives a replicated item (here "step") to one plan; a mirror's is executed
    by no process, so its representative writes what it holds itself, not the mirror's shards."""
    rank0 = plan_as(0, 8, 4)
    checkpoint_plans.local_plan_posted(rank0)
    mirror = checkpoint_plans.mirrors_plans(rank0, [1])[1]
    step = next(item for item in mirror.items if item.index.fqn == "step")
    mine = type(rank0)([item for item in rank0.items if item.index.fqn != "step"])
    mirrors_share = type(rank0)([step, *(item for item in mirror.items if item.index.fqn == "fsdp")])
    merged = checkpoint_plans.with_mirrors_writes(mine, [mirrors_share])
    assert [item.index.fqn for item in merged.items] == [*(item.index.fqn for item in mine.items), "step"]
