"""How the user started this process's ``aiayn``, so that a printed command can be copied and run as it is."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

#: set by ``aiayn train --nproc N`` for its ranks: the command that resumes the run, as the user would type it
RESUME_COMMAND_VAR = "AIAYN_RESUME_COMMAND"


def program() -> str:
    """The command that runs aiayn as the user typed it: ``aiayn`` when that name on PATH is this program, else its
    path as given (``.venv/bin/aiayn``), ``python -m aiayn`` for the module, ``torchrun ... -m aiayn`` for a rank
    that torchrun started (with torchrun's own options to repeat), and ``aiayn`` inside another program."""
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:  # a rank started by torchrun, whose options it does not see
        return "torchrun ... -m aiayn"
    arg0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    path = Path(arg0)
    if path.name == "aiayn":
        return _as_typed(arg0, "aiayn")
    if path.name == "__main__.py" and path.parent.name == "aiayn":
        return shlex.join([_as_typed(sys.executable, Path(sys.executable).name), "-m", "aiayn"])
    return "aiayn"


def _as_typed(path: str, name: str) -> str:
    """``name`` when PATH finds this very file under it, else ``path`` (quoted for a shell)."""
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(path):
        return name
    return shlex.quote(path)


def command(*args: str) -> str:
    """``program()`` followed by ``args``, quoted for a shell."""
    return " ".join([program(), *(shlex.quote(a) for a in args)])
