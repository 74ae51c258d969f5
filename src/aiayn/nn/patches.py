"""Images as token sequences: the Vision Transformer's patch embedding (Dosovitskiy et al. 2021, section 3.1).

"The standard Transformer receives as input a 1D sequence of token embeddings. To handle 2D images, we reshape the
image x in R^(H x W x C) into a sequence of flattened 2D patches x_p in R^(N x (P^2 C)) ... and map to D dimensions
with a trainable linear projection (Eq. 1). ... we prepend a learnable embedding to the sequence of embedded patches
(z_0^0 = x_class)". Positions are added afterwards by the encoder stack, like a sentence's
(:meth:`aiayn.models.stack.TransformerStack.prepare`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut images into flattened square patches, row by row.

    Args:
        images: (B, C, H, W), H and W multiples of ``patch_size``.
        patch_size: P, a patch's side in pixels.
    Returns:
        (B, N, C * P * P) with N = (H / P) * (W / P); patch n = (row n // (W / P), column n % (W / P)), its values
        ordered channel, then pixel row, then pixel column (the layout of a ``Conv2d`` weight (D, C, P, P)).
    """
    cols = F.unfold(images, kernel_size=patch_size, stride=patch_size)  # (B, C * P * P, N)
    return cols.transpose(1, 2)  # (B, N, C * P * P)


class PatchEmbedding(nn.Module):
    """Images -> embedded patches (+ a learned CLS token first): ``[x_class; x_p^1 E; ...; x_p^N E]``.

    The projection E is an ``nn.Linear`` over flattened patches, equal to a ``Conv2d`` with kernel = stride = P
    whose weight is E's reshaped to (D, C, P, P) (the form Hugging Face's ViT checkpoints store).

    Args:
        channels: C.
        image_size: the image's side in pixels (H = W).
        patch_size: P, dividing ``image_size``.
        d_model: D.
        cls_token: prepend a learned (D,) vector (CLS pooling); without it the output has N rows.
        bias: a bias on the projection.
    """

    def __init__(self, channels: int, image_size: int, patch_size: int, d_model: int, *, cls_token: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        self.channels, self.image_size, self.patch_size = channels, image_size, patch_size
        self.proj = nn.Linear(channels * patch_size * patch_size, d_model, bias=bias)
        self.cls_token = nn.Parameter(torch.randn(d_model) * 0.02) if cls_token else None

    def forward(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> (B, N + 1, D) with the CLS token at row 0, or (B, N, D) without one.

        Raises:
            ValueError: ``images`` is not (B, channels, image_size, image_size).
        """
        want = (self.channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != want:
            raise ValueError(f"images of shape {tuple(images.shape)}: this model reads (B, {', '.join(map(str, want))})"
                             " images (channels, height, width); resize them or build the model for their size")
        x = self.proj(patchify(images.to(self.proj.weight.dtype), self.patch_size))  # (B, N, D), the model's dtype
        if self.cls_token is None:
            return x
        cls = self.cls_token.to(x.dtype).expand(x.shape[0], 1, -1)  # (B, 1, D)
        return torch.cat([cls, x], dim=1)  # (B, N + 1, D)
