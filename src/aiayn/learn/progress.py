"""What the learner has passed: a small JSON file, ``progress.json``, in ``$AIAYN_LEARN_HOME`` (default
``$XDG_DATA_HOME/aiayn/learn``, or ``~/.local/share/aiayn/learn``).

``{"format": 1, "exercises": {"attention": "2026-11-28T10:00:00"}, "lessons": {"02": "2026-11-28T10:01:00"}}``:
an exercise is passed when ``aiayn.learn.check`` passed it once; a lesson when its final check passed every one of
its exercises with every earlier lesson passed before.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.errors import AiaynError
from aiayn.files import atomic_write_text, parse_json
from aiayn.learn.lessons import LESSONS, Lesson

ENV_VAR = "AIAYN_LEARN_HOME"
FORMAT = 1


def progress_path() -> Path:
    """Where the progress file is: ``$AIAYN_LEARN_HOME/progress.json``, else under ``$XDG_DATA_HOME`` or
    ``~/.local/share``."""
    home = os.environ.get(ENV_VAR)
    if home:
        return Path(home).expanduser() / "progress.json"
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "aiayn" / "learn" / "progress.json"


@dataclass
class Progress:
    """Passed exercises and lessons, each with the time it was passed (ISO 8601, local time)."""

    exercises: dict[str, str] = field(default_factory=dict)
    lessons: dict[str, str] = field(default_factory=dict)

    def missing_before(self, lesson: Lesson) -> list[Lesson]:
        """The lessons before ``lesson`` that are not passed yet."""
        return [earlier for earlier in LESSONS if earlier.number < lesson.number and earlier.number not in self.lessons]


def load_progress(path: Path | None = None) -> Progress:
    """The progress file's content (empty when there is none).

    Raises:
        AiaynError: the file is not the progress file's JSON (naming it, and the fix).
    """
    path = progress_path() if path is None else path
    if not path.exists():
        return Progress()
    try:
        data = parse_json(path.read_bytes())
        exercises, lessons = data.get("exercises", {}), data.get("lessons", {})
        if not (isinstance(exercises, dict) and isinstance(lessons, dict)
                and all(isinstance(v, str) for v in [*exercises.values(), *lessons.values()])):
            raise ValueError("'exercises' and 'lessons' must map names to times")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
        raise AiaynError(f"{path}: not a course progress file ({e}); delete it to start the course's record again, "
                         f"or set {ENV_VAR} to another folder") from e
    return Progress(dict(exercises), dict(lessons))


def save_progress(progress: Progress, path: Path | None = None) -> Path:
    """Write ``progress`` atomically (the old file or the whole new one, never a part); returns the path."""
    path = progress_path() if path is None else path
    text = json.dumps({"format": FORMAT, "exercises": progress.exercises, "lessons": progress.lessons}, indent=1,
                      sort_keys=True)
    try:
        atomic_write_text(path, text + "\n")
    except OSError as e:
        raise AiaynError(f"{path}: cannot write the course's progress ({e.strerror or e}); set {ENV_VAR} to a "
                         "folder you can write") from e
    return path


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def record_exercise(name: str) -> None:
    """Mark exercise ``name`` passed (keeping the first time it was)."""
    progress = load_progress()
    if name not in progress.exercises:
        progress.exercises[name] = _now()
        save_progress(progress)


def record_lesson(lesson: Lesson) -> None:
    """Mark ``lesson`` passed, and its exercises (keeping the first times)."""
    progress = load_progress()
    for name in lesson.exercises:
        progress.exercises.setdefault(name, _now())
    progress.lessons.setdefault(lesson.number, _now())
    save_progress(progress)
