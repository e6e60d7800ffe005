"""Which files a build reads: files, folders and globs in, each input file once, named stably.

:func:`discover_inputs` is the one walk over the command line's paths. It follows symbolic links
to folders once each (a link loop or a second link to one folder is not walked again), skips
hidden files and folders, and lists every file once however many paths reach it (links, a
repeated argument, a glob through a link loop): the others are reported as ``duplicates``, read
once. A file that cannot be read (a dangling link, permissions, a name that is not UTF-8) is kept
with its ``error`` so that the build turns it into a reject rather than crashing.

Names. Every file is named by its path relative to the input root (the deepest folder holding
every named input), ``/``-separated and printable (:func:`printable`): these names reach shards,
manifest and rejects, so that building ``logs`` or ``/abs/path/logs`` gives the same bytes.
The trade-off: a file's identity is its (device, inode) pair, which is exact on one machine and
costs one ``stat`` per file; a copy of a file under another name is read twice, as it should be.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from treeprep.errors import InputError

__all__ = ["InputFile", "InputSet", "discover_inputs", "expand_inputs", "printable"]


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def printable(path: str) -> str:
    """``path`` as valid UTF-8 text: bytes of a non-UTF-8 file name (held by Python as lone
    surrogates) are written as ``\\xNN`` escapes, so the name can go into JSON and Arrow."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass
class InputFile:
    """One input file: where to open it, and the name that stands for it in every output."""

    #: the path to open (as found: relative or absolute, through links)
    path: str
    #: the path relative to the input root, ``/``-separated, printable: what reaches shards,
    #: manifest and rejects, so the same inputs give the same bytes wherever they lie
    name: str
    #: named as a file on the command line (not found inside a folder or by a glob)
    explicit: bool
    #: why the file cannot be read (dangling link, permission, non-UTF-8 name): a reject
    error: str | None = None


@dataclass
class InputSet:
    """The files of a build, each once, and what was left out on the way."""

    files: list[InputFile]
    #: (name, name of the file it is the same file as): a second path to one file, read once
    duplicates: list[tuple[str, str]]


def _walk(folder: str, seen_dirs: set[tuple[int, int]], bad: list[tuple[str, str]]) -> list[str]:
    """Every non-hidden file under ``folder``, following symbolic links to folders once each (a
    link loop or a second link to one folder is not walked again). Folders that cannot be listed
    go to ``bad`` as (path, reason); dangling links are returned like files (they become
    rejects when opened)."""
    found: list[str] = []

    def onerror(e: OSError) -> None:
        bad.append((e.filename or folder, f"cannot list folder: {e.strerror or e}"))

    for root, dirs, files in os.walk(folder, onerror=onerror, followlinks=True):
        keep = []
        for d in sorted(dirs):
            if _is_hidden(d):
                continue
            try:
                st = os.stat(os.path.join(root, d))
            except OSError as e:
                bad.append((os.path.join(root, d), f"cannot open folder: {e.strerror or e}"))
                continue
            if (st.st_dev, st.st_ino) in seen_dirs:
                continue  # a link loop, or a folder reached twice: its files are listed once
            seen_dirs.add((st.st_dev, st.st_ino))
            keep.append(d)
        dirs[:] = keep
        found.extend(os.path.join(root, f) for f in sorted(files) if not _is_hidden(f))
    return found


def _through_loop(path: str) -> bool:
    """Whether two folders on ``path`` are one folder (the path went round a link loop)."""
    seen: set[str] = set()
    d = os.path.dirname(os.path.abspath(path))
    while True:
        real = os.path.realpath(d)
        if real in seen:
            return True
        seen.add(real)
        parent = os.path.dirname(d)
        if parent == d:
            return False
        d = parent


def _glob_base(spec: str) -> str:
    """The folder part of a glob before its first wildcard."""
    parts = spec.split(os.sep)
    plain = []
    for part in parts:
        if glob.has_magic(part):
            break
        plain.append(part)
    base = os.sep.join(plain)
    return base if os.path.isdir(base) else (os.path.dirname(base) or ".")


