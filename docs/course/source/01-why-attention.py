# Lesson 01 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 01: why attention, the path length problem
#
# A translation model must connect words that are far apart: the verb at the end of a German clause depends on the
# subject at its start. This lesson measures how far information has to travel inside three kinds of layers, and
# then builds the one that needs a single step: a **soft dictionary lookup**, the heart of attention.
#
# **How the course works.** Each exercise asks for a function. The cell holding it has a solution between
# `# BEGIN SOLUTION` and `# END SOLUTION`, so that this notebook runs top to bottom; `aiayn learn start ~/course`
# copies the notebooks with the solutions blanked, for you to write. The cell after each exercise runs
# `learn.check(name, fn)`: your function against aiayn's reference, on random shapes and on the edge cases that catch
# real mistakes. A wrong answer gets a diagnosis, not just "wrong". The last cell of a lesson is its final check; a
# lesson needs the ones before it (`aiayn learn status` shows where you are).

# %%
import math

import matplotlib.pyplot as plt
import torch

from aiayn import learn

torch.manual_seed(0)
torch.set_num_threads(1)  # the course's tensors are tiny: one thread is the fastest

# %% [markdown]
# ## How far apart are two positions?
#
# Table 1 of the paper compares layers by their **maximum path length**: the number of steps a signal takes from one
# position to another.
#
# | layer | operations per layer | sequential steps | maximum path length |
# | --- | --- | --- | --- |
# | self-attention | O(n² d) | O(1) | O(1) |
# | recurrent | O(n d²) | O(n) | O(n) |
# | convolutional (kernel k) | O(k n d²) | O(1) | O(log_k n) |
#
# A recurrent network reads one token per step, so the first token reaches the last through n steps, each of which
# can shrink (or blow up) the signal. Measure it: the gradient of a random RNN's last output with respect to each
# input, against one attention layer's.

# %%
n, d = 40, 16
x = torch.randn(1, n, d, requires_grad=True)

rnn = torch.nn.RNN(d, d, batch_first=True)
rnn(x)[0][0, -1].sum().backward()
rnn_reach = x.grad[0].norm(dim=-1).clone()

x.grad = None
attn = torch.nn.MultiheadAttention(d, 2, batch_first=True)
attn(x, x, x)[0][0, -1].sum().backward()
attn_reach = x.grad[0].norm(dim=-1).clone()

fig, ax = plt.subplots(figsize=(5, 2.8))
ax.semilogy(range(n), rnn_reach.detach(), label="recurrent")
ax.semilogy(range(n), attn_reach.detach(), label="self-attention")
ax.set_xlabel("input position")
ax.set_ylabel("|d out[last] / d x[pos]|")
ax.set_title("how much the last output feels each input")
ax.legend()
plt.show()

# %% [markdown]
# The recurrent network barely feels the first inputs: their influence fades step after step. One attention layer
# connects the last position to every input directly. The price is the O(n²) comparisons of every query with every
# key, paid in parallel: there are no sequential steps.
#
# ## Attention is a soft dictionary lookup
#
# A Python dict returns the value whose key equals the query exactly. Attention compares the query with **every**
# key (a dot product: large when they point the same way), turns the scores into weights with a softmax (positive,
# adding up to 1), and returns the weighted mix of the values:
#
# $$\mathrm{lookup}(q, K, V) = \mathrm{softmax}(K q)\, V$$
#
# Because every value contributes a little, the result changes smoothly with the query and the keys, and gradient
# descent can learn what to look up.

# %% [markdown]
# ### Exercise: `soft_lookup(query, keys, values)`
#
# `query` has shape (Dk,), `keys` (S, Dk), `values` (S, Dv); return the (Dv,) mix `softmax(keys @ query) @ values`.
# No scaling yet: that is lesson 02.

# %%
def soft_lookup(query, keys, values):
    # BEGIN SOLUTION
    scores = keys @ query  # (S,): how well each key matches
    weights = torch.softmax(scores, dim=-1)  # (S,): positive, adding up to 1
    return weights @ values  # (Dv,)
    # END SOLUTION


# %%
learn.check("soft_lookup", soft_lookup)

# %% [markdown]
# A check that fails says why. Here is a lookup that takes only the best match, as a dict would:

# %%
def hard_lookup(query, keys, values):
    return values[(keys @ query).argmax()]


learn.check("soft_lookup", hard_lookup, record=False)

# %% [markdown]
# ### From soft to hard
#
# Multiply the query by a growing factor: the scores spread apart, the softmax sharpens, and the soft lookup becomes
# the hard one. Attention can be as precise as a dict where it must, and as broad as an average where that helps.

# %%
keys = torch.eye(4)
values = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0], [-10.0, 0.0]])
query = torch.tensor([0.1, 0.4, 0.6, 0.0])
sharpness = [0.5, 1, 2, 4, 8, 16, 32]
weights = torch.stack([torch.softmax(keys @ (s * query), dim=-1) for s in sharpness])

fig, ax = plt.subplots(figsize=(5, 2.8))
for j in range(4):
    ax.plot(sharpness, weights[:, j], marker="o", label=f"key {j}")
ax.set_xscale("log", base=2)
ax.set_xlabel("query scale")
ax.set_ylabel("weight")
ax.legend()
plt.show()
print("lookup at scale 32:", soft_lookup(32 * query, keys, values))

# %% [markdown]
# ## See it in a trained model
#
# The attention explorer ([docs/inspect.md](../inspect.md)) shows every attention of a trained model. After
# `make demo` (which trains the translation demo into `runs/demo/best`):
#
# ```
# aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"
# ```
#
# Open its **head view**: each token has lines to every token it reads, all one step away, whatever the distance.
# Hover a token to see only its lines.
#
# ## Final check
#
# The lesson's final check runs every exercise of the lesson on the functions defined here (`globals()`), and marks
# the lesson passed. From a terminal: `aiayn learn check 01 my_transformer.py`.

# %%
learn.check_lesson("01", globals())
