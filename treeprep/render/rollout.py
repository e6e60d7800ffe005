"""A record's token :class:`~treeprep.sequence.Sequence`, and a token rollout taken as it is.

A :class:`~treeprep.schemas.TokenRollout` is taken as is: prompt ids + generation ids, the loss
span over the generation, the sampler's log-probs passed through. Ids outside the vocabulary are
rejected; without ``--tokenizer`` (the built-in byte tokenizer) such ids stop the build at once
with what to pass, rather than rejecting every rollout. A rollout whose log also holds its text
is checked to decode to it (:mod:`treeprep.render.idcheck`).
"""

from __future__ import annotations

import numpy as np

from treeprep.errors import RenderError, TokenizerError
from treeprep.render.idcheck import IdCheck
from treeprep.schemas import ChatCall, TokenizerIdentity, TokenRollout
from treeprep.sequence import Sequence


def record_sequence(
    rec: ChatCall | TokenRollout,
    group_id: str,
    order: int,
    tokens: np.ndarray,
    spans: list[tuple[int, int]],
    logprobs: np.ndarray | None,
    branch: str | None,
) -> Sequence:
    """A rendered record's sequence, carrying the record's reward, ids and origin."""
    return Sequence(
        group_id=group_id,
        tokens=tokens,
        loss_spans=spans,
        logprobs=logprobs,
        reward=rec.reward,
        advantage=rec.advantage,
        agent_id=rec.agent_id,
        call_id=rec.call_id,
        trajectory_id=rec.trajectory_id if rec.trajectory_id is not None else group_id,
        source=f"{rec.source_file}:{rec.source_line}",
        source_format=rec.source_format,
        branch_reason=branch,
        order=order,
    )


def _check_vocabulary(
    rec: TokenRollout, prompt: np.ndarray, gen: np.ndarray, vocab_size: int,
    identity: TokenizerIdentity,
) -> None:  # fmt: skip
    """Reject ids outside the vocabulary; stop the build where no ``--tokenizer`` was given."""
    for name, arr in (("prompt_token_ids", prompt), ("generation_token_ids", gen)):
        if arr.size and int(arr.max()) >= vocab_size:
            pos = int(np.argmax(arr >= vocab_size))
            where = f"{name}[{pos}] = {int(arr[pos])}"
            if identity.path is None:
                # no --tokenizer: every rollout of the build would be rejected; stop at once
                raise TokenizerError(
                    f"{rec.source_file}:{rec.source_line}: a token rollout ({where}) needs "
                    "the tokenizer that produced its ids, and no --tokenizer was given (the "
                    f"built-in byte tokenizer has {vocab_size} ids). Pass --tokenizer "
                    "with the model's Hugging Face tokenizer folder."
                )
            raise RenderError(
                f"{where} is outside the vocabulary of tokenizer "
                f"{identity.name!r} ({vocab_size} ids); build with the tokenizer "
                "that produced these ids (--tokenizer)"
            )


def rollout_sequence(
    rec: TokenRollout, *, group_id: str, order: int, vocab_size: int,
    identity: TokenizerIdentity, id_check: IdCheck,
) -> Sequence:  # fmt: skip
    """``rec``'s prompt and generation ids as one sequence, the loss over the generation."""
    prompt = np.asarray(rec.prompt_token_ids, dtype=np.int64)
    gen = np.asarray(rec.generation_token_ids, dtype=np.int64)
    _check_vocabulary(rec, prompt, gen, vocab_size, identity)
    logged = getattr(rec, "logged_text", None)  # a TextRollout (treeprep.formats.base)
    if logged is not None:
        names = getattr(rec, "logged_tool_names", [])
        id_check.check(rec.generation_token_ids, logged, names, rec.source_file)
    tokens = np.concatenate([prompt, gen]).astype(np.int32)
    n_p, n = len(prompt), len(tokens)
    spans = [(n_p, n)] if n > n_p else []
    lp = rec.generation_log_probs
    logprobs = None if lp is None else np.asarray(lp, dtype=np.float32)
    seq = record_sequence(rec, group_id, order, tokens, spans, logprobs, rec.branch_reason)
    if rec.ref_log_probs is not None and spans:
        seq.ref_logprobs = np.asarray(rec.ref_log_probs, dtype=np.float32)
    return seq
