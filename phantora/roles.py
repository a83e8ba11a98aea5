"""Representative ranks: which ranks run as processes, and which are mirrored from them.

In data, tensor and pipeline parallel training most ranks do what a peer does. `phantora trace
--ranks` runs one process per distinct role (its *representative*) and mirrors the other ranks
inside the simulator: a mirrored rank joins every collective its representative joins (on the
group of the same shape that contains it), at the same simulated time, so the network sees every
GPU's flows while only the representatives run the program.

Each representative stands for the ranks from it up to the next representative: the roles are
contiguous blocks of ranks, which is how pipeline stages are laid out by torch's DeviceMesh and
TorchTitan (pp is the outermost mesh dimension) and by Megatron-Core (order tp-cp-ep-dp-pp). So
`--ranks 0` mirrors every rank from rank 0 (pure DDP/FSDP, or TP x DP: TP ranks of one layer do
the same work on different shards), and `--ranks 0,8,16,24` runs one process per stage of a
4-stage pipeline over 32 GPUs.

`auto` also runs a *witness*: the last rank, a second process in rank 0's role, placed as far
from it as the mesh goes (another node, another TP and DP index). The simulator compares the
two: the same collectives in the same order, the same number of ops in each step; a
divergence stops the run naming the op and the ranks (phantora/engine/mirrors.py).

Values that travel between ranks (a loss all-reduced for logging, objects gathered) take a
mirrored rank's contribution to be its representative's. This module is pure: both the
simulator and the rank processes (interpose/) import it; the launcher hands the choice to the
ranks in PHANTORA_REPRESENTATIVES.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass

ENV = "PHANTORA_REPRESENTATIVES"  # comma-separated ranks that run as processes; unset: all ranks do


class RankGroup(tuple):
    """A process group's global ranks, in group order: a tuple that computes its hash once and
    answers `rank in group` from a set. Collectives are matched by a key holding their group
    (phantora/engine/collectives.py): with 1,000 mirrored ranks joining each collective of a
    1,000-rank group, hashing the key and testing membership at every join made the matching
    grow with GPUs x GPUs. Equal to, and hashed as, the plain tuple of the same ranks; build
    one with rank_group(), which hands out one object per distinct group, so that keys also
    compare by identity."""

    def __new__(cls, ranks: tuple[int, ...]) -> "RankGroup":
        self = super().__new__(cls, ranks)
        self._hash = tuple.__hash__(self)
        self._set = frozenset(self)
        return self

    def __hash__(self) -> int:
        return self._hash

    def __contains__(self, rank: object) -> bool:
        return rank in self._set

    def __reduce__(self) -> tuple:
        return rank_group, (tuple(self),)


_GROUPS: dict[tuple[int, ...], RankGroup] = {}


def rank_group(ranks: "tuple[int, ...] | list[int]") -> RankGroup:
    """The one RankGroup of these ranks (in this order)."""
    key = tuple(ranks)
    group = _GROUPS.get(key)
    if group is None:
        group = _GROUPS[key] = RankGroup(key)
    return group


class RanksChoiceError(ValueError):
    """--ranks names ranks that cannot stand for the world (the message says what to pass)."""


@dataclass(frozen=True)
class RankRoles:
    world_size: int
    representatives: tuple[int, ...]  # sorted, starts with 0
    witnesses: tuple[int, ...] = ()  # also run; each is checked against its role's representative

    @classmethod
    def all_ranks(cls, world_size: int) -> "RankRoles":
        return cls(world_size, tuple(range(world_size)))

    @classmethod
    def parse(cls, text: str, world_size: int, witness: bool = False) -> "RankRoles":
        """--ranks: `all`, `auto` (one role: every rank mirrors rank 0, the last rank runs as
        its witness) or a list of ranks such as `0,8,16,24` (each stands for the ranks up to the
        next; with `witness`, the last rank runs too, as a witness of the last role)."""
        text = text.strip().lower()
        if text == "all":
            return cls.all_ranks(world_size)
        if text == "auto":
            return cls(world_size, (0,), (world_size - 1,) if world_size > 2 else ())
        try:
            ranks = sorted({int(part) for part in text.split(",") if part.strip()})
        except ValueError:
            raise RanksChoiceError(f"--ranks {text!r}: expected all, auto or comma-separated ranks such as 0,8,16") from None
        if not ranks or ranks[0] != 0:
            raise RanksChoiceError(f"--ranks {text!r}: rank 0 must be a representative (it hosts the job's store and "
                                   "its logging); for example --ranks 0," + ",".join(map(str, ranks)))
        if ranks[-1] >= world_size:
            raise RanksChoiceError(f"--ranks {text!r}: rank {ranks[-1]} is outside the world of {world_size} ranks")
        last = world_size - 1
        return cls(world_size, tuple(ranks), (last,) if witness and last not in ranks and last - ranks[-1] > 1 else ())

    @property
    def processes(self) -> tuple[int, ...]:
        """Every rank that runs as a process: representatives and witnesses."""
        return tuple(sorted({*self.representatives, *self.witnesses}))

    @property
    def mirrored(self) -> bool:
        return len(self.processes) < self.world_size

    def representative(self, rank: int) -> int:
        """The rank whose process stands for `rank` (itself if it runs)."""
        return rank if rank in self.witnesses else self.role_of(rank)

    def role_of(self, rank: int) -> int:
        """The representative of `rank`'s role (a witness's too)."""
        return self.representatives[bisect.bisect_right(self.representatives, rank) - 1]

    def mirrors_of(self, rep: int) -> list[int]:
        """The ranks `rep` stands for, other than itself (witnesses run themselves)."""
        if rep in self.witnesses:
            return []
        i = self.representatives.index(rep)
        end = self.representatives[i + 1] if i + 1 < len(self.representatives) else self.world_size
        return [r for r in range(rep + 1, end) if r not in self.witnesses]

    def runs(self, rank: int) -> bool:
        return self.representative(rank) == rank

    def env_value(self) -> str:
        """The processes, as PHANTORA_REPRESENTATIVES and --ranks name them."""
        return ",".join(map(str, self.processes))

    @classmethod
    def from_env(cls, world_size: int) -> "RankRoles":
        """The choice the launcher made (every rank runs when PHANTORA_REPRESENTATIVES is unset)."""
        text = os.environ.get(ENV, "")
        if not text:
            return cls.all_ranks(world_size)
        # A witness runs as a process and posts its own values: to the ranks it is one more
        # representative (each stands for the ranks up to the next).
        return cls(world_size, tuple(sorted(int(r) for r in text.split(",") if r)))
