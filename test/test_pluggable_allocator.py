"""Device memory from a user's allocator library (torch.cuda's CUDAPluggableAllocator):
``torch.accel.MemPool(allocator=...)`` and ``torch.accel.memory.change_current_allocator``.

The allocator is a small C library built here that counts what it was asked: it hands out host
memory where the driver's device memory is host memory (the host driver), calls cudaMalloc and
cudaFree on the cuda driver with a GPU (built against the CUDA toolkit's runtime), and the
emulated CUDA runtime's on the cuda driver built on it (make test-emulated-cuda).
"""

from __future__ import annotations

import ctypes
import gc
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

import helpers  # test/
import torch_accel

ACCEL = torch.device("accel")

ALLOCATOR_SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef ACCEL_TEST_CUDA
#include <cuda_runtime_api.h>
static void* raw_alloc(size_t size) {
  void* p = NULL;
  return cudaMalloc(&p, size) == cudaSuccess ? p : NULL;
}
static void raw_free(void* p) { cudaFree(p); }
#elif defined(ACCEL_TEST_EMULATED)
#include <dlfcn.h>
/* The emulated CUDA runtime inside the emulated cuda driver (its path is the macro's value). */
static void* (*emulated_malloc)(size_t);
static void (*emulated_free)(void*);
static void* raw_alloc(size_t size) {
  if (emulated_malloc == NULL) {
    void* driver = dlopen(ACCEL_TEST_EMULATED, RTLD_NOW | RTLD_NOLOAD);
    if (driver == NULL) return NULL;
    *(void**)&emulated_malloc = dlsym(driver, "cuda_emulator_malloc");
    *(void**)&emulated_free = dlsym(driver, "cuda_emulator_free");
    if (emulated_malloc == NULL || emulated_free == NULL) return NULL;
  }
  return emulated_malloc(size);
}
static void raw_free(void* p) { emulated_free(p); }
#else
static void* raw_alloc(size_t size) { return aligned_alloc(512, (size + 511) / 512 * 512); }
static void raw_free(void* p) { free(p); }
#endif

#define MAX_LIVE 4096
static void* live_ptr[MAX_LIVE];
static size_t live_size[MAX_LIVE];

long long test_allocs = 0, test_frees = 0, test_bad_frees = 0, test_live_bytes = 0;
long long test_refuse_above = -1;  /* alloc returns NULL for larger sizes; -1: never */
int test_last_device = -1;
void* test_last_stream = 0;

void* test_alloc(size_t size, int device, void* stream) {
  test_allocs++;
  test_last_device = device;
  test_last_stream = stream;
  if (test_refuse_above >= 0 && (long long)size > test_refuse_above) return NULL;
  for (int i = 0; i < MAX_LIVE; i++) {
    if (live_ptr[i] == NULL) {
      void* p = raw_alloc(size);
      if (p == NULL) return NULL;
      live_ptr[i] = p;
      live_size[i] = size;
      test_live_bytes += (long long)size;
      return p;
    }
  }
  return NULL;
}

void test_free(void* ptr, size_t size, int device, void* stream) {
  (void)device;
  (void)stream;
  test_frees++;
  for (int i = 0; i < MAX_LIVE; i++) {
    if (live_ptr[i] == ptr && live_size[i] == size) {
      live_ptr[i] = NULL;
      test_live_bytes -= (long long)size;
      raw_free(ptr);
      return;
    }
  }
  test_bad_frees++;
}

