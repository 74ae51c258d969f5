"""Gradients of tied embedding tables without a dense, zero-filled table per lookup.

``nn.Embedding``'s backward builds a dense (V, D) gradient: it zero-fills the whole table, then adds the rows that
were looked up. When the table is tied to the output layer (paper section 3.4, GPT-2), the output layer's product
already makes a dense (V, D) gradient, and autograd adds each embedding's dense gradient to it. At the paper's base
size one table (32000 x 512, 65 MB) serves the source and target embeddings and the output layer, so every training
step zero-filled two 65 MB tables that are almost all zeros and added both to the third, and with glibc's default
allocator each of them was fresh memory, faulted in page by page (docs/BENCHMARKS.md, thirty-third session).

:func:`sparse_tied_embedding_grads` makes such embeddings return sparse gradients (``nn.Embedding.sparse``: only
the rows looked up). Autograd adds a sparse gradient in place into the dense one that reaches the shared table first:
the output layer's, since the loss is the last node of the forward pass and so the first of the backward. The
parameter's ``.grad`` stays dense whatever happens: a hook after accumulation turns a sparse ``.grad`` (a loss that
does not use the output layer, such as a classifier fine-tuned on a model with a tied masked-LM head) into a dense
one, so optimizers (fused Adam), gradient clipping and the all-reduce of distributed training see what they always
saw. The gradients are the same sums in another order: equal up to float rounding.
"""

from __future__ import annotations

from torch import Tensor, nn

_HOOKED = "_aiayn_dense_grad_hook"  # marks a parameter that already has the hook


def _densify_grad(param: Tensor) -> None:
    """Post-accumulate-grad hook: a sparse ``.grad`` becomes the equal dense tensor."""
    if param.grad is not None and param.grad.is_sparse:
        param.grad = param.grad.to_dense()


def sparse_tied_embedding_grads(model: nn.Module) -> nn.Module:
    """Make every ``nn.Embedding`` of ``model`` whose table is also an ``LMHead``'s output weight return sparse
    gradients, keeping the table's ``.grad`` dense (see the module docstring); returns ``model``, changed in place.

    Untied embeddings are left alone (their gradient would reach the optimizer sparse, then be made dense again:
    no saving). Idempotent.
    """
    from aiayn.models.heads import LMHead  # local: models depend on nn, not the other way round

    head_weights = {id(m.proj.weight) for m in model.modules() if isinstance(m, LMHead)}
    for module in model.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) in head_weights:
            module.sparse = True
            if not getattr(module.weight, _HOOKED, False):
                module.weight.register_post_accumulate_grad_hook(_densify_grad)
                setattr(module.weight, _HOOKED, True)
    return model
