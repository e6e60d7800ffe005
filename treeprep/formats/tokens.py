"""``tokens``: rollouts whose token ids are known exactly, so nothing is rendered.

Two JSONL layouts:

* one rollout per line: ``prompt_token_ids``, ``generation_token_ids``, optional
  ``generation_log_probs`` (one per generated token), ``reward``, ``advantage``, ``group_id``
  (or ``task_id``/``session_id``/``metadata.*``/``--group-by``), ``call_id``, ``agent_id``,
  ``trajectory_id`` (or ``sample_id``/``rollout_id``/``episode_id``/``session_id``: the sample the
  call belongs to, its first call hinted ``sampling``; without one the group is one run),
  ``ref_log_probs`` (a reference policy's log-probs of the generated tokens, one per generated
  token, for ``--kl-coef``), and the generation as text (``generation_text``, or its aliases in
  :data:`~treeprep.formats._fields.FIELDS`: a string), which the generation ids are checked to
  decode to (:mod:`treeprep.render.idcheck`);
* NeMo-Gym Responses rollouts, where the ids sit on the ``response.output`` items: every assistant
  turn whose items carry ids is one :class:`~treeprep.schemas.TokenRollout` (the ids on the message
  item cover the whole generation, reasoning included), grouped by ``_ng_task_index`` within the
  file (else by the prompt they were sampled from) so the k samples of a task (a GRPO group) share
  one tree. The conversion is the
  ``openai-responses`` adapter's (:func:`treeprep.formats.openai_responses.responses_items`), so a
  turn without ids in such a file still becomes a chat call rather than being lost.

Ids are checked to be non-negative integers (booleans are not ids) and log-probs to match the
generation in length; a bad rollout is one reject naming the field. Sniffing looks for the id keys
as real JSON keys (not quoted inside text), so this format is chosen before ``openai-responses``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from treeprep.formats._fields import AliasError, aliased, key_of, token_rollout, type_name
from treeprep.formats._read import records
from treeprep.formats._samples import Samples
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.openai_chat import (
    RecordError,
    group_of,
    outcome_fields,
    trajectory_of,
    validation_reason,
)
from treeprep.formats.openai_responses import (
    check_ids,
    check_logprobs,
    looks_like_responses,
    response_of,
    responses_items,
)
from treeprep.io.jsonparse import head_record, json_key_in
from treeprep.schemas import Reject, TokenRollout

NAME = "tokens"
_ID_KEYS = ("prompt_token_ids", "generation_token_ids")


def rollout(rec: dict[str, Any], *, file: str, line: int, opts: ReadOptions) -> TokenRollout:
    """One flat rollout record (raises :class:`RecordError` when it does not fit)."""
    for k in _ID_KEYS:
        if k not in rec:
            raise RecordError(f"no {k!r} (expected prompt_token_ids and generation_token_ids)")
    p = check_ids(rec["prompt_token_ids"], "prompt_token_ids")
    g = check_ids(rec["generation_token_ids"], "generation_token_ids")
    lp = check_logprobs(rec.get("generation_log_probs"), "generation_log_probs")
    ref = check_logprobs(rec.get("ref_log_probs"), "ref_log_probs")
    cid = rec.get("call_id", rec.get("id"))
    if cid is None or isinstance(cid, bool) or not isinstance(cid, str | int):
        cid = f"{os.path.basename(file)}:{line}"
    agent = rec.get("agent_id")
    if agent is not None and not isinstance(agent, str):
        raise RecordError(f"agent_id: expected a string, got {type_name(agent)}")
    try:
        text = aliased(rec, "generation_text")
    except AliasError as e:
        raise RecordError(str(e)) from e
    if text is not None and not isinstance(text, str):
        where = key_of(rec, "generation_text")
        raise RecordError(f"{where}: expected a string, got {type_name(text)}")
    try:
        return token_rollout(
            opts.check_ids,
            text,
            [],
            group_id=group_of(rec, opts),
            agent_id=agent or "main",
            call_id=str(cid),
            trajectory_id=trajectory_of(rec),
            prompt_token_ids=p,
            generation_token_ids=g,
            generation_log_probs=lp,
            ref_log_probs=ref,
            **outcome_fields(rec, file=file, line=line, fmt=NAME),
        )
    except ValidationError as e:
        raise RecordError(validation_reason(e)) from e


def convert(rec: Any, *, file: str, line: int, opts: ReadOptions) -> list[Item]:
    try:
        if not isinstance(rec, dict):
            raise RecordError(f"expected a JSON object, got {type_name(rec)}")
        if any(k in rec for k in _ID_KEYS):
            return [rollout(rec, file=file, line=line, opts=opts)]
        if looks_like_responses(rec):
            return list(responses_items(rec, file=file, line=line, fmt=NAME, opts=opts))
        raise RecordError(
            "expected prompt_token_ids and generation_token_ids, or a Responses record "
            "(responses_create_params/response.output) whose output items carry them"
        )
    except RecordError as e:
        return [Reject(file=file, line=line, reason=str(e), format=NAME)]


def read(path: str, opts: ReadOptions) -> Iterator[Item]:
    samples = Samples()  # each named sample's first call: sampling (see the module)
    for line, rec in records(path, NAME):
        if isinstance(rec, Reject):
            yield rec
        else:
            yield from samples.mark(rec, convert(rec, file=path, line=line, opts=opts))


def _has_ids(rec: Any) -> bool:
    if not isinstance(rec, dict):
        return False
    if any(k in rec for k in _ID_KEYS):
        return True
    resp = response_of(rec)
    out = resp.get("output")
    return isinstance(out, list) and any(
        isinstance(it, dict) and any(k in it for k in _ID_KEYS) for it in out
    )


def sniff(path: str, head: bytes) -> bool:
    rec = head_record(head)
    if rec is not None:
        return _has_ids(rec)
    return head.lstrip().startswith(b"{") and any(json_key_in(head, k) for k in _ID_KEYS)


FORMAT = FormatSpec(name=NAME, sniff=sniff, read=read, priority=40)
