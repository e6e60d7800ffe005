"""The model's own response parser: does every trained completion read back as what was logged?

Rendering a call exactly as ``apply_chat_template`` would proves only that the chat form was
rendered; a wrong chat form (arguments kept as a JSON string that gpt-oss's template quotes, a
reply split over two messages) renders exactly too. The independent reference for a completion
is the parser that turns the model's generated text back into a message: transformers'
``parse_response`` (since 5.13) driven by a *response template*, a declarative description of the
model's output format. Every trained completion (the loss span, parsed with the prompt before it
as the parser's prefix) must give back the logged assistant message:

- its text, with surrounding whitespace stripped (templates strip it), or modulo whitespace runs
  where the template normalizes them (:mod:`treeprep.render.coverage` counts such calls);
- its reasoning, where the template keeps it (a template without reasoning drops it by design;
  reasoning read back must equal the logged one);
- its tool calls, in order, by name, with arguments as the object the log holds (a string holding
  one JSON object is that object: :func:`~treeprep.render.messages.tool_arguments`). Arguments
  that are no JSON object (Codex's freeform ``apply_patch`` text) are refused: every parser reads
  a call's arguments as an object, and a template that quotes the text teaches a string literal.

A call that does not read back is rejected with the difference (:meth:`ResponseParser.check`).

Where the response template comes from, first found wins (:func:`find_parser`):

1. the tokenizer's own ``response_template`` (``tokenizer_config.json``, as transformers saves it);
2. TRL's, for templates it knows (``trl.chat_template_utils``: ``add_response_schema`` supplies
   them for models that ship none; the ``parse`` extra installs TRL). Importing that module takes
   about 9 s (it imports torch), so the templates are read from its source as literals instead,
   with :func:`ast.literal_eval` (no TRL code runs); the tests check that this gives exactly
   what ``add_response_schema`` sets. A template is matched to TRL's by its text (one of TRL's
   ``chat_templates/*.jinja`` files), else by its verified native port: the Qwen ChatML family
   (and the built-in byte tokenizer's ChatML template, which writes tool calls the same way)
   parses with TRL's ``qwen3_template``;
3. none: the build says so once, and its manifest has no ``response_parser``.

The parser itself is transformers' (imported at the first check, about 1 s; loading a renderer
never imports transformers).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from treeprep.render.messages import tool_arguments

__all__ = ["ROUND_TRIP", "ResponseParser", "find_parser", "overlap_free"]

#: the kind (manifest ``normalized``) counting calls whose completion was read back
ROUND_TRIP = "round-trip"

#: TRL's chat template files (``trl/chat_templates/<stem>.jinja``) -> the name of its response
#: template for them, as ``add_response_schema`` pairs them (checked by the tests)
_TRL_BY_JINJA = {
    "qwen2_5": "qwen3_template",
    "qwen3": "qwen3_template",
    "qwen3_instruct_2507": "qwen3_template",
    "qwen3_vl": "qwen3_template",
    "gptoss": "gptoss_template",
    "llama3_1": "llama3_template",
    "llama3_2": "llama3_template",
    "glm4moe": "glm4moe_template",
    "deepseek_r1_distill": "deepseek_r1_distill_template",
}

#: treeprep's verified native ports (:mod:`treeprep.render.native`) -> TRL's response template
#: for their family (a template revision TRL does not ship writes its output the same way)
_TRL_BY_PORT = {
    "qwen3": "qwen3_template",
    "qwen2_5": "qwen3_template",
    "qwen3_instruct_2507": "qwen3_template",
    "builtin_chatml": "qwen3_template",
}


@dataclass(frozen=True)
class ResponseParser:
    """A response template and where it came from (``name``, for reports and rejects)."""

    name: str
    template: dict[str, Any] = field(compare=False)

    @property
    def sha256(self) -> str:
        """Of the template as canonical JSON: what a build's work is keyed by."""
        blob = json.dumps(self.template, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest()

    def parse(self, text: str, prefix: str) -> dict[str, Any]:
        """The message ``text`` (generated after ``prefix``) reads back as."""
        from transformers.utils.chat_parsing import parse_response

        out: dict[str, Any] = parse_response(text, self._compiled, prefix=self.last_turn(prefix))
        return out

    def last_turn(self, prefix: str) -> str:
        """The tail of ``prefix`` from its last start anchor on: what the parser reads of it.

        transformers reads a prefix only to cut it past its last start anchor
        (``ResponseTemplate.truncate_past_last_anchor``, called by ``_consume_prefix``; nothing
        else looks at it but ``is None`` and emptiness tests), and finds that anchor with a regex
        scan of the whole prompt, left to right: O(prompt) per call, quadratic over a session whose
        every call sends the whole history again. Cutting the prompt here at the last anchor's
        start ``i`` gives the same cut at O(last turn), with ``str.rfind`` from the end:

        - the scan of ``prefix[i:]`` matches at 0 the longest literal found at ``i`` (the
          alternation is sorted longest-first), as the scan of the whole prompt does if it tries
          ``i`` at all, and after that match nothing (no literal starts after ``i``);
        - the scan of the whole prompt tries ``i`` unless a match starting before ``i`` runs past
          it, which takes a literal ending inside (or around) one that starts at ``i``: a proper
          suffix of a literal that is a prefix of one, or a literal inside another at a non-zero
          offset. :func:`overlap_free` rules both out, once per template; where it cannot (a
          regex anchor, overlapping literals) the whole prompt is passed, as is one holding no
          anchor (transformers then logs and parses all of it).
        """
        literals = self._anchors
        if not literals:
            return prefix
        i = -1
        for lit in literals:  # each searched only past the best start so far
            i = max(i, prefix.rfind(lit, i + 1))
        return prefix[i:] if i > 0 else prefix

    @cached_property
    def _compiled(self) -> Any:
        """The template compiled once (transformers compiles a dict's regexes on every parse)."""
        from transformers.utils.chat_parsing.response_templates import load_response_template

        return load_response_template(self.template)

    @cached_property
    def _anchors(self) -> tuple[str, ...]:
        """The start anchor's literals where :meth:`last_turn` may cut at the last one, else ()."""
        literals = self._compiled.start_anchor_literals
        return tuple(literals) if literals and overlap_free(literals) else ()

    def check(self, completion: dict[str, Any], prefix: str, text: str) -> str | None:
        """None when the trained ``text`` (after ``prefix``) reads back as ``completion`` (the
        template's dict); else what differs, for the reject."""
        try:
            parsed = self.parse(text, prefix)
        except Exception as e:  # the parser's own errors, whatever their type
            first = (str(e).splitlines() or [""])[0]
            return f"the parser fails on it ({type(e).__name__}: {first}){_freeform(completion)}"
        return differences(completion, parsed)


def overlap_free(literals: list[str] | tuple[str, ...]) -> bool:
    """True when no two occurrences of ``literals`` can overlap unless they start together: no
    proper suffix of a literal is a prefix of a literal (itself included), nor does a literal
    occur inside another at a non-zero offset.

    >>> overlap_free(["<|im_start|>assistant\\n"]), overlap_free(["<a>", "<a><b>"])
    (True, True)
    >>> overlap_free(["aa"]), overlap_free(["ab", "b"]), overlap_free(["ab", "bc"])
    (False, False, False)
    """
    return not any(
        b.startswith(a[k:]) or a[k:].startswith(b)
        for a in literals
        for k in range(1, len(a))
        for b in literals
    )


def _freeform(completion: dict[str, Any]) -> str:
    """Why a parse may fail: a tool call whose arguments are text, not a JSON object (Codex's
    freeform ``apply_patch``), which a template that writes JSON calls cannot write as one."""
    for i, tc in enumerate(completion.get("tool_calls") or [], 1):
        fn = tc.get("function", tc)
        if not isinstance(tool_arguments(fn.get("arguments", "")), dict):
            return (
                f"; tool call {i} ({fn.get('name')}) has arguments that are not a JSON object "
                "(freeform text), which this template writes as invalid JSON"
            )
    return ""


# --------------------------------------------------------------------------------------------
# the comparison
# --------------------------------------------------------------------------------------------


def _same_text(a: str, b: str) -> bool:
    return a.strip() == b.strip() or a.split() == b.split()


def _short(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def differences(logged: dict[str, Any], parsed: dict[str, Any]) -> str | None:
    """What of ``logged`` (the completion as the template got it) ``parsed`` lacks or changes.

    >>> differences({"content": "hi"}, {"role": "assistant", "content": "hi\\n"}) is None
    True
    >>> differences({"content": "", "tool_calls": [{"function": {"name": "ls",
    ...     "arguments": {"p": "."}}}]}, {"tool_calls": [{"function": {"name": "ls",
    ...     "arguments": '{"p": "."}'}}]})
    'tool call 1 (ls) reads back with arguments \\'{"p": "."}\\' (a string), not {"p": "."}'
    """
    text, got = logged.get("content") or "", parsed.get("content") or ""
    back = parsed.get("reasoning_content") or parsed.get("thinking") or ""
    if not _same_text(text, got if isinstance(got, str) else ""):
        if not got and isinstance(back, str) and back.strip().endswith(text.strip()):
            return (
                f"its text {_short(text)} reads back as reasoning: the template writes the text of "
                "a turn with tool calls as its reasoning (gpt-oss's analysis channel); "
                "--reasoning-merge fold trains such text as reasoning on purpose"
            )
        return f"its text reads back as {_short(got)}, not {_short(text)}"
    reasoning = logged.get("reasoning_content") or ""
    if isinstance(back, str) and back.strip() and not _same_text(reasoning, back):
        return f"its reasoning reads back as {_short(back)}, not {_short(reasoning)}"
    return _call_differences(logged.get("tool_calls") or [], parsed.get("tool_calls") or [])


def _call_differences(calls: list[dict[str, Any]], back: list[Any]) -> str | None:
    if len(back) != len(calls):
        return f"{len(back)} tool calls read back, where the log holds {len(calls)}"
    for i, (tc, pc) in enumerate(zip(calls, back, strict=True), 1):
        fn = tc.get("function", tc)
        pfn = pc.get("function", pc) if isinstance(pc, dict) else {}
        name = fn.get("name")
        if pfn.get("name") != name:
            return f"tool call {i} reads back as {_short(pfn.get('name'))}, not {_short(name)}"
        want, got = tool_arguments(fn.get("arguments", "")), pfn.get("arguments")
        if not isinstance(want, dict):
            return (
                f"tool call {i} ({name}) has arguments that are not a JSON object "
                f"({_short(want)}), and the model's parser reads a call's arguments as an object"
            )
        if got != want or type(got) is not type(want):
            kind = "a string" if isinstance(got, str) else type(got).__name__
            return (
                f"tool call {i} ({name}) reads back with arguments {_short(got)} ({kind}), "
                f"not {_short(want)}"
            )
    return None


# --------------------------------------------------------------------------------------------
# where the response template comes from
# --------------------------------------------------------------------------------------------


def find_parser(
    template: str, *, own: Any = None, port: str | None = None
) -> tuple[ResponseParser | None, str]:
    """The parser of chat template ``template`` (:mod:`the module docstring <.>`'s order), and
    how it was found or why there is none. ``own`` is the tokenizer's ``response_template``,
    ``port`` the name of the template's native port (:func:`~.native.find_port`)."""
    if isinstance(own, dict) and own:
        return ResponseParser("the tokenizer's response_template", own), "the tokenizer's own"
    trl = _trl()
    if trl is None:
        return None, (
            "no response parser is known for this chat template: the tokenizer ships no "
            "response_template, and TRL (the parse extra: pip install 'treeprep[parse]') is "
            "not installed"
        )
    version, templates, jinja = trl
    name = jinja.get(template.strip())
    how = "its chat template"
    if name is None and port in _TRL_BY_PORT:
        name, how = _TRL_BY_PORT[port], f"the family of native port {port!r}"
    if name is None or name not in templates:
        return None, (
            f"no response parser is known for this chat template: neither the tokenizer nor "
            f"TRL {version} has one for it"
        )
    return ResponseParser(f"trl {version} {name}", templates[name]), f"TRL's, by {how}"


@cache
def _trl() -> tuple[str, dict[str, dict[str, Any]], dict[str, str]] | None:
    """(TRL's version, its literal response templates by name, its template names by chat
    template text), read from the installed package's files without importing it."""
    try:
        spec = importlib.util.find_spec("trl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        source = (root / "chat_template_utils.py").read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return None
    templates: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.endswith("_template"):
                try:
                    value = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, RecursionError):
                    continue  # built from other names: not a literal, not used here
                if isinstance(value, dict):
                    templates[target.id] = value
    jinja: dict[str, str] = {}
    for stem, name in _TRL_BY_JINJA.items():
        try:
            text = (root / "chat_templates" / f"{stem}.jinja").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        jinja.setdefault(text.strip(), name)
    return _trl_version(root), templates, jinja


def _trl_version(root: Path) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return root.name
