#include "kernels/host/isa.h"

namespace accel::kernels::host {

bool isa_available(Isa isa) {
  switch (isa) {
    case Isa::Best:
    case Isa::Baseline: return true;
    case Isa::Avx2:
#if defined(ACCEL_KERNELS_AVX2)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
  }
  return false;
}

bool use_avx2(Isa isa) {
  static const bool available = isa_available(Isa::Avx2);
  return (isa == Isa::Best || isa == Isa::Avx2) && available;
}

}  // namespace accel::kernels::host
