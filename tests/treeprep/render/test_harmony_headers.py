"""vLLM's Harmony headers (treeprep.render.harmony_headers): the installed library's ids rewritten
into what vLLM sends with the library it had. The layouts are the two libraries' own (and the
rewrite of an assistant's call is vLLM's ``_use_legacy_tool_call_headers``, 0.31 to 0.34)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from hf_reference import hf_tokenizer

from treeprep.modes import Harmony
from treeprep.render import Renderer
from treeprep.render.harmony_headers import Headers, installed_layout

pytest.importorskip("openai_harmony")

GPT_OSS = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "tokenizers" / "gpt-oss"
pytestmark = pytest.mark.skipif(not (GPT_OSS / "tokenizer.json").is_file(), reason="no shared data")

# a call and a tool result in each library's layout; the rest of a prompt has no recipient
OPENAI_CALL = '<|start|>assistant to=functions.a-b.c<|channel|>commentary json<|message|>{"x":1}'
OSS_CALL = (
    '<|start|>assistant<|channel|>commentary to=functions.a-b.c <|constrain|>json<|message|>{"x":1}'  # noqa: E501
)
OPENAI_RESULT = "<|start|>functions.a-b.c to=assistant<|channel|>commentary<|message|>out<|end|>"
OSS_RESULT = "<|start|>functions.a-b.c<|channel|>commentary to=assistant<|message|>out<|end|>"
PLAIN = (
    "<|start|>system<|message|>S<|end|><|start|>developer<|message|>D<|end|>"
    "<|start|>user<|message|>U<|end|><|start|>assistant<|channel|>analysis<|message|>A<|end|>"
    "<|start|>assistant<|channel|>final<|message|>F<|end|>"
)


@pytest.fixture(scope="module")
def r() -> Renderer:
    return Renderer.load(GPT_OSS)


def _fixed(r: Renderer, installed: Harmony, target: Harmony, text: str) -> str:
    assert r.harmony is not None
    enc = r.harmony.encoding
    ids = Headers(enc, installed, target).fix(enc.encode(text, allowed_special="all"))
    out = enc.decode_utf8(ids)
    assert hf_tokenizer(r)(out)["input_ids"] == ids  # the ids are the tokenizer's of the text
    return str(out)


@pytest.mark.parametrize(
    ("installed", "target", "call", "result", "want"),
    [
        (Harmony.oss, Harmony.oss, OSS_CALL, OSS_RESULT, OSS_RESULT),
        (Harmony.oss, Harmony.openai, OSS_CALL, OSS_RESULT, OPENAI_RESULT),
        (Harmony.openai, Harmony.oss, OPENAI_CALL, OPENAI_RESULT, OSS_RESULT),
        (Harmony.openai, Harmony.openai, OPENAI_CALL, OPENAI_RESULT, OPENAI_RESULT),
    ],
)
def test_calls_are_written_first_way_and_results_as_vllm_s_library(
    r: Renderer, installed: Harmony, target: Harmony, call: str, result: str, want: str
) -> None:
    """Whichever library renders: a call's header is the first layout (vLLM 0.31 rewrites
    oss-harmony's back), a tool result's is the layout of the library vLLM had, and a message
    without a recipient is left as it is."""
    text = PLAIN + call + "<|call|>" + result + PLAIN
    assert _fixed(r, installed, target, text) == PLAIN + OPENAI_CALL + "<|call|>" + want + PLAIN


def test_a_header_vllm_leaves_is_left(r: Renderer) -> None:
    """vLLM rewrites an assistant's header only in oss-harmony's call layout (a content type
    after <|constrain|>): one without a content type stays, as a result with one does."""
    bare = "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{}<|call|>"
    typed = "<|start|>functions.f<|channel|>commentary to=assistant <|constrain|>json<|message|>x"
    assert _fixed(r, Harmony.oss, Harmony.openai, bare + typed) == bare + typed


def test_the_installed_library_is_told_by_its_layout(r: Renderer) -> None:
    """Both packages install ``openai_harmony``: the layout says which one renders."""
    assert r.harmony is not None
    try:
        version("oss-harmony")
        want = Harmony.oss
    except PackageNotFoundError:
        want = Harmony.openai
    assert installed_layout(r.harmony.encoding) is want
