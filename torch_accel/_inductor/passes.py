"""Accel's post-grad pass: its identity keys Inductor's caches, it rewrites unfused compositions
into accel's fused operators (fusion_patterns.py), and it moves 0-dim CPU scalars that feed
accel operators onto the device.

Inductor's FX-graph and AOTAutograd caches do not include the registered code generators: an
entry compiled for another backend (or another version of this one) would be served to accel.
The pass's ``uuid()`` (the hash of this package's sources and of accel's C++ headers, the
torch_accel version and the language of the kernels, C++ or Triton) enters the cache key, so
accel's entries are accel's own.

A pointwise operator lowers onto the device of its first input unless another input is a GPU
tensor (2.11's rule, and accel is not a GPU to Inductor): ``s * x`` with a 0-dim CPU ``s`` and an
accel ``x`` would become a CPU kernel reading accel memory. The pass puts such scalars on the
operator's accel device first (a stream-ordered copy). A scalar computed from the graph's
constants alone goes through a copy of its own first (``torch.prod(torch.tensor(x.size()))``):
Inductor moves such a value by recomputing it on the target device, which it cannot do for a
reduction (``NotImplementedError: Reduction`` from ``DeviceCopy.create``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files

import torch_accel

# This package's sources, and the fake kernels of accel's own operators (they shape the graphs).
_SOURCES = tuple(
    sorted(
        str(p)
        for p in (
            *Path(__file__).parent.glob("*.py"),
            *Path(__file__).parent.parent.glob("ops/*.py"),
        )
    )
)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _from_constants(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes computed from the graph's constants alone (no graph input reaches them)."""
    found: set[torch.fx.Node] = set()
    for node in graph.nodes:  # in topological order
        if node.op != "placeholder" and all(n in found for n in node.all_input_nodes):
            found.add(node)
    return found


class AccelPostGradPass(CustomGraphModulePass):
    def __call__(self, gm: torch.fx.GraphModule) -> None:
        from torch_accel._inductor import fusion_patterns

        fusion_patterns.apply(gm)
        graph = gm.graph
        from_constants = _from_constants(graph)
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            out = _val(node)
            outs = out if isinstance(out, (list, tuple)) else [out]
            accel = next(
                (
                    t.device
                    for t in outs
                    if isinstance(t, torch.Tensor) and t.device.type == "accel"
                ),
                None,
            )
            if accel is None:
                continue
            for arg in node.all_input_nodes:
                v = _val(arg)
                if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0:
                    with graph.inserting_before(node):
                        source = arg
                        if arg.op == "call_function" and arg in from_constants:
                            source = graph.call_function(torch.ops.aten.clone.default, (arg,))
                            source.meta["val"] = v
                        moved = graph.call_function(
                            torch.ops.prims.device_put.default, (source, accel)
                        )
                    moved.meta["val"] = v.to(accel) if not v.is_meta else v
                    node.replace_input_with(arg, moved)
        graph.lint()
        gm.recompile()

    def uuid(self) -> Any:
        from torch_accel._inductor import fusion_patterns, kernels
        from torch_accel._inductor.cpp_wrapper import headers_hash
        from torch_accel._inductor.decompositions import KEEP_WHOLE

        language = kernels()
        return (
            torch_accel.__version__,
            get_hash_for_files(_SOURCES),
            headers_hash(),  # what C++ wrappers include: an entry's code names it too
            KEEP_WHOLE,
            fusion_patterns.cache_key(),
            _vector_isa() if language == "cpp" else "",
            language,  # C++ and Triton code for the same graph are different entries
        )


def _vector_isa() -> str:
    """The vector instructions Inductor's C++ code is generated for. 2.11's FX-graph cache key
    lacks them: a process whose ISA probe failed (the probe imports torch in a subprocess, which
    a module shadowing the standard library's on sys.path breaks) caches scalar kernels, about 16
    times slower, that every later process is then served. Accel's entries carry the ISA."""
    from torch._inductor import cpu_vec_isa

    return str(cpu_vec_isa.pick_vec_isa())
