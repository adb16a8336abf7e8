"""Stored feature rows -> float32, on the model's device (issue 25, item 4).

Every tier stores and moves the rows as the dataset stores them (float16, bfloat16 bits as int16,
int8; :mod:`gnnio.graph.feature_dtype`), so the bytes the stores count are the compressed bytes.
They become float32 in one place: :class:`FeatureDecoder`, which
:meth:`gnnio.train.models.BlockGNN.normalize_input` applies first, after the batch has reached the
model's device (training batches, sampled evaluation and full-neighbour inference alike). The int8
scale and zero point are buffers of the decoder, so they move to the model's device once, with the
model; they are non-persistent (not in the model's ``state_dict``: a checkpoint stays the same).
"""

from __future__ import annotations

import torch
from torch import nn

from ..graph.feature_dtype import FeatureCodec

__all__ = ["FeatureDecoder"]


class FeatureDecoder(nn.Module):
    """``[n, F]`` stored rows -> ``[n, F]`` float32 rows on the same device.

    float32 / float16: ``x.float()``; bfloat16 (int16 bits): ``x.view(torch.bfloat16).float()``
    (exact); int8: ``(x.float() - zero_point) * scale`` per column (torch's
    ``dequantize`` of a per-channel ``qint8`` tensor). Rows already in float32 pass unchanged
    whatever the codec (a caller that decoded them itself).
    """

    # int8: buffers registered in __init__ (declared for the type checker only)
    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, codec: FeatureCodec | None = None) -> None:
        super().__init__()
        codec = codec or FeatureCodec()
        self.feat_dtype = codec.feat_dtype
        if codec.feat_dtype == "int8":
            assert codec.scale is not None and codec.zero_point is not None
            self.register_buffer("scale", torch.from_numpy(codec.scale).float(), persistent=False)
            self.register_buffer(
                "zero_point", torch.from_numpy(codec.zero_point).float(), persistent=False
            )

    def extra_repr(self) -> str:
        return f"feat_dtype={self.feat_dtype}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return x
        if self.feat_dtype == "bfloat16" and x.dtype == torch.int16:
            return x.view(torch.bfloat16).float()
        if self.feat_dtype == "int8" and x.dtype == torch.int8:
            return (x.float() - self.zero_point) * self.scale
        if x.is_floating_point():
            return x.float()
        raise TypeError(f"feature rows of dtype {x.dtype} for a {self.feat_dtype} dataset")
