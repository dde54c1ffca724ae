#include "device/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/empty.h>
#include <c10/core/GeneratorImpl.h>

#include <cstring>
#include <deque>
#include <mutex>

#include "device/common.h"

namespace accel::device {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The Mersenne Twister state of draw `offset` of `seed`: filled from a 128-bit key by splitmix64.
at::mt19937 engine_for(uint64_t seed, uint64_t offset) {
  at::mt19937_data_pod pod{};
  uint64_t key = seed ^ (offset * 0xD1B54A32D192ED03ull) ^ 0x5851F42D4C957F2Dull;
  uint64_t mix = splitmix64(key) ^ offset;
  for (std::size_t i = 0; i < pod.state_.size(); i += 2) {
    const uint64_t v = splitmix64(mix);
    pod.state_[i] = static_cast<uint32_t>(v);
    if (i + 1 < pod.state_.size()) pod.state_[i + 1] = static_cast<uint32_t>(v >> 32);
  }
  pod.seed_ = seed;
  pod.seeded_ = true;
  pod.left_ = 1;
  pod.next_ = 0;
  at::mt19937 engine;
  engine.set_data(pod);
  return engine;
}

// A generator's seed and offset. Generators normally own theirs; graphsafe_get_state hands out
// a generator sharing it and graphsafe_set_state makes a generator use another's (CUDA's
// CUDAGeneratorState), so that a graph drawing from a generator draws from whatever state it
// was pointed at before the replay.
struct GeneratorState : c10::intrusive_ptr_target {
  explicit GeneratorState(uint64_t s) : seed(s) {}
  uint64_t seed;
  uint64_t offset = 0;
};

class AccelGeneratorImpl final : public c10::GeneratorImpl {
 public:
  static constexpr std::size_t kStateBytes = 16;  // seed, offset (little-endian uint64 each)

  explicit AccelGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val)
      : AccelGeneratorImpl(device, c10::make_intrusive<GeneratorState>(seed)) {}
  AccelGeneratorImpl(c10::DeviceIndex device, c10::intrusive_ptr<GeneratorState> state)
      : c10::GeneratorImpl(c10::Device(kAccel, device),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        state_(std::move(state)) {}

  void set_current_seed(uint64_t seed) override {
    state_->seed = seed;
    state_->offset = 0;
  }
  uint64_t current_seed() const override { return state_->seed; }
  uint64_t seed() override {
    const uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override { state_->offset = offset; }
  uint64_t get_offset() const override { return state_->offset; }

  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && state.device().is_cpu() &&
                    state.numel() == static_cast<int64_t>(kStateBytes) && state.is_contiguous(),
                "accel generator state must be a contiguous CPU torch.uint8 tensor of ",
                kStateBytes, " bytes (seed and offset), as returned by get_state(); got ",
                state.numel(), " elements of ", state.dtype().name(), " on ", state.device());
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    TORCH_CHECK(bytes != nullptr,
                "accel generator state has no data (a fake or meta tensor); pass the tensor "
                "get_state() returned");
    std::memcpy(&state_->seed, bytes, 8);
    std::memcpy(&state_->offset, bytes + 8, 8);
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    // A CPU tensor made without the dispatcher, as the CPU's and CUDA's generators make theirs:
    // under a Python mode (FakeTensorMode while Dynamo traces) at::empty would return its
    // tensor, with no memory to write.
    at::Tensor t = at::detail::empty_cpu({static_cast<int64_t>(kStateBytes)}, at::kByte,
                                         /*pin_memory=*/false, std::nullopt);
    auto* bytes = static_cast<uint8_t*>(t.data_ptr());
    std::memcpy(bytes, &state_->seed, 8);
    std::memcpy(bytes + 8, &state_->offset, 8);
    return t.getIntrusivePtr();
  }