/* 1 if [ptr, ptr + size) lies in memory this allocator gave out and has not taken back. */
int test_owns(uintptr_t ptr, size_t size) {
  for (int i = 0; i < MAX_LIVE; i++) {
    uintptr_t base = (uintptr_t)live_ptr[i];
    if (live_ptr[i] != NULL && ptr >= base && ptr + size <= base + live_size[i]) return 1;
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def allocator_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    flags: list[str] = []
    if not torch.accel.is_available():
        pytest.skip(f"no accel device: {torch_accel.init_error()}")
    emulated = _emulated_cuda_driver()
    if emulated is not None:
        flags = [f'-DACCEL_TEST_EMULATED="{emulated}"']
    elif not torch_accel.driver_capabilities()["host_accessible_memory"]:
        if torch_accel.driver() != "cuda" or not torch.cuda.is_available():
            pytest.skip(
                "the test allocator hands out host memory, or CUDA memory on a GPU, which the "
                f"{torch_accel.driver()} driver here cannot use as device memory"
            )
        cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
        lib = cuda / "lib64"
        flags = ["-DACCEL_TEST_CUDA", f"-I{cuda / 'include'}", f"-L{lib}", f"-Wl,-rpath,{lib}"]
        flags.append("-lcudart")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the test allocator")
    directory = tmp_path_factory.mktemp("allocator")
    source = directory / "allocator.c"
    source.write_text(ALLOCATOR_SOURCE)
    library = directory / "libtestalloc.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source), *flags], check=True
    )
    return library


def _emulated_cuda_driver() -> str | None:
    """The path of the cuda driver built on the emulated CUDA runtime, if that is accel's driver
    (it exports the emulator's cudaMalloc as cuda_emulator_malloc)."""
    directory = os.environ.get("ACCEL_DRIVER_PATH")
    if torch_accel.driver() != "cuda" or directory is None:
        return None
    path = str(Path(directory) / "libaccel_driver_cuda.so")
    try:
        driver = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        return None
    return path if hasattr(driver, "cuda_emulator_malloc") else None


def _driver_env() -> dict[str, str]:
    """The driver settings of this process, for a fresh one (run_python drops ACCEL_*)."""
    return {k: os.environ[k] for k in ("ACCEL_DRIVER", "ACCEL_DRIVER_PATH") if k in os.environ}


class Counters:
    """The allocator library's counters (the same library object torch_accel loaded)."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.lib.test_owns.argtypes = [ctypes.c_size_t, ctypes.c_size_t]

    def __getattr__(self, name: str) -> int:
        kind = ctypes.c_int if name == "last_device" else ctypes.c_longlong
        return kind.in_dll(self.lib, f"test_{name}").value

    def set_refuse_above(self, size: int) -> None:
        ctypes.c_longlong.in_dll(self.lib, "test_refuse_above").value = size

    def owns(self, t: torch.Tensor) -> bool:
        return bool(self.lib.test_owns(t.data_ptr(), t.untyped_storage().nbytes()))


def test_a_pools_tensors_live_in_the_allocators_memory(allocator_library: Path) -> None:
    allocator = torch.accel.memory.AccelPluggableAllocator(
        str(allocator_library), "test_alloc", "test_free"
    )
    counters = Counters(allocator_library)
    allocs, frees = counters.allocs, counters.frees
    pool = torch.accel.MemPool(allocator=allocator)
    assert pool.allocator is allocator
    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(64, 96), torch.randn(96, 32)
    outside = torch.ones(8, device=ACCEL)
    with torch.accel.use_mem_pool(pool):
        a, b = a_cpu.to(ACCEL), b_cpu.to(ACCEL)
        c = torch.relu(a @ b) + 1.0
        big = torch.full((3 << 20,), 2.0, device=ACCEL)  # a large segment
    assert counters.allocs - allocs == 2  # one small and one large segment
    assert counters.last_device == 0
    assert counters.last_stream == torch.accel.current_stream().native_handle
    for t in (a, b, c, big):
        assert counters.owns(t)
    assert not counters.owns(outside)
    torch.testing.assert_close(c.cpu(), torch.relu(a_cpu @ b_cpu) + 1.0)
    assert big.sum().item() == 2.0 * (3 << 20)
    segments = pool.snapshot()
    # 12 MiB: a segment of its own
    assert sorted(s["total_size"] for s in segments) == [2 << 20, 12 << 20]

    # The pool's memory goes back through the library once the pool and its tensors are gone.
    del a, b, c, big, t, pool
    gc.collect()
    torch.accel.synchronize()
    torch.accel.empty_cache()
    assert counters.frees - frees == 2
    assert counters.bad_frees == 0
    assert counters.live_bytes == 0


def test_a_graph_captures_into_the_allocators_pool(allocator_library: Path) -> None:
    helpers.skip_unless_operators_capture()
    allocator = torch.accel.memory.AccelPluggableAllocator(
        str(allocator_library), "test_alloc", "test_free"
    )
    counters = Counters(allocator_library)
    pool = torch.accel.MemPool(allocator=allocator)
    x = torch.ones(4096, device=ACCEL)
    g = torch.accel.AccelGraph()
    with torch.accel.graph(g, pool=pool.id):
        y = torch.tanh(x * 3.0) + x
    assert counters.owns(y) and not counters.owns(x)
    for value in (2.0, -0.5):
        x.fill_(value)
        g.replay()
        torch.testing.assert_close(y.cpu(), torch.tanh(torch.full((4096,), value * 3.0)) + value)
    del y
    g.reset()
    del pool
    gc.collect()
    torch.accel.synchronize()
    torch.accel.empty_cache()
    assert counters.live_bytes == 0 and counters.bad_frees == 0


def test_an_allocator_without_memory_is_out_of_memory(allocator_library: Path) -> None:
    allocator = torch.accel.memory.AccelPluggableAllocator(
        str(allocator_library), "test_alloc", "test_free"
    )
    counters = Counters(allocator_library)
    counters.set_refuse_above(4 << 20)
    try:
        pool = torch.accel.MemPool(allocator=allocator)
        with torch.accel.use_mem_pool(pool):
            small = torch.ones(1000, device=ACCEL)
            with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
                torch.empty(64 << 20, dtype=torch.uint8, device=ACCEL)
            assert small.sum().item() == 1000.0
        # The device's own memory is untouched.
        assert torch.ones(64 << 20, dtype=torch.uint8, device=ACCEL).sum().item() == 64 << 20
        del small, pool
        gc.collect()
        torch.accel.empty_cache()
        assert counters.live_bytes == 0
    finally:
        counters.set_refuse_above(-1)


def test_errors_name_the_problem(allocator_library: Path) -> None:
    with pytest.raises(AttributeError, match="no free function 'missing'"):
        torch.accel.memory.AccelPluggableAllocator(str(allocator_library), "test_alloc", "missing")
    with pytest.raises(TypeError, match="AccelPluggableAllocator or None, not object"):
        torch.accel.MemPool(allocator=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expects an accel allocator"):
        torch.accel.memory.change_current_allocator(object())  # type: ignore[arg-type]
    torch.ones(1, device=ACCEL)  # this process has device memory
    allocator = torch.accel.memory.AccelPluggableAllocator(
        str(allocator_library), "test_alloc", "test_free"
    )
    with pytest.raises(RuntimeError, match="cannot change: it already allocated"):
        torch.accel.memory.change_current_allocator(allocator)
    assert torch.accel.memory.get_allocator_backend() == "native"
    assert torch.accel.memory._get_current_allocator().allocator() == (0, 0)


def test_the_current_allocator_serves_every_allocation(allocator_library: Path, run_python):
    """change_current_allocator at the start of a process: a training step on accel through
    the library, every allocation and free reaching it, values as on the CPU."""
    code = textwrap.dedent(
        f"""
        import ctypes, gc
        import torch, torch_accel
        lib_path = {str(allocator_library)!r}
        allocator = torch.accel.memory.AccelPluggableAllocator(lib_path, "test_alloc", "test_free")
        torch.accel.memory.change_current_allocator(allocator)
        assert torch.accel.memory._get_current_allocator() is allocator
        assert torch.accel.memory.get_allocator_backend() == "pluggable"
        assert not torch.accel.memory.caching_allocator_enabled()
        lib = ctypes.CDLL(lib_path)
        count = lambda name: ctypes.c_longlong.in_dll(lib, "test_" + name).value

        torch.manual_seed(0)
        make = lambda: torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4)
        )
        model, reference = make(), make()
        reference.load_state_dict(model.state_dict())
        model.to("accel")
        x, y = torch.randn(16, 32), torch.randn(16, 4)
        for net, data, target in ((model, x.to("accel"), y.to("accel")), (reference, x, y)):
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(net(data), target)
                loss.backward()
                opt.step()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
        stats = torch.accel.memory_stats()
        assert count("allocs") >= stats["allocation.all.allocated"] > 20, (count("allocs"), stats)
        assert count("live_bytes") >= torch.accel.memory_allocated() > 0
        del model, reference, opt, loss, data, target, net, p, q
        gc.collect()
        torch.accel.synchronize()
        torch.accel.empty_cache()
        assert count("bad_frees") == 0
        assert count("allocs") == count("frees"), (count("allocs"), count("frees"))
        assert count("live_bytes") == 0
        print("OK", count("allocs"))
        """
    )
    result = run_python(code, **_driver_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK")
