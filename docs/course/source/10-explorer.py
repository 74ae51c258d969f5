# Lesson 10 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 10: looking inside with the explorer
#
# A trained Transformer's attention weights say what each position read to compute its output. aiayn's explorer
# ([docs/inspect.md](../inspect.md)) shows them for any checkpoint: head and model views, the alignment of a
# translation, the masks and positions each attention used, and per-head statistics. This lesson trains the copy
# model of lesson 09, looks inside it with the same tools, and computes two of the explorer's statistics yourself.

# %%
import matplotlib.pyplot as plt
import torch

from aiayn import learn
from aiayn.inspect import capture_attention, inspect_text, show
from aiayn.learn.assemble import copy_config, trained_copy_model
from aiayn.pretrained import Pretrained
from aiayn.tokenize import WordTokenizer

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## A trained model to look at
#
# aiayn's own copy-task model, trained for 300 steps (a few seconds). A word tokenizer names its 8 symbols a .. h,
# so that the explorer can label the tokens; together they make a checkpoint as `aiayn.pretrained.load_pretrained`
# would load it.

# %%
model = trained_copy_model(steps=300)
symbols = WordTokenizer(list("abcdefgh"))  # ids 5 .. 12, after the 5 special tokens
checkpoint = Pretrained(model, copy_config(), {"src": symbols, "tgt": symbols},
                        {"task": "translation", "decode": {"beam": 1}})

# %% [markdown]
# ## Recording the weights
#
# The fast attention kernels return no weights. `capture_attention` gives the chosen attention modules a recorder:
# each forward pass also computes the weights from that pass's own queries and keys, and keeps them, with the mask
# the attention applied.

# %%
src = torch.tensor([[12, 5, 11, 6, 7, 7]])  # h a g b c c
tgt_in = torch.tensor([[1, 12, 5, 11, 6, 7, 7]])  # BOS + the copy
with torch.no_grad(), capture_attention(model) as capture:
    model(src, tgt_in)
cross = capture.kind("cross")[0][-1].weights[0]  # layer 0's last call: (H, T, S)
decoder_self = capture.kind("decoder")[0][-1].weights[0]
tokens_in, tokens_out = list("hagbcc"), ["<s>", *"hagbcc"]

fig, axes = plt.subplots(1, 3, figsize=(9, 2.8))
for ax, w, title, keys in ((axes[0], cross[0], "cross-attention, head 0", tokens_in),
                           (axes[1], cross[1], "cross-attention, head 1", tokens_in),
                           (axes[2], decoder_self.mean(0), "decoder self-attention, mean", tokens_out)):
    ax.imshow(w, cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(len(keys)), keys)
    ax.set_yticks(range(len(tokens_out)), tokens_out)
    ax.set_title(title, fontsize=9)
plt.show()

# %% [markdown]
# To copy, the decoder at position i (which has read BOS and the first i symbols) must find source symbol i: look
# for the diagonal in cross-attention, and in the decoder's causal self-attention for what it uses to know where
# it is.
#
# ## Two statistics of a head
#
# The explorer's **head statistics** summarise each head over an input, averaged over the query rows that attend to
# something (a row with no allowed key is all zeros):
#
# - **entropy**, in bits, -Σⱼ wⱼ log₂ wⱼ: 0 for a head that reads one key, log₂ S for one that spreads evenly;
# - **mean distance**, Σⱼ wᵢⱼ |posᵢ - j|: how far a query looks (self-attention; with T < S queries, the T queries
#   are the last T positions).
#
# ### Exercise: `head_entropy(weights)`
#
# weights (H, T, S) -> (H,), in bits; count 0 · log 0 as 0, and average over the rows whose weights sum to more than
# 0.

# %%
def head_entropy(weights):
    # BEGIN SOLUTION
    w = weights.double()
    per_row = -(w * torch.log2(w.clamp(min=1e-30))).sum(-1)  # (H, T)
    live = w.sum(-1) > 0  # (H, T)
    return (per_row * live).sum(-1) / live.sum(-1).clamp(min=1)
    # END SOLUTION


# %%
learn.check("head_entropy", head_entropy)

# %% [markdown]
# ### Exercise: `mean_distance(weights)`
#
# Self-attention weights (H, T, S), the queries being the last T of the S positions -> (H,).

# %%
def mean_distance(weights):
    # BEGIN SOLUTION
    w = weights.double()
    h, t, s = w.shape
    gap = (torch.arange(s - t, s)[:, None] - torch.arange(s)[None, :]).abs().double()  # (T, S)
    per_row = (w * gap).sum(-1)  # (H, T)
    live = w.sum(-1) > 0
    return (per_row * live).sum(-1) / live.sum(-1).clamp(min=1)
    # END SOLUTION


# %%
learn.check("mean_distance", mean_distance)

# %% [markdown]
# Your statistics of the copy model's heads, next to the explorer's own record of the same input
# (`aiayn.inspect.inspect_text`, what `aiayn inspect` shows):

# %%
record = inspect_text(checkpoint, "h a g b c c")
print("explorer's output:", record["output"]["text"])
for kind, w in (("cross", cross), ("decoder", decoder_self)):
    explorer = record["stats"][kind][0]  # layer 0: one dict per head
    print(f"{kind:8s} entropy yours {[round(float(e), 3) for e in head_entropy(w)]}, "
          f"explorer's {[round(s['entropy'], 3) for s in explorer]}")
print("decoder  distance yours", [round(float(d), 3) for d in mean_distance(decoder_self)],
      "explorer's", [round(s["distance"], 3) for s in record["stats"]["decoder"][0]])

# %% [markdown]
# ## The explorer itself
#
# In a notebook, `show` displays the explorer for one input (the same page `aiayn inspect` serves); type another
# sequence of a .. h into its box. Its views:
#
# | view | what it shows |
# | --- | --- |
# | output | the translation, its beam and score |
# | head view | every head's attention as lines from each query to the keys it reads (lessons 01, 04) |
# | model view | every layer x head as a heatmap (lesson 02) |
# | alignment | cross-attention averaged over heads (lesson 07) |
# | masks | the mask each attention applied (lesson 03) |
# | positions | the position scheme (lesson 05) |
# | head statistics | entropy, distance, weight on the first token (this lesson) |

# %%
show(checkpoint, "h a g b c c")

# %% [markdown]
# For a checkpoint on disk, the same from a terminal (after `make demo`):
#
# ```
# aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"
# aiayn inspect --checkpoint runs/demo/best --text "..." --html explorer.html   # one offline file
# aiayn inspect --checkpoint runs/demo/best --text "..." --png pictures/         # matplotlib pictures
# ```
#
# ## Final check
#
# This is the last lesson. With every lesson passed, `aiayn learn status` says so; `aiayn learn assemble
# my_transformer.py` trains a Transformer made of all your pieces.

# %%
learn.check_lesson("10", globals())
