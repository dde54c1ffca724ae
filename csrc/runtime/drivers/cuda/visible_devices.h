// How many of `raw` CUDA devices CUDA_VISIBLE_DEVICES leaves visible, read as the CUDA runtime
// reads it (and torch.cuda's NVML-based count): a comma-separated list of ordinals, each the
// leading integer of its entry ("1gpu" is 1); the list ends at the first entry that is not one
// or is negative; a repeated ordinal in it hides every device; the devices are those before
// the first ordinal >= raw.
// Returns -1 for lists of UUIDs (GPU-..., MIG-...), which only NVML's UUID queries can map.
// Torch-free and CUDA-free, so that the runtime's tests check it on any machine.
#pragma once

#include <cctype>
#include <string>
#include <vector>

namespace accel::rt::cuda {

inline int visible_device_count(const char* variable, int raw) {
  if (variable == nullptr) return raw;
  const std::string list = variable;
  if (list.rfind("GPU-", 0) == 0 || list.rfind("MIG-", 0) == 0) return -1;
  std::vector<long> ordinals;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::size_t i = start;
    while (i < end && std::isspace(static_cast<unsigned char>(list[i])) != 0) ++i;
    bool negative = false;
    if (i < end && (list[i] == '+' || list[i] == '-')) negative = list[i++] == '-';
    long value = -1;
    for (std::size_t digits = 0; i < end && std::isdigit(static_cast<unsigned char>(list[i])) != 0;
         ++i, ++digits) {
      value = (digits == 0 ? 0 : value * 10) + (list[i] - '0');
      if (value > (1L << 20)) break;  // beyond any device count
    }
    if (value < 0 || (negative && value > 0)) break;
    for (const long seen : ordinals) {
      if (seen == value) return 0;
    }
    ordinals.push_back(value);
    start = end + 1;
  }
  int visible = 0;
  while (visible < static_cast<int>(ordinals.size()) && ordinals[visible] < raw) ++visible;
  return visible;
}

}  // namespace accel::rt::cuda