def _file_error(path: str) -> str | None:
    """Why ``path`` cannot be read as an input file, or None."""
    try:
        printable_ok = path.encode("utf-8") is not None
    except UnicodeEncodeError:
        printable_ok = False
    if not printable_ok:
        return "file name is not valid UTF-8 (rename the file)"
    if os.path.islink(path) and not os.path.exists(path):
        return f"dangling symbolic link (to {printable(os.readlink(path))})"
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        return f"cannot open: {e.strerror or e}"
    return None


def discover_inputs(specs: list[str]) -> InputSet:
    """Files, folders (recursive, links followed once) and globs -> the build's input files.

    Every file is listed once however many paths reach it (links, a repeated argument, a glob
    through a link loop): the others are reported in ``duplicates``. Files that cannot be read
    are kept with their ``error`` (they become rejects, not a crash). Names are relative to the
    input root, the deepest folder holding every named input, so building ``logs`` or
    ``/abs/path/logs`` gives the same names. Hidden files and folders are skipped.
    """
    found: list[tuple[str, bool]] = []
    bases: list[str] = []
    bad: list[tuple[str, str]] = []
    seen_dirs: set[tuple[int, int]] = set()
    for spec in specs:
        if os.path.isdir(spec):
            st = os.stat(spec)
            seen_dirs.add((st.st_dev, st.st_ino))
            files = _walk(spec, seen_dirs, bad)
            if not files and not any(p.startswith(spec) for p, _ in bad):
                raise InputError(printable(spec), 0, "folder holds no files")
            found.extend((f, False) for f in files)
            bases.append(spec)
        elif os.path.isfile(spec) or os.path.islink(spec):
            found.append((spec, True))
            bases.append(os.path.dirname(spec) or ".")
        else:
            matches = sorted(glob.glob(spec, recursive=True)) if glob.has_magic(spec) else []
            n = 0
            for m in matches:
                if _through_loop(m):
                    continue  # ``**`` followed a link back into a folder above it
                if os.path.isdir(m):
                    files = _walk(m, seen_dirs, bad)
                    found.extend((f, False) for f in files)
                    n += len(files)
                else:
                    found.append((m, False))
                    n += 1
            if n == 0:
                raise InputError(printable(spec), 0, "no such file or folder")
            bases.append(_glob_base(spec))
    root = os.path.commonpath([os.path.abspath(b) for b in bases])

    def name_of(path: str) -> str:
        return printable(os.path.relpath(os.path.abspath(path), root)).replace(os.sep, "/")

    by_name: dict[str, InputFile] = {}
    for path, explicit in found:
        name = name_of(path)
        have = by_name.get(name)
        if have is not None:
            have.explicit = have.explicit or explicit
            continue
        by_name[name] = InputFile(path, name, explicit, _file_error(path))
    for path, reason in bad:
        name = name_of(path)
        by_name.setdefault(name, InputFile(path, name, False, reason))
    unique: list[InputFile] = []
    duplicates: list[tuple[str, str]] = []
    first: dict[tuple[int, int], InputFile] = {}
    for name in sorted(by_name):
        f = by_name[name]
        if f.error is None:
            st = os.stat(f.path)
            same = first.get((st.st_dev, st.st_ino))
            if same is not None:
                same.explicit = same.explicit or f.explicit
                duplicates.append((name, same.name))
                continue
            first[(st.st_dev, st.st_ino)] = f
        unique.append(f)
    return InputSet(unique, duplicates)


def expand_inputs(specs: list[str]) -> list[tuple[str, bool]]:
    """Files, folders (recursive) and globs -> sorted unique ``(path, explicit)`` pairs.

    ``explicit`` is True for a file named as such and False for a file found inside a folder or by
    a glob. Hidden files and folders (a name starting with ``.``) inside a folder are skipped, and
    so are files that cannot be read and second paths to one file (see :func:`discover_inputs`,
    which reports both).

    >>> expand_inputs(["sample_data/tokens.jsonl"])
    [('sample_data/tokens.jsonl', True)]
    """
    found = discover_inputs(specs).files
    return sorted((f.path, f.explicit) for f in found if f.error is None)
