"""Curation of a build's records in stage 1, before rendering: filters, redaction, and the
reasoning merge.

* **Filters** (:class:`Filters`): ``--since``/``--until`` (the call's ``timestamp``),
  ``--model-name`` (its ``model``) and ``--project`` (its ``project``, the working directory the
  agent ran in) keep the records that match. A record the filter leaves out is counted as
  *filtered*, by reason, in its file's result and the manifest, never dropped silently; a record
  whose format does not record the field a filter asks about is left out too, with its own
  reason (``no timestamp recorded``), so a filter never lets through what it cannot check.
* **Redaction** (:class:`Redactor`, ``--redact secrets``): every text a call renders (message
  contents, reasoning, tool-call arguments) is scanned with detect-secrets (the ``redact``
  extra) and each secret is replaced by :data:`REDACTED` before rendering. The high-entropy
  string detectors are left out: they take every git hash and checksum for a key. Counts are by
  detector kind (``redacted:AWS Access Key``), once per distinct text of a file (a transcript
  repeats its history in every call's prompt; that is one secret, not one per call). Token
  rollouts (ids only) are not redacted.
* **Reasoning merge** (``--reasoning-merge``): gpt-oss's template refuses an assistant turn with
  text, reasoning and tool calls together, as Claude writes them. ``drop`` removes the reasoning of
  such turns in the history (gpt-oss drops history reasoning anyway); the completion keeps what
  the model said, so a completion with all three is still refused by the template (``fold`` trains
  it). ``fold`` appends the text to the reasoning (gpt-oss's analysis channel), completion
  included; a turn of text and tool calls without reasoning gets its text as the reasoning, which
  is where gpt-oss's template writes it anyway (the response parser reads it back as reasoning,
  so without ``fold`` such a completion is rejected: :mod:`treeprep.render.response`). Each call
  in which a turn changed is counted (``reasoning-merge:drop``); the calls of a session share
  their history's messages (:func:`treeprep.formats._fields.make_call`), up to where a call
  leaves the one before (a retry, a branch), so a turn that later calls repeat is changed, and
  counted, in the first call that carries it. A final answer after such
  turns renders after its generation prompt (:mod:`treeprep.render.prompted`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from treeprep.errors import TreeprepError, install_hint
from treeprep.modes import ReasoningMerge

__all__ = ["REDACTED", "Filters", "Redactor", "merge_reasoning"]

#: what a secret is replaced with
REDACTED = "[REDACTED]"


def _date(value: str | None, what: str) -> datetime | None:
    from treeprep.render.dates import parse_date

    if value is None:
        return None
    d = parse_date(value)
    if d is None:
        raise TreeprepError(f"{what} {value!r}: expected an ISO 8601 date or time")
    return d


@dataclass(frozen=True)
class Filters:
    """Which records a build keeps (None: no filter on that field)."""

    since: str | None = None
    until: str | None = None
    model_name: str | None = None
    project: str | None = None

    def __post_init__(self) -> None:
        _date(self.since, "--since")
        _date(self.until, "--until")

    def __bool__(self) -> bool:
        return any((self.since, self.until, self.model_name, self.project))

    def reason(self, item: Any) -> str | None:
        """Why ``item`` (a ChatCall or TokenRollout) is left out, or None to keep it.

        >>> from types import SimpleNamespace as NS
        >>> f = Filters(since="2025-03-01", model_name="claude-*")
        >>> f.reason(NS(timestamp="2025-04-01T10:00:00Z", model="claude-opus-4"))
        >>> f.reason(NS(timestamp="2025-02-01T10:00:00Z", model="claude-opus-4"))
        'before --since'
        >>> f.reason(NS(timestamp="2025-04-01", model="gpt-5"))
        'model not --model-name'
        """
        from treeprep.render.dates import parse_date

        if self.since or self.until:
            when = parse_date(getattr(item, "timestamp", None))
            if when is None:
                return "no timestamp recorded (--since/--until)"
            since, until = _date(self.since, "--since"), _date(self.until, "--until")
            if since is not None and when < since:
                return "before --since"
            if until is not None and when > until:
                return "after --until"
        if self.model_name:
            model = getattr(item, "model", None)
            if not model:
                return "no model recorded (--model-name)"
            if not (model == self.model_name or fnmatchcase(model, self.model_name)):
                return "model not --model-name"
        if self.project:
            project = getattr(item, "project", None)
            if not project:
                return "no project recorded (--project)"
            under = project.rstrip("/").startswith(self.project.rstrip("/") + "/")
            if not (project == self.project or under or fnmatchcase(project, self.project)):
                return "project not --project"
        return None


# --------------------------------------------------------------------------------------------
# redaction
# --------------------------------------------------------------------------------------------

#: detect-secrets detectors left out: they flag git hashes, checksums and addresses
_NOISY = ("Base64HighEntropyString", "HexHighEntropyString", "IPPublicDetector")
_PRIVATE_KEY = re.compile(
    r"-----BEGIN[A-Z ]*PRIVATE KEY[A-Z ]*-----.*?(?:-----END[A-Z ]*PRIVATE KEY[A-Z ]*-----|\Z)",
    re.S,
)
#: characters a token-like secret is made of: a detector that reports only part of a token
#: (detect-secrets' GitHub detector reports ``ghp``) has its finding widened to the whole run
_TOKEN_CHAR = re.compile(r"[A-Za-z0-9_\-+/=.]")


class Redactor:
    """Replaces secrets in a call's texts (see the module docstring). One per file: its cache
    of texts already scanned, and its counts, are that file's."""

    def __init__(self) -> None:
        try:
            import detect_secrets  # noqa: F401
        except ImportError as e:
            raise TreeprepError(
                f"--redact secrets needs detect-secrets: {install_hint('redact')}"
            ) from e
        self.counts: dict[str, int] = {}
        self._seen: dict[str, str] = {}

    @contextmanager
    def active(self) -> Iterator[Redactor]:
        """detect-secrets' settings (its detectors bar the noisy ones) while scanning."""
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
        from detect_secrets.settings import transient_settings

        detectors: list[type] = list(get_mapping_from_secret_type_to_class().values())
        names = sorted(c.__name__ for c in detectors if c.__name__ not in _NOISY)
        with transient_settings({"plugins_used": [{"name": n} for n in names]}):
            yield self

    def text(self, text: str) -> str:
        """``text`` with its secrets replaced (cached per distinct text)."""
        done = self._seen.get(text)
        if done is None:
            done = self._seen[text] = self._scan(text)
        return done

    def _scan(self, text: str) -> str:
        from detect_secrets.core.scan import scan_line

        if _PRIVATE_KEY.search(text):
            n = len(_PRIVATE_KEY.findall(text))
            self._count("Private Key", n)
            text = _PRIVATE_KEY.sub(REDACTED, text)
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if not line.strip() or len(line) > 100_000:
                continue
            for secret in scan_line(line):
                value = secret.secret_value
                if not value or REDACTED in value or value not in lines[i]:
                    continue
                lines[i], n = _replace_token(lines[i], value)
                self._count(secret.type, n)
        return "\n".join(lines)

    def _count(self, kind: str, n: int) -> None:
        if n:
            key = f"redacted:{kind}"
            self.counts[key] = self.counts.get(key, 0) + n

    def call(self, item: Any) -> None:
        """Redact a ChatCall in place: contents, reasoning and tool-call arguments of every
        message and of the completion."""
        for m in [*item.messages, item.completion]:
            if isinstance(m.content, str):
                m.content = self.text(m.content)
            elif isinstance(m.content, list):
                for part in m.content:
                    if isinstance(part.text, str):
                        part.text = self.text(part.text)
            if m.reasoning_content:
                m.reasoning_content = self.text(m.reasoning_content)
            for tc in m.tool_calls or []:
                tc.function.arguments = self._json(tc.function.arguments)

    def _json(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self._json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._json(v) for v in value]
        return value


