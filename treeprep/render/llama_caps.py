"""What llama.cpp makes of a request's messages by what its chat template reads.

llama.cpp (``common/jinja/caps.cpp``, in the llama.cpp that llama-cpp-python 0.3.36 bundles)
renders a few probe conversations once per template with its own jinja engine, which records
the values a render *used*: read as a member (``m.content``, ``m['content']``), iterated, or
written whole by ``tojson``. ``common/chat.cpp`` then changes every request's messages by what
the probes found, before the template sees them:

- **system role** (``supports_system_role``): a template that does not read the content of a
  leading system message takes none (Gemma 2's refuses one). The first message, when it is a
  system message, is merged into the next one as ``system + "\\n" + next`` (both contents must be
  strings: llama.cpp fails the request otherwise), or dropped when it is the only message
  (``workaround::system_message_not_supported``).
- **object arguments** (``supports_object_arguments``): a template that reads an argument of a
  call whose arguments are an object gets every call's arguments parsed from the request's JSON
  string (one that is not JSON fails the request: ``workaround::func_args_not_string``); any
  other template gets the string as the request held it, an object written compact
  (nlohmann's ``dump()``). :func:`~treeprep.render.messages.llama_cpp_arguments` applies it.
- **content** (``supports_string_content``, ``supports_typed_content``): a user message's content
  is probed as a string and as a list, and what the render uses as an array (a loop, an index,
  ``selectattr``) decides how a message of text parts reaches the template
  (:mod:`treeprep.render.text_parts`);
- **StepFun** (a template with its tool prompt, "You have access to the following functions in
  JSONSchema format"): every request message's text, each text part and reasoning is trimmed of
  whitespace (``workaround::trim_all_content``);
- empty ``reasoning_content``, ``tool_call_id`` and ``name``, and a call's empty ``id``, are left
  out (``common_chat_msg::to_json_oaicompat``), in
  :func:`~treeprep.render.messages.normalize_message`;
- a gpt-oss template (``<|channel|>``) is rendered by llama.cpp's own handler
  (``common_chat_params_init_gpt_oss``), which hands it a turn's reasoning as ``thinking`` (so
  does every render here) and leaves out the text of a turn that has reasoning and tool calls:
  gpt-oss's template refuses text and thinking together beside a call.

The probes here are llama.cpp's conversations, rendered by the sandboxed template on dicts that
record the keys a render reads (:class:`_Watched`: through ``.``, ``[]``, ``items`` and
``values``, which ``tojson`` calls, not ``get``, which llama.cpp's engine does not call on a
message; and all of a dict through the ``string`` filter, as llama.cpp marks it, where writing
it whole reads nothing in it; ``tojson`` uses no list as an array; a loop over a string fails,
as in llama.cpp's engine). On 43 templates (Qwen3's, Qwen2.5's and gpt-oss's among them) this
finds what llama.cpp's own ``caps_get`` finds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from treeprep.errors import RenderError, TreeprepError
from treeprep.render.template import ChatTemplate

__all__ = ["LlamaCaps", "llama_caps", "merge_system"]


@dataclass(frozen=True)
class LlamaCaps:
    """What llama.cpp's probes found a chat template reads."""

    #: the content of a leading system message (else llama.cpp merges it into the next message)
    system_role: bool = True
    #: an argument of a call's object arguments (else every call's arguments go as a string)
    object_arguments: bool = False
    #: a gpt-oss template (one that writes ``<|channel|>``), which llama.cpp's own handler hands
    #: a turn of reasoning and tool calls without its text
    gpt_oss: bool = False
    #: a content given as a string, and as a list of parts (only the one: llama.cpp makes every
    #: content that one; both or neither: each as the request gives it)
    string_content: bool = True
    typed_content: bool = False
    #: StepFun's template (its tool prompt), whose request texts llama.cpp trims
    trims: bool = False


