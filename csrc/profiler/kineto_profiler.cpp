// torch.profiler's device activity for accel: a Kineto child profiler (libkineto's
// IActivityProfiler, registered with libkineto::api().registerProfilerFactory, the extension
// point PyTorch's own device plugins use). With ProfilerActivity.PrivateUse1 requested, Kineto
// asks for CONCURRENT_KERNEL activity and this profiler opens a session: the runtime records
// when each host task ran on its stream worker (runtime/trace.h), tagged with torch's
// correlation id of the operator that launched it (Kineto forwards push/popCorrelationId on the
// launching thread). processTrace turns the records into kernel activities on a track per
// stream of each device, linked to their operators, so key_averages() counts them as the
// operators' device time and export_chrome_trace draws launch-to-run arrows.
#include <libkineto.h>
#include <output_base.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/runtime.h"

namespace accel::profiler {
namespace {

using libkineto::ActivityType;

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override { rt::trace_start(); }

  void stop() override {
    // torch.profiler synchronizes the device (torch.accel.synchronize) before it stops.
    records_ = rt::trace_stop();
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t start, int64_t /*end*/) override {
    std::map<int, std::set<uint64_t>> tracks;  // device -> streams
    int32_t flow = 1;
    for (const auto& r : records_) {
      tracks[r.device].insert(r.stream);
      libkineto::GenericTraceActivity a;
      a.activityType = r.kind == rt::trace::Kind::Memcpy   ? ActivityType::GPU_MEMCPY
                       : r.kind == rt::trace::Kind::Memset ? ActivityType::GPU_MEMSET
                                                           : ActivityType::CONCURRENT_KERNEL;
      a.activityName = r.label;
      a.startTime = r.start_ns;
      a.endTime = r.end_ns;
      a.id = static_cast<int32_t>(r.tag);
      a.device = r.device;
      a.resource = static_cast<int64_t>(r.stream);
      a.threadId = static_cast<int32_t>(r.stream);
      a.linked = (linked && r.tag != 0) ? linked(static_cast<int32_t>(r.tag)) : nullptr;
      a.addMetadataQuoted("device", "accel:" + std::to_string(r.device));
      a.addMetadataQuoted("stream", std::to_string(r.stream));
      if (a.linked != nullptr) {
        a.flow.id = flow++;
        a.flow.type = libkineto::kLinkAsyncCpuGpu;
        a.flow.start = 0;
      }
      a.log(logger);
    }
    first_device_ = tracks.empty() ? 0 : tracks.begin()->first;
    for (const auto& [device, streams] : tracks) {
      if (device != first_device_) {
        logger.handleDeviceInfo(libkineto::DeviceInfo(device, 1000 + device, name(device),
                                                      "accel " + std::to_string(device)),
                                start);
      }
      for (uint64_t s : streams) {
        const std::string label =
            s == 0 ? "default stream" : "stream " + std::to_string(s & 0xffffffffu);
        logger.handleResourceInfo(libkineto::ResourceInfo(device, static_cast<int64_t>(s),
                                                          static_cast<int64_t>(s), label),
                                  start);
      }
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(first_device_, 1000 + first_device_,
                                                   name(first_device_),
                                                   "accel " + std::to_string(first_device_));
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  void pushCorrelationId(uint64_t id) override { rt::trace_push_tag(id); }
  void popCorrelationId() override { rt::trace_pop_tag(); }

 private:
  static std::string name(int device) { return "accel:" + std::to_string(device); }

  std::vector<rt::trace::TaskRecord> records_;
  int first_device_ = 0;
};

class Profiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& types, const libkineto::Config& /*config*/) override {
    // PRIVATEUSE1_RUNTIME/DRIVER come with CPU-only profiling too: device activity is asked for
    // with CONCURRENT_KERNEL.
    if (types.count(ActivityType::CONCURRENT_KERNEL) == 0) return nullptr;
    return std::make_unique<Session>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_ = "accel";
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                     ActivityType::GPU_MEMSET};
};

struct Registrar {
  Registrar() {
    libkineto::api().registerProfilerFactory([] { return std::make_unique<Profiler>(); });
  }
} registrar;

}  // namespace
}  // namespace accel::profiler
