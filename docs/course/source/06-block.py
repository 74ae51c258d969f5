# Lesson 06 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 06: the block: residual, LayerNorm pre and post, FFN
#
# A Transformer layer is two (in a decoder, three) **sublayers**: attention, then a position-wise feed-forward
# network. Each sits in the same wrapping: a residual connection, so the sublayer computes a *change* to its input,
# and a layer norm, which keeps the numbers at a steady scale. The paper normalizes after the sum (**post-LN**);
# most models since normalize the sublayer's input instead (**pre-LN**), which trains deep stacks without warmup
# tricks.
#
# - post-LN (paper, section 5.4): `x = LayerNorm(x + Sublayer(x))`
# - pre-LN: `x = x + Sublayer(LayerNorm(x))`, and one more LayerNorm after the last layer

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from aiayn import ModelConfig, learn
from aiayn.nn.layers import TransformerLayer

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## The feed-forward network (equation 2)
#
# $$\mathrm{FFN}(x) = \max(0,\, x W_1 + b_1)\, W_2 + b_2$$
#
# The same two-layer network for every position, widening D to d_ff (the paper: 512 to 2048) and back. Attention
# moves information between positions; the FFN transforms each position on its own, and holds about two thirds of a
# layer's parameters.
#
# ### Exercise: `feed_forward(x, w1, b1, w2, b2)`
#
# x is (B, T, D); the weights come in `nn.Linear`'s layout, (out, in): w1 (d_ff, D), w2 (D, d_ff). So the
# first layer is `x @ w1.T + b1`.

# %%
def feed_forward(x, w1, b1, w2, b2):
    # BEGIN SOLUTION
    hidden = torch.relu(x @ w1.T + b1)  # (B, T, d_ff)
    return hidden @ w2.T + b2  # (B, T, D)
    # END SOLUTION


# %%
learn.check("feed_forward", feed_forward)

# %% [markdown]
# ### Exercise: `sublayer(x, f, norm, pre_norm)`
#
# The residual wrapping of any sublayer `f` (a function (B, T, D) -> (B, T, D)) with its `norm`: post-LN when
# `pre_norm` is False, pre-LN when it is True. Dropout is left out (it is off at evaluation).

# %%
def sublayer(x, f, norm, pre_norm):
    # BEGIN SOLUTION
    if pre_norm:
        return x + f(norm(x))
    return norm(x + f(x))
    # END SOLUTION


# %%
learn.check("sublayer", sublayer)

# %% [markdown]
# ## Your pieces make an aiayn layer
#
# aiayn's `TransformerLayer` is exactly these pieces: self-attention and the FFN, each wrapped. Rebuild one from its
# weights with your two functions and compare:

# %%
config = ModelConfig.preset("tiny", d_model=16, n_heads=2, d_ff=32, dropout=0.0)
layer = TransformerLayer(config).eval()
x = torch.randn(2, 5, 16)
with torch.no_grad():
    attend = lambda h: layer.self_attn(h)[0]  # noqa: E731
    ffn = lambda h: feed_forward(h, layer.ffn.w_in.weight, layer.ffn.w_in.bias,  # noqa: E731
                                 layer.ffn.w_out.weight, layer.ffn.w_out.bias)
    mine = sublayer(sublayer(x, attend, layer.self_res.norm, False), ffn, layer.ffn_res.norm, False)
    print("your layer == aiayn's TransformerLayer:", torch.allclose(mine, layer(x)[0], atol=1e-5))

# %% [markdown]
# ## Pre-LN and post-LN in a deep stack
#
# Stack 24 sublayers of random weights and watch the size of the residual stream. Post-LN normalizes after every
# sum, so the stream stays at the norm's scale and every update is squeezed through it. Pre-LN leaves the residual
# path alone: the stream grows as updates add up, and each sublayer still sees a normalized input. That untouched
# path is why pre-LN stacks train stably without the long warmup post-LN needs (Xiong et al., 2020).

# %%
d = 32
norms = {False: [], True: []}
for pre in (False, True):
    torch.manual_seed(1)
    h = torch.randn(4, 10, d)
    for _ in range(24):
        lin, norm = nn.Linear(d, d), nn.LayerNorm(d)
        with torch.no_grad():
            h = sublayer(h, lambda z: torch.tanh(lin(z)) * 3, norm, pre)
        norms[pre].append(float(h.norm(dim=-1).mean()))
fig, ax = plt.subplots(figsize=(5, 2.8))
ax.plot(norms[False], label="post-LN")
ax.plot(norms[True], label="pre-LN")
ax.set_xlabel("sublayer")
ax.set_ylabel("mean |x|")
ax.legend()
plt.show()

# %% [markdown]
# In aiayn, `norm_position="pre"` or `"post"` in the config chooses the wrapping (`aiayn.nn.layers.Residual`),
# `norm="rmsnorm"` LLaMA's norm, and `activation="gelu"` or `"swiglu"` the FFN's nonlinearity.
#
# ## See it in a trained model
#
# The explorer's **model view** ([docs/inspect.md](../inspect.md)) shows each layer's heads; its **head statistics**
# give, per layer, how spread out each head is, and how far it looks. After `make demo`:
# `aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"`.
#
# ## Final check

# %%
learn.check_lesson("06", globals())