def _replace_token(line: str, value: str) -> tuple[str, int]:
    """``line`` with every occurrence of ``value``, widened to the token it is part of when it
    starts one, replaced by :data:`REDACTED`; and the number replaced.

    >>> _replace_token("token ghp_abcd123 end", "ghp")
    ('token [REDACTED] end', 1)
    >>> _replace_token('password = "hunter2"', "hunter2")
    ('password = "[REDACTED]"', 1)
    """
    out: list[str] = []
    i = n = 0
    while (j := line.find(value, i)) >= 0:
        end = j + len(value)
        while end < len(line) and _TOKEN_CHAR.match(line[end]):
            end += 1
        out.append(line[i:j] + REDACTED)
        i, n = end, n + 1
    out.append(line[i:])
    return "".join(out), n


# --------------------------------------------------------------------------------------------
# reasoning merge
# --------------------------------------------------------------------------------------------


def merge_reasoning(item: Any, how: ReasoningMerge) -> bool:
    """Fit the turns of a ChatCall that carry text, reasoning and tool calls together (see the
    module docstring); True when it changed any.

    >>> from treeprep.schemas import ChatCall
    >>> turn = {"role": "assistant", "content": "Let me look.", "reasoning_content": "Check.",
    ...         "tool_calls": [{"function": {"name": "ls", "arguments": "{}"}}]}
    >>> c = ChatCall(call_id="c", messages=[{"role": "user", "content": "hi"}], completion=turn)
    >>> merge_reasoning(c, ReasoningMerge.fold), c.completion.reasoning_content
    (True, 'Check.\\n\\nLet me look.')
    """
    if how is ReasoningMerge.off:
        return False
    changed = False
    turns = item.messages if how is ReasoningMerge.drop else [*item.messages, item.completion]
    for m in turns:
        if m.role != "assistant" or not m.tool_calls:
            continue
        if not m.reasoning_content and how is ReasoningMerge.drop:
            continue
        text = _text_of(m.content)
        if not text:
            continue
        if how is ReasoningMerge.drop:
            m.reasoning_content = None
        else:  # the text after the reasoning, or (no reasoning) as the reasoning
            m.reasoning_content = (
                f"{m.reasoning_content}\n\n{text}" if m.reasoning_content else text
            )
            m.content = None
        changed = True
    return changed


