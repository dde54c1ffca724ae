# torch_accel: set-up, build, tests, demo and benchmarks. README.md explains each target.
#
#   make demo      set up .venv, install torch and the package, run the quickstart (a small
#                  transformer trained on accel and checked against the CPU)
#   make test      set up, then run every test suite (C++ GoogleTest via ctest, then pytest)
#   make test-compile
#                  set up, then torch.compile's suite alone (make test runs it once)
#   make test-cuda set up, then every suite and the OpInfo sweep on the cuda driver (skips,
#                  saying why, without one)
#   make test-emulated-cuda
#                  set up, then the device layer's suites on the cuda driver over the emulated
#                  CUDA runtime (no GPU needed; make test runs it)
#   make bench-cuda
#                  accel on the cuda driver against native torch CUDA (skips without a GPU)
#   make install   set up and build only
#   make sanitize  build the runtime tests with ASan+UBSan and with TSan and run them
#   make bench     set up, then run the benchmarks (tables on stdout, JSON in benchmarks/results)
#   make opinfo    set up, then PyTorch's whole OpInfo database on accel against the CPU
#                  (make test runs it once, and a fast subset in each configuration)
#   make compile-sweep
#                  set up, then one compiled training step of tiny transformers models on accel
#                  against the CPU, eager and compiled (test/compile_sweep.py)
#   make inductor-sweep
#                  set up, then PyTorch's own Inductor tests (test_torchinductor.py) compiled for
#                  accel against eager accel (test/inductor_sweep.py)
#   make vision-sweep
#                  set up, then every torchvision model forward and backward on accel against
#                  the CPU, judged by the CPU's own error against float64 (test/vision_sweep.py)
#   make timm-sweep
#                  set up, then the smallest model of each of timm's 191 families forward and
#                  backward on accel, judged as the vision sweep judges (test/timm_sweep.py)
#   make hf-sweep
#                  set up, then one eager training step of every transformers text, vision,
#                  audio and image-text architecture (tiny configurations) on accel against
#                  the CPU (test/hf_sweep.py)
#   make pytorch-suites
#                  set up, then PyTorch's own device-generic test files (v2.6.0) on accel,
#                  every test, with a CPU reference run (make test runs them without the
#                  slowest tests, once)
#
# Wheels are kept in $(WHEELHOUSE) (outside the checkout), so a fresh clone on the same
# machine installs torch from there instead of downloading it again.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := demo

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
WHEELHOUSE ?= $(HOME)/.cache/torch_accel/wheels
BUILD_DIR := build
JOBS ?= $(shell nproc)
# Tools installed into the venv (cmake, ninja) come first on PATH.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export CMAKE_BUILD_PARALLEL_LEVEL := $(JOBS)
# ccache hashes paths inside the checkout (sources, build tree, the venv's torch headers) relative
# to it, so a fresh clone anywhere on the machine reuses what another clone compiled (a cold
# build is most of a fresh clone's `make test` on 2 cores). Debug info of a cached sanitizer
# object may then name the other clone's directory.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

# Debian packages the build and the tests use (GoogleTest sources for sanitizer builds).
APT_PACKAGES := g++ ccache googletest libgtest-dev
REQUIREMENTS := requirements-dev.txt
DEPS_STAMP := $(VENV)/.deps-$(shell sha1sum $(REQUIREMENTS) | cut -c1-12)

.PHONY: demo test install sanitize bench opinfo opinfo-sweep pytorch-suites compile-sweep vision-sweep timm-sweep hf-sweep inductor-sweep \
        system-deps deps test-cpp \
        test-python test-python-default test-python-debug test-lane-default test-lane-debug \
        test-compile test-cuda test-emulated-cuda bench-cuda build-cpp clean

demo: install
	$(PY) examples/transformer_lm.py

