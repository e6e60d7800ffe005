"""One table of field-name aliases, shared by every adapter.

Providers and tools spell the same thing differently: the model's reasoning is ``reasoning_content``
(DeepSeek, vLLM, LiteLLM) or ``reasoning`` (OpenRouter, LiteLLM's OpenRouter responses, Ollama);
ShareGPT-style datasets say ``from``/``value`` where OpenAI says ``role``/``content``, and name
roles ``human``/``gpt``/``observation``. Every adapter looks fields up through this module, so a
spelling learnt for one format is learnt for all of them (a mini-swe-agent run through OpenRouter
and a Gemini CLI session both keep their reasoning because ``reasoning`` is listed once, here).

The table is deliberately small and explicit: an alias is added when a real format uses it. A
field present under two spellings with different values is an error, not a silent choice: the
caller turns the :class:`AliasError` into a reject naming both keys.
"""

from __future__ import annotations

from typing import Any

#: canonical message field -> the keys it is read from, in order of preference
FIELDS: dict[str, tuple[str, ...]] = {
    "role": ("role", "from"),
    "content": ("content", "value"),
    "reasoning_content": ("reasoning_content", "reasoning"),
    "tool_calls": ("tool_calls",),
    "tool_call_id": ("tool_call_id",),
}

#: role spellings (ShareGPT, LLaMA-Factory, Axolotl, ms-swift) -> the canonical chat role.
#: ``function_call``/``tool_call`` are assistant turns whose content is a JSON tool call;
#: ``observation``/``tool_response``/``function`` are tool results.
ROLES: dict[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "tool": "tool",
    "observation": "tool",
    "tool_response": "tool",
    "function": "tool",
    "ipython": "tool",
}

#: role spellings whose content is a tool call written as JSON (``{"name", "arguments"}`` or a
#: list of them), not text
TOOL_CALL_ROLES: frozenset[str] = frozenset({"function_call", "tool_call"})


class AliasError(ValueError):
    """A field is given twice under different spellings with different values."""


def get(m: dict[str, Any], field: str) -> Any:
    """The value of ``field`` in ``m`` under any of its spellings (None when absent).

    Two spellings that both carry a value must agree; otherwise :class:`AliasError`.

    >>> get({"reasoning": "hmm"}, "reasoning_content")
    'hmm'
    """
    found: tuple[str, Any] | None = None
    for key in FIELDS[field]:
        v = m.get(key)
        if v is None:
            continue
        if found is None:
            found = (key, v)
        elif found[1] != v:
            raise AliasError(
                f"{found[0]!r} and {key!r} both give the {field} with different values"
            )
    return None if found is None else found[1]


def key_of(m: dict[str, Any], field: str) -> str | None:
    """The spelling under which ``field`` is present in ``m`` (None when absent)."""
    return next((k for k in FIELDS[field] if m.get(k) is not None), None)


def reasoning_of(m: dict[str, Any]) -> str | None:
    """The message's reasoning text under any spelling; a non-string value is an AliasError.

    OpenRouter also sends ``reasoning_details`` (structured, possibly encrypted); the plain text in
    ``reasoning`` is what a chat template renders, so only the string fields are read.
    """
    v = get(m, "reasoning_content")
    if v is None or isinstance(v, str):
        return v
    raise AliasError(f"{key_of(m, 'reasoning_content')}: expected a string, got {type(v).__name__}")


def canonical_role(role: Any) -> str | None:
    """The chat role for a spelling (None when unknown). Tool-call roles map to ``assistant``."""
    if not isinstance(role, str):
        return None
    r = role.strip().lower()
    if r in TOOL_CALL_ROLES:
        return "assistant"
    return ROLES.get(r)
