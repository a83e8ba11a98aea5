"""A pure-Python model of PyTorch's CUDA caching allocator (native backend).

Mirrors c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator) with
expandable_segments off, so that a simulated script sees the same
torch.cuda.memory_allocated / memory_reserved / max_memory_allocated / memory_stats()
as on a real GPU, and runs out of memory at the same allocation. Reserved memory (the
segments obtained with cudaMalloc) decides when cudaMalloc fails, so fragmentation and the
free-cache-and-retry path matter, not just allocated bytes.

Used by both the user-process side and the simulator: it must not import torch.

What the real allocator does, in one paragraph (comments below cite the C++ function each
piece mirrors). A request is rounded up to a multiple of 512 bytes. Requests <= 1 MiB come
from the small pool, larger ones from the large pool; each pool keeps its free blocks per
stream, ordered by (size, address), and a request takes the smallest free block that fits
(best fit). If none fits, a new segment is cudaMalloc'd: 2 MiB for small requests, 20 MiB
for requests under 10 MiB, otherwise the request rounded up to 2 MiB. A block larger than
the request is split when the remainder is worth keeping (>= 512 B in the small pool,
> 1 MiB in the large pool); otherwise the whole block is handed out and its slack counts as
allocated. Freed blocks merge with free neighbours of the same segment. When cudaMalloc
fails, the allocator frees every cached segment that is entirely unused and retries once;
if that fails too it raises torch.OutOfMemoryError. Segments are only returned to the
driver by that retry path and by empty_cache().

Facts measured on a real H100 80GB (torch 2.11.0+cu130, tests/data/groundtruth/) that the
rest of phantora must model outside this file:
  * The first bf16 matmul on a stream allocates a 32 MiB cuBLAS workspace through this
    allocator; it counts in memory_allocated and is never freed (2 MiB -> 36 MiB allocated,
    20 MiB -> 52 MiB reserved around the first 1024x1024 bf16 matmul). Model it as a
    malloc(32 MiB) at the first GEMM per stream (32 MiB is torch's default on Hopper; older
    GPUs default to a smaller workspace).
  * The CUDA context and library handles take memory outside PyTorch: cudaMemGetInfo showed
    526.8 MiB used before any allocation; at the OOM probe NVML reported 716 MiB in use by
    the process with 32 MiB reserved by PyTorch (~684 MiB non-PyTorch), while cudaMemGetInfo
    counted another ~5-15 MiB as used (see `driver_reserved_bytes`).

CUDA-graph private pools (beginAllocateToPool / releasePool): while a stream captures a graph,
its allocations come from the graph's private pool. Here a pool is a pseudo-stream key
(`graph_pool_key`): its blocks sit in the same BlockPools under that key, so only allocations
routed to the pool reuse them, as with the C++ PrivatePool's own block pools. Its segments count
as reserved, and neither empty_cache nor the free-and-retry path releases them while a graph
holds the pool (use count > 0, `retain_graph_pool` / `release_graph_pool`); once released, its
entirely free segments go at the next empty_cache, as the C++ graph_pools_freeable path does.

Not modelled (defaults of a stock install, or irrelevant here): expandable_segments,
roundup_power2_divisions, garbage_collection_threshold, the free-memory callback registry, IPC, and the exact virtual addresses cudaMalloc returns
(segments get increasing, never reused, 2 MiB-aligned addresses; addresses only break ties
between free blocks of equal size).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# Constants from CUDACachingAllocator.cpp.
kMinBlockSize = 512  # all sizes are rounded to at least 512 bytes
kSmallSize = 1 * MiB  # largest "small" allocation is 1 MiB
kSmallBuffer = 2 * MiB  # "small" allocations are packed in 2 MiB blocks
kLargeBuffer = 20 * MiB  # "large" allocations may be packed in 20 MiB blocks
kMinLargeAlloc = 10 * MiB  # allocations between 1 and 10 MiB may use kLargeBuffer
kRoundLarge = 2 * MiB  # round up large allocations to 2 MiB
ONE_EXABYTE = 1 << 60  # NativeCachingAllocator::allocate refuses sizes >= this
UNLIMITED = (1 << 64) - 1  # max_split_size default: SIZE_MAX

# Keys of CUDA-graph private pools in the per-stream free lists: far below any stream id.
_GRAPH_POOL_KEY_BASE = -(1 << 62)

# The segment base of the first cudaMalloc; any nonzero value works (0 is the null pointer).
_FIRST_SEGMENT_ADDRESS = 0x7F0000000000

OOM_DOCS_HINT = (
    " If reserved but unallocated memory is large try setting"
    " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    "  See documentation for Memory Management "
    " (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)


# ----------------------------------------------------------------------------- sizes


def round_size(size: int) -> int:
    """DeviceCachingAllocator::round_size (roundup_power2_divisions off)."""
    if size < kMinBlockSize:
        return kMinBlockSize
    return kMinBlockSize * ((size + kMinBlockSize - 1) // kMinBlockSize)


def get_allocation_size(size: int) -> int:
    """DeviceCachingAllocator::get_allocation_size: the segment cudaMalloc'd for a rounded request."""
    if size <= kSmallSize:
        return kSmallBuffer
    if size < kMinLargeAlloc:
        return kLargeBuffer
    return kRoundLarge * ((size + kRoundLarge - 1) // kRoundLarge)


def format_size(size: int) -> str:
    """format_size() from the C++ source: std::fixed with precision 2, binary units."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= MiB:
        return f"{size / 1024.0:.2f} KiB"
    if size <= GiB:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


# ----------------------------------------------------------------------------- OOM


@dataclass(frozen=True)
class OomInfo:
    """The numbers torch puts in its OutOfMemoryError message (DeviceCachingAllocator::malloc)."""

    requested_bytes: int  # what the caller asked for
    alloc_size: int  # the segment size that could not be cudaMalloc'd ("Tried to allocate")
    device: int
    device_total: int  # cudaMemGetInfo total
    device_free: int  # cudaMemGetInfo free, after the cache was flushed
    process_used: int  # NVML: this process's device memory (non-PyTorch + reserved)
    allocated: int  # allocated_bytes.all.current
    reserved: int  # reserved_bytes.all.current
    allowed: Optional[int] = None  # set_per_process_memory_fraction limit, if any

    def message(self) -> str:
        return format_oom_message(self)


def format_oom_message(info: OomInfo) -> str:
    """The text of torch.OutOfMemoryError, as built in DeviceCachingAllocator::malloc (torch 2.11)."""
    proc_info = (
        f"Including non-PyTorch memory, this process has {format_size(info.process_used)} memory in use. "
    )
    allowed_info = f"{format_size(info.allowed)} allowed; " if info.allowed is not None else ""
    return (
        f"CUDA out of memory. Tried to allocate {format_size(info.alloc_size)}."
        f" GPU {info.device} has a total capacity of {format_size(info.device_total)}"
        f" of which {format_size(info.device_free)} is free. "
        f"{proc_info}{allowed_info}"
        f"Of the allocated memory {format_size(info.allocated)} is allocated by PyTorch, "
        f"and {format_size(info.reserved - info.allocated)} is reserved by PyTorch but unallocated."
        f"{OOM_DOCS_HINT}"
    )


class OutOfMemory(RuntimeError):
    """Raised where torch raises torch.OutOfMemoryError; `info` is None for the 1 EB check."""

    def __init__(self, message: str, info: Optional[OomInfo] = None):
        super().__init__(message)
        self.info = info

    def __reduce__(self):  # keep `info` when pickled across processes
        return (OutOfMemory, (str(self), self.info))


# ----------------------------------------------------------------------------- stats


class Stat:
    """c10::CachingDeviceAllocator::Stat."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount: int) -> None:  # increase_stat
        self.current += amount
        if self.current > self.peak:
            self.peak = self.current
        self.allocated += amount

    def decrease(self, amount: int) -> None:  # decrease_stat
        self.current -= amount
        self.freed += amount

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


class StatArray:
    """One Stat per StatType; every update goes to "all" and to the pool's own entry."""

    __slots__ = ("all", "small_pool", "large_pool")

    def __init__(self) -> None:
        self.all, self.small_pool, self.large_pool = Stat(), Stat(), Stat()

    # Stat.increase/decrease written out inline: this runs ~10 times per malloc+free pair.
    def increase(self, is_small: bool, amount: int) -> None:
        a = self.all
        p = self.small_pool if is_small else self.large_pool
        a.current += amount
        if a.current > a.peak:
            a.peak = a.current
        a.allocated += amount
        p.current += amount
        if p.current > p.peak:
            p.peak = p.current
        p.allocated += amount

    def decrease(self, is_small: bool, amount: int) -> None:
        a = self.all
        p = self.small_pool if is_small else self.large_pool
        a.current -= amount
        a.freed += amount
        p.current -= amount
        p.freed += amount

    def stats(self) -> tuple[Stat, Stat, Stat]:
        return self.all, self.small_pool, self.large_pool


# Field order of DeviceStats / THCPModule_memoryStats.
_STAT_ARRAY_NAMES = (
    "allocation", "segment", "active", "inactive_split", "allocated_bytes",
    "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
)


class DeviceStats:
    """c10::CachingDeviceAllocator::DeviceStats."""

    def __init__(self, max_split_size: int) -> None:
        self.allocation = StatArray()  # number of allocated blocks
        self.segment = StatArray()  # number of cudaMalloc'd segments
        self.active = StatArray()  # allocated or waiting on stream events
        self.inactive_split = StatArray()  # free blocks inside partly used segments
        self.allocated_bytes = StatArray()
        self.reserved_bytes = StatArray()
        self.active_bytes = StatArray()
        self.inactive_split_bytes = StatArray()
        self.requested_bytes = StatArray()  # unrounded sizes asked for
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        # static_cast<int64_t>(SIZE_MAX) is -1, which is what torch reports by default.
        self.max_split_size = -1 if max_split_size == UNLIMITED else max_split_size

    def all_stats(self) -> list[Stat]:
        stats = [s for name in _STAT_ARRAY_NAMES for s in getattr(self, name).stats()]
        return stats + [self.oversize_allocations, self.oversize_segments]


# ----------------------------------------------------------------------------- blocks


class Block:
    """A range of a segment: free (in its pool), allocated, or freed but awaiting stream events."""

    __slots__ = ("addr", "size", "requested_size", "stream", "pool", "prev", "next",
                 "allocated", "event_count", "stream_uses")

    def __init__(self, addr: int, size: int, stream: int, pool: "BlockPool") -> None:
        self.addr = addr
        self.size = size
        self.requested_size = 0
        self.stream = stream
        self.pool = pool
        self.prev: Optional[Block] = None  # neighbours within the segment
        self.next: Optional[Block] = None
        self.allocated = False
        self.event_count = 0  # outstanding record_stream events
        self.stream_uses: set[int] = set()

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"Block({self.addr:#x}, {self.size}, stream={self.stream}, {state})"


class BlockPool:
    """Free blocks of one pool. The C++ std::set ordered by (stream, size, ptr) is kept here as
    one sorted list of (size, addr, block) per stream, searched with bisect."""

    __slots__ = ("is_small", "free_by_stream")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.free_by_stream: dict[int, list[tuple[int, int, Block]]] = {}

    def insert(self, block: Block) -> None:
        free = self.free_by_stream.get(block.stream)
        if free is None:
            free = self.free_by_stream[block.stream] = []
        insort(free, (block.size, block.addr, block))

    def remove(self, block: Block) -> None:
        free = self.free_by_stream[block.stream]
        i = bisect_left(free, (block.size, block.addr))
        assert free[i][2] is block, "block not in its pool"
        del free[i]

    def blocks(self) -> list[Block]:
        """All free blocks in std::set order: by stream, then size, then address."""
        return [entry[2] for stream in sorted(self.free_by_stream) for entry in self.free_by_stream[stream]]


# ----------------------------------------------------------------------------- allocator

# Given a stream, record an event on it and return a poll saying whether the event has
# completed. record_stream'd blocks wait on such events before they are reused.
EventRecorder = Callable[[int], Callable[[], bool]]


class CachingAllocator:
    """DeviceCachingAllocator for one device.

    total_memory: cudaMemGetInfo total (device properties' total_memory).
    non_pytorch_bytes: this process's device memory outside the allocator (CUDA context,
        library handles, NCCL buffers); capacity left to PyTorch is total minus this.
        Public and mutable, for memory that appears later (e.g. NCCL communicators).
    driver_reserved_bytes: memory cudaMemGetInfo counts as used but NVML does not charge to
        this process; it lowers capacity but is left out of "this process has ... in use".
    max_split_size_mb: PYTORCH_CUDA_ALLOC_CONF max_split_size_mb (None: unlimited).
    event_recorder: how record_stream'd frees learn that the other stream's work is done;
        None means every such event has completed by the next malloc.
    """

    def __init__(
        self,
        total_memory: int,
        non_pytorch_bytes: int = 0,
        device_index: int = 0,
        *,
        driver_reserved_bytes: int = 0,
        max_split_size_mb: Optional[int] = None,
        event_recorder: Optional[EventRecorder] = None,
    ) -> None:
        self.total_memory = total_memory
        self.non_pytorch_bytes = non_pytorch_bytes
        self.driver_reserved_bytes = driver_reserved_bytes
        self.device_index = device_index
        # CUDAAllocatorConfig clamps max_split_size_mb to at least kLargeBuffer.
        self.max_split_size = (
            UNLIMITED if max_split_size_mb is None else max(max_split_size_mb, kLargeBuffer // MiB) * MiB
        )
        self.event_recorder = event_recorder
        self.stats = DeviceStats(self.max_split_size)
        self.large_blocks = BlockPool(is_small=False)
        self.small_blocks = BlockPool(is_small=True)
        self.total_allocated_memory = 0  # bytes in segments (reserved), as in the C++
        self.allowed_memory_maximum: Optional[int] = None  # set_memory_fraction
        self._allocated: dict[int, Block] = {}  # address -> allocated block
        self._events: dict[int, deque[tuple[Callable[[], bool], Block]]] = {}  # per stream
        self._next_segment_address = _FIRST_SEGMENT_ADDRESS
        self._graph_pools: dict[tuple[int, int], int] = {}  # CUDA graph pool id -> its stream key
        self._graph_pool_uses: dict[int, int] = {}  # stream key -> graphs holding the pool

    # ---------------------------------------------------------------- public API

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """Allocate nbytes on a stream; returns the block's address (0 for 0 bytes).

        NativeCachingAllocator::allocate + DeviceCachingAllocator::malloc. Raises OutOfMemory.
        """
        if nbytes == 0:
            return 0  # allocate() hands out a null pointer without touching the allocator
        if nbytes >= ONE_EXABYTE:
            raise OutOfMemory("CUDA out of memory. Tried to allocate more than 1EB memory.")
        if self._events:
            self._process_events()
        size = round_size(nbytes)
        pool = self.small_blocks if size <= kSmallSize else self.large_blocks
        block = self._get_free_block(pool, stream, size)
        if block is None:
            alloc_size = get_allocation_size(size)
            block = (
                self._alloc_block(pool, stream, alloc_size, is_retry=False)
                # Free enough oversize cached blocks to satisfy the request, and retry.
                or (self._release_available_cached_blocks(pool, stream, size)
                    and self._alloc_block(pool, stream, alloc_size, is_retry=False))
                # Free all unused cached segments and retry.
                or (self._release_cached_blocks()
                    and self._alloc_block(pool, stream, alloc_size, is_retry=True))
            )
            if block is None:
                self._raise_oom(nbytes, alloc_size)
        return self._alloc_found_block(block, size, nbytes, self._should_split(block, size)).addr

    def free(self, handle: int) -> None:
        """DeviceCachingAllocator::free: return a block to its pool (or wait on its stream uses)."""
        if handle == 0:
            return
        block = self._allocated.pop(handle, None)
        if block is None:
            raise ValueError(f"invalid device pointer: {handle:#x}")
        block.allocated = False
        stats, is_small = self.stats, block.pool.is_small
        stats.allocation.decrease(is_small, 1)
        stats.allocated_bytes.decrease(is_small, block.size)
        if block.size >= self.max_split_size:
            stats.oversize_allocations.decrease(1)
        if block.stream_uses:
            self._insert_events(block)
        else:
            self._free_block(block)

    def record_stream(self, handle: int, stream: int) -> None:
        """DeviceCachingAllocator::recordStream: the block is also used on `stream`."""
        block = self._allocated.get(handle)
        if block is None:
            raise ValueError(f"invalid device pointer: {handle:#x}")
        if stream != block.stream:  # uses on the allocation stream need no synchronization
            block.stream_uses.add(stream)

    # ---------------------------------------------------------------- CUDA graph pools

    def graph_pool_key(self, pool_id: tuple[int, int]) -> int:
        """The pseudo-stream under which the private pool `pool_id` keeps its blocks: pass it as
        malloc's stream while a capture routes allocations to the pool."""
        key = self._graph_pools.get(pool_id)
        if key is None:
            key = self._graph_pools[pool_id] = _GRAPH_POOL_KEY_BASE - len(self._graph_pools)
        return key

    def retain_graph_pool(self, pool_id: tuple[int, int]) -> int:
        """A graph captures into the pool (beginAllocateToPool): its segments are kept while any
        graph holds it. Returns the pool's key."""
        key = self.graph_pool_key(pool_id)
        self._graph_pool_uses[key] = self._graph_pool_uses.get(key, 0) + 1
        return key

    def release_graph_pool(self, pool_id: tuple[int, int]) -> None:
        """A graph holding the pool was destroyed (releasePool)."""
        key = self._graph_pools.get(pool_id)
        if key is not None and self._graph_pool_uses.get(key, 0) > 0:
            self._graph_pool_uses[key] -= 1

    def _releasable(self, stream: int) -> bool:
        """May cached segments on this free list go back to the driver?"""
        return self._graph_pool_uses.get(stream, 0) == 0

    def empty_cache(self) -> None:
        """DeviceCachingAllocator::emptyCache: release every cached segment that is entirely free."""
        self._release_cached_blocks()

    def set_memory_fraction(self, fraction: float) -> None:
        """DeviceCachingAllocator::setMemoryFraction (torch.cuda.set_per_process_memory_fraction)."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"invalid fraction: {fraction}. Please set within (0, 1).")
        self.allowed_memory_maximum = int(fraction * self.total_memory)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) as cudaMemGetInfo would report them."""
        used = self.non_pytorch_bytes + self.driver_reserved_bytes + self.total_allocated_memory
        return max(self.total_memory - used, 0), self.total_memory

    def memory_allocated(self) -> int:
        return self.stats.allocated_bytes.all.current

    def memory_reserved(self) -> int:
        return self.stats.reserved_bytes.all.current

    def max_memory_allocated(self) -> int:
        return self.stats.allocated_bytes.all.peak

    def max_memory_reserved(self) -> int:
        return self.stats.reserved_bytes.all.peak

    def reset_peak_stats(self) -> None:
        """DeviceCachingAllocator::resetPeakStats."""
        for stat in self.stats.all_stats():
            stat.peak = stat.current

    def reset_accumulated_stats(self) -> None:
        """DeviceCachingAllocator::resetAccumulatedStats."""
        for stat in self.stats.all_stats():
            stat.allocated = stat.freed = 0
        s = self.stats
        s.num_alloc_retries = s.num_ooms = s.num_sync_all_streams = 0
        s.num_device_alloc = s.num_device_free = 0

    def memory_stats(self) -> dict[str, int]:
        """What torch.cuda.memory_stats() returns: flat "a.b.c" keys, sorted."""
        s = self.stats
        flat: dict[str, int] = {
            "num_alloc_retries": s.num_alloc_retries,
            "num_ooms": s.num_ooms,
            "max_split_size": s.max_split_size,
            "num_sync_all_streams": s.num_sync_all_streams,
            "num_device_alloc": s.num_device_alloc,
            "num_device_free": s.num_device_free,
        }
        for name in _STAT_ARRAY_NAMES:
            array = getattr(s, name)
            for pool_name, stat in zip(("all", "small_pool", "large_pool"), array.stats()):
                for metric, value in stat.as_dict().items():
                    flat[f"{name}.{pool_name}.{metric}"] = value
        for name in ("oversize_allocations", "oversize_segments"):
            for metric, value in getattr(s, name).as_dict().items():
                flat[f"{name}.{metric}"] = value
        return dict(sorted(flat.items()))

    def check_invariants(self) -> None:
        """Debug aid, O(blocks): segments tile exactly, pools hold exactly the free blocks,
        and the byte counters agree with the blocks. Raises AssertionError."""
        heads = {b for b in self._all_blocks() if b.prev is None}
        reserved = allocated = 0
        for head in heads:
            addr, block = head.addr, head
            while block is not None:
                assert block.addr == addr, f"gap or overlap at {block}"
                assert block.next is None or block.next.prev is block
                free_neighbour = block.next is not None and not _busy(block) and not _busy(block.next)
                assert not free_neighbour, f"free neighbours not merged at {block}"
                allocated += block.size if block.allocated else 0
                addr += block.size
                block = block.next
            reserved += addr - head.addr
        assert reserved == self.total_allocated_memory == self.stats.reserved_bytes.all.current
        assert allocated == self.stats.allocated_bytes.all.current
        for pool in (self.small_blocks, self.large_blocks):
            for stream, free in pool.free_by_stream.items():
                assert free == sorted(free, key=lambda e: (e[0], e[1]))
                for size, addr, block in free:
                    assert (size, addr, stream) == (block.size, block.addr, block.stream)
                    assert not _busy(block) and block.pool is pool

    # ---------------------------------------------------------------- finding a block

    def _get_free_block(self, pool: BlockPool, stream: int, size: int) -> Optional[Block]:
        """get_free_block: the smallest free block on this stream with at least `size` bytes."""
        free = pool.free_by_stream.get(stream)
        if not free:
            return None
        i = bisect_left(free, (size,))  # (size,) sorts before every (size, addr, block)
        if i == len(free):
            return None
        block = free[i][2]
        # Do not return an oversized block for a small enough request...
        if size < self.max_split_size and block.size >= self.max_split_size:
            return None
        # ...and let an oversize request round up only by less than kLargeBuffer.
        if size >= self.max_split_size and block.size >= size + kLargeBuffer:
            return None
        del free[i]
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        """should_split: keep the remainder as a free block only if it is worth it."""
        remaining = block.size - size
        if block.pool.is_small:
            return remaining >= kMinBlockSize
        return size < self.max_split_size and remaining > kSmallSize

    def _alloc_found_block(self, block: Block, size: int, requested: int, split: bool) -> Block:
        """alloc_found_block: split off the front of `block` if asked, mark it allocated."""
        stats, pool = self.stats, block.pool
        is_small = pool.is_small
        already_split = block.is_split
        if split:
            remaining = block
            block = Block(remaining.addr, size, remaining.stream, pool)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            pool.insert(remaining)
            if already_split:  # an inactive split block shrinks by `size`
                stats.inactive_split_bytes.decrease(is_small, size)
            else:  # a new inactive split block appears
                stats.inactive_split_bytes.increase(is_small, remaining.size)
                stats.inactive_split.increase(is_small, 1)
        elif already_split:  # an inactive split block becomes active
            stats.inactive_split_bytes.decrease(is_small, block.size)
            stats.inactive_split.decrease(is_small, 1)

        block.allocated = True
        block.requested_size = requested
        self._allocated[block.addr] = block
        stats.allocation.increase(is_small, 1)
        stats.allocated_bytes.increase(is_small, block.size)
        stats.active.increase(is_small, 1)
        stats.active_bytes.increase(is_small, block.size)
        stats.requested_bytes.increase(is_small, requested)
        if block.size >= self.max_split_size:
            stats.oversize_allocations.increase(1)
        return block

    # ---------------------------------------------------------------- freeing a block

    def _free_block(self, block: Block) -> None:
        """free_block: merge with free neighbours and put the result back in its pool."""
        pool, stats = block.pool, self.stats
        is_small = pool.is_small
        original_size, requested = block.size, block.requested_size
        net_blocks = net_bytes = 0
        for candidate in (block.prev, block.next):
            subsumed = self._try_merge_blocks(block, candidate, pool)
            if subsumed:
                net_blocks -= 1
                net_bytes -= subsumed
        pool.insert(block)
        if block.is_split:
            net_blocks += 1
            net_bytes += block.size
        if net_blocks > 0:
            stats.inactive_split.increase(is_small, net_blocks)
        elif net_blocks < 0:
            stats.inactive_split.decrease(is_small, -net_blocks)
        if net_bytes > 0:
            stats.inactive_split_bytes.increase(is_small, net_bytes)
        elif net_bytes < 0:
            stats.inactive_split_bytes.decrease(is_small, -net_bytes)
        stats.active.decrease(is_small, 1)
        stats.active_bytes.decrease(is_small, original_size)
        stats.requested_bytes.decrease(is_small, requested)

    @staticmethod
    def _try_merge_blocks(dst: Block, src: Optional[Block], pool: BlockPool) -> int:
        """try_merge_blocks: absorb free neighbour `src` into `dst`; returns the bytes absorbed."""
        if src is None or _busy(src):
            return 0
        pool.remove(src)
        if dst.prev is src:  # [src dst]
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # ---------------------------------------------------------------- segments

    def _alloc_block(self, pool: BlockPool, stream: int, size: int, is_retry: bool) -> Optional[Block]:
        """alloc_block: cudaMalloc a new segment of `size` bytes, or None if it does not fit."""
        if is_retry:
            self.stats.num_alloc_retries += 1
        allowed = self.allowed_memory_maximum
        if allowed is not None and self.total_allocated_memory + size > allowed:
            return None
        if size > self.mem_get_info()[0]:  # cudaErrorMemoryAllocation
            return None
        block = Block(self._next_segment_address, size, stream, pool)
        self._next_segment_address += kRoundLarge * ((size + kRoundLarge - 1) // kRoundLarge)
        self.total_allocated_memory += size
        stats = self.stats
        stats.segment.increase(pool.is_small, 1)
        stats.reserved_bytes.increase(pool.is_small, size)
        if size >= self.max_split_size:
            stats.oversize_segments.increase(1)
        stats.num_device_alloc += 1
        return block

    def _release_block(self, block: Block) -> None:
        """release_block: cudaFree a whole, unused segment (the caller took it out of its pool)."""
        assert not block.is_split and not block.allocated
        stats = self.stats
        stats.num_device_free += 1
        self.total_allocated_memory -= block.size
        stats.segment.decrease(block.pool.is_small, 1)
        stats.reserved_bytes.decrease(block.pool.is_small, block.size)
        if block.size >= self.max_split_size:
            stats.oversize_segments.decrease(1)

    def _release_available_cached_blocks(self, pool: BlockPool, stream: int, size: int) -> bool:
        """release_available_cached_blocks: free oversize cached segments, just enough for `size`.

        Only does anything when max_split_size is set (oversize blocks exist)."""
        if self.max_split_size == UNLIMITED:
            return False
        free = pool.free_by_stream.get(stream)
        if not free or not self._releasable(stream):
            return False
        key_size = max(size, self.max_split_size)
        i = bisect_left(free, (key_size,))
        if i < len(free):
            self._release_block(free.pop(i)[2])
            return True
        # No single block is large enough: free oversize blocks, largest first.
        released = 0
        j = len(free) - 1
        while released < key_size and j >= 0 and free[j][0] >= self.max_split_size:
            released += free[j][0]
            self._release_block(free.pop(j)[2])
            j -= 1
        return released >= key_size

    def _release_cached_blocks(self) -> bool:
        """release_cached_blocks: wait for all stream events, then cudaFree every unused segment."""
        self._synchronize_and_free_events()
        for pool in (self.large_blocks, self.small_blocks):  # release_blocks
            for stream in sorted(pool.free_by_stream):
                if not self._releasable(stream):
                    continue
                kept = []
                for entry in pool.free_by_stream[stream]:
                    if entry[2].is_split:
                        kept.append(entry)
                    else:
                        self._release_block(entry[2])
                pool.free_by_stream[stream] = kept
        return True

    # ---------------------------------------------------------------- cross-stream uses

    def _insert_events(self, block: Block) -> None:
        """insert_events: one event per stream that used the block; it is reused after all complete."""
        streams, block.stream_uses = sorted(block.stream_uses), set()
        for stream in streams:
            poll = self.event_recorder(stream) if self.event_recorder is not None else _always_done
            block.event_count += 1
            self._events.setdefault(stream, deque()).append((poll, block))

    def _process_events(self) -> None:
        """process_events: free blocks whose events completed, in order per stream."""
        for stream in list(self._events):
            queue = self._events[stream]
            while queue and queue[0][0]():
                self._event_done(queue.popleft()[1])
            if not queue:
                del self._events[stream]

    def _synchronize_and_free_events(self) -> None:
        """synchronize_and_free_events: wait for every outstanding event."""
        self.stats.num_sync_all_streams += 1
        events, self._events = self._events, {}
        for queue in events.values():
            for _, block in queue:
                self._event_done(block)

    def _event_done(self, block: Block) -> None:
        block.event_count -= 1
        if block.event_count == 0:
            self._free_block(block)

    # ---------------------------------------------------------------- OOM

    def _raise_oom(self, requested: int, alloc_size: int) -> None:
        """The failure branch of DeviceCachingAllocator::malloc."""
        self.stats.num_ooms += 1
        device_free, device_total = self.mem_get_info()
        info = OomInfo(
            requested_bytes=requested,
            alloc_size=alloc_size,
            device=self.device_index,
            device_total=device_total,
            device_free=device_free,
            process_used=self.non_pytorch_bytes + self.total_allocated_memory,
            allocated=self.stats.allocated_bytes.all.current,
            reserved=self.stats.reserved_bytes.all.current,
            allowed=self.allowed_memory_maximum,
        )
        raise OutOfMemory(info.message(), info)

    def _all_blocks(self) -> list[Block]:
        pending = [block for queue in self._events.values() for _, block in queue]
        free = self.small_blocks.blocks() + self.large_blocks.blocks()
        return free + list(self._allocated.values()) + pending


def _busy(block: Block) -> bool:
    """A block that cannot be merged: allocated or still waiting on stream events."""
    return block.allocated or block.event_count > 0 or bool(block.stream_uses)


def _always_done() -> bool:
    return True