# The default lane leaves the OpInfo subset to the debug lane's full sweep (opinfo-sweep: every
# OpInfo, the subset's too, in the same configuration).
test: test-cpp
	$(MAKE) --no-print-directory -j $(TEST_LANES) --output-sync=target test-lane-default \
	  test-lane-debug DEFAULT_LANE_SKIP=--ignore=test/test_opinfo.py

install: system-deps deps
	$(PIP) install -q --no-build-isolation --no-deps -e .

system-deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
	  echo "warning: missing Debian packages:$$missing; install them (as root: make system-deps)," \
	       "or the build skips the targets that need them"; \
	fi

$(PY):
	$(PYTHON) -m venv $(VENV)

deps: $(DEPS_STAMP)

# Install from the wheelhouse without touching the network; download only what is missing.
# uv (installed into the venv from the wheelhouse) installs the pinned set: it unpacks each
# wheel once into its cache ($(UV_CACHE_DIR)) and links the files from there into each new
# venv, then compiles their bytecode as pip does (environments with PYTHONDONTWRITEBYTECODE=1
# would otherwise compile torch at every import: 7.4 s instead of 3.9 s): 35 s instead of pip's
# 110 s for a fresh clone on 2 cores.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
$(DEPS_STAMP): $(REQUIREMENTS) | $(PY)
	mkdir -p $(WHEELHOUSE)
	if ! $(PIP) install -q --no-index --find-links $(WHEELHOUSE) uv==$(UV_VERSION) 2>/dev/null; then \
	  $(PIP) download -q -d $(WHEELHOUSE) uv==$(UV_VERSION); \
	  $(PIP) install -q --no-index --find-links $(WHEELHOUSE) uv==$(UV_VERSION); \
	fi
	if ! $(UV) pip install -q --python $(PY) --no-index --find-links $(WHEELHOUSE) \
	     --compile-bytecode -r $(REQUIREMENTS) 2>/dev/null; then \
	  $(PIP) download -q -d $(WHEELHOUSE) -r $(REQUIREMENTS); \
	  $(UV) pip install -q --python $(PY) --no-index --find-links $(WHEELHOUSE) \
	    --compile-bytecode -r $(REQUIREMENTS); \
	fi
	rm -f $(VENV)/.deps-*
	touch $@

# C++ tests and benchmarks live in the same build directory that setup.py configures.
build-cpp: install
	cmake --build $(BUILD_DIR)

test-cpp: build-cpp
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# The Python suites run as configured by default, then with launch blocking, then with device
# memory protected (a stray host access to device memory crashes there instead of passing).
# torch.compile's suite is test-compile's. The debug configurations skip the tests they cannot
# change (test/conftest.py: config_independent, and run_python's fresh interpreters).
COMPILE_TESTS := test/test_compile.py test/test_compile_backend.py test/test_compile_fused.py \
                 test/test_compile_triton.py test/test_compile_cpp_wrapper.py \
                 test/test_compile_models.py test/test_compile_modes.py test/test_compile_flex.py
NOT_COMPILE := $(addprefix --ignore=,$(COMPILE_TESTS))
test-python: test-python-default test-python-debug

test-python-default: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q $(NOT_COMPILE) $(DEFAULT_LANE_SKIP) test

# The two debug modes at once: with launch blocking every task runs on the thread that submits
# it, so protected memory is accessible exactly while a task or a copy runs there, and a stray
# host access between them faults every time (run apart, each took about as long as this run).
# The runtime's C++ suite runs protection with asynchronous streams (runtime_protect).
test-python-debug: install
	ACCEL_LAUNCH_BLOCKING=1 ACCEL_PROTECT_DEVICE_MEMORY=1 \
	  $(PY) -m pytest -q -p no:cacheprovider $(NOT_COMPILE) test
	$(MAKE) --no-print-directory opinfo-sweep

# torch.compile's suite, once, in the default configuration (compiled kernels are stream tasks
# like any other: the other configurations add little to what test-python covers). Inductor's
# caches (TORCHINDUCTOR_CACHE_DIR, /tmp/torchinductor_$USER by default) serve later runs.
test-compile: install
	$(PY) -m pytest -q -p no:cacheprovider $(COMPILE_TESTS)

