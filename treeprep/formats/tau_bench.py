"""tau-bench and tau2-bench trajectories: the agent's calls, one tree per task.

``tau-bench`` (sierra-research/tau-bench historical trajectories): a JSON list of
``{task_id, trial, reward, info, traj}`` where ``traj`` is the agent's OpenAI message list (system
policy, user turns from the simulator, assistant turns with ``tool_calls``, ``tool`` results). Each
assistant message is one call whose prompt is every message before it. The 4 trials of a task share
only the system message, so all trials of a task go into one group and the first call of every
later trial is hinted ``new-trial``. Tool schemas are not stored: ``--tools``.

``tau2-bench`` (results JSON): ``info.environment_info`` holds the domain ``policy`` (and
``tool_defs`` when the run saved them) and ``simulations[].messages`` the conversation. The agent's
system prompt is rebuilt from the policy with tau2's ``LLMAgent`` layout
(``<instructions>...</instructions>\\n<policy>...</policy>``). An assistant message is a call only
when it carries the model's ``raw_data``/``usage``: the opening greeting is written by the
orchestrator, not generated, and stays as context. Tool calls keep their argument objects (so a call
renders the same in its completion and in later prompts); tool results are matched by their ``id``.
The user simulator's own calls are not emitted: its prompt (guidelines plus the task's scenario
with the conversation seen from the other side) is not stored and would be a guess. In domains where
the user acts on their own device (telecom), the simulator's tool calls and their results are left
out of the agent's prompts altogether, as tau2 builds the agent's view
(``is_valid_agent_history_message``: a user message with ``tool_calls`` and a tool result for the
user go to the environment and the user, never to the agent).

Rewards: the trajectory's reward is set on every call of that trial. Each trial is its own
trajectory (``trajectory_id`` is the trial's call prefix, ``task-<id>/trial-<n>``, plus the
simulation id in tau2), so a task's tree is a GRPO group of its trials and advantages are
normalized over the trials, each counted once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from treeprep.errors import InputError, RecordError
from treeprep.formats._fields import (
    file_stem,
    group_or,
    make_call,
    openai_tool_calls,
    opt_dict,
    opt_str,
)
from treeprep.formats._read import document
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.io.jsonparse import NonFinite, find_non_finite, find_value
from treeprep.schemas import Reject

TAU = "tau-bench"
TAU2 = "tau2-bench"
#: removed from the file's name for the group ids (``<stem>:task-<id>``)
_SUFFIXES = (".gz", ".zst", ".json")

_TAU2_INSTRUCTION = (
    "You are a customer service agent that helps the user according to the <policy> provided "
    "below.\nIn each turn you can either:\n- Send a message to the user.\n- Make a tool call.\n"
    "You cannot do both at the same time.\n\nTry to be helpful and always follow the policy. "
    "Always make sure you generate valid JSON only."
)


def tau2_system_prompt(policy: str) -> str:
    """tau2-bench ``LLMAgent``'s system prompt for a domain policy."""
    return f"<instructions>\n{_TAU2_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"


def sniff_tau(path: str, head: bytes) -> bool:
    h = head.lstrip()
    return h.startswith(b"[") and b'"task_id"' in head and b'"traj"' in head


def sniff_tau2(path: str, head: bytes) -> bool:
    h = head.lstrip()
    if not h.startswith(b"{"):
        return False
    if b'"simulations"' in head and b'"task_id"' in head:
        return True
    return b'"environment_info"' in head or (b'"user_info"' in head and b'"agent_info"' in head)


def _tau_message(m: dict[str, Any], where: str) -> dict[str, Any]:
    """A tau / tau2 message in OpenAI form; RecordError naming ``where`` when misshapen."""
    out: dict[str, Any] = {"role": m.get("role"), "content": m.get("content")}
    if m.get("tool_calls"):
        out["tool_calls"] = openai_tool_calls(m["tool_calls"], f"{where}.tool_calls")
    if m.get("role") == "tool":
        out["tool_call_id"] = m.get("tool_call_id", m.get("id"))
        if m.get("name"):
            out["name"] = m["name"]
    return out


def _tau_trial(traj: list[Any], where: str) -> tuple[list[dict[str, Any]], list[bool]]:
    """A tau-bench trial's ``traj`` in OpenAI form, and which messages are calls (every
    assistant message); RecordError at the first misshapen message."""
    msgs = []
    for j, m in enumerate(traj):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise RecordError(
                f"{where}[{j}]: expected a message with role system/user/assistant/tool"
            )
        msgs.append(_tau_message(m, f"{where}[{j}]"))
    return msgs, [m["role"] == "assistant" for m in msgs]


