"""Canonical records: what every input format is turned into before rendering.

A :class:`ChatCall` is one LLM call in OpenAI chat form: the prompt ``messages``, the ``tools``
offered, and the ``completion`` (one assistant message) that the model produced. A
:class:`TokenRollout` is a call whose token ids are already known (RL rollouts): the prompt ids
and the generated ids, optionally with the sampler's log-probs.

Both carry their origin (``source_file``, ``source_line``, ``source_format``) so that every reject
and every sequence in a tree can be traced back to the input line it came from, and a
:class:`Provenance` saying how much of the record is exactly what the model saw.

Adapters may give a ``branch_reason`` hint: why this call's context stops being a prefix
continuation of the agent's previous call (see :data:`BRANCH_REASONS`). The trie attaches the hint
to the branch point where the call's sequence diverges.

``trajectory_id`` names the *sample* a call belongs to: one run of the agent on the task, its main
thread and its sub-agents together. A group (``group_id``, one tree) may hold several trajectories
(a GRPO group of k samples); RL advantages from rewards are normalized over a group's trajectories,
and every call of a trajectory carries its trajectory's advantage. Adapters fill it when the format
names the sample; when it is None the builder uses the group id (the group is one run).
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import compress, count
from operator import is_, is_not
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["system", "user", "assistant", "tool"]
#: how a request wrote a tool call's arguments that its log holds as an object
#: (:attr:`ChatCall.arguments_json`)
ArgumentsJson = Literal["python", "javascript"]

BranchReason = Literal[
    "sub-agent",
    "compaction",
    "reasoning-dropped",
    "elided-history",
    "retry",
    "new-trial",
    "parallel-tools",
    "sampling",
    "unknown",
]
BRANCH_REASONS: tuple[str, ...] = get_args(BranchReason)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ContentPart(BaseModel):
    """One part of a multi-part message content (``{"type": "text", "text": ...}`` and others)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCall(_Model):
    name: str
    #: Arguments exactly as logged: a JSON string (OpenAI) or an object (Anthropic, some templates).
    arguments: str | dict[str, Any] = ""


class ToolCall(_Model):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Model):
    role: Role
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined with nothing between them)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(
            p.text or "" for p in self.content if p.type in ("text", "input_text", "output_text")
        )


class Provenance(_Model):
    #: The token ids are exactly those the model saw (token rollouts, logged ids).
    exact_tokens: bool = False
    #: The messages are exactly the prompt the model saw (per-call logs, SWE-agent queries).
    exact_messages: bool = True
    #: The prompt was rebuilt from a transcript (Claude Code, tau-bench, mini-swe-agent).
    reconstructed: bool = False


class ChatCall(_Model):
    """One LLM call in OpenAI chat form."""

    group_id: str | None = None
    agent_id: str = "main"
    call_id: str
    trajectory_id: str | None = None
    parent_call_id: str | None = None
    model: str | None = None
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    completion: Message
    reward: float | None = None
    advantage: float | None = None
    provenance: Provenance = Field(default_factory=Provenance)
    branch_reason: BranchReason | None = None
    #: when the call was made (ISO 8601, as logged); a template that prints the date gets this one
    timestamp: str | None = None
    #: the project the call was made in (the agent's working directory), where the log says
    project: str | None = None
    #: the reasoning effort the request asked for (OpenAI's ``reasoning_effort``, the Responses
    #: API's ``reasoning.effort``, Codex's turn context), where the log says; gpt-oss's prompt
    #: states it (:mod:`treeprep.render.harmony`)
    reasoning_effort: str | None = None
    #: the request turned thinking off the Anthropic way (``thinking.type`` ``disabled`` or
    #: ``between_tools``), which vLLM's Messages endpoint sends as the effort it probes the
    #: template for, over ``reasoning_effort`` (:mod:`treeprep.render.template_kwargs`)
    thinking_disabled: bool = False
    #: the request's ``chat_template_kwargs`` (vLLM, SGLang and llama.cpp hand them to the chat
    #: template, e.g. ``{"enable_thinking": false}``), where the log says
    chat_template_kwargs: dict[str, Any] | None = None
    #: how the request wrote a tool call's arguments that the log holds as an object (the
    #: agent's, or the endpoint's it spoke to): ``python``, ``json.dumps`` (``", "``, ``": "``,
    #: non-ASCII escaped); ``javascript``, ``JSON.stringify`` (compact, non-ASCII as it is);
    #: None, not known (as a chat template's ``tojson`` writes it; on llama.cpp, compact as its
    #: nlohmann ``dump()`` writes an object it is sent). Only a render that writes the request's
    #: string shows it (gpt-oss on vLLM: :mod:`treeprep.render.harmony`; llama.cpp for a
    #: template that reads no object arguments: :mod:`treeprep.render.llama_caps`)
    arguments_json: ArgumentsJson | None = None
    source_file: str = ""
    source_line: int = 0
    source_format: str = ""

    @field_validator("completion")
    @classmethod
    def _completion_is_assistant(cls, m: Message) -> Message:
        if m.role != "assistant":
            raise ValueError(f"completion must be an assistant message, got role {m.role!r}")
        return m

    @model_validator(mode="after")
    def _tool_results_have_calls(self) -> ChatCall:
        global _LAST_CALLS
        msgs = self.messages
        last, made, where, seen = _LAST_CALLS
        _LAST_CALLS = ([], [], [], set())  # forgotten until this call passes
        start = shared_prefix(msgs, last)
        if start < len(last):
            # leaves the objects checked last time: the calls made before it leaves them
            kept = bisect_left(where, start)
            made, where = made[:kept], where[:kept]
            seen = set(made)
        # else the same objects checked last time (not again), whose calls grow in place (a copy
        # would cost the whole history's ids per call)
        for i in range(start, len(msgs)):
            m = msgs[i]
            if m.role == "assistant" and m.tool_calls:
                for tc in m.tool_calls:
                    if tc.id:
                        seen.add(tc.id)
                        made.append(tc.id)
                        where.append(i)
            if m.role == "tool" and m.tool_call_id is not None and m.tool_call_id not in seen:
                raise ValueError(
                    f"messages[{i}] is a tool result for tool_call_id {m.tool_call_id!r} "
                    "but no earlier assistant message made that call"
                )
        _LAST_CALLS = (list(msgs), made, where, seen)
        return self