# make test: after the C++ suites, two lanes side by side (each keeps about one core busy, so two
# cores finish both in little more than the longer one's time); each target's output is printed
# whole when it ends. torch.compile's suite is split between the lanes to even them out (about
# 15 minutes each from a fresh clone, 2 cores: 14.5 and 15.3 measured; on an AVX2-only EPYC of
# 2026-12-01, where import torch alone takes 4 s, make test took 38 minutes, and 30 on 12-02
# once the test processes paid for import torch once: default lane 1133 s of pytest + 216 s
# compiling, debug lane 347 + 467 + 284 (OpInfo) + 374 + 107 s; test_compile_models.py then
# moved to the default lane: 26 minutes; 18.4 minutes later that day, with uv, one debug run for
# both modes, lazily opened protected memory and frozen garbage-collector generations: set-up
# 80 s, default lane 874 + 139 s, debug lane 364 + 234 + 288 + 86 s). TEST_LANES=1 runs them one
# after the other.
TEST_LANES ?= 2
# The lanes share the cores, and OpenMP threads that spin after each parallel region (libgomp's
# default policy) take the cores the other lane's kernels are waiting for: two OpInfo runs side
# by side on 2 cores took 62 s, against 16 s with passive waiting (alone: 13.6 s and 14.2 s).
# The test targets wait passively unless the caller chose a policy.
OMP_WAIT_POLICY ?= passive
test test-python test-python-default test-python-debug test-compile test-lane-default \
test-lane-debug test-emulated-cuda test-cuda opinfo: export OMP_WAIT_POLICY := $(OMP_WAIT_POLICY)
COMPILE_IN_DEBUG_LANE := test/test_compile_modes.py test/test_compile_triton.py \
                         test/test_compile_models.py test/test_compile_flex.py \
                         test/test_compile_cpp_wrapper.py test/test_compile_backend.py
test-lane-default: test-python-default
	$(PY) -m pytest -q -p no:cacheprovider $(filter-out $(COMPILE_IN_DEBUG_LANE),$(COMPILE_TESTS))

# The device layer on the cuda driver where no GPU is: the driver's own code on the emulated CUDA
# runtime (test/cpp/cuda_emulator, built by test-cpp where the CUDA toolkit is), device memory
# the host cannot touch, no executor (torch's CUDA finds no GPU: operators take the visible
# fallback). The suites whose subject is not an operator's kernel; about 25 s.
EMULATED_CUDA := $(BUILD_DIR)/test/cpp/emulated_cuda
EMULATED_CUDA_TESTS := $(addprefix test/,test_streams.py test_events.py test_memory.py \
  test_copies.py test_serialization.py test_rng.py test_amp.py test_autograd.py test_modules.py \
  test_device.py test_fork.py test_dynamo_accel_api.py test_pluggable_allocator.py \
  test_multiprocessing.py)
test-emulated-cuda: install
	@if [ ! -f $(EMULATED_CUDA)/libaccel_driver_cuda.so ]; then \
	  echo "make test-emulated-cuda: skipped: no $(EMULATED_CUDA) (no CUDA toolkit; make test-cpp builds it)"; \
	else \
	  ACCEL_DRIVER=cuda ACCEL_DRIVER_PATH=$(abspath $(EMULATED_CUDA)) \
	    $(PY) -m pytest -q -p no:cacheprovider $(EMULATED_CUDA_TESTS); \
	fi

test-lane-debug: test-python-debug
	$(PY) -m pytest -q -p no:cacheprovider $(COMPILE_IN_DEBUG_LANE)
	$(MAKE) --no-print-directory test-emulated-cuda

