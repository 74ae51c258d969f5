"""Every exercise of the course, by name (the name of the function the learner writes)."""

from __future__ import annotations

from aiayn.learn.checking import Exercise
from aiayn.learn.exercises.block import FEED_FORWARD, SUBLAYER
from aiayn.learn.exercises.decoding import BEAM_STEP, GREEDY_DECODE
from aiayn.learn.exercises.explorer import HEAD_ENTROPY, MEAN_DISTANCE
from aiayn.learn.exercises.heads import MERGE_HEADS, MULTI_HEAD_ATTENTION, SPLIT_HEADS
from aiayn.learn.exercises.lookup import ATTENTION, SOFT_LOOKUP
from aiayn.learn.exercises.masking import CAUSAL_MASK, DECODER_MASK, MASKED_ATTENTION
from aiayn.learn.exercises.positions import ROPE, SINUSOIDAL
from aiayn.learn.exercises.stacks import ENCODE, TEACHER_FORCING
from aiayn.learn.exercises.training import LABEL_SMOOTHED_LOSS, NOAM_LR

#: name -> exercise, in the course's order
EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    SOFT_LOOKUP, ATTENTION, CAUSAL_MASK, DECODER_MASK, MASKED_ATTENTION, SPLIT_HEADS, MERGE_HEADS,
    MULTI_HEAD_ATTENTION, SINUSOIDAL, ROPE, FEED_FORWARD, SUBLAYER, TEACHER_FORCING, ENCODE, GREEDY_DECODE, BEAM_STEP,
    NOAM_LR, LABEL_SMOOTHED_LOSS, HEAD_ENTROPY, MEAN_DISTANCE)}

__all__ = ["EXERCISES"]
