"""Accel on the cuda driver against native PyTorch CUDA on the same GPU, measured in one run.

Each case times the same work on `cuda` tensors and on `accel` tensors (ACCEL_DRIVER=cuda), in
alternation, and prints native time / accel time against its goal (higher is better):

  copy_bandwidth   1 GiB device-to-device copy                                  goal 0.95
  matmul_bf16      8192 x 8192 x 8192 bf16 matrix product (TFLOP/s)             goal 0.98
  tiny_op          per-call cost of eager ops on 8x8 tensors (at most 1.2x)     goal 0.83
  graph_replay     replay of a captured step of 32 small ops (at most 1.05x)    goal 0.95
  train_step       one training step of the quickstart model (examples/)        goal 0.95

Where accel cannot run on the cuda driver or there is no GPU, it says why and exits 0.

    ACCEL_DRIVER=cuda python benchmarks/cuda_vs_native.py [--json PATH]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from ratios import interleaved, report

import torch_accel

ROOT = Path(__file__).resolve().parent.parent
GOALS = {
    "copy_bandwidth": 0.95,
    "matmul_bf16": 0.98,
    "tiny_op": 1 / 1.2,
    "graph_replay": 1 / 1.05,
    "train_step": 0.95,
}
ROUNDS = 10


def both(make: Callable[[str], Callable[[], object]], rounds: int = ROUNDS) -> tuple[float, float]:
    """(native time, accel time) of the callables `make` builds for each device."""
    native, accel = make("cuda"), make("accel")
    for _ in range(2):  # warm-up: allocator caches, cuBLAS handles, kernel selection
        native()
        accel()
    return interleaved(native, accel, rounds, device="both")


def copy_bandwidth() -> tuple[float, float]:
    def make(device: str) -> Callable[[], object]:
        src = torch.empty(1 << 30, dtype=torch.uint8, device=device).fill_(7)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    return both(make)


def matmul_bf16() -> tuple[float, float]:
    def make(device: str) -> Callable[[], object]:
        g = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(8192, 8192, generator=g, dtype=torch.bfloat16).to(device)
        b = torch.randn(8192, 8192, generator=g, dtype=torch.bfloat16).to(device)
        return lambda: a @ b

    native, accel = both(make, rounds=5)
    flops = 2 * 8192**3
    print(f"  matmul_bf16: native {flops / native / 1e12:.0f} TFLOP/s, "
          f"accel {flops / accel / 1e12:.0f} TFLOP/s")  # fmt: skip
    return native, accel


def tiny_op() -> tuple[float, float]:
    calls = 1000

    def make(device: str) -> Callable[[], object]:
        a = torch.randn(8, 8).to(device)
        b = torch.randn(8, 8).to(device)

        def run() -> None:
            for _ in range(calls):
                torch.add(a, b)

        return run

    native, accel = both(make)
    return native / calls, accel / calls


def small_step(x: torch.Tensor) -> torch.Tensor:
    for _ in range(16):
        x = torch.relu(x * 1.01 + 0.5)
    return x


def graph_replay() -> tuple[float, float]:
    def make(device: str) -> Callable[[], object]:
        x = torch.randn(256, 256).to(device)
        if device == "cuda":
            graph, stream, sync = torch.cuda.CUDAGraph(), torch.cuda.Stream(), torch.cuda
            capture = torch.cuda.graph
        else:
            graph, stream, sync = torch.accel.AccelGraph(), torch.accel.Stream(), torch.accel
            capture = torch.accel.graph
        stream.wait_stream(sync.current_stream())
        with sync.stream(stream):  # warm-up off the default stream, as torch.cuda.graphs asks
            small_step(x)
        sync.current_stream().wait_stream(stream)
        with capture(graph):
            small_step(x)
        return graph.replay

    return both(make, rounds=50)


def train_step() -> tuple[float, float]:
    sys.path.insert(0, str(ROOT / "examples"))
    from transformer_lm import BATCH, CONTEXT, VOCAB, TinyLM

    def make(device: str) -> Callable[[], object]:
        torch.manual_seed(0)
        tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1)).to(device)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        model = TinyLM().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

        def step() -> None:
            opt.zero_grad(set_to_none=False)
            logits = model(inputs)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
            opt.step()

        return step

    return both(make, rounds=20)


def main() -> int:
    if not torch.cuda.is_available():
        print("cuda_vs_native: skipped: torch sees no CUDA GPU here")
        return 0
    if not torch_accel.is_available() or torch_accel.driver() != "cuda":
        why = torch_accel.init_error() or f"the accel driver is {torch_accel.driver()!r}"
        print(
            f"cuda_vs_native: skipped: accel is not on the cuda driver ({why}); "
            "run with ACCEL_DRIVER=cuda"
        )
        return 0
    print(f"GPU: {torch.cuda.get_device_name()}")
    return report(
        __doc__.splitlines()[0],
        ROOT / "benchmarks/results/cuda_vs_native.json",
        [
            ("copy_bandwidth", copy_bandwidth),
            ("matmul_bf16", matmul_bf16),
            ("tiny_op", tiny_op),
            ("graph_replay", graph_replay),
            ("train_step", train_step),
        ],
        GOALS,
        ("native", "accel", "ratio"),
    )


if __name__ == "__main__":
    sys.exit(main())
