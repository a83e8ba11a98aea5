// phantora's virtual CUDA shim for CPU and CUDA builds of PyTorch.
//
// Loaded with RTLD_GLOBAL before `import torch` (torch._C caches getCUDAHooks() at init), it
// makes stock PyTorch believe CUDA devices exist, without any CUDA library or GPU driver:
//  * a DeviceGuardImplInterface for DeviceType::CUDA: thread-local current device and current
//    stream per device (c10's FakeGuardImpl caps at 8 devices; we need more), stream ids from a
//    counter, event handles that are plain integers. No work ever runs: tensors are FakeTensors
//    and timing is the simulator's job, so record/block/synchronize are no-ops here.
//  * a CUDAHooksInterface registered under the key "CUDAHooks", so hasCUDA() is true (autograd
//    and torch.accelerator then pick CUDA), and a pinned-memory allocator: host memory that
//    isPinnedPtr recognises, as C++ code (DDP's reducer) checks with is_pinned().
//  * a kernel for the CUDA dispatch key (installed by phantora_install_cuda_dispatch) that hands
//    ops arriving there outside phantora's dispatch modes back to them (see the section below).
//  * the CUDA entry of _fused_sdp_choice_stub, so F.scaled_dot_product_attention takes the
//    fused backend a real GPU would take instead of the math path (see choose_sdp_backend).
//  * one default Philox random number generator per device and new ones on request (the
//    hooks' getDefaultGenerator / getNewGenerator), holding the state a real CUDA generator
//    holds: seed and offset, 16 bytes (see the RNG section).
//
// On a CUDA build of torch the real CUDA guard, hooks and SDPA chooser exist too; they need a
// driver and a GPU. The shim is then linked against libc10_cuda and libtorch_cuda (see
// shim_build.py), so the dynamic loader runs their static registrations before ours: the guard
// and the dispatch stub are plain slots (the last registration wins) and the hooks are
// registered with a higher priority than torch's own (an equal one would abort the process).
//
// DDP's reducer also times each iteration with a per-device-type timer; the CUDA build's
// records real CUDA events (cudaErrorInsufficientDriver without a GPU), so on CUDA builds the
// shim registers a host-clock timer for CUDA, as CPU builds of torch use for CPU tensors.
//
// Configuration comes from the environment, read once:
//   PHANTORA_DEVICE_COUNT      number of virtual GPUs on the node (default 8); the process sees
//                              phantora_shim_set_device_count's number instead once it is called
//   PHANTORA_SDPA_PRIORITY     comma list of backends in priority order, e.g. "cudnn,flash,efficient"
//   PHANTORA_SDPA_MAX_HEADDIM  per-backend head-dim limits "flash=256,cudnn=128,efficient=1024"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/core/impl/alloc_cpu.h>
#ifdef PHANTORA_TORCH_CUDA_BUILD
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#endif

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <dlfcn.h>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr int kMaxDevices = 256;

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s && *s ? std::atoi(s) : fallback;
}

// Set by interpose/launch/hook.py before torch's import: the node's GPUs narrowed by CUDA_VISIBLE_DEVICES
// (0 when it hides them all: torch then sees no CUDA, as on a real machine).
std::atomic<int> visible_devices{-1};

int device_count() {
  static const int from_env = [] {
    int v = env_int("PHANTORA_DEVICE_COUNT", 8);
    return v < 1 ? 1 : (v > kMaxDevices ? kMaxDevices : v);
  }();
  int v = visible_devices.load();
  return v >= 0 ? v : from_env;
}

thread_local c10::DeviceIndex tl_device = 0;
thread_local std::array<c10::StreamId, kMaxDevices> tl_stream{};
std::atomic<c10::StreamId> next_stream_id{1};
std::atomic<intptr_t> next_event_id{1};

int index_of(c10::Device d) {
  return d.has_index() ? d.index() : tl_device;
}

struct VirtualCudaGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::CUDA, tl_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.index() >= 0 && d.index() < device_count(),
                "CUDA error: invalid device ordinal: cuda:", static_cast<int>(d.index()),
                " does not exist (phantora simulates ", device_count(),
                " GPUs per node; change --nproc-per-node / the cluster, or the device index)");
    tl_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) tl_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, index_of(d)),
                       tl_stream[index_of(d)]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, index_of(d)), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, index_of(d)),
                       next_stream_id++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    int i = index_of(s.device());
    auto old = tl_stream[i];
    tl_stream[i] = s.id();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, i), old);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = reinterpret_cast<void*>(next_event_id++);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override { return 0.0; }
};

