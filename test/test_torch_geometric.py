"""PyTorch Geometric on accel: its message-passing layers, aggregations, pooling and models
against the CPU.

Graph networks lean on what image and text models rarely do: scatter and segment reductions over
edges (sum, mean, min, max, product, standard deviation, median, softmax per destination node,
an LSTM over each node's sorted neighbours), gathers by edge index, sparse adjacency matrices
(CSR and COO products), PyG's own `EdgeIndex` tensor subclass, data-dependent pooling (top-k
node selection per graph, dense batches of ragged graphs). Each case builds one module, copies it
to accel, and runs both from the same inputs: outputs and the gradients of the input features
and of every parameter must match the CPU's, with the CPU fallback forbidden.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

pyg = pytest.importorskip("torch_geometric")
import torch_geometric.nn as gnn  # noqa: E402
from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric.utils import (  # noqa: E402
    scatter,
    softmax,
    to_dense_batch,
    to_torch_coo_tensor,
    to_torch_csr_tensor,
)

ACCEL = torch.device("accel")
N, F, E, GRAPHS = 40, 16, 160, 4

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _graph(device: torch.device | str) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    edges = torch.randint(0, N, (2, E), generator=g)
    data = {
        "x": torch.randn(N, F, generator=g),
        "edges": edges,
        "edge_attr": torch.randn(E, 8, generator=g),
        "edge_type": torch.randint(0, 3, (E,), generator=g),
        "pos": torch.randn(N, 3, generator=g),
        "batch": torch.arange(N) // (N // GRAPHS),
        "by_target": edges[:, edges[1].argsort(stable=True)],  # what LSTM aggregation requires
    }
    data = {k: v.to(device) for k, v in data.items()}
    data["x"].requires_grad_()
    return data


def _mlp(i: int, o: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))


# name: (module factory, call(module, graph))
CASES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[Any, dict[str, Any]], Any]]] = {
    "GCNConv": (lambda: gnn.GCNConv(F, 8), lambda m, d: m(d["x"], d["edges"])),
    "GATConv": (
        lambda: gnn.GATConv(F, 8, heads=2, edge_dim=8),
        lambda m, d: m(d["x"], d["edges"], d["edge_attr"]),
    ),
    "GATv2Conv": (lambda: gnn.GATv2Conv(F, 8, heads=2), lambda m, d: m(d["x"], d["edges"])),
    "TransformerConv": (
        lambda: gnn.TransformerConv(F, 8, heads=2, edge_dim=8),
        lambda m, d: m(d["x"], d["edges"], d["edge_attr"]),
    ),
    "SAGEConv-max": (lambda: gnn.SAGEConv(F, 8, aggr="max"), lambda m, d: m(d["x"], d["edges"])),
    "SAGEConv-lstm": (
        lambda: gnn.SAGEConv(F, 8, aggr="lstm"),
        lambda m, d: m(d["x"], d["by_target"]),
    ),
    "SAGEConv-mean-max-std": (
        lambda: gnn.SAGEConv(F, 8, aggr=["mean", "max", "std"]),
        lambda m, d: m(d["x"], d["edges"]),
    ),
    "SAGEConv-median": (
        lambda: gnn.SAGEConv(F, 8, aggr="median"),
        lambda m, d: m(d["x"], d["edges"]),
    ),
    "GINEConv": (
        lambda: gnn.GINEConv(_mlp(F, 8), edge_dim=8),
        lambda m, d: m(d["x"], d["edges"], d["edge_attr"]),
    ),
    "PNAConv": (
        lambda: gnn.PNAConv(
            F,
            8,
            aggregators=["mean", "min", "max", "std"],
            scalers=["identity", "amplification"],
            deg=torch.tensor([0, 2, 5, 8, 5, 3, 1]),
        ),
        lambda m, d: m(d["x"], d["edges"]),
    ),  # fmt: skip
    "GENConv-softmax": (
        lambda: gnn.GENConv(F, 8, aggr="softmax", learn_t=True),
        lambda m, d: m(d["x"], d["edges"]),
    ),
    "RGCNConv": (
        lambda: gnn.RGCNConv(F, 8, num_relations=3),
        lambda m, d: m(d["x"], d["edges"], d["edge_type"]),
    ),
    "ChebConv": (lambda: gnn.ChebConv(F, 8, K=3), lambda m, d: m(d["x"], d["edges"])),
    "GatedGraphConv": (lambda: gnn.GatedGraphConv(F, 3), lambda m, d: m(d["x"], d["edges"])),
    "PointNetConv": (
        lambda: gnn.PointNetConv(torch.nn.Linear(F + 3, 8)),
        lambda m, d: m(d["x"], d["pos"], d["edges"]),
    ),
    "NNConv": (
        lambda: gnn.NNConv(F, 8, torch.nn.Linear(8, F * 8)),
        lambda m, d: m(d["x"], d["edges"], d["edge_attr"]),
    ),
    "GPSConv": (
        lambda: gnn.GPSConv(F, gnn.GINConv(torch.nn.Linear(F, F)), heads=2),
        lambda m, d: m(d["x"], d["edges"], d["batch"]),
    ),
    "GraphNorm": (lambda: gnn.GraphNorm(F), lambda m, d: m(d["x"], d["batch"])),
    "global-pools": (
        lambda: torch.nn.Identity(),
        lambda m, d: torch.cat(
            [
                gnn.global_mean_pool(d["x"], d["batch"]),
                gnn.global_max_pool(d["x"], d["batch"]),
                gnn.global_add_pool(d["x"], d["batch"]),
            ],
            -1,
        ),
    ),
    "Set2Set": (lambda: gnn.Set2Set(F, processing_steps=2), lambda m, d: m(d["x"], d["batch"])),
    "SortAggregation": (lambda: gnn.SortAggregation(k=4), lambda m, d: m(d["x"], d["batch"])),
    "TopKPooling": (
        lambda: gnn.TopKPooling(F, ratio=0.5),
        lambda m, d: m(d["x"], d["edges"], batch=d["batch"])[:2],
    ),
    "SAGPooling": (
        lambda: gnn.SAGPooling(F, ratio=0.5),
        lambda m, d: m(d["x"], d["edges"], batch=d["batch"])[:2],
    ),
    "to_dense_batch": (
        lambda: torch.nn.Identity(),
        lambda m, d: to_dense_batch(d["x"], d["batch"]),
    ),
    "softmax-by-target": (
        lambda: torch.nn.Identity(),
        lambda m, d: softmax(d["x"][d["edges"][0]], d["edges"][1], num_nodes=N),
    ),
    "scatter-mul": (
        lambda: torch.nn.Identity(),
        lambda m, d: scatter(d["x"][d["edges"][0]], d["edges"][1], 0, dim_size=N, reduce="mul"),
    ),
    "GINConv-sparse-csr": (
        lambda: gnn.GINConv(torch.nn.Linear(F, 8)),
        lambda m, d: m(d["x"], to_torch_csr_tensor(d["edges"].flip(0), size=(N, N))),
    ),
    "SAGEConv-sparse-coo": (
        lambda: gnn.SAGEConv(F, 8),
        lambda m, d: m(d["x"], to_torch_coo_tensor(d["edges"].flip(0), size=(N, N))),
    ),
    "GCNConv-EdgeIndex": (
        lambda: gnn.GCNConv(F, 8),
        lambda m, d: m(d["x"], EdgeIndex(d["edges"], sparse_size=(N, N)).sort_by("col")[0]),
    ),
    "GraphSAGE-jk": (
        lambda: gnn.GraphSAGE(F, 16, num_layers=2, out_channels=4, jk="cat"),
        lambda m, d: m(d["x"], d["edges"]),
    ),
    "GIN-batch-norm": (
        lambda: gnn.GIN(F, 16, num_layers=2, out_channels=4, norm="batch_norm"),
        lambda m, d: m(d["x"], d["edges"]),
    ),
    "DeepGCNLayer": (
        lambda: gnn.DeepGCNLayer(
            gnn.GENConv(F, F), torch.nn.LayerNorm(F), torch.nn.ReLU(), block="res+"
        ),
        lambda m, d: m(d["x"], d["edges"]),
    ),
}


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _tensors(o)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_geometric_like_cpu(name: str, no_fallback: None) -> None:
    make, call = CASES[name]
    torch.manual_seed(0)
    cpu_module = make()
    accel_module = copy.deepcopy(cpu_module).to(ACCEL)
    cpu, acc = _graph("cpu"), _graph(ACCEL)
    cpu_out, acc_out = _tensors(call(cpu_module, cpu)), _tensors(call(accel_module, acc))
    assert len(cpu_out) == len(acc_out)
    for c, a in zip(cpu_out, acc_out, strict=True):
        assert a.device.type == "accel", f"{name}: a result on {a.device}"
        torch.testing.assert_close(a.cpu(), c, rtol=1e-4, atol=1e-4)

    def grads(module: torch.nn.Module, data: dict[str, Any], out: list[torch.Tensor]) -> Any:
        loss = sum(o.float().pow(2).sum() for o in out if o.is_floating_point())
        params = [p for p in module.parameters() if p.requires_grad]
        return torch.autograd.grad(loss, [data["x"], *params], allow_unused=True)

    for i, (c, a) in enumerate(
        zip(grads(cpu_module, cpu, cpu_out), grads(accel_module, acc, acc_out), strict=True)
    ):
        assert (c is None) == (a is None), f"{name}: gradient {i}"
        if c is not None:
            torch.testing.assert_close(a.cpu(), c, rtol=1e-3, atol=1e-3)


@pytest.mark.default_only  # torch.compile's suites run in the default configuration only
def test_compiled_graph_attention_network_like_cpu() -> None:
    # Dynamic shapes: graphs of another size reuse the compiled code, as PyG's guide advises.
    torch.manual_seed(0)
    cpu_model = gnn.GAT(F, 16, num_layers=2, out_channels=4, v2=True)
    accel_model = copy.deepcopy(cpu_model).to(ACCEL)
    compiled_accel = torch.compile(accel_model, dynamic=True)
    for nodes in (N, N + 7):
        g = torch.Generator().manual_seed(nodes)
        x, edges = torch.randn(nodes, F, generator=g), torch.randint(0, nodes, (2, E), generator=g)
        expected = cpu_model(x, edges)
        torch.testing.assert_close(
            compiled_accel(x.to(ACCEL), edges.to(ACCEL)).cpu(), expected, rtol=1e-4, atol=1e-4
        )
