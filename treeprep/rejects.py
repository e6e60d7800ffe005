"""``treeprep rejects``: what a build could not use, summarized.

A build's ``rejects.jsonl`` lists every unusable record (file, line, reason, format). This module
counts them by reason, by file and by format, each with one example (the first in the file), and
adds the records the build's filters and deduplication left out (the manifest's ``filtered``),
which are not rejects but are not in the trees either. Reasons that differ only in numbers
(``messages[3]: ...`` and ``messages[7]: ...``) are one reason: digits are read as ``N`` for
counting; the example keeps the reject as written.

The rejects file is checked against the manifest beside it, which records the sha256 of the
``rejects.jsonl`` the build wrote (``rejects_sha256``) and how many records it rejected: a
``rejects.jsonl`` with other bytes, even holding as many rejects, is another build's (swapped in,
or edited), and is refused rather than shown as this build's. A manifest written before the
digest existed is checked by the count alone.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

import orjson

from treeprep.errors import ShardError
from treeprep.schemas.manifest import load_manifest

__all__ = ["RejectSummary", "summarize_rejects"]

_NUMBER = re.compile(r"\d+")


@dataclass
class Tally:
    """One count and its first example."""

    count: int = 0
    example: dict = field(default_factory=dict)


@dataclass
class RejectSummary:
    """A build's rejects counted three ways, and its filtered records by reason."""

    records_read: int
    records_rejected: int
    records_filtered: int
    by_reason: dict[str, Tally]
    by_file: dict[str, Tally]
    by_format: dict[str, Tally]
    filtered: dict[str, int]

    def to_json(self) -> dict:
        def table(d: dict[str, Tally]) -> list[dict]:
            return [{"key": k, "count": t.count, "example": t.example} for k, t in d.items()]

        return {
            "records_read": self.records_read,
            "records_rejected": self.records_rejected,
            "records_filtered": self.records_filtered,
            "by_reason": table(self.by_reason),
            "by_file": table(self.by_file),
            "by_format": table(self.by_format),
            "filtered": self.filtered,
        }


def reason_key(reason: str) -> str:
    """A reason with its numbers read as N, for counting.

    >>> reason_key("messages[3]: line 12 too long")
    'messages[N]: line N too long'
    """
    return _NUMBER.sub("N", reason)


def summarize_rejects(build_dir: str) -> RejectSummary:
    """The rejects of the finished build in ``build_dir`` (ShardError when there is none), each
    table sorted by count, largest first."""
    manifest = load_manifest(build_dir)
    path = os.path.join(build_dir, "rejects.jsonl")
    by: tuple[dict[str, Tally], dict[str, Tally], dict[str, Tally]] = ({}, {}, {})
    digest, found, bad = hashlib.sha256(), True, None
    try:
        with open(path, "rb") as f:
            for no, line in enumerate(f, 1):
                digest.update(line)
                if bad is not None or not line.strip():
                    continue
                try:
                    rej = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    bad = ShardError(f"{path}:{no}: not a JSON line ({e})")
                    continue  # hashed to the end: another build's file is named as such
                keys = (
                    reason_key(str(rej.get("reason", ""))),
                    str(rej.get("file", "")),
                    str(rej.get("format") or "unknown"),
                )
                for table, key in zip(by, keys, strict=True):
                    tally = table.setdefault(key, Tally(example=rej))
                    tally.count += 1
    except FileNotFoundError:
        found = False  # a build with no rejects file rejected nothing (the count says)
    except OSError as e:
        raise ShardError(f"{path}: cannot read ({e})") from e
    c = manifest.counts
    recorded = manifest.rejects_sha256
    if found and recorded is not None and digest.hexdigest() != recorded:
        raise ShardError(
            f"{path} is not this build's rejects file: its sha256 differs from the "
            f"rejects_sha256 that {os.path.join(build_dir, 'manifest.json')} records (copied in "
            "from another build, or edited); build again to write its own"
        )
    if bad is not None:
        raise bad
    listed = sum(t.count for t in by[0].values())
    if listed != c.records_rejected:
        raise ShardError(
            f"{path} lists {listed:,} rejects, but the build's manifest records "
            f"{c.records_rejected:,}: it is not this build's rejects file (copied in from "
            "another build, or edited); build again to write its own"
        )
    reason, file, fmt = (dict(sorted(t.items(), key=lambda kv: (-kv[1].count, kv[0]))) for t in by)
    return RejectSummary(
        c.records_read,
        c.records_rejected,
        c.records_filtered,
        reason,
        file,
        fmt,
        dict(manifest.filtered),
    )
