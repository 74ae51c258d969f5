# Lesson 05 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 05: positions: sinusoidal, learned, RoPE, ALiBi
#
# Attention compares every query with every key, and nothing in that comparison says where a token is. Shuffle the
# tokens, and the outputs are shuffled the same way and otherwise unchanged: attention without positions is
# **permutation-equivariant**, a bag of words. Word order must be put in from outside. This lesson builds the
# paper's answer (a fixed table of sines and cosines added to the embeddings) and RoPE, today's most common one
# (a rotation of the queries and keys), and looks at learned positions and ALiBi.

# %%
import math

import matplotlib.pyplot as plt
import torch

from aiayn import learn
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.positions import ALiBi, LearnedPositions

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## A bag of words
#
# One of the seed lesson's two theorems, checked numerically: permute the input of a multi-head attention and its
# output is permuted the same way.

# %%
mha = MultiHeadAttention(16, 4).eval()
x = torch.randn(1, 6, 16)
perm = torch.tensor([3, 0, 5, 1, 4, 2])
with torch.no_grad():
    same = torch.allclose(mha(x[:, perm])[0], mha(x)[0][:, perm], atol=1e-6)
print("attention(shuffled x) == shuffled attention(x):", same)

# %% [markdown]
# ## The sinusoidal table (paper section 3.5)
#
# $$PE_{(pos, 2i)} = \sin(pos / 10000^{2i/d}), \qquad PE_{(pos, 2i+1)} = \cos(pos / 10000^{2i/d})$$
#
# Columns 2i and 2i+1 hold the sine and the cosine of **one** angle, turning at a frequency that falls from 1 (the
# first pair) to 1/10000 (the last): fast pairs tell neighbours apart, slow ones far-away positions. Because a pair
# is a point on a circle, moving k positions is the same rotation wherever you start, so PE(pos + k) is a linear
# function of PE(pos): relative offsets are easy for the model to read.
#
# ### Exercise: `sinusoidal(max_len, d_model)`
#
# Return the (max_len, d_model) float table; positions start at 0, d_model is even.

# %%
def sinusoidal(max_len, d_model):
    # BEGIN SOLUTION
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,): the even columns' index
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (L, D/2)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe.float()
    # END SOLUTION


# %%
learn.check("sinusoidal", sinusoidal)

# %%
table = sinusoidal(64, 32)
fig, axes = plt.subplots(1, 2, figsize=(8, 2.8))
axes[0].imshow(table, cmap="RdBu", aspect="auto")
axes[0].set_xlabel("column")
axes[0].set_ylabel("position")
axes[0].set_title("PE table", fontsize=9)
similarity = table @ table[20]  # how much each position's encoding resembles position 20's
axes[1].plot(similarity)
axes[1].axvline(20, color="gray", ls=":")
axes[1].set_xlabel("position")
axes[1].set_title("PE(pos) . PE(20)", fontsize=9)
plt.show()

# %% [markdown]
# ## Learned positions
#
# BERT and GPT-2 learn one vector per position instead (`position="learned"` in aiayn's config,
# `aiayn.nn.positions.LearnedPositions`): as good in practice, but a model cannot read past the last position it
# was trained on.

# %%
learned = LearnedPositions(d_model=32, max_len=64)
print(learned(torch.arange(5)[None]).shape, "- one trainable row per position,", learned.weight.weight.shape)

# %% [markdown]
# ## RoPE: positions as rotations of q and k
#
# Rotary embeddings (Su et al. 2021; LLaMA, Mistral, Qwen) add nothing to the embeddings. Inside attention they
# rotate each query and key by an angle proportional to its position: pair i of the head's Dh columns (aiayn and
# LLaMA pair column i with column i + Dh/2) turns by position · θᵢ, θᵢ = 10000^(-2i/Dh):
#
# (a, b) → (a cos φ - b sin φ, a sin φ + b cos φ).
#
# A dot product of two rotated vectors depends only on the **difference** of their angles, so the score of query m
# and key n depends on m - n alone: attention becomes relative.
#
# ### Exercise: `rope(x, positions)`
#
# x is (B, H, T, Dh), positions (T,) long (after a cache of n tokens they start at n); return x rotated.

# %%
def rope(x, positions):
    # BEGIN SOLUTION
    dh = x.shape[-1]
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh)  # (Dh/2,)
    angle = positions[:, None].float() * inv_freq  # (T, Dh/2)
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., : dh // 2], x[..., dh // 2:]  # the pairs (a_i, b_i) = (x[i], x[i + Dh/2])
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    # END SOLUTION


# %%
learn.check("rope", rope)

# %% [markdown]
# The relative property, checked: the same query and key at positions (m, n) and (m + 7, n + 7) score the same.

# %%
q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
score = lambda m, n: float((rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum())  # noqa: E731
print(f"score(3, 1) = {score(3, 1):.5f}   score(10, 8) = {score(10, 8):.5f}   score(3, 2) = {score(3, 2):.5f}")

# %% [markdown]
# ## ALiBi: a distance penalty
#
# ALiBi (Press et al. 2022; BLOOM) adds no embedding and no rotation: each head subtracts slopeₕ · |i - j| from its
# scores, a bias that grows with distance, steep in some heads (local) and gentle in others. aiayn passes such
# biases (ALiBi, T5's) to attention as a separate float `bias`, never inside the bool mask.

# %%
bias = ALiBi(n_heads=4)(torch.arange(8)[None], torch.arange(8)[None])  # (1, H, T, S)
fig, axes = plt.subplots(1, 4, figsize=(9, 2.2))
for h, ax in enumerate(axes):
    ax.imshow(bias[0, h], cmap="Blues_r")
    ax.set_title(f"head {h}: slope {ALiBi(4).slopes[h]:.3f}", fontsize=8)
    ax.axis("off")
plt.show()

# %% [markdown]
# ## See it in a trained model
#
# The explorer's **positions** view ([docs/inspect.md](../inspect.md)) draws the scheme a model uses: the sinusoidal
# table it adds, RoPE's cos(position × frequency) per pair, or the ALiBi / T5 bias of each head. After `make demo`:
# `aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"`.
#
# ## Final check

# %%
learn.check_lesson("05", globals())
