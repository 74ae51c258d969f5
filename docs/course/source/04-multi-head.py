# Lesson 04 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 04: multi-head attention and its shapes
#
# One attention gives each query one distribution over the keys. A token often needs several at once (its subject,
# its object, the previous word), so the paper runs **H attentions side by side**, each on its own D/H-wide slice
# of learned projections, and mixes their outputs:
#
# $$\mathrm{MultiHead}(X) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)\, W^O, \qquad
# \mathrm{head}_h = \mathrm{Attention}(X W^Q_h, X W^K_h, X W^V_h)$$
#
# In code there is no loop over heads: one product computes every head's q, k and v, a reshape **splits** the width
# D into H heads of Dh = D/H columns, attention runs on (B, H, T, Dh) at once, and a reshape **merges** the heads
# back. The reshapes are where shapes go wrong.

# %%
import math

import matplotlib.pyplot as plt
import torch

from aiayn import learn
from aiayn.nn.attention import MultiHeadAttention

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## The shapes, step by step
#
# The paper's base model has D = 512 and H = 8, so Dh = 64. A small one: D = 8, H = 2, three tokens.
#
# | step | shape |
# | --- | --- |
# | input x | (B, T, D) = (1, 3, 8) |
# | q, k, v = x W (one fused product `qkv_proj`, then split three ways) | (1, 3, 8) each |
# | split into heads | (B, H, T, Dh) = (1, 2, 3, 4) |
# | scores q kᵀ per head | (1, 2, 3, 3) |
# | weights @ v | (1, 2, 3, 4) |
# | merge heads | (1, 3, 8) |
# | out = merged W^O (`out_proj`) | (1, 3, 8) |

# %%
mha = MultiHeadAttention(d_model=8, n_heads=2).eval()
print(mha)
x = torch.randn(1, 3, 8)
out, weights = mha(x, return_weights=True)
print("output", tuple(out.shape), "weights", tuple(weights.shape))

# %% [markdown]
# ## Which columns belong to which head?
#
# Head h owns columns h·Dh .. (h+1)·Dh - 1 of every token's q, k and v. Memory holds x (B, T, D) token after token,
# so the split is `x.view(B, T, H, Dh)` (a token's D columns cut into H pieces) and then `.transpose(1, 2)` to bring
# the heads in front of the tokens. Writing `x.view(B, H, T, Dh)` instead also runs, but it cuts the memory in the
# wrong places: a "head" then holds whole tokens, and its rows mix columns of several tokens. Colour each entry of a
# (T, D) = (3, 8) input by the head it lands in:

# %%
t, d, h = 3, 8, 2
ids = torch.arange(t * d).view(1, t, d).float()  # entry number of each (token, column)
right = ids.view(1, t, h, d // h).transpose(1, 2)  # (1, H, T, Dh)
wrong = ids.view(1, h, t, d // h)
fig, axes = plt.subplots(1, 2, figsize=(8, 2.2))
for ax, split, title in ((axes[0], right, "view(B, T, H, Dh).transpose(1, 2)"), (axes[1], wrong, "view(B, H, T, Dh)")):
    owner = torch.zeros(t, d)
    for head in range(h):
        for entry in split[0, head].flatten().long().tolist():
            owner[entry // d, entry % d] = head
    ax.imshow(owner, cmap="coolwarm")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("column")
    ax.set_ylabel("token")
plt.show()

# %% [markdown]
# On the left each head owns a block of columns of every token; on the right head 0 got the first half of the
# memory: all of token 0, and half of token 1.
#
# ### Exercise: `split_heads(x, n_heads)` and `merge_heads(x)`
#
# `split_heads`: (B, T, D) -> (B, H, T, D/H). `merge_heads`: (B, H, T, Dh) -> (B, T, H·Dh), its inverse.

# %%
def split_heads(x, n_heads):
    # BEGIN SOLUTION
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)  # (B, H, T, Dh)
    # END SOLUTION


def merge_heads(x):
    # BEGIN SOLUTION
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)  # (B, T, D)
    # END SOLUTION


# %%
learn.check("split_heads", split_heads)

# %%
learn.check("merge_heads", merge_heads)

# %% [markdown]
# ### Exercise: `multi_head_attention(x, mha)`
#
# The whole module's forward pass with its weights: `mha.qkv_proj(x)` gives (B, T, 3D) = [q | k | v];
# split each into `mha.n_heads` heads, attend (each head scaled by its own √Dh), merge, and apply `mha.out_proj`.
# The lesson 02 `attention` works on every head at once.

# %%
def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def multi_head_attention(x, mha):
    # BEGIN SOLUTION
    d = x.shape[-1]
    q, k, v = mha.qkv_proj(x).split(d, dim=-1)  # (B, T, D) each
    heads = attention(split_heads(q, mha.n_heads), split_heads(k, mha.n_heads), split_heads(v, mha.n_heads))
    return mha.out_proj(merge_heads(heads))  # (B, T, D)
    # END SOLUTION


# %%
learn.check("multi_head_attention", multi_head_attention)

# %% [markdown]
# A common slip: scaling each head by √D, the model's width, instead of √Dh:

# %%
def scaled_by_model_width(x, mha):
    d = x.shape[-1]
    q, k, v = (split_heads(p, mha.n_heads) for p in mha.qkv_proj(x).split(d, dim=-1))
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
    return mha.out_proj(merge_heads(w @ v))


learn.check("multi_head_attention", scaled_by_model_width, record=False)

# %% [markdown]
# ## Heads cost nothing extra
#
# W^Q, W^K, W^V and W^O are D × D whatever H is: more heads means narrower heads, not more parameters.

# %%
for heads in (1, 2, 4, 8):
    m = MultiHeadAttention(512, heads)
    print(f"{heads} heads of width {512 // heads:3d}: {sum(p.numel() for p in m.parameters()):,} parameters")

# %% [markdown]
# ## See it in a trained model
#
# The explorer's **head view** ([docs/inspect.md](../inspect.md)) draws one colour per head; click a colour to hide
# a head, double-click it to see that head alone, and compare what the heads of one layer read. After `make demo`:
# `aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"`.
#
# ## Final check

# %%
learn.check_lesson("04", globals())
