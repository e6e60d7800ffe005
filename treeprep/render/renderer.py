"""Rendering: a canonical record (chat call or token rollout) becomes a token :class:`Sequence`.

Contract (exactness first)
--------------------------
For a :class:`~treeprep.schemas.ChatCall` the messages are normalized (text parts joined into one
string, ``content: null`` made ``""``, tool-call arguments kept exactly as logged,
``reasoning_content`` passed through, unset fields dropped), the tools are the server's models'
dump of them (:mod:`treeprep.render.server_tools`), and then

- ``tokens == tokenizer.apply_chat_template(messages + [completion], tools=tools, tokenize=True)``,
- the loss span is exactly the tokens after
  ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)``; where that prompt is
  not a token prefix of the full sequence the call is rejected (:class:`RenderError`) with that
  reason.

Where the inference server renders without the template, so does the renderer: gpt-oss on vLLM
(``--server vllm``, the default) is Harmony's render of the request as vLLM builds it, and its
completions are read back with Harmony's parser (:mod:`treeprep.render.harmony`).

The renderer never invents, strips or "fixes" text: what the template does to earlier reasoning
(Qwen3 keeps it only after the last user query) is what ends up in the tokens. It only *notices* it:
when the record has no ``branch_reason`` and the previous turn of the same conversation (the
history up to its last assistant message, rendered as that call's own training sequence) is not a
token prefix of this call, the template rewrote history (dropped reasoning, or rendered the last
completion differently in history, like Qwen3's empty ``<think>\\n\\n</think>\\n\\n`` block), and
the sequence gets ``branch_reason = "reasoning-dropped"`` so the trie can say why it branches there.

Nothing the model said is silently lost: when the text of the loss span lacks the completion's
text or one of its tool calls (name and arguments), the call is rejected with that reason
(:mod:`treeprep.render.coverage`); ``--chat-template`` renders with a template that keeps them.

A :class:`~treeprep.schemas.TokenRollout` is taken as is (:mod:`treeprep.render.rollout`).

How: the messages are made the template's dicts (:mod:`treeprep.render.messages`); the tokenizer
folder is read with ``tokenizers`` and JSON (:mod:`treeprep.render.tokenizer`, no transformers;
what is loaded and the identity it records: :mod:`treeprep.render.identity`); the chat template
renders the call to text (:mod:`treeprep.render.template`: jinja in a limited sandbox with a fixed
date; a verified native port from :mod:`treeprep.render.native`; or, for other templates,
incremental jinja rendering of the appended messages, :mod:`treeprep.render.incremental`), and
the piece cache (:mod:`treeprep.render.encoder`) turns the text into ids, each unique piece once;
the built-in byte tokenizer (:mod:`treeprep.render.builtin`) needs no files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Sequence as _Seq
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from treeprep.crosscheck import CrossCheck
from treeprep.errors import NativeTemplateMismatch, RenderError, TokenizerError
from treeprep.io.jsonparse import json_key
from treeprep.modes import Harmony, ParallelCalls, Server
from treeprep.render import parallel
from treeprep.render.coverage import (
    completion_coverage,
    dropped_error,
    inline_think_missing,
    normalized_kinds,
    undeclared_tools,
)
from treeprep.render.dates import parse_date
from treeprep.render.encoder import DEFAULT_CACHE_CHARS, CachedEncoder, probe_texts
from treeprep.render.gaps import prompt_gaps
from treeprep.render.harmony import HarmonyChat, HarmonyParser, load_harmony
from treeprep.render.history import NormalizedHistory, RenderedPrefixes
from treeprep.render.idcheck import IdCheck
from treeprep.render.identity import load_builtin, load_tokenizer_folder, read_template_file
from treeprep.render.incremental import IncrementalRenderer, verified_once
from treeprep.render.messages import template_messages
from treeprep.render.native import FALLBACK_ERRORS, check_port, find_port, find_verified_port
from treeprep.render.response import ROUND_TRIP, ResponseParser, find_parser
from treeprep.render.rewritten import PreviousTurns
from treeprep.render.rollout import record_sequence, rollout_sequence
from treeprep.render.server_side import ServerSide
from treeprep.render.server_tools import SGLANG_NEWEST, Version
from treeprep.render.span import TrainedSpan, completion_span, trained_span
from treeprep.render.template import ChatTemplate, RenderFn, RenderLimits
from treeprep.render.text_parts import template_parts
from treeprep.schemas import ChatCall, TokenizerIdentity, TokenRollout
from treeprep.schemas.tokenizer import content_identity, sha256_text
from treeprep.sequence import Sequence, is_prefix

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# --------------------------------------------------------------------------------------------------
# The renderer
# --------------------------------------------------------------------------------------------------

#: the template kwargs whose incremental renderers are kept (a build's calls share a few)
_KEEP_KWARGS = 8


class Renderer:
    """Turns records into token sequences with one tokenizer and its chat template.

    Build it with :meth:`load`. It keeps per-process caches (the piece cache, the last few rendered
    calls, the incremental renderer's texts), so use one per worker process.
    """

    def __init__(
        self,
        backend: Tokenizer,
        template: ChatTemplate,
        identity: TokenizerIdentity,
        *,
        split_special_tokens: bool = False,
        cache_chars: int = DEFAULT_CACHE_CHARS,
        probe: bool = True,
        native_templates: bool = True,
        response_template: dict[str, Any] | None = None,
        server: Server | str = Server.vllm,
        harmony: Harmony | str = Harmony.oss,
    ) -> None:
        self.template = template
        self.identity = identity
        self.vocab_size = identity.vocab_size
        # apply_chat_template(tokenize=True) encodes with the flag set on the backend; so do we.
        backend.encode_special_tokens = split_special_tokens
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.encoder = CachedEncoder(backend, max_chars=cache_chars)
        if probe:
            self.encoder.probe(probe_texts(self.encoder._by_content))
        #: the last few calls' sequences, for the ``reasoning-dropped`` hint (:mod:`.rewritten`)
        self._turns = PreviousTurns()
        #: the last call's prompt, normalized (:mod:`treeprep.render.history`; :meth:`set_server`)
        self._history = NormalizedHistory()
        #: the name of the native template port in use (None: jinja renders every call)
        self.native_template: str | None = None
        self._native: RenderFn | None = None
        #: the tokenizer folder and template the identity by content is computed from
        self._identity_source: tuple[Path, str] | None = None
        #: which of the port's renders are compared with the template
        self._native_check = CrossCheck()
        #: vLLM's render of a gpt-oss template (:mod:`treeprep.render.harmony`; :meth:`set_server`)
        self.harmony: HarmonyChat | None = None
        #: which of its texts are tokenized and compared with Harmony's own ids
        self._harmony_check = CrossCheck()
        #: the reasoning effort of the call being rendered (Harmony states it in the prompt)
        self._effort: str | None = None
        #: the template kwargs of the call being rendered (:mod:`.template_kwargs`)
        self._kwargs: dict[str, Any] = {}
        #: the date of the call being rendered: its timestamp, else the renderer's date
        self._day: datetime | None = None
        #: incremental rendering with template kwargs, per kwargs (None: jinja renders whole)
        self._kw_incremental: dict[bytes | None, IncrementalRenderer | None] = {}
        #: the server (and Harmony library, SGLang version) :meth:`set_server` last set
        self._server: tuple[Server, Harmony, Version] | None = None
        #: the server's part in a call's render: its effort and kwargs (:mod:`.server_side`)
        self.server_side = ServerSide(self.template)
        #: how the last call :meth:`render` returned was normalized (inline ``<think>`` made
        #: reasoning, text found modulo whitespace: :func:`~.coverage.normalized_kinds`)
        self.last_normalized: tuple[str, ...] = ()
        #: whether the last call :meth:`render` returned is a final answer rendered after its
        #: generation prompt (:mod:`treeprep.render.prompted`)
        self.last_prompt_kept = False
        #: ``--parallel-calls``: split turns of parallel tool calls (:mod:`.parallel`)
        self.parallel_calls = ParallelCalls.off
        #: what rendering the last call rewrote, as curation counts (``parallel-calls:...``)
        self.last_rewrites: dict[str, int] = {}
        #: calls 2..N of split parallel completions that no later prompt has trained yet
        self._unanswered: set[str] = set()
        #: incremental jinja rendering (None: every jinja render is whole)
        self.incremental: IncrementalRenderer | None = None
        #: logged ids checked against logged text
        self.id_check = IdCheck(self.decode, identity.name)
        #: the model's response parser every trained completion is read back with (None: none
        #: is known, :attr:`response_note` says why; :mod:`treeprep.render.response`)
        port = find_port(sha256_text(template.source))
        self.response_parser: ResponseParser | HarmonyParser | None
        self.response_parser, self.response_note = find_parser(
            template.source, own=response_template, port=port.name if port else None
        )
        self._template_parser = (self.response_parser, self.response_note)
        self._native_templates = native_templates
        if native_templates:
            self._native = self._make_native()
        #: the template has a native port (jinja renders it whole where the port is off)
        self._ported = self._native is not None
        self.set_server(server, harmony)

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        tokenizer_dir: str | os.PathLike[str] | None,
        *,
        cache_chars: int = DEFAULT_CACHE_CHARS,
        native_templates: bool = True,
        chat_template: str | os.PathLike[str] | None = None,
        date: str | None = None,
        limits: RenderLimits | None = None,
        server: Server | str = Server.vllm,
        harmony: Harmony | str = Harmony.oss,
    ) -> Renderer:
        """A renderer for a Hugging Face tokenizer folder, or the built-in byte tokenizer (None).

        The folder needs ``tokenizer.json`` and a chat template (``chat_template.jinja`` or
        ``chat_template`` in ``tokenizer_config.json``), unless ``chat_template`` names a file
        with the template to render with instead. Only local files are read; transformers is not
        imported. ``native_templates=False`` renders every call whole with jinja (no native port,
        no incremental rendering). ``date`` (ISO 8601) is what ``strftime_now`` reports for
        records without a timestamp (default :data:`~treeprep.render.dates.DEFAULT_DATE`);
        ``server`` the inference server the calls were served by, ``harmony`` the library vLLM
        rendered gpt-oss with (:meth:`set_server`).
        """
        override = read_template_file(chat_template) if chat_template is not None else None
        fixed = parse_date(date)
        if date is not None and fixed is None:
            raise TokenizerError(f"--date {date!r}: expected an ISO 8601 date, like 2025-06-30")
        if tokenizer_dir is None:
            src = load_builtin(override, limits=limits, date=fixed)
        else:
            src = load_tokenizer_folder(tokenizer_dir, override, limits=limits, date=fixed)
        renderer = cls(
            src.backend,
            src.template,
            src.identity,
            split_special_tokens=src.split_special_tokens,
            cache_chars=cache_chars,
            native_templates=native_templates,
            response_template=src.response_template,
            server=server,
            harmony=harmony,
        )
        renderer._identity_source = src.content_source
        return renderer

    def set_server(
        self,
        server: Server | str,
        harmony: Harmony | str = Harmony.oss,
        sglang: Version = SGLANG_NEWEST,
    ) -> None:
        """Render a prompt's messages of several text parts as ``server`` hands them to this
        chat template (``--server``, :mod:`.text_parts`), its tools as its models write them
        (:mod:`.server_tools`; ``sglang``: ``--sglang-version``). Parts handed over as a list:
        jinja renders every call (the native ports take strings); gpt-oss on vLLM: Harmony
        renders (:mod:`.harmony`), with library ``harmony``'s headers (``--harmony``). Set
        already: nothing to do (a build's worker loads its renderer for the build's server, then
        sets it again)."""
        server, harmony = Server.of(server, "server"), Harmony.of(harmony, "harmony")
        if (server, harmony, sglang) == self._server:
            return
        self._server = (server, harmony, sglang)
        self.server_side.sglang_version = sglang
        parts = template_parts(server, self.template, sglang)
        self.template.wrap_strings = parts.wrap
        self._history = NormalizedHistory(parts)
        self._turns = PreviousTurns()
        self._kw_incremental.clear()  # their texts were rendered for the last server's parts
        if self.incremental is not None:
            self.incremental.clear()
        self.harmony = None
        self.response_parser, self.response_note = self._template_parser
        if parts.harmony:
            self.harmony = load_harmony(
                self.backend, self.identity.name, self.identity.sha256, harmony
            )
            self.response_parser = HarmonyParser(self.harmony.encoding)
            self.response_note = "Harmony's, as vLLM reads gpt-oss (--server vllm)"
        self.server_side.set_server(server, harmony=parts.harmony)
        if parts.as_list or parts.harmony:
            self._native, self.native_template = None, None
        if not (parts.harmony or self._ported or self.incremental or not self._native_templates):
            self._start_incremental()

    def _start_incremental(self) -> None:
        """Incremental jinja rendering, for a template without a native port, where it stays on
        through the probe sessions (:func:`~.incremental.verified_once`; not needed where Harmony
        renders)."""
        name = f"the chat template of {self.identity.name!r}"
        inc = IncrementalRenderer(self._jinja_at, name=name)
        self.incremental = inc if verified_once(inc, self.template, self.identity) else None

    def identity_by_content(self) -> TokenizerIdentity:
        """:attr:`identity` with its ``content_sha256`` (what a manifest records). Computed on
        request, not in :meth:`load`: it parses ``tokenizer.json`` once more, which the build's
        workers need not do."""
        if self._identity_source is None or self.identity.content_sha256 is not None:
            return self.identity
        folder, template = self._identity_source
        self.identity = self.identity.model_copy(
            update={"content_sha256": content_identity(folder, template)}
        )
        return self.identity

    @property
    def date(self) -> datetime | None:
        """The date a template's ``strftime_now`` reports for records without a timestamp (the
        template's :attr:`~treeprep.render.template.ChatTemplate.date`)."""
        return self.template.date

    @property
    def native_renders(self) -> int:
        """Renders done by the native port so far."""
        return self._native_check.renders

    @property
    def cache_key(self) -> str:
        """What a rendered sequence depends on besides the record: the tokenizer, the template
        used, the fixed date and the response parser (a build's work files are keyed by it)."""
        date = self.date.isoformat() if self.date else ""
        parser = self.response_parser.sha256 if self.response_parser else ""
        return sha256_text(
            f"{self.identity.sha256}\0{self.identity.chat_template_sha256}\0{date}\0{parser}"
        )

    # -- text and ids ----------------------------------------------------------------------------

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = False,
        now: datetime | None = None,
        where: str = "",
    ) -> str:
        """``apply_chat_template(messages, tools=tools, tokenize=False, ...)``; errors become
        :class:`RenderError`.

        Uses the verified native port when there is one (checked against the template on a
        deterministic sample of renders; :class:`NativeTemplateMismatch` names ``where``, the
        record's ``file:line``, if they differ), else the jinja template, incrementally where the
        template allows it (:mod:`treeprep.render.incremental`); a call with template kwargs
        (:mod:`treeprep.render.template_kwargs`) with jinja given them, incrementally per kwargs.
        ``now`` is the date the template's ``strftime_now`` reports (default: the renderer's
        ``date``).
        """
        now = now or self.date
        if self.harmony is not None:
            h, effort = self.harmony, self._effort
            text = h.render(messages, tools, add_generation_prompt, now, effort)
            if self._harmony_check.due(len(text)):
                ref = h.reference_ids(messages, tools, add_generation_prompt, now, effort)
                why = h.differs(text, self.encode(text).tolist(), ref, self.identity.name)
                if why is not None:
                    raise NativeTemplateMismatch(f"{where or 'a record'}: {why}")
            return text
        if self._kwargs:  # the ports know no kwargs
            inc = self._incremental_with(self._kwargs)
            if inc is not None:
                return inc.render(messages, tools, add_generation_prompt, now, where=where)
            return self.template.render(messages, tools, add_generation_prompt, now=now,
                                        extra=self._kwargs)  # fmt: skip
        if self._native is not None:
            try:
                text = self._native(messages, tools, add_generation_prompt)
            except FALLBACK_ERRORS:
                pass  # outside the port's domain: the template decides (and names any error)
            else:
                if self._native_check.due(len(text)):
                    self._check_native(text, messages, tools, add_generation_prompt, where, now)
                return text
        if self.incremental is not None:
            return self.incremental.render(messages, tools, add_generation_prompt, now, where=where)
        return self.template.render(messages, tools, add_generation_prompt, now=now)

    def _check_native(
        self, text: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool, where: str, now: datetime | None,
    ) -> None:  # fmt: skip
        reference = partial(self.template.render, messages, tools, add_generation_prompt, now=now)
        check_port(text, reference, port=self.native_template or "", tokenizer=self.identity.name,
                   add_generation_prompt=add_generation_prompt, where=where)  # fmt: skip

    def _jinja_at(
        self, msgs: list[dict], tools: list[dict] | None, gen: bool, now: datetime | None,
        extra: dict[str, Any] | None = None,
    ) -> str:  # fmt: skip
        """The jinja template's text (the incremental renderer's whole render)."""
        return self.template.render(msgs, tools, gen, now=now, extra=extra)

    def _incremental_with(self, kwargs: dict[str, Any]) -> IncrementalRenderer | None:
        """Incremental jinja rendering with these template kwargs, where it stays on through the
        probe sessions rendered with them (None: render whole; also where ``native_templates``
        is off, and for kwargs that are not plain JSON)."""
        key = json_key(kwargs)
        if key not in self._kw_incremental:
            inc = None
            if self._native_templates and key is not None:
                name = f"the chat template of {self.identity.name!r} with {key.decode()}"
                inc = IncrementalRenderer(partial(self._jinja_at, extra=dict(kwargs)), name=name)
                if not verified_once(inc, self.template, self.identity, key):
                    inc = None
            if len(self._kw_incremental) >= _KEEP_KWARGS:
                self._kw_incremental.clear()
            self._kw_incremental[key] = inc
        return self._kw_incremental[key]

    def _make_native(self) -> RenderFn | None:
        port = find_verified_port(self.template.source, self.template.render)
        if port is None:
            return None
        self.native_template = port.name
        return RenderedPrefixes(port).render

    def encode(self, text: str) -> np.ndarray:
        """Token ids of rendered text (int32), through the piece cache."""
        return self.encoder.encode(text)

    def decode(self, ids: _Seq[int] | np.ndarray) -> str:
        """Text of ``ids`` (special tokens kept), for previews."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    # -- records ---------------------------------------------------------------------------------

    def _reported_date(self) -> datetime | None:
        """The date the call being rendered renders with (its timestamp, else the renderer's
        date) as the template prints it (one per day where it prints only the day: a session's
        calls then find each other's renders, :mod:`treeprep.render.dates`)."""
        return self.template.reported_date(self._day)

    def normalize(self, rec: ChatCall) -> tuple[list[dict], dict, list[dict] | None]:
        """(messages, completion, tools) as passed to the chat template
        (:func:`~treeprep.render.messages.template_messages`)."""
        msgs, comp, tools = template_messages(
            rec, self._history.parts, normalized=self._history.messages
        )
        return msgs, comp, self.server_side.template_tools(tools)

    def render(self, rec: ChatCall | TokenRollout, *, group_id: str, order: int = 0) -> Sequence:
        """One record as a :class:`Sequence`; :class:`RenderError` if it is unusable."""
        self.last_normalized, self.last_prompt_kept, self.last_rewrites = (), False, {}
        self._effort, self._kwargs, self._day = None, {}, None
        if isinstance(rec, ChatCall):
            self._day = parse_date(rec.timestamp) or self.date
            self._effort = self.server_side.effort(rec)
            self._kwargs = self.server_side.kwargs(rec, self._effort, self._day)
        if isinstance(rec, TokenRollout):
            return rollout_sequence(
                rec,
                group_id=group_id,
                order=order,
                vocab_size=self.vocab_size,
                identity=self.identity,
                id_check=self.id_check,
            )
        later: list[int] = []
        calls = rec.completion.tool_calls or []
        if self.parallel_calls is ParallelCalls.split_turns:
            split, later = parallel.split_call(rec)
            if split is not rec:
                self.last_rewrites[parallel.SPLIT] = 1
                rec = split
        seq = self._render_chat(rec, group_id=group_id, order=order)
        if self.parallel_calls is ParallelCalls.split_turns:
            self._unanswered.update(parallel.call_key(group_id, tc) for tc in calls[1:])
        if later:
            self._train_later_calls(rec, seq, later, group_id)
        return seq

    def take_unanswered(self) -> int:
        """How many calls of split parallel completions no later prompt trained (since the last
        time this was asked: the build asks at the end of each file), forgetting them."""
        n = len(self._unanswered)
        self._unanswered.clear()
        return n

    def _train_later_calls(
        self, rec: ChatCall, seq: Sequence, later: list[int], group_id: str
    ) -> None:
        """Loss spans for the sub-turns ``later`` of the prompt (a parallel completion's calls 2..N
        split by :mod:`.parallel`): each the tokens ``apply_chat_template`` trains for the prompt
        up to it, where those are a token prefix of ``seq``, show the call and read back through
        the model's response parser as that call (as the call's own completion must)."""
        msgs, _, tools = self.normalize(rec)
        where = f"{rec.source_file}:{rec.source_line}"
        now = self._reported_date()
        spans: list[tuple[int, int]] = []
        for j in later:
            for tc in rec.messages[j].tool_calls or []:
                self._unanswered.discard(parallel.call_key(group_id, tc))
            try:
                head_text = self.render_text(
                    msgs[:j], tools, add_generation_prompt=True, now=now, where=where
                )
                full_text = self.render_text(msgs[: j + 1], tools, now=now, where=where)
            except RenderError:
                head_text = full_text = ""
            head, full = self.encode(head_text), self.encode(full_text)
            a, b = len(head), len(full)
            span_text = self.decode(full[a:])
            ok = (
                a < b <= len(seq.tokens)
                and is_prefix(head, full)
                and is_prefix(full, seq.tokens)
                and completion_coverage(msgs[j], span_text)[0] is None
                and (
                    self.response_parser is None
                    or self.response_parser.check(msgs[j], head_text, span_text) is None
                )
            )
            key = parallel.LATER if ok else parallel.UNTRAINED
            self.last_rewrites[key] = self.last_rewrites.get(key, 0) + 1
            if ok:
                spans.append((a, b))
        seq.loss_spans = sorted([*spans, *seq.loss_spans])

    def _render_chat(self, rec: ChatCall, *, group_id: str, order: int) -> Sequence:
        if not rec.messages:
            raise RenderError("the call has no prompt messages")
        msgs, comp, tools = self.normalize(rec)
        marks = self._history.marks(msgs)
        where = f"{rec.source_file}:{rec.source_line}"
        now = self._reported_date()
        span, forms = self._completion_span(msgs, comp, tools, now, where)
        comp, inline = forms[0], forms[0] is not comp  # inline: the split form renders
        missing, normalized = completion_coverage(comp, span.text)
        if missing is None and inline:
            missing = inline_think_missing(comp, span.text)
        if missing is not None:
            raise dropped_error(comp, missing)
        checked = self._read_back(forms, span.head_text, span.text)
        branch = rec.branch_reason
        if branch is None and self._turns.rewritten(
            msgs, tools, now, span.full_ids, self._history_ids(tools, now, where),
            look_up=self._native is None,
        ):  # fmt: skip
            branch = "reasoning-dropped"
        if self._native is None:
            self._turns.remember([*msgs, comp], tools, now, span.full_ids)
        kinds = normalized_kinds(inline, normalized, undeclared_tools(comp, tools))
        kinds += prompt_gaps(msgs, comp, tools, has_system=self._history.has_system(msgs))
        kinds += marks
        self.last_normalized = (*kinds, ROUND_TRIP) if checked else kinds
        self.last_prompt_kept = span.kept
        n, n_p = len(span.full_ids), span.n_prompt
        return record_sequence(rec, group_id, order, span.full_ids, [(n_p, n)], None, branch)

    def _completion_span(
        self,
        msgs: list[dict],
        comp: dict,
        tools: list[dict] | None,
        now: datetime | None,
        where: str,
    ) -> tuple[TrainedSpan, tuple[dict, ...]]:
        """The trained span, and the forms of the completion, the one it renders first
        (:func:`~.span.completion_span`: with an inline ``<think>`` block, as the model wrote it
        or the block made its reasoning, in the order this template's reasoning asks)."""
        head: list[tuple[str, np.ndarray]] = []

        def prompt() -> tuple[str, np.ndarray]:  # rendered once, after the first full render
            if not head:
                text = self.render_text(msgs, tools, add_generation_prompt=True, now=now,
                                        where=where)  # fmt: skip
                head.append((text, self.encode(text)))
            return head[0]

        span = partial(trained_span, self.render_text, self.encode, self.decode, msgs,
                       tools=tools, prompt=prompt, now=now, where=where)  # fmt: skip
        return completion_span(span, comp, self.template.source)

    def _read_back(self, forms: tuple[dict, ...], head_text: str, span_text: str) -> bool:
        """Whether the model's response parser read the trained span (after ``head_text``, the
        prompt's text) back as the completion, in one of its ``forms`` (False: no parser known);
        :class:`RenderError` naming the difference when it reads back as another message."""
        if self.response_parser is None:
            return False
        first = None
        for comp in forms:  # the second only where the first does not read back
            why = self.response_parser.check(comp, head_text, span_text)
            if why is None:
                return True
            first = first or why
        raise RenderError(
            f"the trained completion does not round-trip through the model's response parser "
            f"({self.response_parser.name}): {first}; training on it would teach the model an "
            "output it does not emit"
        )

    def _history_ids(
        self, tools: list[dict] | None, now: datetime | None, where: str
    ) -> Callable[[list[dict]], np.ndarray | None]:
        """A history's training sequence as this renderer renders it (None: it does not render)."""

        def ids(msgs: list[dict]) -> np.ndarray | None:
            try:
                return self.encode(self.render_text(msgs, tools, now=now, where=where))
            except RenderError:
                return None

        return ids