// ==== CUDA random number generators (phantora's RNG section) =========================
// A virtual GPU draws no random numbers (tensors are FakeTensors), but programs treat the
// generator state as data: they save, restore, compare and broadcast it (torch.random.fork_rng,
// activation checkpointing, Megatron's CudaRNGStatesTracker, DTensor's OffsetBasedRNGTracker
// rewrites the offset bytes). So each device gets a generator with a real CUDA generator's
// state and rules (ATen/cuda/CUDAGeneratorImpl.cpp): a seed and a Philox offset that is a
// multiple of 4, serialised as 16 bytes (seed as uint64, then offset as int64); setting the
// seed zeroes the offset; graphsafe_get_state shares the state object, clone copies it. The
// offset advances for random ops from Python (interpose/device/cuda_rng.py), which sees every op.
struct PhiloxState final : public c10::intrusive_ptr_target {
  uint64_t seed = c10::default_rng_seed_val;
  uint64_t offset = 0;
};

struct VirtualCudaGenerator final : public c10::GeneratorImpl {
  static constexpr size_t kSeedBytes = sizeof(uint64_t), kOffsetBytes = sizeof(int64_t);

  explicit VirtualCudaGenerator(c10::DeviceIndex index,
                                c10::intrusive_ptr<PhiloxState> state = c10::make_intrusive<PhiloxState>())
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::CUDA, index), c10::DispatchKeySet(c10::DispatchKey::CUDA)),
        state_(std::move(state)) {}

  void set_current_seed(uint64_t seed) override {
    state_->seed = seed;
    state_->offset = 0;
  }
  void set_offset(uint64_t offset) override {
    TORCH_CHECK(offset % 4 == 0, "offset must be a multiple of 4");
    state_->offset = offset;
  }
  uint64_t get_offset() const override { return state_->offset; }
  uint64_t current_seed() const override { return state_->seed; }
  uint64_t seed() override {
    auto random = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(random);
    return random;
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::detail::empty_cpu({static_cast<int64_t>(kSeedBytes + kOffsetBytes)}, c10::ScalarType::Byte,
                                   std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    auto* bytes = static_cast<uint8_t*>(t.mutable_data_ptr());
    const uint64_t seed = state_->seed;
    const int64_t offset = static_cast<int64_t>(state_->offset);
    std::memcpy(bytes, &seed, kSeedBytes);
    std::memcpy(bytes + kSeedBytes, &offset, kOffsetBytes);
    return t.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    at::detail::check_rng_state(new_state);
    const auto n = static_cast<size_t>(new_state.numel());
    TORCH_CHECK(n == kSeedBytes || n == kSeedBytes + kOffsetBytes, "RNG state is wrong size");
    const auto* bytes = static_cast<const uint8_t*>(new_state.data());
    TORCH_CHECK(bytes != nullptr, "RNG state must be a torch.ByteTensor with data (phantora: got a tensor "
                "without storage, e.g. a FakeTensor; pass the tensor torch.cuda.get_rng_state() returned)");
    uint64_t seed = 0;
    int64_t offset = 0;
    std::memcpy(&seed, bytes, kSeedBytes);
    if (n > kSeedBytes) std::memcpy(&offset, bytes + kSeedBytes, kOffsetBytes);
    set_current_seed(seed);
    set_offset(static_cast<uint64_t>(offset));
  }
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& gen) override {
    auto* other = dynamic_cast<VirtualCudaGenerator*>(gen.get());
    TORCH_CHECK(other != nullptr, "Expected a CUDA Generator");
    state_ = other->state_;
  }
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override {
    return c10::make_intrusive<VirtualCudaGenerator>(device().index(), state_);
  }

 private:
  VirtualCudaGenerator* clone_impl() const override {
    return new VirtualCudaGenerator(device().index(), c10::make_intrusive<PhiloxState>(*state_));
  }

  c10::intrusive_ptr<PhiloxState> state_;
};

c10::DeviceIndex generator_device(c10::DeviceIndex index) {
  const int i = index < 0 ? tl_device : index;
  TORCH_CHECK(i >= 0 && i < device_count(), "The device_index is invalid. (phantora simulates ", device_count(),
              " GPUs per node; cuda:", i, " does not exist)");
  return static_cast<c10::DeviceIndex>(i);
}

