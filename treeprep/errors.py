"""The one error family of treeprep. The CLI catches :class:`TreeprepError` once and exits 1.

Every public error class of the pipeline lives here, so that a caller catches by name without
importing the module that raises it. This module imports nothing: the schemas (the readers of the
contract) and the trainer raise these errors too, and depending on this leaf drags nothing along.
"""

from __future__ import annotations


class TreeprepError(Exception):
    """Base class of every error treeprep raises on purpose."""


class InputError(TreeprepError):
    """Bad input: names the file, the line and what was expected."""

    def __init__(self, file: str, line: int, reason: str) -> None:
        self.file = file
        self.line = line
        self.reason = reason
        super().__init__(f"{file}:{line}: {reason}")


class RecordError(TreeprepError):
    """One record does not fit; the reason becomes a Reject (never escapes an adapter)."""


class TooManyErrors(TreeprepError):
    """More rejects than ``--max-errors`` allows."""


class EmptyBuildError(TreeprepError):
    """No record reached a tree: there is nothing to train on (the rejects say why)."""


class FolderLocked(TreeprepError):
    """A folder another treeprep process holds locked (a build's ``OUT``, a run folder); the
    message names the holder's pid and host (:mod:`treeprep.locks`)."""


class WorkerDied(TreeprepError):
    """A stage-1 worker process died (killed, out of memory) while rendering a file."""


class ShardError(TreeprepError):
    """A shard or manifest that cannot be used (missing, corrupt, other schema version)."""


class RenderError(TreeprepError):
    """A call that cannot be rendered into a training sequence; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class TemplateLimitError(RenderError):
    """A chat template broke one of its limits on a render (time, output size, memory, depth, or
    the time budget of the process): the record is a reject, and probing the template stops."""


class TokenizerError(TreeprepError):
    """A tokenizer folder that cannot be loaded (missing files, no chat template)."""


class NativeTemplateMismatch(TreeprepError):
    """A native template port rendered a record differently from the jinja template: a bug in the
    port (:mod:`treeprep.render.native`), never a bad record, so the build stops."""


class ReplayMismatch(TreeprepError):
    """Claude Code's incremental replay of a thread differs from a whole replay of it: a bug in
    :mod:`treeprep.formats._claude_replay`, never a bad record. The file it was reading ends as
    one ``internal error in adapter`` reject."""


class PackError(TreeprepError):
    """The trees cannot be packed under the given settings (a path longer than the budget)."""


class TrainingError(TreeprepError):
    """Training cannot go on (non-finite loss or gradient, bad configuration)."""


class CheckpointError(TreeprepError):
    """A checkpoint that cannot be used (missing, half written, damaged, for another
    configuration)."""


class ModelRefused(TreeprepError):
    """A model treeprep cannot train exactly on trees (unhandled token mixer, or failed probe)."""


def install_hint(extra: str) -> str:
    """The command that installs an optional extra of treeprep (a checkout: treeprep is not on
    PyPI), for the messages that refuse what a missing extra would do."""
    return f'pip install -e ".[{extra}]" (in your treeprep checkout)'
