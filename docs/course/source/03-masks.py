# Lesson 03 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 03: masks: padding, causal, combined, an empty row
#
# Attention lets every query read every key. Two things must be hidden:
#
# - **padding**: sentences of a batch have different lengths, and the short ones are filled with a pad token that
#   must never be read;
# - **the future**: a decoder predicts token t + 1 from tokens 0 .. t, so while training (all positions at once) a
#   query must not read the keys after it.
#
# aiayn's masks are **boolean, True = may attend** (the convention of torch's `scaled_dot_product_attention`), shaped
# to broadcast against the scores (B, H, T, S). Attention blocks a score by filling it with the lowest float before
# the softmax, so its weight is exactly 0.

# %%
import math

import matplotlib.pyplot as plt
import torch

from aiayn import learn
from aiayn.nn import masks as M

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## The causal mask
#
# Query i may read key j when j ≤ i: a lower triangle. `render` draws it as the scores it leaves: 0 where allowed,
# -inf where blocked.

# %%
print(M.render(M.causal_mask(4)))

# %% [markdown]
# With a KV cache (lesson 08) the model is given T new queries while S ≥ T keys are cached: the queries are the
# **last** T positions, so query i sits at position S - T + i.

# %%
print(M.render(M.causal_mask(2, 5), as_bias=False))

# %% [markdown]
# ### Exercise: `causal_mask(t, s=None)`
#
# Return the (T, S) bool mask, True where query i (at position S - T + i) may attend key j; `s` defaults to `t`.

# %%
def causal_mask(t, s=None):
    # BEGIN SOLUTION
    s = t if s is None else s
    query_pos = torch.arange(s - t, s)[:, None]  # (T, 1)
    key_pos = torch.arange(s)[None, :]  # (1, S)
    return key_pos <= query_pos
    # END SOLUTION


# %%
learn.check("causal_mask", causal_mask)

# %% [markdown]
# ## Padding, and both together
#
# A padding mask says which keys are real tokens: `is_token` (B, S) becomes (B, 1, 1, S), the same for every head and
# every query. A decoder's self-attention needs both masks at once: a key is allowed when it is in the past **and**
# a real token. Batched generation pads on the left (so that every row's next token is at the end), and then the
# padding sits in the past of real queries: the causal mask alone does not hide it.

# %%
is_token = torch.tensor([[False, False, True, True, True]])  # one row, left-padded
pictures = {"padding (keys)": M.padding_mask(is_token)[0, 0].expand(5, 5), "causal": M.causal_mask(5),
            "padding AND causal": M.combine(M.padding_mask(is_token), M.causal_mask(5))[0, 0]}
fig, axes = plt.subplots(1, 3, figsize=(8, 2.6))
for ax, (title, m) in zip(axes, pictures.items()):
    ax.imshow(m, cmap="Greens", vmin=0, vmax=1)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("key")
axes[0].set_ylabel("query")
plt.show()

# %% [markdown]
# ### Exercise: `decoder_mask(is_token)`
#
# `is_token` is (B, T) bool, False at padding; return the (B, 1, T, T) mask of a decoder's self-attention: query i
# may attend key j when j ≤ i and key j is a real token. (The rows of padded queries are not checked: their outputs
# are never used.)

# %%
def decoder_mask(is_token):
    # BEGIN SOLUTION
    t = is_token.shape[1]
    keys = is_token[:, None, None, :]  # (B, 1, 1, T): the real keys
    past = torch.ones(t, t, dtype=torch.bool).tril()  # (T, T)
    return keys & past  # (B, 1, T, T)
    # END SOLUTION


# %%
learn.check("decoder_mask", decoder_mask)

# %% [markdown]
# ## The empty row
#
# Look at the picture above: the first two queries (padding) have **no** allowed key. If blocked scores are -inf,
# their softmax is exp(-inf) / Σ exp(-inf) = 0 / 0: NaN, and NaN spreads through every later layer and into the
# gradients. If blocked scores are a large finite number (the Annotated Transformer's -1e9), the row gets a uniform
# softmax: the mean of all the values, padding included. aiayn's convention: **a query row with no allowed key gives
# zeros**.

# %%
scores = torch.randn(5, 5)
mask = M.combine(M.padding_mask(is_token), M.causal_mask(5))[0, 0]
print("with -inf:\n", torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)[:3])
print("with -1e9:\n", torch.softmax(scores.masked_fill(~mask, -1e9), -1)[:3])

# %% [markdown]
# ### Exercise: `masked_attention(q, k, v, mask=None)`
#
# Lesson 02's attention with a mask: bool, broadcastable to (B, H, T, S), True = may attend, or None. Fill the
# blocked scores with `torch.finfo(scores.dtype).min` before the softmax, and give the rows with no allowed key
# zeros.

# %%
def masked_attention(q, k, v, mask=None):
    # BEGIN SOLUTION
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # rows with no allowed key
    return weights @ v
    # END SOLUTION


# %%
learn.check("masked_attention", masked_attention)

# %% [markdown]
# Here is what the check says about the most common slip, masking after the softmax:

# %%
def mask_after_softmax(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ v


learn.check("masked_attention", mask_after_softmax, record=False)

# %% [markdown]
# ## See it in a trained model
#
# The explorer's **masks** view ([docs/inspect.md](../inspect.md)) shows the mask each attention of a model applied:
# the decoder's causal mask, the encoder's padding. Run
# `aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"` after
# `make demo`.
#
# ## Final check

# %%
learn.check_lesson("03", globals())
