// Inductor's C++ wrapper and AOTInductor on accel (csrc/aoti): what the Python module calls.
#pragma once

namespace accel::aoti {

// Gives libtorch_accel's symbols (accel's C shim, the kernel launcher) global scope, so that
// the libraries Inductor compiles for accel resolve them when they load.
void expose_symbols();

}  // namespace accel::aoti
