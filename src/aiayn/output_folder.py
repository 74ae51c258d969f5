"""Where a command may write its output folder, and how it puts its files there without touching anyone else's.

The rule (:func:`check_output_folder`): a command writes into a new folder, an empty folder, or a folder that is
already its own kind of aiayn output, recognised by the manifest aiayn wrote there (never by a bare file name such
as ``config.json``):

- an aiayn checkpoint (``aiayn convert --from-hf``, ``aiayn average``, a sharded export) by its ``manifest.json``
  (:mod:`aiayn.checkpoint.layout`: ``format_version`` and the size and SHA-256 of every file);
- a transformers folder (``aiayn convert --to-hf``) or the pictures of ``aiayn inspect --png`` by
  ``aiayn-output.json``: the kind of output and the size and SHA-256 of every file aiayn wrote.

Any other folder is refused with one :class:`~aiayn.errors.AiaynError` naming it and the flag that allows it
(``--overwrite``). With the flag, and in a folder of the command's own kind that also holds other files, only the
files the command writes are replaced (:func:`merge_into`); nothing else there is changed or removed. A folder
that is, holds or lies inside a source of the command is refused always.

Writing: the command fills a hidden sibling (:func:`staging_folder`, made with the umask's mode, as every other
folder) and :func:`install` puts it in place: renamed into place when the folder is new or holds nothing but the
command's earlier output; otherwise file by file (each an atomic rename), the manifest last.

:func:`check_run_folder` is the rule for ``train.out_dir``: a new run starts in a new or empty folder, or one
holding only what training runs write there.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from aiayn.errors import AiaynError
from aiayn.files import SIDE_FOLDER, BadJSON, fsync_dir, manifest_entries, parse_json, sha256_of, side_name

CHECKPOINT = "aiayn checkpoint"
TRANSFORMERS = "transformers folder"
PICTURES = "pictures folder"
CHECKPOINT_MANIFEST = "manifest.json"  # aiayn.checkpoint.layout.MANIFEST_FILE
MARKER = "aiayn-output.json"  # the manifest of every other kind of output
MARKER_VERSION = 1


def manifest_name(kind: str) -> str:
    """The file that marks a folder as ``kind`` of aiayn output: ``manifest.json`` or ``aiayn-output.json``."""
    return CHECKPOINT_MANIFEST if kind == CHECKPOINT else MARKER


@dataclass(frozen=True)
class OutputFolder:
    """An output folder checked by :func:`check_output_folder`.

    Attributes:
        path: the folder.
        kind: what the command writes there (:data:`CHECKPOINT`, :data:`TRANSFORMERS`, :data:`PICTURES`).
        state: ``new`` (missing), ``empty``, ``own`` (holds this kind's manifest) or ``other`` (allowed by the flag).
        previous: the files the earlier output recorded in its manifest (relative path -> ``{"size", "sha256"}``).
        whole: whether the output replaces the folder as a whole (a rename): it is new, or holds nothing but the
            files of ``previous`` and the manifest; otherwise the files are moved in one by one.
    """

    path: Path
    kind: str
    state: str
    previous: dict[str, dict[str, Any]] = field(default_factory=dict)
    whole: bool = True


def _listed_files(folder: Path, kind: str) -> dict[str, dict[str, Any]] | None:
    """The files listed by ``folder``'s manifest of ``kind``; None when it has none (or not of this kind)."""
    file = folder / manifest_name(kind)
    try:
        if file.is_symlink() or not file.is_file():
            return None
        data = parse_json(file.read_bytes())
    except (OSError, BadJSON):
        return None
    files = manifest_entries(data)
    if files is None or (kind != CHECKPOINT and data.get("aiayn_output") != kind):
        return None
    return files


def _only_listed(folder: Path, listed: set[str]) -> bool:
    """Whether every entry under ``folder`` is a listed file or a folder of listed files (empty folders are not)."""
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        if root != str(folder) and not dirs and not files:
            return False
        for name in files:
            if (rel / name).as_posix() not in listed:
                return False
        for name in dirs:
            if (Path(root) / name).is_symlink():
                return False  # os.walk lists a link to a folder among the folders, and does not enter it
    return True


def _is_within(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def _check_sources(out: Path, sources: Iterable[str | os.PathLike]) -> None:
    here = out.resolve()
    for source in sources:
        src = Path(source)
        there = src.resolve()
        if _is_within(here, there) or _is_within(there, here):
            relation = "is" if here == there else "lies inside" if _is_within(here, there) else "holds"
            raise AiaynError(f"{out}: {relation} the source {src}; a command never writes into its own input: "
                             "choose an output folder outside it")


def check_output_folder(out: str | os.PathLike, kind: str, *, overwrite: bool = False, flag: str = "--overwrite",
                        sources: Iterable[str | os.PathLike] = ()) -> OutputFolder:
    """Check the folder a command is about to write its ``kind`` of output into (see the module docstring).

    Args:
        out: the output folder.
        kind: :data:`CHECKPOINT`, :data:`TRANSFORMERS` or :data:`PICTURES`.
        overwrite: the user's flag: write into a non-empty folder of another kind too (only the command's own
            files are replaced there).
        flag: how the user says ``overwrite`` (named in the refusal).
        sources: the command's input folders; the output may be none of them, nor inside or around one.

    Returns:
        The checked folder, for :func:`install` (or :func:`merge_into`).

    Raises:
        AiaynError: ``out`` cannot be a folder (:func:`folder_problem`: a file, a looping or dangling symbolic link, a
            name too long, ...); it is, holds or lies inside a source; or it is a non-empty folder that is not
            ``kind``'s output and ``overwrite`` is false.
    """
    path = Path(out)
    refuse_unusable(path, "another folder")
    _check_sources(path, sources)
    if not path.exists():
        return OutputFolder(path, kind, "new")
    try:
        entries = sorted(p.name for p in islice(path.iterdir(), 1000))
    except OSError as e:
        raise AiaynError(f"{path}: cannot read the folder ({e.strerror or e}); make it readable for this user, or "
                         "choose another folder") from None
    if not entries:
        return OutputFolder(path, kind, "empty", whole=False)  # filled in place: the user's folder, its mode kept
    previous = _listed_files(path, kind)
    if previous is not None:
        whole = not path.is_symlink() and _only_listed(path, {*previous, manifest_name(kind)})
        return OutputFolder(path, kind, "own", previous, whole)
    if overwrite:
        return OutputFolder(path, kind, "other", whole=False)
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    article = "an" if kind[0] in "aeiou" else "a"
    raise AiaynError(f"{path}: exists, holds {shown}, and no {manifest_name(kind)} of aiayn's marks it as {article} "
                     f"{kind}; refusing to write into it: choose a new or empty folder, or pass {flag} to write the "
                     f"{kind}'s files into it (files of the same names are replaced; nothing else there is changed "
                     "or removed)")


# ------------------------------------------------------------------------------------------- unusable paths


def folder_problem(path: str | os.PathLike) -> tuple[Path, str, str] | None:
    """Why ``path`` cannot be a folder to write into, as ``(the path at fault, the cause, the fix)``; None when it
    is a folder, or is missing and can be made.

    The causes: a file; a symbolic link that loops, or that points to something missing; a name longer than the
    file system allows (255 bytes on most); a path longer than it allows; a file where a folder of the path should
    be; a folder this user may not enter.
    """
    path = Path(path)
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            return None
    except OSError:
        pass
    limit = _limit(path, "PC_NAME_MAX", 255)
    for part in (path, *path.parents):
        size = len(os.fsencode(part.name))
        if size > limit:
            return (part, f"a name in the path is {size} bytes long, over the file system's limit of {limit} "
                          "bytes per name", "shorten that name")
    size, most = len(os.fsencode(os.path.abspath(path))), _limit(path, "PC_PATH_MAX", 4096)
    if size >= most:
        return path, f"the path is {size} bytes long, over the file system's limit of {most - 1}", "shorten it"
    for part in [*reversed(path.parents), path]:
        try:
            st = os.stat(part)
        except FileNotFoundError:
            if not os.path.islink(part):
                return None  # the rest of the path is made
            target = Path(os.path.normpath(part.parent / os.readlink(part)))
            return (part, f"a symbolic link to a missing folder, {target}",
                    f"create that folder (mkdir -p {target}), or remove the link (rm {part})")
        except OSError as e:
            if e.errno == errno.ELOOP:
                return (part, "a symbolic link that loops (it leads back to itself through links)",
                        f"point it at a folder (ln -sfn FOLDER {part}), or remove it (rm {part})")
            if e.errno in (errno.EACCES, errno.EPERM):
                return (part.parent, "this user may not look inside that folder (permission denied)",
                        f"give this user access to it (chmod u+rx {part.parent})")
            if e.errno == errno.ENAMETOOLONG:
                return path, f"the path is {len(os.fsencode(path))} bytes long, too long for the file system", \
                    "shorten it"
            return part, e.strerror or str(e), "check the path"
        if not stat.S_ISDIR(st.st_mode):
            inside = "" if part == path else f", so {path} cannot be made inside it"
            return part, f"is a file, not a folder{inside}", "remove or rename that file"
    return None


def _limit(path: Path, name: str, default: int) -> int:
    """``os.pathconf(name)`` of ``path``'s nearest existing folder; ``default`` where it cannot be asked."""
    for folder in path.parents:
        try:
            return int(os.pathconf(folder, name))
        except (OSError, ValueError, AttributeError):
            continue
    return default


def refuse_unusable(path: Path, other: str) -> None:
    """Raise :func:`folder_problem`'s reason as one :class:`AiaynError`, its fix ending with "or choose ``other``".

    Raises:
        AiaynError: ``<path at fault>: <cause>; <fix>, or choose <other>``.
    """
    problem = folder_problem(path)
    if problem is not None:
        where, cause, fix = problem
        raise AiaynError(f"{where}: {cause}; {fix}, or choose {other}")


# ----------------------------------------------------------------------------------------------------- writing


def staging_folder(out: str | os.PathLike) -> Path:
    """A new hidden sibling ``.<name>.tmp-<host>-<pid>-<random>`` of ``out`` to write the output into (its mode
    as the umask allows, as any folder the user makes; aiayn's savers sweep it up when its process is gone).

    Raises:
        AiaynError: the folder cannot be made (named, with the cause).
    """
    out = Path(out)
    tmp = side_name(out, "tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(tmp)
    except OSError as e:
        raise AiaynError(f"{e.filename or tmp}: cannot create a folder beside {out} ({e.strerror or e}); make "
                         f"{out.parent} writable for this user, or choose another folder") from None
    return tmp


def _files(tmp: Path) -> list[str]:
    """The files under ``tmp`` as relative POSIX paths, sorted."""
    return sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())


def write_marker(tmp: Path, kind: str) -> None:
    """Write ``aiayn-output.json`` into ``tmp``: the kind of output and the size and SHA-256 of every file in it."""
    files = {name: {"size": (tmp / name).stat().st_size, "sha256": sha256_of(tmp / name)}
             for name in _files(tmp) if name != MARKER}
    data = {"aiayn_output": kind, "format_version": MARKER_VERSION, "files": files}
    (tmp / MARKER).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def merge_into(tmp: Path, folder: OutputFolder) -> None:
    """Move every file of ``tmp`` into ``folder.path`` (each an atomic rename, the manifest last), leaving every
    other file there as it is; files the earlier output listed and this one does not write are removed when
    they are still as recorded (size and SHA-256). ``tmp`` is removed.

    Raises:
        AiaynError: a file of ``tmp`` would replace a folder there (nothing is moved then).
        OSError: a rename failed.
    """
    out = folder.path
    marker = manifest_name(folder.kind)
    names = [n for n in _files(tmp) if n != marker]
    for name in [*names, marker]:
        dest = out / name
        ancestors = [out / part for part in reversed(Path(name).parents[:-1])]
        in_the_way = [p for p in ancestors if p.is_symlink() or (p.exists() and not p.is_dir())]
        in_the_way += [dest] if dest.is_dir() and not dest.is_symlink() else []
        if in_the_way:
            here = in_the_way[0]
            raise AiaynError(f"{here}: is in the way of the file {dest} that the {folder.kind} holds; move it "
                             "away, or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    if (out / marker).is_file() or (out / marker).is_symlink():
        os.unlink(out / marker)  # until the new one is in place, no manifest vouches for a half-replaced folder
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / name, out / name)
    for name, entry in folder.previous.items():
        stale = out / name
        if name in names or name == marker or Path(name).is_absolute() or ".." in Path(name).parts:
            continue
        if stale.is_symlink() or not stale.is_file():
            continue
        if stale.stat().st_size == entry.get("size") and sha256_of(stale) == entry.get("sha256"):
            stale.unlink()
            for parent in stale.relative_to(out).parents[:-1]:
                try:
                    (out / parent).rmdir()  # only when empty
                except OSError:
                    break
    if (tmp / marker).is_file():
        os.replace(tmp / marker, out / marker)
    fsync_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)


def install(tmp: Path, folder: OutputFolder) -> Path:
    """Put the output written into ``tmp`` (:func:`staging_folder`) in place at ``folder.path``, with its manifest
    (:func:`write_marker`, for a kind other than a checkpoint, whose manifest the saver writes).

    A new folder, or one holding nothing but the earlier output, is replaced by renaming ``tmp`` into place; any
    other is merged file by file (:func:`merge_into`). ``tmp`` is gone afterwards, also on an error.

    Raises:
        AiaynError: writing failed (named, with the cause), or a file would replace a folder.
    """
    out = folder.path
    try:
        if folder.kind != CHECKPOINT:
            write_marker(tmp, folder.kind)
        if not folder.whole:
            merge_into(tmp, folder)
        elif not out.exists():
            os.rename(tmp, out)
        else:
            trash = side_name(out, "trash")
            os.rename(out, trash)
            try:
                os.rename(tmp, out)
            except BaseException:
                os.rename(trash, out)
                raise
            shutil.rmtree(trash, ignore_errors=True)
        fsync_dir(out.parent)
    except OSError as e:
        raise AiaynError(f"{out}: cannot write the {folder.kind} ({e.strerror or e}); check the disk space and "
                         "permissions (nothing else in the folder was changed)") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------------------- run folders

#: what training writes into ``train.out_dir``: checkpoint folders (and their ``.old`` copies of an interrupted
#: save), the metrics log, the learning curve, the lock, and hidden temporary / trash folders of saves
_RUN_FOLDERS = re.compile(r"^(last|best|averaged|step-\d+)(\.old)?$")
_RUN_FILES = {".lock", ".lock.takeover", "metrics.jsonl", "metrics.csv", "learning_curve.png"}
_RUN_OR_SIDE_FOLDER = re.compile(f"{_RUN_FOLDERS.pattern}|{SIDE_FOLDER.pattern}")


def clear_run_folder(out: str | os.PathLike, extra: tuple[str, ...] = ()) -> None:
    """Empty a run folder for a new run of the same program (a demo run again): its checkpoints, metrics and
    curve, and the ``extra`` files the program writes beside them, after :func:`check_run_folder` found nothing
    else there. A live run's ``.lock`` stays (the new run then stops at it).

    Raises:
        AiaynError: ``out`` holds anything else (named), or is a file.
    """
    path = Path(out)
    check_run_folder(path, extra)
    if not path.is_dir():
        return
    for entry in path.iterdir():
        if entry.name in (".lock", ".lock.takeover"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def check_run_files(out: str | os.PathLike) -> None:
    """Refuse a run folder where a file training writes (``metrics.jsonl``, ``learning_curve.png``, ...) is a
    folder: before any work, rather than when the run writes it.

    Raises:
        AiaynError: naming the folder in the way, or why ``out`` cannot be a folder (:func:`folder_problem`).
    """
    refuse_unusable(Path(out), "another train.out_dir")
    for name in sorted(_RUN_FILES):
        if (Path(out) / name).is_dir():
            raise AiaynError(f"{Path(out) / name}: is a folder, where training writes its {name} file; remove or "
                             "rename the folder, or choose another train.out_dir")


def check_run_folder(out: str | os.PathLike, extra: tuple[str, ...] = ()) -> None:
    """Refuse to start a new training run in a folder that is not a run folder of aiayn's.

    A new run writes ``last/``, ``best/``, ``step-N/``, ``averaged/``, ``metrics.jsonl`` and ``learning_curve.png``
    into ``train.out_dir`` (and prunes old ``step-N/``), so it starts only in a new or empty folder, or in one
    that holds nothing but such entries (and the ``extra`` file names a program writes beside them).

    Raises:
        AiaynError: ``out`` holds anything else (named), or cannot be a folder (:func:`folder_problem`: a file, a
            looping or dangling symbolic link, a name longer than the file system allows, ...).
    """
    path = Path(out)
    refuse_unusable(path, "another train.out_dir")
    if not path.is_dir():
        return
    check_run_files(path)
    foreign = sorted(p.name for p in path.iterdir()
                     if not (p.is_dir() and not p.is_symlink() and _RUN_OR_SIDE_FOLDER.match(p.name))
                     and not (p.is_file() and (p.name in _RUN_FILES or p.name in extra)))
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise AiaynError(f"{path}: exists and is not an aiayn run folder (it holds {shown}); a new run writes "
                         "last/, best/, step-N/ and metrics.jsonl there: choose another train.out_dir (a new or "
                         "empty folder)")
