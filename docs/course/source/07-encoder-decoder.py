# Lesson 07 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 07: encoder, decoder, cross-attention and teacher forcing
#
# The paper's model (its Figure 1) is two stacks of the layers of lesson 06:
#
# - the **encoder** reads the source: embeddings × √D plus positions, then N layers of self-attention (padding
#   masked) and FFN;
# - the **decoder** writes the target: the same, with a causal mask on its self-attention, and a third sublayer in
#   between, **cross-attention**, whose queries come from the decoder and whose keys and values are the encoder's
#   output (the "memory").
#
# It is one attention function used three ways; only the mask and the source of K and V change.

# %%
import torch

from aiayn import ModelConfig, build_model, learn
from aiayn.models.stack import TransformerStack

torch.manual_seed(0)
torch.set_num_threads(1)

# %%
config = ModelConfig.preset("tiny", vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0)
model = build_model(config).eval()
print(model.decoder.layers[0])

# %% [markdown]
# ## Teacher forcing
#
# While training, the decoder is given the whole correct target at once, shifted: it reads BOS followed by the
# target, and at every position must predict the **next** token, the last one being EOS. All positions train in
# one pass (the causal mask keeps each from reading its answer); at generation time the decoder reads its own
# outputs instead (lesson 08).
#
# | position | 0 | 1 | 2 | 3 |
# | --- | --- | --- | --- | --- |
# | decoder reads | BOS | the | cat | sat |
# | must predict | the | cat | sat | EOS |
#
# Shorter targets are padded: the inputs with the pad id, the labels with -100, the loss's "ignore" value, so
# that padding is never scored.
#
# ### Exercise: `teacher_forcing(targets, bos_id, eos_id, pad_id)`
#
# `targets` is a list of B lists of ids (no BOS, no EOS). Return `(tgt_in, labels)`, two (B, L + 1) long tensors
# where L is the longest target.

# %%
def teacher_forcing(targets, bos_id, eos_id, pad_id):
    # BEGIN SOLUTION
    width = max(len(t) for t in targets) + 1
    tgt_in = torch.full((len(targets), width), pad_id, dtype=torch.long)
    labels = torch.full((len(targets), width), -100, dtype=torch.long)
    for row, target in enumerate(targets):
        tgt_in[row, : len(target) + 1] = torch.tensor([bos_id, *target])
        labels[row, : len(target) + 1] = torch.tensor([*target, eos_id])
    return tgt_in, labels
    # END SOLUTION


# %%
learn.check("teacher_forcing", teacher_forcing)

# %%
tgt_in, labels = teacher_forcing([[7, 8, 9], [5]], bos_id=1, eos_id=2, pad_id=0)
print("decoder reads\n", tgt_in, "\nmust predict\n", labels)

# %% [markdown]
# ## The encoder's forward pass
#
# An aiayn `TransformerStack` holds what a stack needs: `stack.embed` (the token embedding), `stack.abs_pos.table`
# (the sinusoidal table of lesson 05), `stack.layers` (each called as `layer(x, mask=...)`, returning the new x
# first), and `stack.final_norm` (the norm after the last layer of a pre-LN stack; nothing in a post-LN one). The
# paper multiplies the embeddings by √D before adding the positions (section 3.4), which puts them on the table's
# scale.
#
# ### Exercise: `encode(stack, ids)`
#
# ids is (B, S), right-padded with `stack.config.pad_id`; return the stack's output (B, S, D). The positions go in
# once, before the first layer: every layer, the first included, must see them.

# %%
def encode(stack, ids):
    # BEGIN SOLUTION
    c = stack.config
    x = stack.embed(ids) * c.d_model**0.5  # (B, S, D)
    x = x + stack.abs_pos.table[: ids.shape[1]]  # positions, before any layer
    mask = (ids != c.pad_id)[:, None, None, :]  # (B, 1, 1, S): the keys that are tokens
    for layer in stack.layers:
        x = layer(x, mask=mask)[0]
    return stack.final_norm(x)
    # END SOLUTION


# %%
learn.check("encode", encode)

# %% [markdown]
# Your function on the model built above gives its encoder's output:

# %%
src = torch.tensor([[5, 9, 12, 7], [6, 17, 0, 0]])
with torch.no_grad():
    memory, src_is_token, _ = model.encode(src)
    print("yours == model.encode:", torch.allclose(encode(model.encoder, src), memory, atol=1e-5))

# %% [markdown]
# ## Cross-attention, and no peeking
#
# The decoder reads the memory through cross-attention: change the source and every decoder output changes. Its
# self-attention is causal: change a **later** target token and the earlier outputs stay exactly the same. That is
# the seed lesson's second theorem, and it is what makes teacher forcing honest.

# %%
tgt = torch.tensor([[1, 7, 8, 9, 10]])
with torch.no_grad():
    base = model(src[:1], tgt).logits
    other_source = model(torch.tensor([[11, 3, 14, 8]]), tgt).logits
    later_changed = tgt.clone()
    later_changed[0, 3] = 15
    changed = model(src[:1], later_changed).logits
print("another source changes position 0:", not torch.allclose(base[0, 0], other_source[0, 0]))
print("changing token 3 leaves positions 0..2 unchanged:", torch.allclose(base[0, :3], changed[0, :3], atol=1e-6),
      "and changes position 3:", not torch.allclose(base[0, 3], changed[0, 3]))

# %% [markdown]
# ## See it in a trained model
#
# The explorer's **alignment** view ([docs/inspect.md](../inspect.md)) shows a translation's cross-attention averaged
# over heads: which source words each target word read. After `make demo`:
# `aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"`; its head
# view opens on cross-attention too.
#
# ## Final check

# %%
learn.check_lesson("07", globals())
