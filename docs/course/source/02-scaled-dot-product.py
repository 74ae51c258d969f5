# Lesson 02 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 02: scaled dot-product attention by hand
#
# The paper's equation 1 is the soft lookup of lesson 01 for many queries at once, with one change, the scale:
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V$$
#
# Q holds T queries (T × d_k), K holds S keys (S × d_k), V holds S values (S × d_v). Row i of the weights is query
# i's distribution over the keys. In a model there are more axes in front: a batch B and heads H, so q is
# (B, H, T, d_k); everything here works on the last two axes.

# %%
import math

import matplotlib.pyplot as plt
import torch

from aiayn import learn
from aiayn.nn.attention import scaled_dot_product_attention

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## The worked example, number by number
#
# Two queries, two keys, d_k = 2:
#
# Q = [[1, 0], [0, 1]], K = [[1, 0], [1, 1]], V = [[1, 2], [3, 4]].
#
# 1. Scores Q Kᵀ = [[1, 1], [0, 1]]: query 1 matches both keys equally, query 2 only the second.
# 2. Divided by √2: [[0.707, 0.707], [0, 0.707]].
# 3. Softmax per row: [0.5, 0.5] and [e⁰, e^0.707] / (e⁰ + e^0.707) = [0.330, 0.670].
# 4. Times V: query 1 gets the mean of the values, [2, 3]; query 2 gets 0.330·[1, 2] + 0.670·[3, 4] = [2.34, 3.34].

# %%
Q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
K = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
V = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
scores = Q @ K.T / math.sqrt(2)
weights = torch.softmax(scores, dim=-1)
print("scores\n", scores, "\nweights\n", weights.round(decimals=3), "\noutput\n", (weights @ V).round(decimals=2))

# %% [markdown]
# aiayn's one attention function gives the same numbers (`tests/golden/test_seed_lesson.py` holds it to them):

# %%
out, w = scaled_dot_product_attention(Q[None, None], K[None, None], V[None, None], backend="reference",
                                      return_weights=True)
print(out[0, 0].round(decimals=2), w[0, 0].round(decimals=3), sep="\n")

# %% [markdown]
# ## Why divide by √d_k?
#
# If the entries of q and k are independent with mean 0 and variance 1, their dot product has variance d_k. With
# d_k = 64 the scores spread over ±16, and the softmax of such scores is nearly one-hot: its gradient vanishes, and
# learning stalls. Dividing by √d_k brings the variance back to 1, whatever the width. Measure the largest weight of
# a row, with and without the scale:

# %%
widths = [2, 8, 32, 128, 512]
top_plain, top_scaled = [], []
for dk in widths:
    q, k = torch.randn(200, 10, dk), torch.randn(200, 10, dk)
    s = q @ k.transpose(-2, -1)
    top_plain.append(torch.softmax(s, -1).max(-1).values.mean())
    top_scaled.append(torch.softmax(s / math.sqrt(dk), -1).max(-1).values.mean())

fig, ax = plt.subplots(figsize=(5, 2.8))
ax.plot(widths, top_plain, marker="o", label="softmax(q k)")
ax.plot(widths, top_scaled, marker="o", label="softmax(q k / sqrt(d_k))")
ax.set_xscale("log", base=2)
ax.set_xlabel("d_k")
ax.set_ylabel("mean largest weight")
ax.legend()
plt.show()

# %% [markdown]
# ### Exercise: `attention(q, k, v)`
#
# q is (B, H, T, d_k), k is (B, H, S, d_k), v is (B, H, S, d_v); return (B, H, T, d_v). Use `k.transpose(-2, -1)`
# (not `.T`, which would reverse every axis) and a softmax over the keys.

# %%
def attention(q, k, v):
    # BEGIN SOLUTION
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    return torch.softmax(scores, dim=-1) @ v  # (B, H, T, Dv)
    # END SOLUTION


# %%
learn.check("attention", attention)

# %% [markdown]
# The check runs your function on the worked example, on random shapes, on queries and keys of different counts
# (T ≠ S), on one query (a decoding step) and on values wider than the keys. Each known mistake has a diagnosis.
# Two at once are named too:

# %%
def attention_with_two_mistakes(q, k, v):
    scores = q @ k.transpose(-2, -1)  # no scale
    return torch.softmax(scores, dim=-2) @ v  # and the softmax over the queries


learn.check("attention", attention_with_two_mistakes, record=False)

# %% [markdown]
# ## What the weights look like
#
# Each row of the weights is a distribution over the keys. Random queries and keys give blurred rows; training
# makes them sharp where a token must find one other token.

# %%
q, k = torch.randn(1, 1, 6, 16), torch.randn(1, 1, 9, 16)
_, w = scaled_dot_product_attention(q, k, torch.randn(1, 1, 9, 16), return_weights=True)
fig, ax = plt.subplots(figsize=(4, 3))
ax.imshow(w[0, 0], cmap="viridis", vmin=0)
ax.set_xlabel("key")
ax.set_ylabel("query")
plt.show()
print("each row adds up to 1:", w.sum(-1))

# %% [markdown]
# aiayn computes this once, for every family: `aiayn.nn.attention.scaled_dot_product_attention`, a reference that
# returns the weights, and torch's fused kernel (`F.scaled_dot_product_attention`) for speed, held equal by tests.

# %%
import torch.nn.functional as F

q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
print("yours == torch's fused kernel:", torch.allclose(attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                                                       atol=1e-6))

# %% [markdown]
# ## See it in a trained model
#
# In the explorer ([docs/inspect.md](../inspect.md)) of the demo model,
# `aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"`, the
# **model view** draws these weights as one heatmap per layer and head; click one to see it large, with each weight
# on hover.
#
# ## Final check

# %%
learn.check_lesson("02", globals())
