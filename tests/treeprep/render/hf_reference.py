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
