"""The training loss, as the trainer and the tasks name it: the label-smoothed cross-entropy lives in
:mod:`aiayn.models.losses`, beside the output heads that compute it (:meth:`aiayn.models.heads.LMHead.loss`)."""

from __future__ import annotations

from aiayn.models.losses import IGNORE_INDEX, count_targets, label_smoothed_nll

__all__ = ["IGNORE_INDEX", "count_targets", "label_smoothed_nll"]
