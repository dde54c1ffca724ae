#!/usr/bin/env bash
# Everything CUDA the project has, proven on a GPU machine in few calls of the device tool
# (docs/drivers.md says what runs on cuda and how). Stages, in the order given (default:
# build smoke bench):
#   build   pip install -e . against the machine's torch, then the C++ tests (GoogleTest from
#           .gtest when the machine has none: cp -r /usr/src/googletest .gtest here, and list
#           .gtest in .git/info/exclude and in the call's carry)
#   smoke   the driver's selection, the runtime's C++ suite on cuda, test/test_cuda_driver.py
#           (accel against native CUDA), test/test_distributed_cuda.py (accl through NCCL),
#           test/test_compile_triton.py (torch.compile: Inductor's Triton kernels on accel
#           streams, against eager; captured into a graph that keeps its freed input), the
#           quickstart
#   suites  every pytest suite with ACCEL_DRIVER=cuda, then the OpInfo sweep against the CPU
#           and against native CUDA (OPINFO_AGAINST=cuda)
#   bench   benchmarks/cuda_vs_native.py (accel against native CUDA on the same GPU) and
#           benchmarks/fused_ops.py (the fused operators' Triton kernels, flash attention
#           against torch's SDPA flash kernel)
# Each step has a time limit (a hang costs its limit, not the call); each prints ok or the tail
# of its log. Logs and JSON are written to build/gpu_proof; where $OUT is set (the device tool
# brings back at most 8 files from it) the JSON results are copied there and every log goes
# there as one archive, logs.tgz. Exits nonzero if any step failed.
#
#   bash test/gpu_proof.sh build smoke bench      # one call: about 5 minutes
#   bash test/gpu_proof.sh build suites           # a second call (build is incremental if warm)
set -uo pipefail
cd "$(dirname "$0")/.."
out=build/gpu_proof
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ACCEL_DRIVER=cuda
status=0

bring_back() {
  [ -n "${OUT:-}" ] || return 0
  cp "$out"/*.json "$OUT"/ 2>/dev/null
  tar czf "$OUT/logs.tgz" -C "$out" .
}
trap bring_back EXIT

# step NAME SECONDS COMMAND...: runs COMMAND with its output in NAME.log, stopped after SECONDS.
step() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS rc=0
  timeout --kill-after=15 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    echo "== $name: ok ($((SECONDS - start)) s)"
  else
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "== $name: stopped at its limit of $limit s"
    echo "== $name: FAILED (exit $rc, $((SECONDS - start)) s), last lines of $name.log:"
    tail -25 "$out/$name.log"
    status=1
  fi
}

for stage in ${*:-build smoke bench}; do
  case $stage in
    build)
      nvidia-smi -L | tee "$out/gpu.txt"
      gtest=()
      [ -f .gtest/CMakeLists.txt ] && gtest=(-DACCEL_GTEST_SOURCE_DIR="$PWD/.gtest")
      step build 420 bash -c "$py -m pip install -q --no-build-isolation --no-deps -e . &&
        cmake -S . -B build ${gtest[*]} && cmake --build build -j $(nproc)"
      ;;
    smoke)
      step driver 90 "$py" -c "import torch, torch_accel as t
print(t.driver_selection()); print(t.driver(), t.driver_capabilities())
print(torch.accel.get_device_properties(0))
assert t.driver() == 'cuda', t.init_error()"
      if [ -x build/test/cpp/runtime_tests ]; then
        step runtime_tests 150 build/test/cpp/runtime_tests --gtest_brief=1 \
          --gtest_filter=-EnvConfig.*:InitFailure.*:Plugin.*:DriverSelection.*:Capabilities.*:DeviceLost.*:DeviceAllocator.*
      else
        echo "== runtime_tests: not built (no GoogleTest: see the header of this script)"
      fi
      step test_cuda_driver 240 "$py" -m pytest -q -p no:cacheprovider -rs test/test_cuda_driver.py \
        test/test_pluggable_allocator.py test/test_multiprocessing.py
      step test_distributed_cuda 180 "$py" -m pytest -q -p no:cacheprovider -rs \
        test/test_distributed_cuda.py
      step test_compile_triton 240 "$py" -m pytest -q -p no:cacheprovider -rs \
        test/test_compile_triton.py test/test_compile.py::test_compiled_kernels_are_captured_into_graphs
      step quickstart 90 "$py" examples/transformer_lm.py
      ;;
    suites)
      step suites 540 "$py" -m pytest -q -p no:cacheprovider -rs test \
        --ignore=test/test_compile_models.py
      step opinfo 300 env OPINFO_FULL=1 "$py" -m pytest -q -p no:cacheprovider test/test_opinfo.py
      step opinfo_vs_cuda 300 env OPINFO_FULL=1 OPINFO_AGAINST=cuda "$py" -m pytest -q \
        -p no:cacheprovider test/test_opinfo.py
      ;;
    bench)
      step bench 240 "$py" benchmarks/cuda_vs_native.py --json "$out/cuda_vs_native.json"
      cat "$out/bench.log"
      step fused_ops 240 "$py" benchmarks/fused_ops.py --json "$out/fused_ops.json"
      cat "$out/fused_ops.log"
      ;;
    *)
      echo "unknown stage '$stage' (build, smoke, suites, bench)"
      status=1
      ;;
  esac
done
exit $status
