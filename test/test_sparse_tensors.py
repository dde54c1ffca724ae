"""Sparse accel tensors (COO and compressed): ATen's sparse tensor types over dense accel indices
and values, every operator that has a sparse CPU kernel running that kernel on the same memory
(csrc/aten/sparse.cpp, direct_call.cpp). Values and gradients are compared with the CPU's.
PyTorch's own test_sparse.py runs over accel in test_pytorch_suites.py.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import nn

ACCEL = torch.device("accel", 0)


@pytest.fixture(autouse=True)
def no_fallback(fallback_mode) -> Iterator[None]:
    fallback_mode("error")
    torch.accel.reset_fallback_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Sparse CSR tensor support is in beta state"
        yield
    assert torch.accel.fallback_stats() == {}


def _coo(seed: int = 0, shape: tuple[int, ...] = (5, 7), nnz: int = 9) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randint(0, n, (nnz,), generator=g) for n in shape])
    return torch.sparse_coo_tensor(idx, torch.randn(nnz, generator=g), shape)  # uncoalesced


def _same(got: torch.Tensor, expected: torch.Tensor, **tol: float) -> None:
    assert got.device.type == "accel" and got.layout == expected.layout
    if got.layout != torch.strided:
        got, expected = got.to_dense(), expected.to_dense()
    torch.testing.assert_close(got.cpu(), expected, **tol)


def test_sparse_tensors_live_on_accel_with_their_members() -> None:
    s = _coo()
    idx, vals = s._indices().to(ACCEL), s._values().to(ACCEL)
    a = torch.sparse_coo_tensor(idx, vals, s.shape)
    assert a.device == ACCEL and a.layout == torch.sparse_coo and a._nnz() == s._nnz()
    assert not a.is_coalesced() and a.sparse_dim() == 2 and a.dense_dim() == 0
    # The members are the accel tensors it was built from: no copy.
    assert a._values().data_ptr() == vals.data_ptr()
    assert a._indices().device == ACCEL and a._values().device == ACCEL
    _same(a, s)
    _same(s.to(ACCEL), s)
    back = a.cpu()
    assert back.layout == torch.sparse_coo and back.device.type == "cpu"
    torch.testing.assert_close(back.to_dense(), s.to_dense())
    assert "device='accel:0'" in repr(a) and "layout=torch.sparse_coo" in repr(a)
    c = a.coalesce()
    assert c.is_coalesced()
    torch.testing.assert_close(c.indices().cpu(), s.coalesce().indices())
    torch.testing.assert_close(c.values().cpu(), s.coalesce().values())
    dense = torch.randn(4, 6).relu()
    for layout, extra in (
        (torch.sparse_coo, {}),
        (torch.sparse_csr, {}),
        (torch.sparse_csc, {}),
        (torch.sparse_bsr, {"blocksize": (2, 3)}),
        (torch.sparse_bsc, {"blocksize": (2, 3)}),
    ):
        got = dense.to(ACCEL).to_sparse(layout=layout, **extra)
        expected = dense.to_sparse(layout=layout, **extra)
        assert got.layout == layout and got._nnz() == expected._nnz()
        _same(got, expected)
        _same(expected.to(ACCEL), expected)


def test_operators_match_the_cpu() -> None:
    s, t = _coo(0), _coo(1)
    a, b = s.to(ACCEL), t.to(ACCEL)
    d = torch.randn(7, 3)
    row = torch.randn(5, 7)
    _same(a + b, s + t)
    _same(a - b * 2, s - t * 2)
    _same(a * b, s * t)
    _same(row.to(ACCEL) + a, row + s)
    _same(torch.sparse.mm(a, d.to(ACCEL)), torch.sparse.mm(s, d))
    _same(a @ d.to(ACCEL), s @ d)
    _same(
        torch.addmm(torch.ones(5, 3, device=ACCEL), a, d.to(ACCEL)),
        torch.addmm(torch.ones(5, 3), s, d),
    )
    _same(torch.sparse.sum(a, dim=1), torch.sparse.sum(s, dim=1))
    _same(a.sum(), s.sum())
    _same(torch.sparse.softmax(a.coalesce(), 1), torch.sparse.softmax(s.coalesce(), 1))
    _same(a.t().coalesce(), s.t().coalesce())
    _same(
        a.index_select(1, torch.tensor([0, 3, 3], device=ACCEL)),
        s.index_select(1, torch.tensor([0, 3, 3])),
    )
    _same(a.sin().coalesce(), s.sin().coalesce())
    _same(a.to_dense().sparse_mask(b.coalesce()), s.to_dense().sparse_mask(t.coalesce()))
    batch, m = torch.stack([s, t]).coalesce(), torch.randn(2, 7, 3)
    _same(torch.bmm(batch.to(ACCEL), m.to(ACCEL)), torch.bmm(batch, m))
    csr = s.to_dense().to_sparse_csr()
    _same(csr.to(ACCEL) @ d.to(ACCEL), csr @ d)
    _same(csr.to(ACCEL).to_sparse_coo(), csr.to_sparse_coo())
    _same((csr.to(ACCEL) * 3).to_dense(), (csr * 3).to_dense())
    torch.testing.assert_close(csr.to(ACCEL).crow_indices().cpu(), csr.crow_indices())


def test_in_place_operators_change_the_accel_tensor() -> None:
    s, t = _coo(0), _coo(1)
    a = s.to(ACCEL)
    a.add_(t.to(ACCEL))  # a new structure: more entries
    _same(a, s + t)
    a.mul_(0.5)
    _same(a, (s + t) * 0.5)
    a.zero_()
    assert a._nnz() == 0 and a.shape == s.shape
    a.copy_(t)  # from a CPU sparse tensor
    _same(a, t)
    a.sparse_resize_and_clear_((6, 9), 2, 0)
    assert a.shape == (6, 9) and a._nnz() == 0
    dense = torch.zeros(5, 7, device=ACCEL)
    dense.add_(s.to(ACCEL))  # dense += sparse, in place on the accel memory
    torch.testing.assert_close(dense.cpu(), s.to_dense())
    out = torch.empty(0, device=ACCEL)
    torch.mm(s.to(ACCEL), torch.ones(7, 2, device=ACCEL), out=out)  # resized by the kernel
    torch.testing.assert_close(out.cpu(), torch.mm(s, torch.ones(7, 2)))


def test_gradients_through_sparse_operators_match_the_cpu() -> None:
    s = _coo().coalesce()
    d = torch.randn(7, 3)

    def run(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        values = s.values().to(device).requires_grad_()
        dense = d.to(device).requires_grad_()
        sp = torch.sparse_coo_tensor(s.indices().to(device), values, s.shape)
        (torch.sparse.mm(sp, dense).tanh().sum() + torch.sparse.sum(sp * sp)).backward()
        return values.grad, dense.grad

    for got, expected in zip(run(ACCEL), run(torch.device("cpu")), strict=True):
        _same(got, expected)


def test_sparse_embeddings_train_like_the_cpu() -> None:
    torch.manual_seed(0)
    model = nn.ModuleDict(
        {"emb": nn.Embedding(50, 8, sparse=True), "bag": nn.EmbeddingBag(40, 8, sparse=True)}
    )
    head = nn.Linear(8, 1)
    ids = torch.randint(0, 40, (6, 5))
    offsets = torch.tensor([0, 7, 15, 22])
    bag_ids = torch.randint(0, 40, (30,))

    def train(device: torch.device) -> list[torch.Tensor]:
        m, h = copy.deepcopy(model).to(device), copy.deepcopy(head).to(device)
        sparse = torch.optim.SparseAdam(list(m.parameters()), lr=0.05)
        dense = torch.optim.SGD(h.parameters(), lr=0.1)
        for _ in range(3):
            loss = h(m["emb"](ids.to(device))).square().mean()
            loss = loss + h(m["bag"](bag_ids.to(device), offsets.to(device))).square().mean()
            sparse.zero_grad()
            dense.zero_grad()
            loss.backward()
            assert m["emb"].weight.grad.layout == torch.sparse_coo
            assert m["emb"].weight.grad.device == device
            sparse.step()
            dense.step()
        return [p.detach() for p in [*m.parameters(), *h.parameters()]]

    for got, expected in zip(train(ACCEL), train(torch.device("cpu")), strict=True):
        _same(got, expected, rtol=1e-5, atol=1e-6)
    # Plain SGD applies a sparse gradient to a dense parameter in place.
    emb = nn.Embedding(10, 3, sparse=True)
    acc = copy.deepcopy(emb).to(ACCEL)
    for e, ids_ in (
        (emb, torch.tensor([1, 2, 2, 7])),
        (acc, torch.tensor([1, 2, 2, 7], device=ACCEL)),
    ):
        e(ids_).sum().backward()
        torch.optim.SGD(e.parameters(), lr=0.5).step()
    _same(acc.weight.detach(), emb.weight.detach())


def test_sparse_operators_follow_the_stream() -> None:
    """A sparse operator reads members written by work still running on the stream: it waits."""
    a = torch.randn(256, 256, device=ACCEL) / 16
    x = a
    for _ in range(20):
        x = x @ a
    values = torch.ones(4, device=ACCEL) + x.sum() * 0
    sp = torch.sparse_coo_tensor(
        torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]], device=ACCEL), values, (4, 4)
    )
    torch.testing.assert_close(torch.sparse.mm(sp, torch.eye(4, device=ACCEL)).cpu(), torch.eye(4))


def test_mismatched_sparse_calls_raise_like_the_cpu() -> None:
    a = _coo().to(ACCEL)
    with pytest.raises(RuntimeError, match="size"):
        torch.sparse.mm(a, torch.ones(3, 2, device=ACCEL))
    with pytest.raises(RuntimeError):
        a.copy_(
            torch.ones(5, 7, device=ACCEL)
        )  # dense into sparse: not implemented on the CPU either
    with pytest.raises(RuntimeError, match="at least two devices, accel:0 and cpu"):
        torch.sparse.mm(a, torch.ones(7, 2))  # a CPU operand
    if torch.accel.device_count() > 1:
        with pytest.raises(RuntimeError, match="at least two devices, accel:. and accel:."):
            torch.sparse.mm(a, torch.ones(7, 2, device="accel:1"))
        with pytest.raises(RuntimeError, match="at least two devices, accel:. and accel:."):
            a + _coo().to("accel:1")
    torch.testing.assert_close((a * 2).to_dense().cpu(), _coo().to_dense() * 2)  # still usable


def test_sparse_tensors_on_another_device_stay_there() -> None:
    if torch.accel.device_count() < 2:
        pytest.skip("one accel device")
    dev = torch.device("accel", 1)
    s = _coo()
    for got in (
        s.to(dev),
        torch.sparse_coo_tensor(s._indices(), s._values(), s.shape, device=dev),
        s.to_dense().to(dev).to_sparse(),
        torch.empty(5, 7, layout=torch.sparse_coo, device=dev).sparse_resize_and_clear_(
            (5, 7), 2, 0
        )
        + s.to(dev),
    ):
        assert got.device == dev and got._values().device == dev and got._indices().device == dev
        _same((got * 2).coalesce(), (s * 2).coalesce())
        assert (got * 2).device == dev
    csr = s.to_dense().to(dev).to_sparse_csr()
    assert csr.device == dev and csr.col_indices().device == dev
    _same(csr @ torch.ones(7, 2, device=dev), s.to_dense() @ torch.ones(7, 2))
    assert torch.accel.current_device() == 0


@pytest.mark.parametrize(
    "indices",
    [
        [[0, 1, 2], [1, 2, 3]],  # sorted and unique: coalesced
        [[0, 1, 1], [3, 2, 2]],  # a duplicate
        [[2, 1, 0], [0, 0, 0]],  # unsorted
        [[0, 1, 3], [4, 0, 0], [1, 1, 0]],  # three sparse dimensions, coalesced
        [[1, 1, 3], [0, 0, 0], [1, 0, 0]],  # unsorted in the last dimension
    ],
)
def test_is_coalesced_checked_like_the_cpu(indices: list[list[int]]) -> None:
    """sparse_coo_tensor(..., is_coalesced=True, check_invariants=True) checks the claim through
    a dispatch stub PyTorch fills for the CPU and CUDA only (at::sparse::flatten_indices): accel
    accepts and refuses exactly what the CPU does."""
    idx = torch.tensor(indices)
    size = (4, 5, 2)[: idx.shape[0]]
    values = torch.arange(1.0, idx.shape[1] + 1)

    def build(device: torch.device | str) -> torch.Tensor | str:
        try:
            return torch.sparse_coo_tensor(
                idx.to(device), values.to(device), size, is_coalesced=True, check_invariants=True
            )
        except RuntimeError as e:
            return str(e)

    expected, got = build("cpu"), build(ACCEL)
    if isinstance(expected, str):
        assert got == expected and "uncoalesced" in got
    else:
        assert not isinstance(got, str) and got.is_coalesced()
        _same(got, expected)


def test_gradcheck_of_sparse_inputs() -> None:
    """gradcheck of sparse inputs (masked and not) validates the perturbed inputs it builds with
    check_invariants=True (the same stub)."""
    x = _coo(shape=(4, 6), nnz=6).coalesce().double().to(ACCEL).requires_grad_()
    for masked in (True, False):
        assert torch.autograd.gradcheck(
            lambda t: torch.sparse.sum(t * t, dim=1).to_dense(), (x,), masked=masked
        )
