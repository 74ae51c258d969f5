# Lesson 09 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 09: training the copy task, then the translation demo
#
# Everything is in place: attention, masks, heads, positions, the block, the stacks and decoding. Training needs
# three more things from the paper: the loss (cross-entropy with **label smoothing**, section 5.4), the optimizer
# (Adam with β = (0.9, 0.98), ε = 10⁻⁹) and the **learning-rate schedule** (equation 3). Then a Transformer made of
# **your** pieces learns its first task: copying random sequences of symbols, the Annotated Transformer's first
# experiment.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from aiayn import learn

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## The schedule (equation 3)
#
# $$lrate = d_{model}^{-0.5} \cdot \min(step^{-0.5},\; step \cdot warmup^{-1.5})$$
#
# The rate grows linearly for `warmup` steps (4000 in the paper), then decays as 1/√step. At step = warmup the two
# terms are equal: the peak. Early on, Adam's statistics are poor and the post-LN network is fragile; a small rate
# protects it.
#
# ### Exercise: `noam_lr(step, d_model, warmup)`
#
# Steps count from 1.

# %%
def noam_lr(step, d_model, warmup):
    # BEGIN SOLUTION
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    # END SOLUTION


# %%
learn.check("noam_lr", noam_lr)

# %%
steps = range(1, 40_001, 50)
fig, ax = plt.subplots(figsize=(5, 2.8))
for d_model, warmup in ((512, 4000), (512, 8000), (256, 4000)):
    ax.plot(steps, [noam_lr(s, d_model, warmup) for s in steps], label=f"d_model {d_model}, warmup {warmup}")
ax.set_xlabel("step")
ax.set_ylabel("learning rate")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Label smoothing (section 5.4)
#
# Instead of the one-hot target, the model is trained towards (1 - ε) on the right token plus ε spread evenly over
# the whole vocabulary (ε = 0.1). It "hurts perplexity, as the model learns to be more unsure, but improves accuracy
# and BLEU". aiayn's convention is PyTorch's: ε/V on each of the V classes, the right one included. Positions whose
# label is -100 (padding) never count, and the loss is their mean.
#
# ### Exercise: `label_smoothed_loss(logits, labels, epsilon)`
#
# logits (N, V), labels (N,) with -100 where ignored; return the 0-d mean over the counted positions of
# (1 - ε)·(-log p[label]) + ε·mean over the vocabulary of (-log p).

# %%
def label_smoothed_loss(logits, labels, epsilon):
    # BEGIN SOLUTION
    logp = torch.log_softmax(logits, dim=-1)  # (N, V)
    counted = labels != -100
    nll = -logp.gather(-1, labels.clamp(min=0)[:, None])[:, 0]  # (N,)
    smooth = -logp.mean(dim=-1)  # (N,)
    loss = (1 - epsilon) * nll + epsilon * smooth
    return loss[counted].mean()
    # END SOLUTION


# %%
learn.check("label_smoothed_loss", label_smoothed_loss)

# %%
logits, labels = torch.randn(6, 10), torch.tensor([1, 4, -100, 7, 0, -100])
print("yours:", float(label_smoothed_loss(logits, labels, 0.1)),
      " torch's:", float(F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1)))

# %% [markdown]
# ## Your Transformer learns to copy
#
# `learn.assemble` builds a small aiayn encoder-decoder (1 + 1 layers, width 32, 2 heads) whose pieces are **yours**
# wherever you give one: `masked_attention`, `causal_mask`, `split_heads`, `merge_heads`, `sinusoidal`,
# `feed_forward`, `sublayer`, and for training `noam_lr` (times 0.1, warmup 40) and `label_smoothed_loss`; aiayn's
# own pieces fill in the rest. It checks each piece, trains 300 steps on random sequences of 6 symbols out of 8,
# and decodes 200 held-out ones greedily.
#
# Here it takes this notebook's two functions from `globals()`. With all your pieces in one file, say
# `my_transformer.py`, run `learn.assemble(my_transformer)` after `import my_transformer`, or in a terminal
# `aiayn learn assemble my_transformer.py`.

# %%
mine = learn.assemble(globals())
mine

# %% [markdown]
# ## A Transformer that cheats
#
# Now one broken piece: a causal mask off by one, which lets every position also see the next token, exactly the
# token it must predict. The check names the mistake; see what training does with it.

# %%
def peeking_causal_mask(t, s=None):
    s = t if s is None else s
    return torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None] + 1  # one too many


cheat = learn.assemble(globals(), causal_mask=peeking_causal_mask)
cheat

# %%
fig, ax = plt.subplots(figsize=(5, 2.8))
mine.plot(ax)
cheat.plot(ax)
ax.legend([f"your pieces: {mine.exact_match:.0%} copied", f"peeking mask: {cheat.exact_match:.0%} copied"])
ax.set_title("training loss")
plt.show()

# %% [markdown]
# The cheating model's training loss falls **faster** than the honest one's, to the floor label smoothing allows:
# it simply reads the answer. At generation time there is no next token to read, and it copies nothing. A training
# curve alone would never have told you; the check, and decoding held-out data, do.
#
# ## The translation demo
#
# The same machinery at a larger scale: `make demo` (or `aiayn demo`) trains a Transformer to translate a synthetic
# English-to-German grammar in about two minutes on two CPU cores, reaching about 97% exact match on held-out
# sentences, then prints beam-search translations and saves the model in `runs/demo/best` with its learning curve
# (`runs/demo/learning_curve.png`). Set `RUN_DEMO = True` to run it from here.

# %%
RUN_DEMO = False
if RUN_DEMO:
    from aiayn.demos.translation import run_translation_demo

    run_translation_demo()  # writes runs/demo under the current folder

# %% [markdown]
# ## See it in a trained model
#
# After `make demo`, the explorer ([docs/inspect.md](../inspect.md)) shows what the trained translator computes: its
# **output** (the beam-search translation and its score) and the **alignment** its cross-attention learned:
# `aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball"`.
#
# ## Final check

# %%
learn.check_lesson("09", globals())