def starts_with(items: list[Any], head: list[Any]) -> bool:
    """Whether ``items`` starts with the very objects of ``head`` (identity, in C), ``head`` not
    empty: how a session's calls know the history they share, here and in
    :mod:`treeprep.render.history`."""
    k = len(head)
    return 0 < k <= len(items) and items[k - 1] is head[-1] and all(map(is_, head, items))


def shared_prefix(items: list[Any], head: list[Any]) -> int:
    """How many of ``items`` are, from the first on, the very objects of ``head`` (identity, in
    C): what a call shares with the history of one before it that it leaves somewhere (Aider's
    files after the history, an elided output, a retry).

    >>> a, b = object(), object()
    >>> shared_prefix([a, b, 1], [a, b, 2]), shared_prefix([a], [b]), shared_prefix([a, b], [a])
    (2, 0, 1)
    """
    return next(compress(count(), map(is_not, items, head)), min(len(items), len(head)))


#: the messages :meth:`ChatCall._tool_results_have_calls` checked last, the tool-call ids they
#: made, the index of the message that made each, and the ids as a set: a session's calls share
#: their history's :class:`Message` objects (the adapters validate each once), so a call checks
#: only the messages after those it begins with that are the last call's objects (a message's
#: role and ids are not changed after it is made)
_LAST_CALLS: tuple[list[Message], list[str], list[int], set[str]] = ([], [], [], set())


class TokenRollout(_Model):
    """One call whose token ids are known exactly (an RL rollout)."""

    group_id: str | None = None
    agent_id: str = "main"
    call_id: str
    trajectory_id: str | None = None
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float] | None = None
    #: the reference policy's log-probs of the generated tokens (one per generation token, in
    #: order), for a KL penalty against it (``--kl-coef``)
    ref_log_probs: list[float] | None = None
    reward: float | None = None
    advantage: float | None = None
    branch_reason: BranchReason | None = None
    source_file: str = ""
    source_line: int = 0
    source_format: str = ""

    @model_validator(mode="after")
    def _check(self) -> TokenRollout:
        if not self.prompt_token_ids and not self.generation_token_ids:
            raise ValueError("a token rollout needs at least one token")
        if any(t < 0 for t in self.prompt_token_ids) or any(
            t < 0 for t in self.generation_token_ids
        ):
            raise ValueError("token ids must be non-negative")
        n = len(self.generation_token_ids)
        for name, probs in (
            ("generation_log_probs", self.generation_log_probs),
            ("ref_log_probs", self.ref_log_probs),
        ):  # one per generated token
            if probs is not None and len(probs) != n:
                raise ValueError(f"{name} has {len(probs)} entries, generation_token_ids has {n}")
        return self


class Reject(_Model):
    """An input record that is not in any tree, and why."""

    file: str
    line: int
    reason: str
    format: str | None = None
    call_id: str | None = None
