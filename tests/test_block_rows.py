"""A block with more sources than the rows it is given is refused, not read past its input."""

from __future__ import annotations

import pytest
import torch

from gnnio.sampling.base import Block
from gnnio.train.models import build_model


@pytest.mark.parametrize("impl", ["numba", "torch"])
@pytest.mark.parametrize("name", ["sage", "gcn", "gin", "gat"])
def test_a_layer_given_fewer_rows_than_its_sources_raises(monkeypatch, impl, name):
    """A layer whose block reads sources beyond ``x``'s rows raises ``ValueError`` (the numba
    kernels do not check indices: they returned values read from memory past ``x``)."""
    monkeypatch.setenv("GNNIO_SPMM", "" if impl == "numba" else "torch")
    layer = build_model(name, 4, 4, 2, num_layers=1, heads=2).layers[0]
    block = Block(torch.tensor([[9, 8, 7], [0, 1, 2]]), 10, 3)
    with pytest.raises(ValueError, match="fewer than the block's 10 sources"):
        layer(torch.randn(3, 4), block)


def test_a_model_given_blocks_that_do_not_chain_raises():
    """Layer 1's block has more sources than layer 0's destinations: the forward raises rather
    than aggregate rows that do not exist."""
    model = build_model("sage", 4, 5, 2, num_layers=2)
    b0 = Block(torch.tensor([[1, 2], [0, 1]]), 3, 2)
    b1 = Block(torch.tensor([[3, 4], [0, 0]]), 5, 1)
    with pytest.raises(ValueError, match="fewer than the block's 5 sources"):
        model(torch.randn(3, 4), [b0, b1])
