"""The one error family of treeprep. The CLI catches :class:`TreeprepError` once and exits 1."""

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


class TooManyErrors(TreeprepError):
    """More rejects than ``--max-errors`` allows."""


class ShardError(TreeprepError):
    """A shard or manifest that cannot be used (missing, corrupt, other schema version)."""


class ModelRefused(TreeprepError):
    """A model treeprep cannot train exactly on trees (unhandled token mixer, or failed probe)."""
