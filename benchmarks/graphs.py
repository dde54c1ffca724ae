"""Graph replay against eager execution on accel, measured in the same run.

(a) 100 dependent tiny operators (a chain of mul and add on 64 elements): eager issue and run
    against one replay of their capture (goal: replay at least 20x faster);
(b) one training step of the quickstart model (examples/transformer_lm.py: forward, backward,
    AdamW) eager against the same step with the model made graphed through
    torch.accel.make_graphed_callables (goal: at least 2x faster).

Each side is timed as the best of several repeats, device synchronized. Prints a table and
writes JSON (default benchmarks/results/graphs.json).

    python benchmarks/graphs.py [--json PATH]
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from ratios import best_of, report

import torch_accel  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
ACCEL = torch.device("accel")
GOALS = {"tiny_chain": 20.0, "train_step": 2.0}


def tiny_chain() -> tuple[float, float]:
    x = torch.randn(64, device=ACCEL)

    def chain() -> torch.Tensor:
        y = x
        for _ in range(50):
            y = y * 1.0001
            y = y + 0.0001
        return y

    for _ in range(3):
        chain()
    eager = best_of(chain, 30)
    graph = torch.accel.AccelGraph()
    with torch.accel.graph(graph):
        out = chain()
    graph.replay()
    torch.testing.assert_close(out.cpu(), chain().cpu())
    return eager, best_of(graph.replay, 30)


def train_step() -> tuple[float, float]:
    sys.path.insert(0, str(ROOT / "examples"))
    from transformer_lm import BATCH, CONTEXT, VOCAB, TinyLM

    torch.manual_seed(0)
    model = TinyLM().to(ACCEL)
    graphed_model = copy.deepcopy(model)
    tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), device=ACCEL)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    graphed = torch.accel.make_graphed_callables(graphed_model, (inputs,))

    def step(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad(set_to_none=False)
        logits = m(inputs)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        opt.step()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    opt_graphed = torch.optim.AdamW(graphed_model.parameters(), lr=1e-3, foreach=True)
    for _ in range(3):
        step(model, opt)
        step(graphed, opt_graphed)
    return best_of(lambda: step(model, opt), 10), best_of(lambda: step(graphed, opt_graphed), 10)


def main() -> int:
    return report(
        __doc__.splitlines()[0],
        ROOT / "benchmarks/results/graphs.json",
        [("tiny_chain", tiny_chain), ("train_step", train_step)],
        GOALS,
        ("eager", "replay", "speedup"),
    )


if __name__ == "__main__":
    sys.exit(main())