# Every suite on the cuda driver (ACCEL_DRIVER=cuda) where this build has one and a GPU is
# present; elsewhere it says why it skipped (the runtime's reason) and succeeds.
test-cuda: install build-cpp
	@why=$$(ACCEL_DRIVER=cuda $(PY) -c "import torch_accel as t; print('' if t.is_available() else t.init_error())"); \
	if [ -n "$$why" ]; then echo "make test-cuda: skipped: $$why"; exit 0; fi; \
	ACCEL_DRIVER=cuda $(BUILD_DIR)/test/cpp/runtime_tests --gtest_brief=1 \
	  --gtest_filter=-EnvConfig.*:InitFailure.*:Plugin.*:DriverSelection.*:Capabilities.*:DeviceLost.* && \
	ACCEL_DRIVER=cuda $(PY) -m pytest -q -p no:cacheprovider test && \
	ACCEL_DRIVER=cuda $(MAKE) --no-print-directory opinfo-sweep && \
	ACCEL_DRIVER=cuda OPINFO_AGAINST=cuda $(MAKE) --no-print-directory opinfo-sweep

# accel on the cuda driver against native torch CUDA on the same GPU (skips without one).
bench-cuda: install
	ACCEL_DRIVER=cuda $(PY) benchmarks/cuda_vs_native.py

sanitize: system-deps deps
	for san in address thread; do \
	  cmake -S . -B $(BUILD_DIR)-$$san -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	        -DACCEL_SANITIZE=$$san -DACCEL_BUILD_BENCHMARKS=OFF >/dev/null; \
	  cmake --build $(BUILD_DIR)-$$san; \
	  echo "== runtime tests under $$san sanitizer"; \
	  ctest --test-dir $(BUILD_DIR)-$$san --output-on-failure -j $(JOBS); \
	done

bench: build-cpp
	mkdir -p benchmarks/results
	$(BUILD_DIR)/runtime_bench benchmarks/results/runtime.json
	$(PY) benchmarks/eager_ops.py --json benchmarks/results/eager_ops.json
	$(PY) benchmarks/models.py --json benchmarks/results/models.json
	$(PY) benchmarks/graphs.py --json benchmarks/results/graphs.json
	$(PY) benchmarks/compile.py --json benchmarks/results/compile.json
	$(PY) benchmarks/fused_ops.py --json benchmarks/results/fused_ops.json
	$(PY) benchmarks/ipc.py --json benchmarks/results/ipc.json
	$(PY) benchmarks/distributed.py --json benchmarks/results/distributed.json

# The whole OpInfo database (about a minute here); the suites above run a fast subset of it.
opinfo: install opinfo-sweep

opinfo-sweep:
	OPINFO_FULL=1 $(PY) -m pytest -q -p no:cacheprovider test/test_opinfo.py

# torch.compile over tiny transformers models, one training step each, accel against the CPU
# (about a minute per architecture; ARCHS="gpt2 mamba" for some of them).
compile-sweep: install
	$(PY) test/compile_sweep.py $(ARCHS)

vision-sweep: install
	$(PY) test/vision_sweep.py $(MODELS)

timm-sweep: install
	$(PY) test/timm_sweep.py $(MODELS)

# Every transformers architecture the sweep can feed (text, vision, audio, multimodal) and 31
# diffusers models, tiny configurations, one eager training step on accel against the CPU, no
# CPU fallback allowed (about 10 minutes; ARCHS="llama image/vit diffusion/AutoencoderKL").
hf-sweep: install
	$(PY) test/hf_sweep.py $(ARCHS)

# PyTorch's own Inductor tests (test_torchinductor.py's CommonTemplate, v2.6.0) compiled for accel
# against eager accel (about 35 minutes; test/inductor_sweep.py lists the known failures).
inductor-sweep: install
	$(PY) -m pytest -q -p no:cacheprovider test/inductor_sweep.py

# PyTorch's test files, every test, and the same files on the CPU to tell drift from defects.
pytorch-suites: install
	PYTORCH_SUITES_FULL=1 PYTORCH_SUITES_CPU=1 $(PY) -m pytest -q -p no:cacheprovider \
	  test/test_pytorch_suites.py

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR)-address $(BUILD_DIR)-thread torch_accel/_C*.so torch_accel/lib
