// phantora's virtual CUDA shim for CPU and CUDA builds of PyTorch.
//
// Loaded with RTLD_GLOBAL before `import torch` (torch._C caches getCUDAHooks() at init), it
// makes stock PyTorch believe CUDA devices exist, without any CUDA library or GPU driver:
//  * a DeviceGuardImplInterface for DeviceType::CUDA: thread-local current device and current
//    stream per device (c10's FakeGuardImpl caps at 8 devices; we need more), stream ids from a
//    counter, event handles that are plain integers. No work ever runs: tensors are FakeTensors
//    and timing is the simulator's job, so record/block/synchronize are no-ops here.
//  * a CUDAHooksInterface registered under the key "CUDAHooks", so hasCUDA() is true (autograd
//    and torch.accelerator then pick CUDA) and pinned memory comes from the CPU allocator.
//  * the CUDA entry of _fused_sdp_choice_stub, so F.scaled_dot_product_attention takes the
//    fused backend a real GPU would take instead of the math path (see choose_sdp_backend).
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
#include <ATen/core/Tensor.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#ifdef PHANTORA_TORCH_CUDA_BUILD
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#endif

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kMaxDevices = 256;

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s && *s ? std::atoi(s) : fallback;
}

// Set by interpose/hook.py before torch's import: the node's GPUs narrowed by CUDA_VISIBLE_DEVICES
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

struct VirtualCudaHooks final : public at::CUDAHooksInterface {
  explicit VirtualCudaHooks(at::CUDAHooksArgs) {}
  void init() const override {}
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
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  bool isPinnedPtr(const void*) const override { return false; }
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
extern "C" void phantora_shim_set_device_count(int n) {
  visible_devices.store(n < 0 ? 0 : (n > kMaxDevices ? kMaxDevices : n));
}