def _text_of(content: Any) -> str | None:
    """The text of a content (its text parts joined, as the renderer joins them, Responses'
    ``output_text`` ones included), or None when it holds other parts (an image) folding would
    lose."""
    from treeprep.render.messages import TEXT_PART_TYPES

    if isinstance(content, str) or content is None:
        return content or ""
    if any(p.type not in TEXT_PART_TYPES or not isinstance(p.text, str) for p in content):
        return None
    return "".join(p.text for p in content)


# --------------------------------------------------------------------------------------------
# the three, as stage 1 runs them on one file
# --------------------------------------------------------------------------------------------


class Curator:
    """One file's curation: :meth:`keep` filters a record and, for a kept ChatCall, merges its
    reasoning and redacts it, counting what it did (``filtered``, ``curated``)."""

    def __init__(self, options: Any) -> None:
        self.filters = Filters(options.since, options.until, options.model_name, options.project)
        self.merge = ReasoningMerge(options.reasoning_merge)
        self.redactor = Redactor() if str(options.redact) == "secrets" else None
        self.filtered: dict[str, int] = {}
        self.curated: dict[str, int] = {}

    @contextmanager
    def active(self) -> Iterator[Curator]:
        """Around the file's records (detect-secrets' settings, when redacting)."""
        if self.redactor is None:
            yield self
            return
        with self.redactor.active():
            yield self
        for kind, n in self.redactor.counts.items():
            self.curated[kind] = self.curated.get(kind, 0) + n

    def keep(self, item: Any) -> bool:
        """False (and counted by reason) when a filter leaves ``item`` out; else True, the
        record merged and redacted in place where asked."""
        if self.filters:
            why = self.filters.reason(item)
            if why is not None:
                self.filtered[why] = self.filtered.get(why, 0) + 1
                return False
        if not hasattr(item, "messages"):  # a token rollout: ids only, nothing to rewrite
            return True
        if merge_reasoning(item, self.merge):
            key = f"reasoning-merge:{self.merge}"
            self.curated[key] = self.curated.get(key, 0) + 1
        if self.redactor is not None:
            self.redactor.call(item)
        return True
