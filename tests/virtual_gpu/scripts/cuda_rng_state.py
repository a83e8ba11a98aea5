"""CUDA random number generator state on the virtual GPUs, as on a real one (issue 14, cause 2).

Plain torch only. Each check prints `ok <name>`. Expected offsets are worked out by hand from
torch's CUDA launch rules for an H100 SXM (132 SMs, 2048 threads per SM), see `grid_offset`.
"""

import torch

DEFAULT_RNG_SEED = 67280421310721  # c10::default_rng_seed_val, the seed of torch.Generator(device="cuda")


def state_words(state):
    """The 16-byte CUDA Philox state as (seed, offset)."""
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 16, state
    seed, offset = state.view(torch.int64).tolist()
    return seed, offset


def make_state(seed, offset):
    return torch.tensor([seed, offset], dtype=torch.int64).view(torch.uint8)


def grid_offset(numel, unroll):
    """ATen/native/cuda/DistributionTemplates.h calc_execution_policy on an H100 (132 SMs x 8
    blocks of 256 threads): 4 per Philox call each thread makes."""
    blocks = min(132 * (2048 // 256), (numel + 255) // 256)
    return ((numel - 1) // (256 * blocks * unroll) + 1) * 4


# --- default generators ---------------------------------------------------------------------
n = torch.cuda.device_count()
gens = torch.cuda.default_generators
assert len(gens) == n == 8, (len(gens), n)
assert all(isinstance(g, torch.Generator) for g in gens)
assert [str(g.device) for g in gens] == [f"cuda:{i}" for i in range(n)]
print("ok default_generators")

g = torch.Generator(device="cuda")
assert g.device == torch.device("cuda", 0) and g.initial_seed() == DEFAULT_RNG_SEED, (g.device, g.initial_seed())
g3 = torch.Generator(device="cuda:3")
assert g3.device == torch.device("cuda", 3)
try:
    torch.Generator(device="cuda:8")
except RuntimeError as e:
    assert "device_index is invalid" in str(e), e
else:
    raise AssertionError("a generator on cuda:8 of an 8-GPU node was created")
print("ok new_generator")

# --- seeds reach the generators ops use -----------------------------------------------------
torch.manual_seed(1234)  # seeds every device, as on a GPU
assert [x.initial_seed() for x in gens] == [1234] * n
torch.cuda.set_device(2)
torch.cuda.manual_seed(99)
assert gens[2].initial_seed() == 99 and gens[0].initial_seed() == 1234
assert torch.cuda.initial_seed() == 99
torch.cuda.set_device(0)
torch.cuda.manual_seed_all(7)
assert [x.initial_seed() for x in gens] == [7] * n
torch.cuda.seed()
assert torch.cuda.initial_seed() != 7 and gens[1].initial_seed() == 7
torch.cuda.seed_all()
assert len({x.initial_seed() for x in gens}) == 1 and gens[0].initial_seed() != 7
if hasattr(torch._C, "_accelerator_getDefaultGenerator"):  # torch >= 2.14: torch.accelerator's RNG functions
    gens[1].manual_seed(31)
    assert torch.accelerator.random.initial_seed(1) == 31
    assert torch.equal(torch.accelerator.random.get_rng_state(1), gens[1].get_state())
print("ok seeds")

# --- state layout and round trips -----------------------------------------------------------
torch.cuda.manual_seed(0xDEADBEEF)
assert state_words(torch.cuda.get_rng_state()) == (0xDEADBEEF, 0)
torch.cuda.set_rng_state(make_state(42, 4096))
assert state_words(torch.cuda.get_rng_state()) == (42, 4096)
assert torch.cuda.initial_seed() == 42 and gens[0].get_offset() == 4096
torch.cuda.set_rng_state(make_state(5, 8), device=1)
assert state_words(torch.cuda.get_rng_state(1)) == (5, 8) and state_words(torch.cuda.get_rng_state(0)) == (42, 4096)
all_states = torch.cuda.get_rng_state_all()
torch.cuda.manual_seed_all(1)
torch.cuda.set_rng_state_all(all_states)
assert [state_words(s) for s in torch.cuda.get_rng_state_all()] == [state_words(s) for s in all_states]
gens[0].set_state(make_state(11, 0)[:8].clone())  # a seed-only state, as the CUDA generator accepts
assert state_words(gens[0].get_state()) == (11, 0)
for bad, message in ((make_state(1, 6), "multiple of 4"), (torch.zeros(15, dtype=torch.uint8), "wrong size")):
    try:
        torch.cuda.set_rng_state(bad)
    except RuntimeError as e:
        assert message in str(e), e
    else:
        raise AssertionError(f"set_rng_state accepted {bad}")
try:
    torch.cuda.set_rng_state(torch.zeros(16, dtype=torch.int32))
except TypeError as e:
    assert "RNG state must be a torch.ByteTensor" in str(e), e
else:
    raise AssertionError("set_rng_state accepted an int32 tensor")
print("ok state_round_trip")

# --- the offset advances as the GPU's kernels advance it -------------------------------------
torch.cuda.set_rng_state(make_state(3, 0))
torch.randn(1000, device="cuda")  # 4 blocks x 256 threads x 4 per call: one call per thread
assert gens[0].get_offset() == 4 == grid_offset(1000, 4)
x = torch.empty(4096, 4096, device="cuda")
torch.nn.functional.dropout(x, p=0.1, training=True)  # Dropout.cu: same grid, UNROLL 4 -> +64
assert gens[0].get_offset() == 4 + 64, gens[0].get_offset()
torch.nn.functional.dropout(x, p=0.1, training=False)  # eval: no random numbers drawn
x.normal_()  # 2**24 floats -> +64
torch.empty(1 << 24, dtype=torch.float64, device="cuda").uniform_()  # doubles: 2 per call -> +128
assert gens[0].get_offset() == 4 + 64 + 64 + 128, gens[0].get_offset()
torch.rand_like(x[:1000, 0])
torch.randint(0, 10, (1000,), device="cuda")
assert gens[0].get_offset() == 4 + 64 + 64 + 128 + 4 + 4
y = torch.empty(1000, device="cuda:1")
y.bernoulli_(0.5)
assert gens[1].get_offset() == 8 + 4 and gens[0].get_offset() == 268  # on y's device only
mine = torch.Generator(device="cuda")
mine.manual_seed(5)
torch.randn(1000, device="cuda", generator=mine)
assert mine.get_offset() == 4 and gens[0].get_offset() == 268  # an explicit generator, not the default
print("ok offsets_advance")

# --- torch.random.fork_rng restores the CUDA state exactly ----------------------------------
torch.cuda.set_rng_state(make_state(77, 400))
with torch.random.fork_rng(devices=[0], device_type="cuda"):
    torch.cuda.manual_seed(5)
    torch.randn(10, device="cuda")
    assert state_words(torch.cuda.get_rng_state()) == (5, 4)
assert state_words(torch.cuda.get_rng_state()) == (77, 400)
with torch.random.fork_rng(devices=[0], device_type="cuda"):
    torch.randn(10, device="cuda")
assert state_words(torch.cuda.get_rng_state()) == (77, 400)
print("ok fork_rng")

# --- graph-safe states: shared by graphsafe_get_state, copied by clone_state -----------------
default = gens[0]
default.manual_seed(21)
shared = default.graphsafe_get_state()
copied = default.clone_state()
assert shared.device == copied.device == torch.device("cuda", 0)
torch.randn(1000, device="cuda")
assert shared.get_offset() == 4 and copied.get_offset() == 0 and copied.initial_seed() == 21
copied.manual_seed(22)
default.graphsafe_set_state(copied)  # the default generator now draws from `copied`'s state
torch.randn(1000, device="cuda")
assert copied.get_offset() == 4 and default.initial_seed() == 22 and shared.get_offset() == 4
default.graphsafe_set_state(shared)
assert default.initial_seed() == 21 and default.get_offset() == 4
try:
    default.graphsafe_set_state(torch.Generator())
except RuntimeError as e:
    assert "Expected a CUDA Generator" in str(e), e
else:
    raise AssertionError("graphsafe_set_state accepted a CPU generator")
print("ok graphsafe_state")

# --- Megatron-Core's RNG tracker --------------------------------------------------------------
# The steps of model_parallel_cuda_manual_seed and CudaRNGStatesTracker.add / fork in
# megatron/core/tensor_parallel/random.py (NVIDIA/Megatron-LM main, commit 004bfb5), copied as
# plain torch: _set_cuda_rng_state is default_generators[idx].set_state(state) (or
# graphsafe_set_state with use_cudagraphable_rng), _get_cuda_rng_state is torch.cuda.get_rng_state
# (or default_generators[idx].clone_state() / graphsafe_get_state()).


class Tracker:
    def __init__(self, graph_safe=False):
        self.graph_safe, self.states, self.seeds = graph_safe, {}, set()

    def get(self, clone=False):
        gen = torch.cuda.default_generators[torch.cuda.current_device()]
        if not self.graph_safe:
            return torch.cuda.get_rng_state()
        return gen.clone_state() if clone else gen.graphsafe_get_state()

    def set(self, state):
        gen = torch.cuda.default_generators[torch.cuda.current_device()]
        gen.graphsafe_set_state(state) if self.graph_safe else gen.set_state(state)

    def add(self, name, seed):
        assert seed not in self.seeds and name not in self.states
        self.seeds.add(seed)
        if self.graph_safe:
            state = self.get(clone=True)
            state.manual_seed(seed)
            self.states[name] = state
        else:
            orig = torch.cuda.get_rng_state()
            torch.cuda.manual_seed(seed)
            self.states[name] = torch.cuda.get_rng_state()
            self.set(orig)

    def fork(self, name, body):
        orig = self.get()
        self.set(self.states[name])
        try:
            body()
        finally:
            self.states[name] = self.get()
            self.set(orig)


def model_parallel_cuda_manual_seed(tracker, seed, tp_rank, ep_rank=0, etp_rank=0):
    tracker.states.clear()
    tracker.seeds.clear()
    torch.cuda.manual_seed(seed)  # data parallel: the original seed
    tracker.add("data-parallel-rng", seed)
    tracker.add("model-parallel-rng", seed + 2718 + tp_rank)
    tracker.add("expert-parallel-rng", seed + 1024 + 100 * ep_rank + etp_rank)


def seed_and_offset(state):
    return (state.initial_seed(), state.get_offset()) if isinstance(state, torch.Generator) else state_words(state)


for graph_safe in (False, True):
    tracker = Tracker(graph_safe)
    model_parallel_cuda_manual_seed(tracker, 1000, tp_rank=3)
    assert torch.cuda.initial_seed() == 1000 and gens[0].get_offset() == 0
    assert seed_and_offset(tracker.states["model-parallel-rng"]) == (1000 + 2718 + 3, 0)
    assert seed_and_offset(tracker.states["expert-parallel-rng"]) == (1000 + 1024, 0)
    torch.randn(1000, device="cuda")  # the default (data parallel) state: +4
    seen = []

    def tensor_parallel_region():
        seen.append(torch.cuda.initial_seed())
        torch.nn.functional.dropout(torch.empty(4096, 4096, device="cuda"), 0.1)  # +64

    tracker.fork("model-parallel-rng", tensor_parallel_region)
    tracker.fork("model-parallel-rng", tensor_parallel_region)
    assert seen == [3721, 3721], seen
    assert seed_and_offset(tracker.states["model-parallel-rng"]) == (3721, 128)
    assert (torch.cuda.initial_seed(), gens[0].get_offset()) == (1000, 4)  # the default state is back
    assert seed_and_offset(tracker.states["expert-parallel-rng"]) == (2024, 0)
print("ok megatron_rng_tracker")

# --- activation checkpointing replays the forward's random numbers ----------------------------
from torch.utils.checkpoint import checkpoint  # noqa: E402

w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
for reentrant in (False, True):
    torch.cuda.set_rng_state(make_state(17, 1000))
    entry_states = []

    def block(inp):
        entry_states.append(state_words(torch.cuda.get_rng_state()))
        return torch.nn.functional.dropout(inp @ w, 0.1)  # 2**20 elements: 1056 blocks -> +4

    out = checkpoint(block, torch.randn(1024, 1024, device="cuda", requires_grad=reentrant),  # +4
                     use_reentrant=reentrant)
    assert state_words(torch.cuda.get_rng_state()) == (17, 1008)
    out.sum().backward()  # the recomputation runs from the forward's state, then puts it back
    assert entry_states == [(17, 1004), (17, 1004)], entry_states
    assert state_words(torch.cuda.get_rng_state()) == (17, 1008)
print("ok checkpoint_replays_rng")