// As at::cuda::detail::getDefaultCUDAGenerator: created on first use, seeded nondeterministically.
const at::Generator& default_cuda_generator(c10::DeviceIndex index) {
  static std::deque<std::once_flag> once(kMaxDevices);
  static std::vector<at::Generator> generators(kMaxDevices);
  const auto i = generator_device(index);
  std::call_once(once[i], [i] {
    generators[i] = at::make_generator<VirtualCudaGenerator>(i);
    generators[i].seed();
  });
  return generators[i];
}

// As at::cuda::detail::createCUDAGenerator (torch.Generator(device="cuda")): the default seed.
at::Generator new_cuda_generator(c10::DeviceIndex index) {
  return at::make_generator<VirtualCudaGenerator>(generator_device(index));
}
}  // namespace

// torch.cuda.default_generators[i] as torch's own CUDA init builds it (THCPModule_initExtension):
// the Python object that wraps the device's default generator. THPGenerator_initDefaultGenerator
// lives in libtorch_python, which is loaded only once torch is imported, after the shim; it is
// looked up then. Returns nullptr when it cannot be found (the caller raises).
extern "C" void* phantora_cuda_default_generator(int index) {
  using InitDefault = void* (*)(const at::Generator&);
  void* lib = dlopen("libtorch_python.so", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  auto init = reinterpret_cast<InitDefault>(dlsym(lib, "_Z33THPGenerator_initDefaultGeneratorRKN2at9GeneratorE"));
  dlclose(lib);  // drops the reference RTLD_NOLOAD took; torch._C keeps the library loaded
  if (init == nullptr) return nullptr;
  try {
    return init(default_cuda_generator(static_cast<c10::DeviceIndex>(index)));
  } catch (...) {
    return nullptr;
  }
}

namespace {
// ==== end of the RNG section =================================================================
// --- pinned host memory ----------------------------------------------------------------------
// Page-locked memory is plain host memory here; what matters is that C++ code asking
// isPinnedPtr about it gets the answer a GPU build gives (DDP's reducer asserts is_pinned() on
// the staging copy of its used-parameter map). Blocks are kept by start address, with sizes,
// so a pointer into a block is pinned too, as cudaHostGetFlags says on a GPU.
struct PinnedBlocks {
  std::mutex mu;
  std::map<const char*, size_t> blocks;
};

PinnedBlocks& pinned_blocks() {
  static auto* p = new PinnedBlocks();  // leaked: deleters may run during static destruction
  return *p;
}

bool is_pinned_ptr(const void* ptr) {
  auto& pb = pinned_blocks();
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(pb.mu);
  auto it = pb.blocks.upper_bound(p);
  if (it == pb.blocks.begin()) return false;
  --it;
  return p < it->first + std::max<size_t>(it->second, 1);
}

void free_pinned(void* ptr) {
  {
    auto& pb = pinned_blocks();
    std::lock_guard<std::mutex> lock(pb.mu);
    pb.blocks.erase(static_cast<const char*>(ptr));
  }
  c10::free_cpu(ptr);
}

struct VirtualPinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (p) {
      auto& pb = pinned_blocks();
      std::lock_guard<std::mutex> lock(pb.mu);
      pb.blocks[static_cast<const char*>(p)] = nbytes;
    }
    return {p, p, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

VirtualPinnedAllocator pinned_allocator;

struct VirtualCudaHooks final : public at::CUDAHooksInterface {
  explicit VirtualCudaHooks(at::CUDAHooksArgs) {}
  void init() const override {}
  const at::Generator& getDefaultGenerator(c10::DeviceIndex i = -1) const override {
    return default_cuda_generator(i);
  }
  at::Generator getNewGenerator(c10::DeviceIndex i = -1) const override { return new_cuda_generator(i); }
  bool hasCUDA() const override { return device_count() > 0; }
  bool isAvailable() const override { return device_count() > 0; }
  bool isBuilt() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  int getNumGPUs() const override { return device_count(); }
  c10::DeviceIndex current_device() const override { return tl_device; }
  c10::DeviceIndex getCurrentDevice() const override { return tl_device; }
  void setCurrentDevice(c10::DeviceIndex d) const override { tl_device = d; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = tl_device;
    tl_device = d;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  bool isPinnedPtr(const void* p) const override { return is_pinned_ptr(p); }
  void deviceSynchronize(c10::DeviceIndex) const override {}
};

// --- scaled_dot_product_attention backend choice -------------------------------------------
// Values of sdp::SDPBackend (ATen/native/transformers/sdp_utils_cpp.h).
enum Backend : int64_t { kMath = 0, kFlash = 1, kEfficient = 2, kCudnn = 3 };

struct SdpaPolicy {
  std::vector<int64_t> priority{kFlash, kEfficient};
  int64_t max_headdim[4] = {0, 256, 1 << 30, 256};
};

const SdpaPolicy& sdpa_policy() {
  static const SdpaPolicy policy = [] {
    SdpaPolicy p;
    if (const char* s = std::getenv("PHANTORA_SDPA_PRIORITY")) {
      p.priority.clear();
      std::string all(s);
      size_t pos = 0;
      while (pos <= all.size()) {
        size_t end = all.find(',', pos);
        std::string name = all.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        if (name == "flash") p.priority.push_back(kFlash);
        else if (name == "efficient") p.priority.push_back(kEfficient);
        else if (name == "cudnn") p.priority.push_back(kCudnn);
        if (end == std::string::npos) break;
        pos = end + 1;
      }
    }
    if (const char* s = std::getenv("PHANTORA_SDPA_MAX_HEADDIM")) {
      std::string all(s);
      for (auto [name, idx] : {std::pair<const char*, int>{"flash=", kFlash}, {"efficient=", kEfficient}, {"cudnn=", kCudnn}}) {
        auto at = all.find(name);
        if (at != std::string::npos) p.max_headdim[idx] = std::atoll(all.c_str() + at + std::strlen(name));
      }
    }
    return p;
  }();
  return policy;
}

bool backend_enabled(int64_t b) {
  auto& ctx = at::globalContext();
  switch (b) {
    case kFlash: return ctx.userEnabledFlashSDP();
    case kEfficient: return ctx.userEnabledMemEfficientSDP();
    case kCudnn: return ctx.userEnabledCuDNNSDP();
    default: return ctx.userEnabledMathSDP();
  }
}

// The constraints below follow sdp_utils.cpp's checks that depend only on metadata (dtype, rank,
// head dim, mask, GQA). They reproduce what a real H100 with torch 2.11 picks for a grid of
// inputs (tests/data/groundtruth/sdpa_choice.json): fp16/bf16 -> cuDNN up to head dim 256 with
// any mask, dropout or GQA; larger head dims and fp32 -> memory-efficient, which has no GQA
// support, so GQA there -> math.
bool backend_supports(int64_t b, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const std::optional<at::Tensor>& mask, double dropout, bool enable_gqa) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  const auto dt = q.scalar_type();
  const bool half = dt == at::kHalf || dt == at::kBFloat16;
  const int64_t d_qk = q.size(-1), d_v = v.size(-1);
  if (d_qk > sdpa_policy().max_headdim[b] || d_v > sdpa_policy().max_headdim[b]) return false;
  if (k.scalar_type() != dt || v.scalar_type() != dt) return false;
  switch (b) {
    case kFlash:
      return half && !mask.has_value() && d_qk == d_v && d_qk % 8 == 0;
    case kCudnn:
      return half && d_qk % 8 == 0 && d_v % 8 == 0;
    case kEfficient:
      return (half || dt == at::kFloat) && !enable_gqa && d_qk % (half ? 8 : 4) == 0 &&
             d_v % (half ? 8 : 4) == 0;
    default:
      return true;
  }
}

int64_t choose_sdp_backend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& mask, double dropout, bool /*is_causal*/,
                           std::optional<double> /*scale*/, bool enable_gqa) {
  for (int64_t b : sdpa_policy().priority) {
    if (backend_enabled(b) && backend_supports(b, q, k, v, mask, dropout, enable_gqa)) return b;
  }
  TORCH_CHECK(backend_enabled(kMath),
              "No available kernel. Aborting execution. (phantora: no enabled fused SDPA backend "
              "accepts these inputs and the math backend is disabled)");
  return kMath;
}

#ifdef PHANTORA_TORCH_CUDA_BUILD
// Like c10d's CpuTimer: host timestamps (DDP uses them only for its runtime-stats logging).
struct HostClockTimer final : public c10d::Timer {
  explicit HostClockTimer(c10::Device) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t t0 = getTimeRef(start), t1 = getTimeRef(end);
    if (t0 == c10d::kUnsetTime || t1 < t0) return std::nullopt;
    return t1 - t0;
  }
};
#endif

// --- ops that reach the CUDA dispatch key outside phantora's dispatch modes -----------------
// Every op on a virtual GPU is meant to reach phantora's dispatch modes (the op observer, then
// FakeTensorMode) through the Python dispatch key. Some code steps around them and lands on the
// CUDA key, which has no kernels on a CPU build ("Could not run ... 'CUDA' backend") and real
// ones needing a driver on a CUDA build:
//  * no_dispatch() / C++ guards that exclude the Python key (FSDP1's record_stream;
//    torch.tensor([0-dim CUDA tensors]) reading each element with item());
//  * code that runs with the mode stack empty: _disable_current_modes(), or a tensor subclass's
//    __torch_dispatch__ (DTensor's), which runs with the modes stashed; a factory there that
//    asks for a CUDA tensor has no FakeTensor input to bring it back to Python.
// The kernel below hands such an op back to the modes: it re-includes the Python key and, when
// the stack is empty, puts the simulation's modes (captured at install) back for the call, then
// calls the op again from the top. The observer reports it and FakeTensorMode computes it, so the
// outputs are virtual CUDA tensors and values follow interpose/values/policy.py (item() reads included).
// It is installed as the CUDA fallback (ops with no CUDA kernel: all of them on a CPU build) and
// as the CUDA kernel of every op that has a real one (CUDA build: they need a driver).
const c10::impl::TorchDispatchModeTLS* simulation_modes = nullptr;  // leaked: holds Python objects
thread_local int tl_reroute_depth = 0;
constexpr int kMaxRerouteDepth = 8;

[[noreturn]] void refuse(const c10::OperatorHandle& op, const std::string& why) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "Could not run '", op.schema().operator_name(),
                              "' with arguments from the 'CUDA' backend. phantora: ", why);
}

