// The instruction sets the host kernels are built for (each kernel's *_impl.h is compiled once
// per set) and the choice among them at run time.
#pragma once

namespace accel::kernels::host {

// Best: the best the CPU has (AVX2 with FMA and F16C on x86-64 where present, else the target's
// baseline); tests ask for each.
enum class Isa { Best, Baseline, Avx2 };

// Whether this build has kernels for `isa` and the CPU runs them.
bool isa_available(Isa isa);

// Whether a kernel asked to run for `isa` runs its AVX2 build.
bool use_avx2(Isa isa = Isa::Best);

}  // namespace accel::kernels::host