def _tau2_simulation(
    messages: list[Any], where: str, system: str | None
) -> tuple[list[dict[str, Any]], list[bool]]:
    """A tau2 simulation's ``messages`` as the agent sees them, in OpenAI form after the
    ``system`` prompt, and which of them are the agent's calls; RecordError at the first
    misshapen message."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    is_call = [False] * len(msgs)
    for j, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant", "tool"):
            raise RecordError(f"{where}[{j}]: unknown role {role!r}")
        if role == "tool" and m.get("requestor", "assistant") != "assistant":
            continue  # the user simulator's own tool results: the agent never sees them
        if role == "user" and m.get("tool_calls") is not None:
            # tau2's is_valid_agent_history_message: a user message that makes tool calls
            # goes to the environment, never to the agent (not even as an empty turn)
            continue
        msgs.append(_tau_message(m, f"{where}[{j}]"))
        is_call.append(
            role == "assistant" and (m.get("raw_data") is not None or m.get("usage") is not None)
        )
    return msgs, is_call


#: a trial read: its chat (messages, which are calls) and its logged reward
_Trial = tuple[tuple[list[dict[str, Any]], list[bool]], Any]


class _Trials:
    """One results file's trials, read in file order, and what both formats make of them: a
    task's trials share its group (``<stem>:task-<id>``, unless the record names one), and a
    trial after the task's first branches off their shared system prompt as ``new-trial``."""

    def __init__(self, path: str, fmt: str, opts: ReadOptions) -> None:
        self.path, self.fmt, self.opts = path, fmt, opts
        self.stem = file_stem(path, _SUFFIXES)
        self._seen: dict[str, int] = {}

    def number(self, task: str) -> int:
        """This trial's number among ``task``'s trials in the file (0: the first)."""
        n = self._seen.get(task, 0)
        self._seen[task] = n + 1
        return n

    def reject(self, line: int, reason: str, call_id: str | None = None) -> Reject:
        return Reject(file=self.path, line=line, format=self.fmt, reason=reason, call_id=call_id)

    def trial(
        self,
        rec: dict[str, Any],
        task: str,
        *,
        line: int,
        where: str,
        read: Callable[[], _Trial],
        prefix: Callable[[int], str],
        tools: list[dict[str, Any]] | None,
    ) -> Iterator[Item]:
        """One trial of ``task`` (both formats' loop): ``read()`` gives its chat and its logged
        reward (a RecordError: the trial is one reject), ``prefix(n)`` its calls' id prefix
        from its number among the task's trials."""
        n = self.number(task)
        try:
            chat, reward = read()
        except RecordError as err:
            yield self.reject(line, str(err))
            return
        yield from self.calls(
            rec, task, n, prefix=prefix(n), line=line, where=where, chat=chat, tools=tools,
            reward=_float(reward),
        )  # fmt: skip

    def calls(
        self,
        rec: dict[str, Any],
        task: str,
        n: int,
        *,
        prefix: str,
        line: int,
        where: str,
        chat: tuple[list[dict[str, Any]], list[bool]],
        tools: list[dict[str, Any]] | None,
        reward: float | NonFinite | None,
    ) -> Iterator[Item]:
        """The calls of trial ``n`` of ``task`` (record ``rec``): each message marked a call in
        ``chat`` (messages, is_call), with the messages before it as its prompt; call ids are
        ``prefix/<k>``."""
        gid = group_or(rec, self.opts, f"{self.stem}:task-{task}")
        messages, is_call = chat
        k = 0
        for i, (m, call) in enumerate(zip(messages, is_call, strict=True)):
            if not call:
                continue
            held = {"messages": messages[:i], "completion": m, "tools": tools, "reward": reward}
            bad = find_non_finite(held)
            if bad is not None:  # a NaN/Infinity in what this call holds rejects this call only
                got = find_value(held, bad)
                reason = f"{where}: {bad}: expected a finite number, got {got}"
                yield self.reject(line, reason, call_id=f"{prefix}/{k}")
                k += 1
                continue
            item = make_call(
                {
                    "group_id": gid,
                    "agent_id": "main",
                    "call_id": f"{prefix}/{k}",
                    "trajectory_id": prefix,
                    "parent_call_id": f"{prefix}/{k - 1}" if k else None,
                    "messages": messages[:i],
                    "tools": tools,
                    "completion": m,
                    "reward": reward,
                    "provenance": {
                        "exact_tokens": False,
                        "exact_messages": False,
                        "reconstructed": True,
                    },
                    "branch_reason": "new-trial" if n and k == 0 else None,
                    # tau2's to_litellm_messages: json.dumps(tc.arguments)
                    "arguments_json": "python",
                    "source_file": self.path,
                    "source_line": line,
                    "source_format": self.fmt,
                },
                file=self.path,
                line=line,
                fmt=self.fmt,
            )
            if isinstance(item, Reject):
                item.reason = f"{where}.messages[{i}]: {item.reason}"
            yield item
            k += 1


