# Lesson 08 of the aiayn course (percent format: python -m aiayn.learn.notebooks builds the notebook).

# %% [markdown]
# # Lesson 08: greedy and beam decoding with a KV cache
#
# A trained decoder gives a distribution over the next token. Generating means choosing a token, appending it, and
# asking again, until EOS. **Greedy** search takes the most likely token each time; **beam search** (the paper: 4
# beams, length penalty 0.6) keeps the K best partial outputs, so that a good sentence with a less likely first
# word is not lost.
#
# Each step would recompute every earlier position, though nothing about them changed: their keys and values are
# the same at every later step. A **KV cache** keeps them, and each step runs only the newest token through the
# decoder. Step t then costs O(t) (one query over t keys) instead of O(t²).

# %%
import matplotlib.pyplot as plt
import torch

from aiayn import learn
from aiayn.generate import greedy_translate, translate
from aiayn.learn.exercises.decoding import decoding_model

torch.manual_seed(0)
torch.set_num_threads(1)

# %% [markdown]
# ## The model's decoding interface
#
# An aiayn encoder-decoder encodes a source once, `memory, src_is_token, _ = model.encode(src)`; makes an empty
# cache, `cache = model.new_cache(n)`; and gives the next-token logits of new decoder inputs,
# `model.decode(new_ids, memory, src_is_token, cache=cache).logits` of shape (B, t, V), storing their keys and
# values in the cache. The model here is small and random (ids 0 pad, 1 BOS, 2 EOS), set up so that some outputs
# stop at EOS and others run to the length limit.

# %%
model = decoding_model()
src = torch.tensor([[4, 7, 9, 3, 5], [11, 8, 8, 6, 0]])  # the second source is padded
memory, src_is_token, _ = model.encode(src)
cache = model.new_cache(10)
logits = model.decode(torch.tensor([[1], [1]]), memory, src_is_token, cache=cache).logits
print("logits", tuple(logits.shape), "- the cache holds", cache.length, "position(s)")

# %% [markdown]
# ### Exercise: `greedy_decode(model, src, max_len)`
#
# Return one list of ids per source: the argmax at each step, at most `max_len` of them, stopping a sentence at its
# first EOS (not included). Start every sentence from BOS (id 1), use a cache, and feed only the newest token at
# each step. (A sentence that has stopped may go on being fed; just ignore what it produces.)

# %%
def greedy_decode(model, src, max_len):
    # BEGIN SOLUTION
    memory, src_is_token, _ = model.encode(src)
    cache = model.new_cache(max_len + 1)
    token = torch.full((src.shape[0], 1), 1)  # (B, 1): BOS
    outputs, done = [[] for _ in range(src.shape[0])], [False] * src.shape[0]
    for _ in range(max_len):
        logits = model.decode(token, memory, src_is_token, cache=cache).logits  # (B, 1, V)
        token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        for row, t in enumerate(token[:, 0].tolist()):
            if not done[row]:
                done[row] = t == 2
                if not done[row]:
                    outputs[row].append(t)
        if all(done):
            break
    return outputs
    # END SOLUTION


# %%
learn.check("greedy_decode", greedy_decode)

# %% [markdown]
# aiayn's own greedy search, `aiayn.generate.greedy_translate`, is what the check compares with:

# %%
with torch.no_grad():
    print("yours: ", greedy_decode(model, src, 8))
    print("aiayn's:", [h.tokens for h in greedy_translate(model, src, max_len_a=0, max_len_b=8)])

# %% [markdown]
# ## What the cache saves
#
# Without a cache, step t runs all t positions of the prefix through the decoder; with it, one. Count the positions
# a 100-token output costs (aiayn's `aiayn check` holds cached decoding equal to recomputing everything):

# %%
steps = range(1, 101)
fig, ax = plt.subplots(figsize=(5, 2.8))
ax.plot(steps, torch.tensor(list(steps)).cumsum(0), label="without a cache")
ax.plot(steps, steps, label="with a KV cache")
ax.set_xlabel("tokens generated")
ax.set_ylabel("positions run")
ax.legend()
plt.show()

# %% [markdown]
# ## Beam search, one step at a time
#
# Each sentence keeps K beams, each with its score: the sum of its tokens' log-probabilities. At a step, every beam
# proposes every token: K × V candidates per sentence, each scored beam score + log p(token). The best ones survive,
# whichever beams they come from: one beam may supply all of them. Flatten each sentence's (K, V) candidates to
# K·V, take the top k; candidate index i extends beam i // V with token i % V.
#
# ### Exercise: `beam_step(scores, log_probs, k)`
#
# scores (B, K), log_probs (B, K, V); return `(top_scores, beam, token)`, each (B, k), best first.

# %%
def beam_step(scores, log_probs, k):
    # BEGIN SOLUTION
    b, beams, v = log_probs.shape
    candidates = (scores[:, :, None] + log_probs).reshape(b, beams * v)  # (B, K*V)
    top, index = candidates.topk(k, dim=1)  # (B, k), best first
    return top, index // v, index % v
    # END SOLUTION


# %%
learn.check("beam_step", beam_step)

# %% [markdown]
# aiayn's `translate` runs the whole search, ranking finished hypotheses by log-probability divided by the length
# penalty ((5 + |Y|) / 6)^α. Beam search finds outputs at least as likely as greedy's. On this random model the most
# likely output is often the **empty** one (EOS first): beam search finds it where greedy walks past it. Trained
# translation models share this weakness (Stahlberg and Byrne, 2019), which the length penalty (α = 0.6 in the
# paper) partly counters by favouring longer outputs.

# %%
with torch.no_grad():
    probe = torch.randint(3, 12, (4, 5), generator=torch.Generator().manual_seed(3))
    greedy = greedy_translate(model, probe, max_len_a=0, max_len_b=8, alpha=0.0)
    beam = translate(model, probe, beam_size=4, max_len_a=0, max_len_b=8, alpha=0.0)
for g, b in zip(greedy, beam):
    print(f"greedy {g.tokens} log p {g.logprob:.2f}   beam {b[0].tokens} log p {b[0].logprob:.2f}")

# %% [markdown]
# ## See it in a trained model
#
# The explorer's **output** view ([docs/inspect.md](../inspect.md)) shows a translation with its beam and its score;
# `--beam 1` shows the greedy one. After `make demo`:
# `aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the ball" --beam 1`.
#
# ## Final check

# %%
learn.check_lesson("08", globals())
