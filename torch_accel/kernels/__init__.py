"""Triton kernels of accel's fused operators for the cuda driver (and any CUDA tensors).

They take and return CUDA tensors and launch on the current CUDA stream (inside accel's kernel
scope that is the accel stream). Importing this package needs Triton (it comes with torch's CUDA
builds); nothing imports it on the host driver. With ``TRITON_INTERPRET=1`` set before the
import, the kernels run on CPU tensors through Triton's interpreter: the tests check them that
way where no GPU is present.
"""
