"""Triton's compiler for accel: kernels Inductor generates for accel tensors on the cuda driver.

Registered through Triton's backend entry point (``triton.backends``: ``accel``), which Triton
reads when it is first imported; kept outside ``torch_accel`` so that importing Triton does not
import torch or start accel.

Inductor compiles a Triton kernel for the device type of its tensors (``GPUTarget("accel", cc,
warp_size)``). Accel's cuda driver keeps accel memory on the GPU through the CUDA runtime, so an
accel kernel is a CUDA kernel: ``compiler.AccelCUDABackend`` compiles it as Triton's own CUDA
backend does (PTX, then a cubin for the device's compute capability), and the resulting
kernel is loaded and launched by Triton's CUDA driver, on the accel stream that Inductor's
wrapper passes (the stream's ``cudaStream_t``). ``driver.AccelTritonDriver`` is never active:
the GPU's driver in Triton stays CUDA's, and a host-driver accel device runs Inductor's C++
kernels instead (torch_accel/_inductor).
"""
