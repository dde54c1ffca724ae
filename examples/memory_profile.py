"""Memory profile of a few training steps of the quickstart model, in PyTorch's own viewer.

Records the allocation history (with Python stack frames) of the quickstart transformer
(examples/transformer_lm.py) while it trains a few steps on accel, dumps the snapshot, and
turns it into the two HTML views of ``torch.cuda._memory_viz``: the memory timeline
(trace_plot: every allocation over time, hover for the stack that made it) and the allocator
state (segment_plot). Open them in a browser.

    python examples/memory_profile.py [--steps 3] [--out memory_profile]
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import torch
from torch.cuda import _memory_viz
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transformer_lm import VOCAB, TinyLM, batches  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("memory_profile"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = TinyLM().to("accel")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.accel.memory._record_memory_history(stacks="python", max_entries=100_000)
    for x, y in batches(args.steps):
        x, y = x.to("accel"), y.to("accel")
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.accel.synchronize()
    snapshot = args.out / "snapshot.pickle"
    torch.accel.memory._dump_snapshot(str(snapshot))
    torch.accel.memory._record_memory_history(enabled=None)

    with snapshot.open("rb") as f:
        data = pickle.load(f)
    events = sum(len(t) for t in data["device_traces"])
    peak = torch.accel.max_memory_allocated() / 2**20
    print(f"{args.steps} steps: {events} allocator events recorded, peak {peak:.1f} MiB allocated")
    # What `python -m torch.cuda._memory_viz trace_plot|segment_plot SNAPSHOT -o HTML` writes.
    for kind, plot in (
        ("trace_plot", _memory_viz.trace_plot),
        ("segment_plot", _memory_viz.segment_plot),
    ):
        html = args.out / f"{kind}.html"
        html.write_text(plot(data))
        print(f"wrote {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