// Sets one dispatch key's TLS exclusion for a scope.
class KeyExclusion {
 public:
  KeyExclusion(c10::DispatchKey k, bool excluded)
      : key_(k), prev_(c10::impl::tls_is_dispatch_key_excluded(k)) {
    c10::impl::tls_set_dispatch_key_excluded(k, excluded);
  }
  ~KeyExclusion() { c10::impl::tls_set_dispatch_key_excluded(key_, prev_); }
  KeyExclusion(const KeyExclusion&) = delete;
  KeyExclusion& operator=(const KeyExclusion&) = delete;

 private:
  c10::DispatchKey key_;
  bool prev_;
};

// Puts the simulation's modes on an empty mode stack for a scope.
class SimulationModes {
 public:
  SimulationModes() : active_(c10::impl::TorchDispatchModeTLS::stack_len() == 0) {
    if (active_) {
      prev_ = c10::impl::TorchDispatchModeTLS::get_state();
      c10::impl::TorchDispatchModeTLS::set_state(*simulation_modes);
    }
  }
  ~SimulationModes() {
    if (active_) c10::impl::TorchDispatchModeTLS::set_state(std::move(prev_));
  }
  SimulationModes(const SimulationModes&) = delete;
  SimulationModes& operator=(const SimulationModes&) = delete;