def _float(v: Any) -> float | NonFinite | None:
    if isinstance(v, NonFinite):
        return v  # rejected with the calls that carry it
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _tau_read(e: dict[str, Any], i: int) -> _Trial:
    return _tau_trial(e["traj"], f"[{i}].traj"), e.get("reward")


def _tau_prefix(e: dict[str, Any], task: str, n: int) -> str:
    return f"task-{task}/trial-{e.get('trial', n)}"


def _tau2_read(s: dict[str, Any], i: int, system: str | None) -> _Trial:
    chat = _tau2_simulation(s["messages"], f"simulations[{i}].messages", system)
    return chat, opt_dict(s.get("reward_info"), f"simulations[{i}].reward_info").get("reward")


def _tau2_prefix(s: dict[str, Any], i: int, task: str, n: int) -> str:
    return f"task-{task}/trial-{s.get('trial', n)}/{s.get('id', i)}"


def read_tau(path: str, opts: ReadOptions) -> Iterator[Item]:
    d = document(path, keep_non_finite=True)
    doc = d.value
    if not isinstance(doc, list):
        raise InputError(path, 1, "expected a tau-bench JSON list of {task_id, traj, reward}")
    lines = d.element_lines(len(doc))
    trials = _Trials(path, TAU, opts)
    for i, e in enumerate(doc):
        line = lines[i]
        if not isinstance(e, dict) or "task_id" not in e or not isinstance(e.get("traj"), list):
            yield trials.reject(line, f"[{i}]: expected an object with 'task_id' and a 'traj' list")
            continue
        task = str(e["task_id"])
        yield from trials.trial(
            e,
            task,
            line=line,
            where=f"[{i}].traj",
            read=partial(_tau_read, e, i),
            prefix=partial(_tau_prefix, e, task),
            tools=opts.tools,
        )


def read_tau2(path: str, opts: ReadOptions) -> Iterator[Item]:
    d = document(path, keep_non_finite=True)
    doc = d.value
    if not isinstance(doc, dict) or not isinstance(doc.get("simulations"), list):
        raise InputError(path, 1, "expected a tau2-bench results object with 'simulations'")
    try:
        info = opt_dict(doc.get("info"), "info")
        env = opt_dict(info.get("environment_info"), "info.environment_info")
        policy = opt_str(env.get("policy"), "info.environment_info.policy")
    except RecordError as e:
        raise InputError(path, 1, str(e)) from e
    tools = env.get("tool_defs") if isinstance(env.get("tool_defs"), list) else opts.tools
    system = opts.system_prompt or (tau2_system_prompt(policy) if policy else None)
    trials = _Trials(path, TAU2, opts)
    for i, s in enumerate(doc["simulations"]):
        if not isinstance(s, dict) or not isinstance(s.get("messages"), list):
            yield trials.reject(1, f"simulations[{i}]: expected an object with a 'messages' list")
            continue
        sid = s.get("id")
        line = d.line_of(f'"{sid}"') if isinstance(sid, str | int) and sid else 1
        task = str(s.get("task_id"))
        yield from trials.trial(
            s,
            task,
            line=line,
            where=f"simulations[{i}]",
            read=partial(_tau2_read, s, i, system),
            prefix=partial(_tau2_prefix, s, i, task),
            tools=tools,
        )


FORMATS = [
    FormatSpec(name=TAU, sniff=sniff_tau, read=read_tau, priority=40),
    FormatSpec(name=TAU2, sniff=sniff_tau2, read=read_tau2, priority=40),
]
