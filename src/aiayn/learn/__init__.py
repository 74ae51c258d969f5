"""Learn the Transformer by rebuilding it: a course of ten notebooks (``docs/course/``) whose exercises are checked
against aiayn's reference, with a diagnosis for every known mistake.

- :func:`check`: one function of yours against aiayn's reference, on random shapes and edge cases; a wrong answer
  gets a diagnosis (the mistake and its fix).
- :func:`check_lesson`: a lesson's final check (every exercise of the lesson; needs the earlier lessons passed).
- :func:`status`: which lessons and exercises are passed (``aiayn learn status``).
- :func:`assemble`: your pieces in a whole aiayn encoder-decoder, trained on the copy task.
"""

from __future__ import annotations

from aiayn.learn.assemble import REFERENCE_PIECES, Assembled, assemble
from aiayn.learn.checking import CheckResult
from aiayn.learn.course import LessonResult, check, check_lesson, status
from aiayn.learn.exercises import EXERCISES
from aiayn.learn.lessons import LESSONS, Lesson, find_lesson

__all__ = ["EXERCISES", "LESSONS", "REFERENCE_PIECES", "Assembled", "CheckResult", "Lesson", "LessonResult",
           "assemble", "check", "check_lesson", "find_lesson", "status"]