 private:
  bool active_;
  c10::impl::TorchDispatchModeTLS prev_;
};

void reroute_to_simulation(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (simulation_modes == nullptr) {
    refuse(op, "this process has no virtual GPUs (phantora's interposition is not installed)");
  }
  const bool stack_empty = c10::impl::TorchDispatchModeTLS::stack_len() == 0;
  const bool python_excluded = c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python);
  if (stack_empty && python_excluded) {
    // Only the modes themselves run like this: FakeTensorMode running an op's real kernel on the
    // device because the op has no fake/meta implementation.
    refuse(op, "the op has no fake (meta) implementation, so its output shapes on a virtual GPU are "
               "unknown; register one with torch.library.register_fake");
  }
  TORCH_CHECK(tl_reroute_depth < kMaxRerouteDepth, "phantora: '", op.schema().operator_name(),
              "' keeps returning to the CUDA backend of a virtual GPU (", kMaxRerouteDepth,
              " nested attempts to hand it to phantora's dispatch modes)");
  ++tl_reroute_depth;
  struct Depth {
    ~Depth() { --tl_reroute_depth; }
  } depth;
  SimulationModes modes;
  KeyExclusion python(c10::DispatchKey::Python, false);
  KeyExclusion snapshot(c10::DispatchKey::PythonTLSSnapshot, false);
  op.callBoxed(stack);
}

