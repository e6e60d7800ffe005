"""Issue 50 items 0-1: every trained completion reads back, through the model's own response
parser, as the logged assistant message; tool-call arguments reach the template as objects.

The references are code we did not write: TRL's ``add_response_schema`` (which response
template belongs to which chat template) and ``parse_response`` over transformers'
``AutoTokenizer`` (the parse of the trained tokens, given the prompt's tokens as the prefix). The
comparison of a parsed message with the logged one is written here, apart from
:mod:`treeprep.render.response`.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from hf_reference import hf_tokenizer

from treeprep.build import BuildConfig, build
from treeprep.errors import TreeprepError
from treeprep.formats import detect_format
from treeprep.render import Renderer, response
from treeprep.render.messages import split_inline_think
from treeprep.render.response import ResponseParser, find_parser
from treeprep.schemas import ChatCall
from treeprep.shards import iter_trees

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_data"
DATA = ROOT / ".." / "shared" / "data"
TOKENIZERS = DATA / "tokenizers"
needs_data = pytest.mark.skipif(not TOKENIZERS.is_dir(), reason="../shared/data is absent")
trl = pytest.importorskip("trl.chat_template_utils")

#: every template treeprep ships a test for: the built-in one, and the real tokenizers
SHIPPED = [None, "qwen3", "qwen2_5", "gpt-oss"]


def _folder(name: str | None) -> str | None:
    return None if name is None else str(TOKENIZERS / name)


#: TRL's parsers read what the chat template writes: the server that renders with it (vLLM renders
#: gpt-oss with Harmony and reads it back with Harmony's parser: test_harmony.py)
TEMPLATE_SERVER = "llama.cpp"


def _reference_tokenizer(r: Renderer) -> Any:
    """transformers' tokenizer with TRL's response template for the template's family: TRL's
    own chat template file of that family, given to ``add_response_schema``."""
    tok = hf_tokenizer(r)
    try:
        trl.add_response_schema(tok)
    except ValueError:  # a template revision TRL does not ship: its family's TRL file
        family = type("T", (), {"chat_template": trl.qwen3_chat_template})()
        trl.add_response_schema(family)
        tok.response_template = family.response_template
    return tok


# ------------------------------------------------------------------------------------------------
# the response template: what TRL's add_response_schema sets
# ------------------------------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("name", SHIPPED)
def test_the_parser_is_trls(name: str | None) -> None:
    """The template read from TRL's source (no import) is what ``add_response_schema`` sets on
    transformers' tokenizer, for TRL's own file of the same template or family."""
    r = Renderer.load(_folder(name), server=TEMPLATE_SERVER)
    assert r.response_parser is not None, r.response_note
    tok = _reference_tokenizer(r)
    assert r.response_parser.template == tok.response_template
    assert r.response_parser.name.startswith("trl ")


def test_no_parser_is_said(tmp_path: Path) -> None:
    """A template nobody has a parser for: none, the note says why, and a build with it records
    why in its manifest (which ``treeprep build`` prints once) and reads nothing back."""
    from treeprep.build import FileOptions
    from treeprep.render import builtin

    parser, why = find_parser("{{ messages[0].content }}")
    assert parser is None and "no response parser is known" in why
    template = tmp_path / "t.jinja"  # the built-in template and a comment: no known family
    template.write_text("{#- a copy -#}" + builtin.CHAT_TEMPLATE)
    m = build(BuildConfig(inputs=[str(SAMPLES / "openai_chat.jsonl")], out=str(tmp_path / "o"),
                          file=FileOptions(chat_template=str(template))))  # fmt: skip
    assert m.response_parser is None and m.normalized.get("round-trip", 0) == 0
    assert m.response_parser_missing and "no response parser is known" in m.response_parser_missing
    assert m.counts.records_in_trees > 0


# ------------------------------------------------------------------------------------------------
# every sample and real log reads back under every shipped template
# ------------------------------------------------------------------------------------------------


def _calls(paths: list[Path], per_file: int | None) -> list[ChatCall]:
    from treeprep.formats import ReadOptions
    from treeprep.io.compressed import read_head_checked

    calls: list[ChatCall] = []
    for path in paths:
        spec = detect_format(str(path), read_head_checked(str(path))[0])
        if spec is None:
            continue
        got: list[ChatCall] = []
        try:
            for c in spec.read(str(path), ReadOptions()):
                if isinstance(c, ChatCall):
                    got.append(c)
        except TreeprepError:  # the file's one reject (Aider's chat transcript): nothing more
            pass
        calls.extend(got[:per_file] if per_file else got)
    return calls


def _inputs(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "README.md")


def _same(a: Any, b: Any) -> bool:
    return (a or "").split() == (b or "").split()


def _read_back(tok: Any, seq_ids: list[int], span: tuple[int, int], logged: dict) -> str | None:
    """TRL's parse of the trained tokens (the prompt's tokens as the prefix) against the logged
    message: text, reasoning where it reads back, and tool calls with arguments as objects."""
    a, b = span
    parsed = trl.parse_response(tok, seq_ids[a:b], prefix=seq_ids[:a])
    if not _same(parsed.get("content"), logged.get("content")):
        return f"text {parsed.get('content')!r}"
    back = parsed.get("reasoning_content") or parsed.get("thinking")
    if back and not _same(back, logged.get("reasoning_content")):
        return f"reasoning {back!r}"
    want = []
    for tc in logged.get("tool_calls") or []:
        args = tc["function"]["arguments"]
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        want.append((tc["function"]["name"], args))
    got = [
        (c["function"]["name"], c["function"]["arguments"]) for c in parsed.get("tool_calls", [])
    ]
    return None if got == want else f"tool calls {got}"


def _check_round_trip(name: str | None, calls: list[ChatCall]) -> int:
    r = Renderer.load(_folder(name), server=TEMPLATE_SERVER)
    tok = _reference_tokenizer(r)
    checked = 0
    for call in calls:
        try:
            seq = r.render(call, group_id="g")
        except Exception:  # rejected (with its reason): not trained, nothing to read back
            continue
        _, comp, _ = r.normalize(call)
        # the completion as the model wrote it, or its inline <think> block made reasoning
        whys = [_read_back(tok, seq.tokens.tolist(), seq.loss_spans[-1], c)
                for c in (comp, split_inline_think(comp))]  # fmt: skip
        assert None in whys, f"{call.source_file}:{call.source_line} reads back with {whys[0]}"
        checked += 1
    return checked


@pytest.mark.parametrize("name", SHIPPED)
def test_every_sample_reads_back(name: str | None) -> None:
    if name is not None and not TOKENIZERS.is_dir():
        pytest.skip("../shared/data is absent")
    calls = _calls(_inputs(SAMPLES), None)
    assert _check_round_trip(name, calls) > 50  # gpt-oss refuses more (text beside calls)


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED[1:])
def test_real_logs_read_back(name: str) -> None:
    """The first calls of every real log (a deterministic subset: the suite's time)."""
    calls = _calls(_inputs(DATA / "logs"), 12)
    assert _check_round_trip(name, calls) > 100


# ------------------------------------------------------------------------------------------------
# the build: rejects what does not read back, counts what does
# ------------------------------------------------------------------------------------------------


@needs_data
def test_a_call_that_does_not_read_back_is_rejected(tmp_path: Path) -> None:
    """A tokenizer whose own response_template (TRL's Qwen one, in its config) disagrees with its
    template, which double-encodes the arguments as gpt-oss's used to render logged strings: every
    tool call is rejected with the difference, and the other calls are read back and counted."""
    folder = tmp_path / "tok"
    shutil.copytree(TOKENIZERS / "qwen2_5", folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg["chat_template"].replace(
        "tool_call.arguments | tojson", "tool_call.arguments | tojson | tojson"
    )
    assert "| tojson | tojson" in cfg["chat_template"]
    cfg["response_template"] = trl.qwen3_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    m = build(BuildConfig(inputs=[str(SAMPLES / "openai_chat.jsonl")], out=str(tmp_path / "o"),
                          tokenizer=str(folder)))  # fmt: skip
    assert m.response_parser == "the tokenizer's response_template"
    rejects = [json.loads(x) for x in (tmp_path / "o" / "rejects.jsonl").read_text().splitlines()]
    round_trip = [x for x in rejects if "does not round-trip" in x["reason"]]
    assert round_trip and all("(a string)" in x["reason"] for x in round_trip)
    assert m.normalized["round-trip"] == m.counts.records_in_trees > 0


@needs_data
def test_gpt_oss_trains_tool_calls_as_json_objects(tmp_path: Path) -> None:
    """Codex, Gemini CLI and OpenAI-chat rows (SWE-Gym's shape: arguments as JSON strings) built
    for gpt-oss with its template: every trained call's arguments are a JSON object after
    ``json<|message|>``, never a quoted string (the fault: ``"{\\"cmd\\": ...}"``)."""
    inputs = [SAMPLES / "codex", SAMPLES / "gemini_cli", SAMPLES / "openai_chat.jsonl"]
    out = tmp_path / "o"
    m = build(BuildConfig(inputs=[str(p) for p in inputs], out=str(out),
                          tokenizer=str(TOKENIZERS / "gpt-oss"), file=_fold()))  # fmt: skip
    assert m.response_parser and "gptoss_template" in m.response_parser
    r = Renderer.load(TOKENIZERS / "gpt-oss")
    marker = "<|channel|>commentary json<|message|>"
    calls = 0
    for tree in iter_trees(str(out)):
        for rec in tree.iter_sequences():
            trained = [t for t, m in zip(rec["input_ids"], rec["loss_mask"], strict=True) if m]
            text = r.decode(trained)
            for part in text.split(marker)[1:]:
                calls += 1
                body = part.split("<|call|>")[0]
                assert isinstance(json.loads(body), dict), body[:80]
    assert calls >= 5


def _fold() -> Any:
    from treeprep.build import FileOptions

    return FileOptions(reasoning_merge="fold", server=TEMPLATE_SERVER)


# ------------------------------------------------------------------------------------------------
# the prefix: cut at its last start anchor, the parse is transformers' on the whole prompt
# ------------------------------------------------------------------------------------------------

#: TRL's response templates (dicts: the ones treeprep's tables name and the rest of them)
TRL_TEMPLATES = sorted(
    n for n in dir(trl) if n.endswith("_template") and isinstance(getattr(trl, n), dict)
)


def _reference(text: str, template: dict[str, Any], prefix: str) -> Any:
    """transformers' parse with the whole prompt as the prefix (or its error, by type and text)."""
    from transformers.utils.chat_parsing import parse_response

    try:
        return parse_response(text, template, prefix=prefix)
    except Exception as e:  # the parser's own errors: ours must raise the same
        return (type(e).__name__, str(e))


def _ours(parser: ResponseParser, text: str, prefix: str) -> Any:
    try:
        return parser.parse(text, prefix)
    except Exception as e:
        return (type(e).__name__, str(e))


def _markers(template: dict[str, Any]) -> list[str]:
    """The template's literal anchors and field delimiters, whole and cut short."""
    anchor = template.get("start_anchor") or []
    whole = [anchor] if isinstance(anchor, str) else list(anchor)
    for f in template["fields"].values():
        for key in ("open", "close"):
            v = f.get(key) or []
            whole += [v] if isinstance(v, str) else list(v)
    return whole + [m[: len(m) // 2] for m in whole] + [m[1:] for m in whole if len(m) > 1]


def _prefixes(pieces: list[str], seed: int) -> list[str]:
    """Prompts made of ``pieces`` and filler: long histories, an anchor at the very end, none."""
    rng = random.Random(seed)
    filler = ["hi ", "\n", " ", "<", ">", "|", '{"a": 1}', "ok\n\n", "x"]
    out = ["", "no anchor here at all\n", pieces[0], "text\n" + pieces[0]]
    for n in [1, 3, 10, 40, 400]:
        for _ in range(6 if n < 400 else 2):
            out.append("".join(rng.choice(pieces + filler) for _ in range(n)))
    out += [p + pieces[0] for p in out[4:12]] + [p + pieces[0][:-1] for p in out[4:12]]
    return out


@pytest.mark.parametrize("name", TRL_TEMPLATES)
def test_the_cut_prefix_parses_as_the_whole(name: str) -> None:
    """Every TRL template, over many prompts: ``ResponseParser.parse`` (the prompt cut at its last
    start anchor) gives what transformers' ``parse_response`` gives on the whole prompt; the cut
    truncates to the same text; a regex anchor keeps the whole prompt."""
    assert set(response._TRL_BY_JINJA.values()) | set(response._TRL_BY_PORT.values()) <= set(
        TRL_TEMPLATES
    )
    template = getattr(trl, name)
    parser = ResponseParser(name, template)
    compiled = parser._compiled
    pieces = _markers(template) or ["<|turn>model\n"]
    texts = ["", "hello", "<think>why</think>\n\nhi", *pieces[:4], "".join(pieces)]
    literals = compiled.start_anchor_literals
    assert literals is None or response.overlap_free(literals)  # TRL's literals: the fast path
    cut = 0
    for prefix in _prefixes(pieces, seed=len(name)):
        tail = parser.last_turn(prefix)
        assert prefix.endswith(tail)
        if literals is None:
            assert tail is prefix  # a regex anchor: transformers' scan, as before
        else:  # cut at the last anchor's start, where there is one
            assert (len(tail) < len(prefix)) == (max(prefix.rfind(s) for s in literals) > 0)
        cut += len(tail) < len(prefix)
        truncated = compiled.truncate_past_last_anchor(prefix)
        assert compiled.truncate_past_last_anchor(tail) == truncated, repr(prefix[-200:])
        for text in texts:
            assert _ours(parser, text, prefix) == _reference(text, template, prefix), (
                repr(prefix[-200:]),
                text,
            )
    assert cut >= 15 or literals is None


#: anchors whose occurrences can overlap (the guard passes the whole prompt), then safe ones
OVERLAPPING = [["aa"], ["aba"], ["ab", "b"], ["abc", "b"], ["ab", "bc"], ["ba", "ab"]]
SAFE = [["ab"], ["a", "b"], ["ab", "abc"], ["<a>", "<a><b>"], ["ac", "b"]]
#: the overlapping sets where a cut at the last occurrence would truncate wrongly on some prompt
#: (["ab", "b"] overlaps only end to end, which the guard refuses too: it is sufficient, not
#: necessary)
NAIVE_ERRS = [["aa"], ["aba"], ["abc", "b"], ["ab", "bc"], ["ba", "ab"]]


def _short_prompts(letters: str, seed: int) -> list[str]:
    """Every prompt of ``letters`` (at least two) up to the length where they number about
    1,000, and 300 random longer ones."""
    rng = random.Random(seed)
    out, n = [], 0
    while len(letters) ** n <= 6000 // (n + 1):
        out += ["".join(p) for p in itertools.product(letters, repeat=n)]
        n += 1
    return out + ["".join(rng.choices(letters, k=rng.randint(n, 40))) for _ in range(300)]


@pytest.mark.parametrize("literals", OVERLAPPING + SAFE, ids=str)
def test_overlapping_anchors_keep_the_whole_prefix(literals: list[str]) -> None:
    """Adversarial literal sets over every short prompt of their letters: the parse equals
    transformers' on the whole prompt. Where occurrences can overlap, the last occurrence is not
    where the left-to-right scan cuts (shown on one prompt), so the whole prompt is passed."""
    template = {"start_anchor": literals, "fields": {"content": {}}}
    parser = ResponseParser("adversarial", template)
    compiled = parser._compiled
    naive_differs = False
    for prefix in _short_prompts("".join(sorted(set("".join(literals) + "x"))), len(literals)):
        tail = parser.last_turn(prefix)
        whole = compiled.truncate_past_last_anchor(prefix)
        assert compiled.truncate_past_last_anchor(tail) == whole, prefix
        assert _ours(parser, "z", prefix) == _reference("z", template, prefix), prefix
        i = max(prefix.rfind(s) for s in literals)
        naive = compiled.truncate_past_last_anchor(prefix[max(i, 0) :])
        naive_differs |= naive != whole
        if literals in OVERLAPPING:
            assert tail is prefix
    assert response.overlap_free(literals) == (literals not in OVERLAPPING)
    assert naive_differs == (literals in NAIVE_ERRS)
