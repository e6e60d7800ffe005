"""The reference the renderer is tested against: transformers' tokenizer for the same folder.

The renderer itself never imports transformers (issue 14 item 11); the tests load
``AutoTokenizer`` (or the built-in tokenizer wrapped in ``PreTrainedTokenizerFast``) for the
renderer's folder and compare with ``apply_chat_template``. A template given with
``--chat-template`` is set on the reference too.
"""

from __future__ import annotations

from typing import Any

from treeprep.render import Renderer

_CACHE: dict[tuple[str | None, str], Any] = {}


def hf_tokenizer(r: Renderer) -> Any:
    """transformers' tokenizer for ``r``'s folder, with the template ``r`` renders with."""
    key = (r.identity.path, r.template.source)
    tok = _CACHE.get(key)
    if tok is None:
        if r.identity.path is None:
            from treeprep.render import builtin as bt

            tok = bt.load_builtin()
        else:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(r.identity.path, local_files_only=True)
        tok.chat_template = r.template.source
        _CACHE[key] = tok
    return tok


def assert_calls_match_apply_chat_template(r: Renderer, calls: Any) -> None:
    """Each call renders as ``apply_chat_template`` of its messages and completion, trained on
    exactly what follows the generation prompt."""
    hf = hf_tokenizer(r)
    for call in calls:
        msgs, comp, tools = r.normalize(call)
        seq = r.render(call, group_id="g")
        kw = {"tools": tools, "tokenize": True, "return_dict": False}
        full = list(hf.apply_chat_template([*msgs, comp], **kw))
        head = list(hf.apply_chat_template(msgs, add_generation_prompt=True, **kw))
        assert seq.tokens.tolist() == full and seq.loss_spans == [(len(head), len(full))]


def hf_convention(msgs: list[dict]) -> list[dict]:
    """``msgs`` as the Hugging Face chat-template convention asks (transformers' docs: a tool
    call's ``arguments`` is a dict): a string that ``json.loads`` reads as an object becomes that
    object. Written here, apart from the renderer's own conversion, as the reference."""
    import json

    out = []
    for m in msgs:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [_hf_call(tc, json) for tc in calls]}
        out.append(m)
    return out


def _hf_call(tc: dict, json: Any) -> dict:
    fn = tc.get("function", tc)
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            fn = {**fn, "arguments": parsed}
    return {**tc, "function": fn} if "function" in tc else fn


def apply_at_fixed_date(r: Renderer, msgs: list[dict], **kw: Any) -> Any:
    """``apply_chat_template(hf_convention(msgs), **kw)`` of ``r``'s reference tokenizer, its
    ``strftime_now`` reporting the renderer's fixed date (:data:`DEFAULT_DATE`), as the
    renderer's does for a record without a timestamp."""
    from transformers.utils import chat_template_utils as ctu

    from treeprep.render.dates import DEFAULT_DATE

    orig = ctu.datetime

    class _Fixed(orig):  # type: ignore[misc, valid-type]
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return DEFAULT_DATE

    ctu.datetime = _Fixed
    try:
        return hf_tokenizer(r).apply_chat_template(hf_convention(msgs), **kw)
    finally:
        ctu.datetime = orig


def arg_tools(*names: str) -> list[dict]:
    """Function tools of these names, each taking one string ``arg``."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} tool",
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string", "description": "the arg"}},
                    "required": ["arg"],
                },
            },
        }
        for name in names
    ]
