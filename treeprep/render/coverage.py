"""Does the rendered loss span hold what the model said? (the completion's text and tool calls)

A chat template may silently drop part of a completion: DeepSeek-V3's official template renders
tool calls only when ``content`` is null, the Llama 3 template ignores tool calls, gpt-oss's
renders only the first of parallel calls. The call would then train on the end-of-turn token
alone, with the action the model took gone. The renderer therefore checks the text of the loss
span (what follows the generation prompt) and rejects the call when something is missing.

What counts as present, in the order the completion has them:

- the text: the content with surrounding whitespace stripped (templates strip it) appears;
- each tool call: its name appears after the previous call's, and then its arguments do, in one
  of the forms templates print them: the logged string, that string JSON-quoted (``tojson`` of a
  string), the parsed object as ``json.dumps`` writes it (default, compact, ASCII-escaped or
  sorted), or, failing those (templates that print ``<parameter=k>v</parameter>`` or
  ``k=v``), every key and every scalar value of the object, each in its plain or JSON form.

The last form is a weaker test by design: it cannot confuse a template's own markup with an
argument, but it accepts a reordering of the values. Reasoning is not checked: a template without
reasoning support drops it by design, and such logs are common.

Templates normalize whitespace: Qwen3's moves an inline ``<think>...</think>`` out of the text and
strips the newlines around it and at the end. When the text is not found verbatim, it counts as
present if its words (whitespace-separated, the think tags words of their own) appear as one
run of words of the span: only a lost word rejects. Such a call is *normalized*
(:func:`completion_coverage` says so). The build counts normalized calls by kind
(:data:`NORMALIZED_WHITESPACE`, and :data:`NORMALIZED_INLINE_THINK` for a completion whose inline
``<think>`` block the renderer made its reasoning) in the manifest's ``normalized``.

An empty reply is never trained: a completion with no text, no tool call, and no reasoning that
the span shows (Qwen3 renders it as ``<think>\n\n</think>\n\n<|im_end|>``: markup only) is
rejected (:data:`EMPTY_REPLY`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from treeprep.errors import RenderError


def _json_forms(obj: Any) -> Iterator[str]:
    yield json.dumps(obj, ensure_ascii=False)
    yield json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    yield json.dumps(obj)
    yield json.dumps(obj, ensure_ascii=False, sort_keys=True)
    yield json.dumps(obj, ensure_ascii=False, indent=2)


def _argument_forms(args: str | dict[str, Any]) -> tuple[list[str], Any]:
    """Whole forms of the arguments, and the parsed object (None when not JSON)."""
    forms: list[str] = []
    parsed: Any = None
    if isinstance(args, str):
        forms.append(args)
        forms.append(json.dumps(args, ensure_ascii=False)[1:-1])  # tojson of the string
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
    else:
        parsed = args
    if parsed is not None:
        forms.extend(_json_forms(parsed))
    return [f for f in forms if f], parsed


def _leaves(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def _scalar_present(v: Any, text: str) -> bool:
    if v is None or v == "":
        return True
    if isinstance(v, str):
        return v in text or json.dumps(v, ensure_ascii=False)[1:-1] in text or v.strip() in text
    if isinstance(v, bool):
        return json.dumps(v) in text or str(v) in text
    return json.dumps(v) in text or str(v) in text


#: the reject reason of a call whose trained reply holds nothing the model said
EMPTY_REPLY = (
    "the completion is empty (no text, no tool call and no reasoning in the rendered loss span), "
    "so training would teach an empty reply"
)

#: the kinds of normalized calls the build counts (``Manifest.normalized``): the completion's text
#: was found in the loss span only modulo the template's whitespace normalization; the completion
#: opened with an inline ``<think>`` block that became its reasoning
NORMALIZED_WHITESPACE = "whitespace"
NORMALIZED_INLINE_THINK = "inline-think"
#: counted beside them, though nothing is changed: the call's tool list is partial (its completion
#: calls a tool the schemas do not declare, like Codex's built-ins next to its dynamic tools), so
#: the prompt lacks a schema the model saw; ``--tools`` gives the whole list
PARTIAL_TOOLS = "partial-tools"


def normalized_kinds(
    inline_think: bool, whitespace: bool, partial_tools: bool = False
) -> tuple[str, ...]:
    """The kinds a rendered call was normalized by, as the build counts them."""
    kinds = (
        (NORMALIZED_INLINE_THINK, inline_think),
        (NORMALIZED_WHITESPACE, whitespace),
        (PARTIAL_TOOLS, partial_tools),
    )
    return tuple(kind for kind, done in kinds if done)


def _schema(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's function schema: ``function`` when it is an object, else the tool itself."""
    fn = tool.get("function")
    return fn if isinstance(fn, dict) else tool


