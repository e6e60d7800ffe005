"""What a rendered call's prompt lacks that the model saw: a system prompt, tool schemas.

Some agents do not log them: Claude Code writes neither its system prompt nor its tool list to
its session files, so its calls render with no system message and, where the model called a
tool, with no schema of it in the prompt. Such a tree still trains, on a prompt the model never
saw. The renderer marks each call by the gaps its prompt has (:func:`prompt_gaps`), beside its
normalized kinds (:func:`~treeprep.render.coverage.normalized_kinds`), so that deduplication
takes a dropped call's marks out with it; the build counts them per format in the manifest's
``prompt_gaps``, and build, stats and show print one line per format with the options that
supply them (:func:`gap_notes`).

- :data:`NO_SYSTEM_PROMPT`: no message of the prompt has the role ``system`` or ``developer``;
- :data:`NO_TOOL_SCHEMAS`: the call has no tool schemas while its completion calls a tool (a call
  that calls no tool is not marked: a prompt without tools may be what the model saw).

A call whose tool list lacks only some of the tools it calls is counted apart, as
:data:`~treeprep.render.coverage.PARTIAL_TOOLS`.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

#: a call whose prompt holds no system (or developer) message
NO_SYSTEM_PROMPT = "no-system-prompt"
#: a call that calls a tool and was rendered with no tool schemas
NO_TOOL_SCHEMAS = "no-tool-schemas"
#: the kinds above, in the order the notes name them
GAP_KINDS = (NO_SYSTEM_PROMPT, NO_TOOL_SCHEMAS)

SYSTEM_ROLES = frozenset({"system", "developer"})


def prompt_gaps(
    messages: list[dict[str, Any]],
    completion: dict[str, Any],
    tools: list[dict] | None,
    *,
    has_system: bool | None = None,
) -> tuple[str, ...]:
    """The gaps of a call's prompt (template messages, completion and tools), as the build
    counts them. ``has_system``: whether a message has a system role, where the caller knows
    (:meth:`~treeprep.render.history.NormalizedHistory.has_system`: a session's calls would
    otherwise scan their whole history's roles, each call).

    >>> call = {"role": "assistant", "tool_calls": [{"function": {"name": "ls"}}]}
    >>> prompt_gaps([{"role": "user", "content": "hi"}], call, None)
    ('no-system-prompt', 'no-tool-schemas')
    >>> prompt_gaps([{"role": "system", "content": "be brief"}], {"content": "ok"}, None)
    ()
    """
    if has_system is None:
        has_system = not SYSTEM_ROLES.isdisjoint(map(dict.get, messages, repeat("role")))  # in C
    no_system = not has_system
    no_tools = not tools and bool(completion.get("tool_calls"))
    return tuple(kind for kind, gap in zip(GAP_KINDS, (no_system, no_tools), strict=True) if gap)


def split_gaps(kinds: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """``kinds`` (a file's normalized counts) as (the normalized kinds, the prompt gaps)."""
    gaps = {k: n for k, n in kinds.items() if k in GAP_KINDS}
    return {k: n for k, n in kinds.items() if k not in GAP_KINDS}, gaps


def given_gaps(gaps: dict[str, dict[str, int]], options: Any) -> list[str]:
    """The kinds of ``gaps`` (``Manifest.prompt_gaps``) the build's ``options``
    (:class:`~treeprep.build.config.FileOptions`) gave an option for: ``--system-prompt``,
    ``--tools``."""
    given = {NO_SYSTEM_PROMPT: options.system_prompt, NO_TOOL_SCHEMAS: options.tools}
    left = {k for kinds in gaps.values() for k, n in kinds.items() if n}
    return [k for k in GAP_KINDS if k in left and given[k] is not None]


#: the option that supplies each gap
_OPTION = {NO_SYSTEM_PROMPT: "--system-prompt", NO_TOOL_SCHEMAS: "--tools"}
_ARG = {NO_SYSTEM_PROMPT: "FILE", NO_TOOL_SCHEMAS: "FILE.json"}
_WHAT = {
    NO_SYSTEM_PROMPT: ("call has no system prompt", "calls have no system prompt"),
    NO_TOOL_SCHEMAS: (
        "call calls tools with no tool schemas in its prompt",
        "calls call tools with no tool schemas in their prompt",
    ),
}


def _what(kinds: list[str], counts: dict[str, int]) -> str:
    return " and ".join(f"{counts[k]:,} {_WHAT[k][counts[k] != 1]}" for k in kinds)


def gap_notes(gaps: dict[str, dict[str, int]], given: list[str] | None = None) -> list[str]:
    """One line per format whose calls in trees have gaps (``Manifest.prompt_gaps``), naming the
    options that supply what the logs lack; a gap the build had an option for (``given``:
    ``Manifest.prompt_given``) is one the format's adapter does not fill from it.

    >>> gaps = {"claude-code": {"no-system-prompt": 12, "no-tool-schemas": 8}}
    >>> print(*gap_notes(gaps))  # doctest: +NORMALIZE_WHITESPACE
    claude-code: 12 calls have no system prompt and 8 calls call tools with no tool schemas in
    their prompt (the logs hold none, so they train on prompts the model never saw): rebuild with
    --system-prompt FILE --tools FILE.json, the agent's own as it sent them
    >>> given = ["no-system-prompt"]
    >>> print(*gap_notes({"sharegpt": {"no-system-prompt": 1}}, given))  # doctest: +ELLIPSIS
    sharegpt: 1 call has no system prompt, and this format takes none from --system-prompt: ...
    """
    notes = []
    for fmt, counts in sorted(gaps.items()):
        kinds = [k for k in GAP_KINDS if counts.get(k)]
        missing = [k for k in kinds if k not in (given or ())]
        if missing:
            what = _what(missing, counts)
            options = " ".join(f"{_OPTION[k]} {_ARG[k]}" for k in missing)
            notes.append(
                f"{fmt}: {what} (the logs hold none, so they train on prompts the model never "
                f"saw): rebuild with {options}, the agent's own as it sent them"
            )
        if ignored := [k for k in kinds if k not in missing]:
            what = _what(ignored, counts)
            options = " or ".join(_OPTION[k] for k in ignored)
            notes.append(
                f"{fmt}: {what}, and this format takes none from {options}: its records are the "
                "prompts as logged: put what is missing in them"
            )
    return notes