class _Watched(dict):  # type: ignore[type-arg]
    """A dict that records into ``used`` the paths of the keys a render reads."""

    __slots__ = ("_path", "_used")

    def __init__(self, d: dict[str, Any], path: str, used: set[str]) -> None:
        super().__init__({k: _watch(v, f"{path}.{k}", used) for k, v in d.items()})
        self._path, self._used = path, used

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        self._used.add(f"{self._path}.{key}")
        return value

    def items(self) -> Any:
        self._used.update(f"{self._path}.{k}" for k in self)
        return super().items()

    def values(self) -> Any:
        self._used.update(f"{self._path}.{k}" for k in self)
        return super().values()

    def __str__(self) -> str:
        if _by_string_filter(sys._getframe(1)):
            _mark_all(self)
        return super().__str__()


class _WatchedList(list):  # type: ignore[type-arg]
    """A list of watched values, which marks them all read through the ``string`` filter, and
    records ``path[]`` when a render uses it as an array (iterates or indexes it)."""

    def __init__(self, items: Any, path: str, used: set[str]) -> None:
        super().__init__(items)
        self._path, self._used = path, used

    def __iter__(self) -> Any:
        if not _by_json(sys._getframe(1)):  # tojson writes it whole: no array use
            self._used.add(f"{self._path}[]")
        return super().__iter__()

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            self._used.add(f"{self._path}[]")
        return super().__getitem__(key)

    def __str__(self) -> str:
        if _by_string_filter(sys._getframe(1)):
            _mark_all(self)
        return super().__str__()


class _WatchedStr(str):
    """A string that records ``path[]`` when a render uses it as an array, as llama.cpp's
    content probe looks for (a loop over it, an index, ``selectattr``), and fails a loop over
    it, as llama.cpp's engine does."""

    def __new__(cls, text: str, path: str, used: set[str]) -> _WatchedStr:
        obj = super().__new__(cls, text)
        obj._path, obj._used = path, used  # type: ignore[attr-defined]
        return obj

    def __iter__(self) -> Any:
        self._used.add(f"{self._path}[]")  # type: ignore[attr-defined]
        raise TypeError("llama.cpp's engine loops over no string")

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            self._used.add(f"{self._path}[]")  # type: ignore[attr-defined]
        return super().__getitem__(key)


def _by_string_filter(caller: Any) -> bool:
    """Whether ``str()`` was called by the template's ``string`` filter (markupsafe's
    ``soft_str``, called by the template's own code), which llama.cpp counts as reading the
    value through and through, where writing it (``{{ x }}``, also ``str()``) reads nothing
    in it."""
    return (
        caller.f_code.co_name == "soft_str"
        and caller.f_back is not None
        and caller.f_back.f_code.co_filename == "<template>"
    )


def _by_json(caller: Any) -> bool:
    """Whether a list is iterated by ``json`` (``tojson``), which llama.cpp does not count as
    using it as an array."""
    return caller.f_code.co_filename.endswith(("json/encoder.py", "json\\encoder.py"))


def _mark_all(value: Any) -> None:
    if isinstance(value, _Watched):
        for k, v in dict.items(value):
            value._used.add(f"{value._path}.{k}")
            _mark_all(v)
    elif isinstance(value, list):
        for v in list.__iter__(value):
            _mark_all(v)


def _watch(value: Any, path: str, used: set[str]) -> Any:
    if isinstance(value, dict):
        return _Watched(value, path, used)
    if isinstance(value, list):
        items = (_watch(v, f"{path}[{i}]", used) for i, v in enumerate(value))
        return _WatchedList(items, path, used)
    if isinstance(value, str):
        return _WatchedStr(value, path, used)
    return value


def _probe(
    template: ChatTemplate, messages: list[dict[str, Any]], tools: list[Any]
) -> tuple[set[str], str | None]:
    """(the paths a render of llama.cpp's probe read, ``messages[1].content`` and so on, its
    text or None where it failed: llama.cpp keeps what a failed probe read too)."""
    used: set[str] = set()
    variables = {
        **template.special_tokens,
        "messages": _watch(messages, "messages", used),
        "tools": _watch(tools, "tools", used),
        "bos_token": "",
        "eos_token": "",
        "add_generation_prompt": True,
    }
    try:
        return used, template.render_variables(variables)
    except TreeprepError:
        return used, None