  // A generator sharing this one's state: what either draws advances both.
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override {
    return c10::make_intrusive<AccelGeneratorImpl>(device().index(), state_);
  }
  // From now on this generator uses `gen`'s state (no copy).
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& gen) override {
    auto* other = dynamic_cast<AccelGeneratorImpl*>(gen.get());
    TORCH_CHECK(other != nullptr,
                "graphsafe_set_state: expected a generator of an accel device (from "
                "graphsafe_get_state), got one for ",
                gen->device());
    TORCH_CHECK(other->device() == device(),
                "graphsafe_set_state: the state belongs to a generator of ", other->device(),
                ", this generator is of ", device());
    state_ = other->state_;
  }

  static c10::DeviceType device_type() { return kAccel; }

  // The Mersenne Twister state for the next operator (caller holds mutex_).
  at::mt19937 next_engine() { return engine_for(state_->seed, state_->offset++); }

  // (seed, offset) now, then the offset advanced by n (caller holds mutex_).
  std::pair<uint64_t, uint64_t> take(uint64_t n) {
    const std::pair<uint64_t, uint64_t> now{state_->seed, state_->offset};
    state_->offset += n;
    return now;
  }

 private:
  AccelGeneratorImpl* clone_impl() const override {
    auto* g = new AccelGeneratorImpl(device().index(), state_->seed);
    g->state_->offset = state_->offset;
    return g;
  }

  c10::intrusive_ptr<GeneratorState> state_;
};

struct DefaultGenerators {
  std::once_flag once;
  std::deque<at::Generator> generators;  // never reallocates: references stay valid
};

DefaultGenerators& defaults() {
  static DefaultGenerators d;
  return d;
}

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  const c10::DeviceIndex d = resolve_device(index);
  DefaultGenerators& g = defaults();
  std::call_once(g.once, [&] {
    const int n = call([] { return rt::device_count(); });
    for (int i = 0; i < n; ++i) {
      g.generators.push_back(
          at::make_generator<AccelGeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
    }
  });
  return g.generators.at(static_cast<std::size_t>(d));
}

at::Generator new_generator(c10::DeviceIndex index) {
  return at::make_generator<AccelGeneratorImpl>(resolve_device(index));
}

bool is_accel_generator(const at::Generator& gen) {
  return gen.defined() && gen.device().type() == kAccel;
}

std::pair<uint64_t, uint64_t> take_offsets(const at::Generator& gen, uint64_t n) {
  TORCH_CHECK(is_accel_generator(gen), "expected an accel generator, got one for ", gen.device());
  auto* impl = static_cast<AccelGeneratorImpl*>(gen.unsafeGetGeneratorImpl());
  std::lock_guard<std::mutex> lock(impl->mutex_);
  return impl->take(n);
}

std::pair<uint64_t, uint64_t> take_philox_offsets(const at::Generator& gen, uint64_t n) {
  TORCH_CHECK(is_accel_generator(gen), "expected an accel generator, got one for ", gen.device());
  auto* impl = static_cast<AccelGeneratorImpl*>(gen.unsafeGetGeneratorImpl());
  std::lock_guard<std::mutex> lock(impl->mutex_);
  impl->set_offset((impl->get_offset() + 3) / 4 * 4);  // as CudaDraw rounds it
  return impl->take(n);
}

void set_cpu_generator_state(const at::Generator& cpu, uint64_t seed, uint64_t offset) {
  cpu.get<at::CPUGeneratorImpl>()->set_engine(engine_for(seed, offset));
}

at::Generator next_cpu_generator(const at::Generator& gen) {
  TORCH_CHECK(is_accel_generator(gen), "expected an accel generator, got one for ", gen.device());
  auto* impl = static_cast<AccelGeneratorImpl*>(gen.unsafeGetGeneratorImpl());
  at::Generator cpu = at::detail::createCPUGenerator();
  std::lock_guard<std::mutex> lock(impl->mutex_);
  cpu.get<at::CPUGeneratorImpl>()->set_engine(impl->next_engine());
  return cpu;
}

CudaDraw::CudaDraw(const at::Generator& gen, c10::DeviceIndex cuda_device) : accel_(gen) {
  TORCH_CHECK(is_accel_generator(gen), "expected an accel generator, got one for ", gen.device());
  auto* impl = static_cast<AccelGeneratorImpl*>(accel_.unsafeGetGeneratorImpl());
  impl->mutex_.lock();  // until the kernel took its offsets
  try {
    cuda_ = at::detail::getCUDAHooks().getNewGenerator(cuda_device);
    cuda_.set_current_seed(impl->current_seed());
    cuda_.set_offset((impl->get_offset() + 3) / 4 * 4);
  } catch (...) {
    impl->mutex_.unlock();
    throw;
  }
}

CudaDraw::~CudaDraw() {
  auto* impl = static_cast<AccelGeneratorImpl*>(accel_.unsafeGetGeneratorImpl());
  try {
    impl->set_offset(cuda_.get_offset());
  } catch (...) {  // NOLINT(bugprone-empty-catch): the offset stays; a destructor must not throw
  }
  impl->mutex_.unlock();
}

}  // namespace accel::device