def undeclared_tools(completion: dict[str, Any], tools: list[dict[str, Any]] | None) -> bool:
    """Whether ``tools`` (a non-empty schema list) lacks a tool the completion calls.

    >>> tool = {"type": "function", "function": {"name": "ls"}}
    >>> call = {"tool_calls": [{"function": {"name": "exec_command"}}]}
    >>> undeclared_tools(call, [tool]), undeclared_tools(call, None)
    (True, False)
    """
    if not tools:
        return False
    declared = {str(_schema(t).get("name")) for t in tools if isinstance(t, dict)}
    return any(tc["function"]["name"] not in declared for tc in completion.get("tool_calls") or [])


_TAG = re.compile(r"(</?think>)")


def _words(text: str) -> list[str]:
    return _TAG.sub(r" \1 ", text).split()


def _words_present(text: str, span: str) -> bool:
    """Do the words of ``text`` appear as one run of the words of ``span``? (each run of
    whitespace read as one space, so a template's markup may follow the last word directly)"""
    return " ".join(_words(text)) in " ".join(_words(span))


def _is_empty(completion: dict[str, Any], span: str) -> bool:
    """No tool call, no words in the text (think tags are markup: a text of empty think blocks
    says nothing), and no reasoning that the span shows."""
    content = completion.get("content") or ""
    if completion.get("tool_calls") or (isinstance(content, str) and _TAG.sub("", content).strip()):
        return False
    reasoning = completion.get("reasoning_content")
    return not (isinstance(reasoning, str) and reasoning.strip() and reasoning.strip() in span)


def dropped_error(completion: dict[str, Any], missing: str) -> RenderError:
    """The error of a call whose loss span lacks ``missing`` (what :func:`completion_coverage`
    found), with the options that render it whole."""
    if missing == EMPTY_REPLY:
        return RenderError(EMPTY_REPLY)
    parallel = len(completion.get("tool_calls") or []) > 1 and missing.startswith(
        ("tool call", "the arguments of tool call")
    )
    split = (
        "; or --parallel-calls split, which renders the parallel calls as consecutive "
        "single-call turns"
    )
    return RenderError(
        f"the chat template drops part of the completion: {missing} in the rendered loss span, "
        "so training would miss what the model said (render with a template that keeps it: "
        f"--chat-template FILE{split if parallel else ''})"
    )


def completion_coverage(completion: dict[str, Any], span: str) -> tuple[str | None, bool]:
    """(what is missing, as :func:`completion_loss` says; was the text found only modulo the
    template's whitespace normalization?)"""
    if _is_empty(completion, span):
        return EMPTY_REPLY, False
    content = completion.get("content") or ""
    normalized = False
    if isinstance(content, str) and content.strip() and content.strip() not in span:
        if not _words_present(content, span):
            return "the completion's text does not appear", False
        normalized = True
    return _tool_calls_missing(completion, span), normalized


def inline_think_missing(completion: dict[str, Any], span: str) -> str | None:
    """What is missing when a completion's inline ``<think>`` block, made its reasoning
    (:func:`~treeprep.render.messages.split_inline_think`), is not in ``span``: the model wrote
    the block in its text, so a template that does not show ``reasoning_content`` (Qwen2.5's)
    would train the reply without it. None when the span shows its words.

    >>> inline_think_missing({"reasoning_content": "Add them."}, "<think>Add them.</think>4")
    >>> inline_think_missing({"reasoning_content": "Add them."}, "4")
    "the completion's inline <think> block does not appear"
    """
    reasoning = completion.get("reasoning_content") or ""
    if not reasoning.strip() or _words_present(reasoning, span):
        return None
    return "the completion's inline <think> block does not appear"


def completion_loss(completion: dict[str, Any], span: str) -> str | None:
    """What of ``completion`` (a normalized assistant message) is missing from ``span``, the text
    of the rendered loss span, as a phrase for the reject reason; None when nothing is."""
    return completion_coverage(completion, span)[0]


def _tool_calls_missing(completion: dict[str, Any], span: str) -> str | None:
    pos = 0
    calls = completion.get("tool_calls") or []
    for i, tc in enumerate(calls):
        fn = tc.get("function") or {}
        name = fn.get("name") or ""
        what = f"tool call {i + 1} of {len(calls)} ({name!r})"
        at = span.find(name, pos) if name else pos
        if at < 0:
            return f"{what} does not appear"
        after = at + len(name)
        forms, parsed = _argument_forms(fn.get("arguments", ""))
        found = -1
        for f in forms:
            j = span.find(f, after)
            if j >= 0:
                found = j + len(f)
                break
        if found < 0:
            if parsed is None or not all(_scalar_present(v, span[after:]) for v in _leaves(parsed)):
                return f"the arguments of {what} do not appear"
            found = after
        pos = found
    return None
