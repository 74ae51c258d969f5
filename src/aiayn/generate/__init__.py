"""Decoding: beam search and greedy translation for encoder-decoder models, greedy and sampled generation for
decoder-only models; one step interface (:mod:`aiayn.generate.steppers`) under every search, which also
lets an ensemble of models (:mod:`aiayn.generate.ensemble`) decode as one."""

from aiayn.generate.beam import beam_search
from aiayn.generate.common import Hypothesis, length_penalty
from aiayn.generate.ensemble import EnsembleStepper
from aiayn.generate.filtering import filter_logits, top_k_filter, top_p_filter
from aiayn.generate.lm import generate, left_pad
from aiayn.generate.sampling import decode_loop, greedy_choice, make_sampler
from aiayn.generate.steppers import LMStepper, Seq2SeqStepper, Stepper
from aiayn.generate.translate import greedy_translate, translate

__all__ = ["EnsembleStepper", "Hypothesis", "LMStepper", "Seq2SeqStepper", "Stepper", "beam_search", "decode_loop",
           "filter_logits", "generate", "greedy_choice", "greedy_translate", "left_pad", "length_penalty",
           "make_sampler", "top_k_filter", "top_p_filter", "translate"]