// The dispatcher warns once when a kernel replaces another; replacing torch's CUDA kernels is the
// point here.
struct SilentWarnings final : public c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// Which ops get the kernel besides the fallback: those with a CUDA kernel of their own (CUDA
// build) or a CompositeExplicitAutogradNonFunctional one (structured ops on a CPU build: the CUDA
// build has real kernels for them, so both builds hand over the same op), and _to_copy, a
// composite that moves data onto the device: handed over whole, the observer sees the copy (and
// values/policy.py shadows its result) rather than an allocation and a copy_ it never sees. Other
// composite kernels stay: FakeTensor runs them on plain tensors that carry the CUDA key over meta
// storage (views' bases, detach() in Tensor._make_subclass); handing those over would recurse.
bool takes_virtual_cuda_kernel(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CUDA) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
         op.operator_name() == c10::OperatorName("aten::_to_copy", "");
}

// Returns the number of ops given the kernel (the fallback counts as one).
int install_cuda_dispatch() {
  static std::mutex mu;
  static std::vector<c10::RegistrationHandleRAII>* handles = nullptr;  // leaked: kept for the process
  std::lock_guard<std::mutex> lock(mu);
  auto* state = new c10::impl::TorchDispatchModeTLS(c10::impl::TorchDispatchModeTLS::get_state());
  simulation_modes = state;  // the latest capture wins; an old one stays valid for readers
  if (handles != nullptr) return static_cast<int>(handles->size());
  handles = new std::vector<c10::RegistrationHandleRAII>();
  auto& dispatcher = c10::Dispatcher::singleton();
  SilentWarnings silent;
  c10::WarningUtils::WarningHandlerGuard quiet(&silent);
  if (!dispatcher.hasBackendFallbackForDispatchKey(c10::DispatchKey::CUDA)) {
    handles->push_back(dispatcher.registerFallback(
        c10::DispatchKey::CUDA, c10::KernelFunction::makeFromBoxedFunction<&reroute_to_simulation>(),
        "phantora virtual CUDA fallback"));
  }
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op.has_value() || !takes_virtual_cuda_kernel(*op)) continue;
    handles->push_back(dispatcher.registerImpl(
        name, c10::DispatchKey::CUDA, c10::KernelFunction::makeFromBoxedFunction<&reroute_to_simulation>(),
        std::nullopt, nullptr, "phantora virtual CUDA kernel"));
  }
  // C++ asks isPinnedPtr only of an initialised device (Context::isPinnedPtr); torch's own CUDA
  // initialisation, which would do this, is replaced by interpose/device/cuda_api.py.
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  return static_cast<int>(handles->size());
}

}  // namespace

namespace c10::impl {
C10_REGISTER_GUARD_IMPL(CUDA, VirtualCudaGuard);
}
namespace at {
C10_REGISTER_TYPED_CLASS_WITH_PRIORITY(CUDAHooksRegistry, "CUDAHooks", c10::REGISTRY_PREFERRED, VirtualCudaHooks);
namespace native {
REGISTER_CUDA_DISPATCH(_fused_sdp_choice_stub, &choose_sdp_backend);
}
}  // namespace at
#ifdef PHANTORA_TORCH_CUDA_BUILD
namespace c10d {
C10_REGISTER_TYPED_CLASS_WITH_PRIORITY(TimerRegistry, c10::kCUDA, c10::REGISTRY_PREFERRED, HostClockTimer);
}
#endif

extern "C" int phantora_shim_device_count() { return device_count(); }

// Captures the calling thread's dispatch modes as the simulation's and installs the CUDA-key
// kernel (see "ops that reach the CUDA dispatch key"). Call with the modes entered and the GIL held.
extern "C" int phantora_install_cuda_dispatch() {
  try {
    return install_cuda_dispatch();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phantora: installing the virtual CUDA kernel failed: %s\n", e.what());
    return -1;
  }
}

extern "C" int phantora_is_pinned_ptr(const void* p) { return is_pinned_ptr(p) ? 1 : 0; }

extern "C" void phantora_shim_set_device_count(int n) {
  visible_devices.store(n < 0 ? 0 : (n > kMaxDevices ? kMaxDevices : n));
}