#: what llama.cpp's content probe gives a user message, and looks for in the render
_MARKER = "STRING_MARKER"
#: what llama.cpp finds StepFun's template by (``common_chat_templates_apply_jinja``)
_STEPFUN = "You have access to the following functions in JSONSchema format"


def _content_caps(template: ChatTemplate) -> tuple[bool, bool]:
    """(string content, typed content): llama.cpp's probe of a user message's content as the
    string :data:`_MARKER`, then as an empty list. Typed: the render used the content as an
    array (a loop, an index, ``selectattr``), the list's render doing so without failing;
    string: the string's render did not fail, nor, using it as an array, leave the marker out.
    (llama.cpp renders the list only for a template that tests the content with ``is
    string``; a template that does not and loops over a list does so over the string too.)"""
    content = "messages[0].content[]"
    used, text = _probe(template, [{"role": "user", "content": _MARKER}], [])
    typed = content in used
    string = text is not None and not (typed and _MARKER not in text)
    used, text = _probe(template, [{"role": "user", "content": []}], [])
    return string, typed or (content in used and text is not None)


def _probe_tool_call() -> list[dict[str, Any]]:
    """llama.cpp's conversation of one call with object arguments."""
    call = {
        "id": "call00001",
        "type": "function",
        "function": {"name": "tool1", "arguments": {"arg": "value"}},
    }
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


#: the tool llama.cpp's call probes declare
_PROBE_TOOLS = [
    {
        "name": "tool",
        "type": "function",
        "function": {
            "name": "tool1",
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"],
            },
        },
    }
]


def llama_caps(template: ChatTemplate) -> LlamaCaps:
    """llama.cpp's findings for ``template`` (its probes: see the module docstring).

    >>> llama_caps(ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"))
    LlamaCaps(system_role=True, object_arguments=False, gpt_oss=False, string_content=True,
              typed_content=False, trims=False)
    >>> t = "{% for m in messages %}{{ m.role }}{{ (m.tool_calls or []) | tojson }}{% endfor %}"
    >>> llama_caps(ChatTemplate(t))
    LlamaCaps(system_role=False, object_arguments=True, gpt_oss=False, string_content=True,
              typed_content=False, trims=False)
    """
    system = [
        {"role": "system", "content": "System message"},
        {"role": "user", "content": "User message"},
    ]
    system_role = "messages[0].content" in _probe(template, system, [])[0]
    read = _probe(template, _probe_tool_call(), _PROBE_TOOLS)[0]
    string, typed = _content_caps(template)
    return LlamaCaps(
        system_role=system_role,
        object_arguments="messages[1].tool_calls[0].function.arguments.arg" in read,
        gpt_oss="<|channel|>" in template.source,
        string_content=string,
        typed_content=typed,
        trims=_STEPFUN in template.source,
    )


def merge_system(messages: list[dict[str, Any]], caps: LlamaCaps) -> list[dict[str, Any]]:
    """``messages`` as llama.cpp hands them to a template that takes no system role: a leading
    system message merged into the next one (or dropped, alone); as they are otherwise.

    >>> merge_system([{"role": "system", "content": "be brief"},
    ...               {"role": "user", "content": "hi"}], LlamaCaps(system_role=False))
    [{'role': 'user', 'content': 'be brief\\nhi'}]
    """
    if caps.system_role or not messages or messages[0].get("role") != "system":
        return messages
    if len(messages) == 1:
        return []
    first, second = messages[0], messages[1]
    if not isinstance(first.get("content"), str) or not isinstance(second.get("content"), str):
        raise RenderError(
            "llama.cpp merges the system message into the next one for this chat template, "
            "which takes no system role, and fails a request where either is not a string "
            "(a list of parts)"
        )
    return [{**second, "content": f"{first['content']}\n{second['content']}"}, *messages[2:]]
