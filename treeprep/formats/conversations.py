"""Conversation datasets (the usual SFT shape): ``chat-messages`` and ``sharegpt``.

One record is one whole conversation, not one LLM call. Every assistant turn is a training target
whose prompt is the history before it, so a record becomes several :class:`ChatCall` records of one
group and the trie merges them: training on the tree equals multi-turn SFT with an assistant mask.

``chat-messages`` (``messages`` list of ``role``/``content`` messages):

* OpenAI fine-tuning JSONL: several assistant turns, optional ``tools`` (or the legacy API's
  ``functions``, with ``function_call`` turns and ``function`` results), and a
  per-assistant ``weight``: ``0`` makes that turn context, not a target
  (``1`` or absent: a target). Any other weight is a reject.
* Toucan-1.5M rows: ``messages`` and ``available_tools`` as JSON text, and each reply split
  over several assistant messages (its reasoning, its text, one ``function_call`` message per
  call), joined back into one turn (:mod:`treeprep.formats._rows`).
* Hugging Face / TRL ``messages`` datasets, JSONL or Parquet, with ``tools`` as a list or as a
  JSON string; ms-swift's ``tool_call``/``tool_response`` roles (a JSON tool call as content) and
  Axolotl's spellings are read through :mod:`treeprep.formats._fields`.

``sharegpt`` (``conversations`` list of ``from``/``value`` turns, as LLaMA-Factory, Axolotl and
ms-swift read it): ``human``/``gpt``/``system`` turns, ``function_call`` turns whose value is a JSON
call ``{"name", "arguments"}`` (or a list of them: parallel calls), ``observation`` turns (the tool
result), a top-level ``system`` string and ``tools`` as a JSON string. ShareGPT carries no call ids,
so tool calls and results have none (the model never saw any); LLaMA-Factory trains both ``gpt``
and ``function_call`` turns, and so do we.

Files: JSONL (one conversation per line), a JSON array (``line`` is then 1 for every record: the
array is one document), or Parquet (``line`` is the row number, 1-based). Parquet stores lists of
structs with the union of all keys, so a key missing from one message reads back as null; nulls
are treated as absent everywhere, and for ``tools`` and dict ``arguments`` read from a struct
column null-valued keys are dropped (a JSON schema with a real ``null`` default must be stored as a
JSON string to survive; Hugging Face datasets do that).

Group: ``--group-by`` or ``group_id``/``task_id``/``session_id``/``id``/``conversation_id``,
else ``<file name>:<line>``: one tree per conversation. Rejects: a record that does not fit is one
reject naming the field (an unknown role, a ``function_call`` value that is not JSON, a bad
``weight``, no assistant turn to train on); a target with nothing before it, or whose reply is
empty (no text, reasoning or tool call), is rejected alone: it is never trained. A record's
``trajectory_id`` (one run of a task, with ``--group-by`` naming the task) names its calls and
its sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson
from pydantic import ValidationError

from treeprep.errors import InputError
from treeprep.formats._fields import (
    FIELDS,
    REWARD_KEYS,
    TOOL_CALL_ROLES,
    AliasError,
    aliased,
    canonical_role,
    file_stem,
    openai_tool_calls,
    template_kwargs_at,
    type_name,
    value_parts,
)
from treeprep.formats._read import document, records
from treeprep.formats._rows import drop_nulls, join_split_replies, row_tools, split_call, turns_of
from treeprep.formats.base import FormatSpec, Item, ReadOptions
from treeprep.formats.openai_chat import (
    GROUP_KEYS,
    RecordError,
    group_of,
    normalize_message,
    row_model,
    row_reward,
    validation_reason,
)
from treeprep.io.lines import record_limit
from treeprep.schemas import ChatCall, Provenance, Reject
from treeprep.schemas.records import Message

#: a dataset record -> a ``messages`` record (field mapping), RecordError when it does not fit
Prepare = Callable[[Any, ReadOptions], Any]

MESSAGES = "chat-messages"
SHAREGPT = "sharegpt"
_EXTRA_GROUP_KEYS = ("id", "conversation_id")
#: removed from the file's name for the group ids made from it
_SUFFIXES = (".gz", ".zst", ".zstd", ".jsonl", ".ndjson", ".json", ".parquet")


# --------------------------------------------------------------------------------------------
# one record -> canonical messages with a target mask
# --------------------------------------------------------------------------------------------


def _json_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """A ShareGPT ``function_call`` / ms-swift ``tool_call`` value -> chat tool calls."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise RecordError(
                f'{where}: expected a JSON tool call {{"name": ..., "arguments": ...}}, '
                f"got text that is not JSON ({e})"
            ) from e
    return openai_tool_calls(value if isinstance(value, list) else [value], where)


def _weight(m: dict[str, Any], where: str) -> bool:
    """Is this assistant message a target? (OpenAI ``weight``: 0 context, 1 or absent target)."""
    w = m.get("weight")
    if w is None:
        return True
    if isinstance(w, bool) or w not in (0, 1):
        raise RecordError(f"{where}.weight: expected 0 or 1, got {w!r}")
    return w == 1


def _message(m: Any, where: str, *, sharegpt: bool) -> tuple[dict[str, Any], bool]:
    """One turn -> (chat message, is a target)."""
    if not isinstance(m, dict):
        raise RecordError(f"{where}: expected a message object, got {type_name(m)}")
    try:
        raw_role = aliased(m, "role")
        content = aliased(m, "content")
    except AliasError as e:
        raise RecordError(f"{where}: {e}") from e
    role = canonical_role(raw_role)
    if role is None:
        raise RecordError(
            f"{where}.{'from' if sharegpt else 'role'}: unknown role {raw_role!r} (expected "
            "system, user/human, assistant/gpt, tool/observation or function_call/tool_call)"
        )
    if isinstance(raw_role, str) and raw_role.strip().lower() in TOOL_CALL_ROLES:
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": _json_calls(content, f"{where}.{'value' if sharegpt else 'content'}"),
        }
        return msg, _weight(m, where)
    plain = {k: v for k, v in m.items() if v is not None and k not in ("from", "value", "weight")}
    plain["role"] = role
    plain["content"] = content
    if (parts := value_parts(content)) is not None:  # LLaMA-Factory v1 {type, value} parts
        plain["content"], plain["reasoning_content"] = parts[0], parts[1]
        calls = [c for i, v in enumerate(parts[2]) for c in _json_calls(v, f"{where}.content[{i}]")]
        plain.update({"tool_calls": calls} if calls else {})
    if isinstance(plain.get("tool_calls"), list):
        plain["tool_calls"] = [
            (tc if not isinstance(tc, dict) else drop_nulls(tc)) for tc in plain["tool_calls"]
        ]
    msg = normalize_message(plain, where)
    return msg, role == "assistant" and _weight(m, where)


def conversation(
    rec: Any, *, sharegpt: bool, from_struct: bool = False, label: str | None = None
) -> tuple[list[dict[str, Any]], list[bool], list[str], list[dict[str, Any]] | None]:
    """(messages, target mask, where each message came from, tools) of one record.

    ``label`` names the turns' field in messages (a mapped dataset's own key). Raises
    :class:`RecordError` when the record does not fit.
    """
    if not isinstance(rec, dict):
        raise RecordError(f"expected a JSON object, got {type_name(rec)}")
    key = "conversations" if sharegpt else "messages"
    turns = turns_of(rec, key, label)
    key = label or key
    messages: list[dict[str, Any]] = []
    targets: list[bool] = []
    wheres: list[str] = []
    system = rec.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise RecordError(f"system: expected a string, got {type_name(system)}")
        if system:
            messages.append({"role": "system", "content": system})
            targets.append(False)
            wheres.append("system")
    for i, m in enumerate(turns):
        msg, target = _message(m, f"{key}[{i}]", sharegpt=sharegpt)
        messages.append(msg)
        targets.append(target)
        wheres.append(f"{key}[{i}]")
    split = [False] * (len(messages) - len(turns)) + [split_call(m) for m in turns]
    messages, targets, wheres = join_split_replies(messages, targets, wheres, split)
    return messages, targets, wheres, row_tools(rec, from_struct)


# --------------------------------------------------------------------------------------------
# one record -> calls
# --------------------------------------------------------------------------------------------


def _group(rec: dict[str, Any], opts: ReadOptions, file: str, line: int, index: int) -> str:
    g = group_of(rec, opts)
    stem = file_stem(file, _SUFFIXES)
    if g is None and not opts.group_by:
        for k in _EXTRA_GROUP_KEYS:
            v = rec.get(k)
            if isinstance(v, str | int) and not isinstance(v, bool):
                return f"{stem}:{v}"
    if g is not None:
        return g
    return f"{stem}[{index - 1}]" if index else f"{stem}:{line}"


def convert(
    rec: Any,
    *,
    file: str,
    line: int,
    fmt: str,
    opts: ReadOptions,
    index: int = 0,
    from_struct: bool = False,
    prepare: Prepare | None = None,
) -> Iterator[Item]:
    """Every target of one conversation as a ChatCall; a record that does not fit is one Reject.

    The calls are made one at a time, as they are read, and share the conversation's message
    objects (validated once): a record of N turns holds O(N) messages, not the O(N^2) of N
    histories held at once. ``prepare`` turns a dataset's record into a ``messages`` record first
    (field mapping) and names the dataset's turns field as ``prepare.label``."""
    try:
        label = None
        if prepare is not None:
            label = _label(rec, opts)
            rec = prepare(rec, opts)
        messages, targets, wheres, tools = conversation(
            rec, sharegpt=fmt == SHAREGPT, from_struct=from_struct, label=label
        )
        if not any(targets):
            raise RecordError(
                "no assistant turn to train on (every assistant message has weight 0, or none)"
            )
        assert isinstance(rec, dict)
        gid = _group(rec, opts, file, line, index)
        fm = opts.field_map
        reward = row_reward(rec, getattr(fm, "reward", None))
        model = row_model(rec, getattr(fm, "model", None))
        kwargs = template_kwargs_at([("", rec)])  # TRL's column: the row's template kwargs
    except RecordError as e:
        where = f"[{index - 1}]: " if index else ""
        yield Reject(file=file, line=line, reason=f"{where}{e}", format=fmt)
        return
    tid = rec.get("trajectory_id")
    tid = tid if isinstance(tid, str) and tid else None  # a run of a task: names its calls
    stem = tid or gid
    shared = _validated(messages)
    k = 0
    for i, target in enumerate(targets):
        if not target:
            continue
        why = "an assistant turn with nothing before it to prompt it" if i == 0 else None
        if why is None and _empty_reply(messages[i]):
            why = "the assistant's reply is empty (no text, reasoning or tool call): not trained"
        if why is None:
            try:
                yield ChatCall(
                    group_id=gid,
                    call_id=f"{stem}#{k}",
                    trajectory_id=tid,
                    parent_call_id=f"{stem}#{k - 1}" if k else None,
                    model=model,
                    messages=shared[:i],  # type: ignore[arg-type]
                    tools=tools,
                    completion=shared[i],  # type: ignore[arg-type]
                    chat_template_kwargs=kwargs,
                    reward=reward,
                    provenance=Provenance(exact_messages=True, reconstructed=True),
                    source_file=file,
                    source_line=line,
                    source_format=fmt,
                )
            except ValidationError as e:
                why = validation_reason(e)
        if why is not None:
            why = f"{wheres[i]}: {why}"
            yield Reject(file=file, line=line, format=fmt, call_id=f"{stem}#{k}", reason=why)
        k += 1


def _empty_reply(m: dict[str, Any]) -> bool:
    content = m.get("content")
    text = (
        content
        if isinstance(content, str)
        else "".join(
            str(p.get("text") or "") if isinstance(p, dict) else "x" for p in content or []
        )
    )
    return not (text or m.get("reasoning_content") or m.get("tool_calls"))


def _label(rec: Any, opts: ReadOptions) -> str:
    """The turns' field of a mapped record (``--map messages=...``, else ``trajectory``)."""
    fm = opts.field_map
    return str(getattr(fm, "messages", "trajectory"))


def _validated(messages: list[dict[str, Any]]) -> list[Any]:
    """The messages as :class:`~treeprep.schemas.records.Message` objects, each validated once
    and shared by every call of the conversation; the dicts themselves when one does not
    validate (each call then validates its own, and its reject names the field as before)."""
    try:
        return [Message.model_validate(m) for m in messages]
    except ValidationError:
        return messages


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------


def _is_parquet(path: str) -> bool:
    return path.lower().endswith(".parquet")


def _is_json_doc(path: str) -> bool:
    p = path.lower()
    for ext in (".gz", ".zst", ".zstd"):
        p = p.removesuffix(ext)
    return p.endswith(".json")


#: the top-level fields :func:`convert` reads (besides the turns): only these columns are read
_FIELDS = (
    "system",
    *FIELDS["tools"],
    "functions",
    *REWARD_KEYS,
    "model",
    "model_name",
    "metadata",
    "trajectory_id",
    *GROUP_KEYS,
)
#: rows per batch read from a Parquet row group
_PARQUET_BATCH = 1024


def _read_parquet(
    path: str, fmt: str, opts: ReadOptions, prepare: Prepare | None, more: set[str]
) -> Iterator[Item]:
    """Rows of a Parquet file (``line`` is the 1-based row number), row group by row group.

    Only the columns :func:`convert` reads are materialized; a row whose columns hold more than
    ``--max-record-mb`` bytes is a reject, never converted to Python; a row group that cannot be
    decoded (a corrupt page) is one reject naming it and its rows, and reading goes on.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    broken = (OSError, ValueError, pa.ArrowException)  # what pyarrow raises on a bad file
    try:
        pf = pq.ParquetFile(path)
        columns = _parquet_needed(pf.schema_arrow.names, fmt, opts, more)
    except broken as e:
        yield Reject(file=path, line=0, reason=f"cannot read Parquet file: {e}", format=fmt)
        return
    limit = record_limit()
    row = 0
    for rg in range(pf.num_row_groups):
        end = row + pf.metadata.row_group(rg).num_rows
        batches = pf.iter_batches(_PARQUET_BATCH, row_groups=[rg], columns=columns)
        while True:
            try:
                batch = next(batches, None)
            except broken as e:  # a corrupt page
                why = f"cannot read Parquet row group {rg} (rows {row + 1}-{end}): {e}"
                yield Reject(file=path, line=row + 1, reason=why, format=fmt)
                row = end
                break
            if batch is None:
                break
            for size, rec in _rows_within(batch, limit):
                row += 1
                if rec is None:
                    yield Reject(file=path, line=row, reason=_too_big(size, limit), format=fmt)
                    continue
                yield from convert(
                    rec, file=path, line=row, fmt=fmt, opts=opts, from_struct=True, prepare=prepare
                )
    if row == 0:
        yield Reject(file=path, line=0, reason="Parquet file holds no rows", format=fmt)


def _parquet_needed(names: list[str], fmt: str, opts: ReadOptions, more: set[str]) -> list[str]:
    """The columns of ``names`` that :func:`convert` reads (and ``more``), in file order."""
    want = {"conversations" if fmt == SHAREGPT else "messages", *_FIELDS, *_EXTRA_GROUP_KEYS}
    want |= more
    if opts.group_by:
        want |= {opts.group_by, opts.group_by.split(".")[0]}
    return [n for n in names if n in want]


def _rows_within(batch: Any, limit: int) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(bytes, row as Python) for each row of ``batch``; the row is None when its bytes in the
    batch are over ``limit`` (it is never converted). A batch within the limit as a whole is
    not measured row by row."""
    if batch.nbytes <= limit:
        for rec in batch.to_pylist():
            yield 0, rec
        return
    for i in range(batch.num_rows):
        one = batch.slice(i, 1)
        size = one.nbytes
        yield (size, None) if size > limit else (size, one.to_pylist()[0])


def _too_big(size: int, limit: int) -> str:
    return f"row is {size:,} bytes, over the limit of {limit:,} bytes per record (--max-record-mb)"


def read_dataset(
    path: str,
    fmt: str,
    opts: ReadOptions,
    *,
    prepare: Prepare | None = None,
    more: set[str] | None = None,
) -> Iterator[Item]:
    """Every conversation of a JSONL, JSON or Parquet dataset file (see the module docstring);
    ``prepare`` maps a record first, ``more`` names the Parquet columns it reads."""
    if _is_parquet(path):
        yield from _read_parquet(path, fmt, opts, prepare, more or set())
        return
    if _is_json_doc(path):
        try:
            doc = document(path).value
        except InputError as e:
            yield Reject(file=e.file, line=e.line, reason=e.reason, format=fmt)
            return
        recs = doc if isinstance(doc, list) else [doc]
        if not recs:
            yield Reject(file=path, line=1, reason="empty JSON array", format=fmt)
        for i, rec in enumerate(recs):
            idx = i + 1 if isinstance(doc, list) else 0
            yield from convert(
                rec, file=path, line=1, fmt=fmt, opts=opts, index=idx, prepare=prepare
            )
        return
    for line, rec in records(path, fmt):
        yield from (
            [rec]
            if isinstance(rec, Reject)
            else convert(rec, file=path, line=line, fmt=fmt, opts=opts, prepare=prepare)
        )


def _reader(fmt: str):  # type: ignore[no-untyped-def]
    def read(path: str, opts: ReadOptions) -> Iterator[Item]:
        yield from read_dataset(path, fmt, opts)

    return read


# --------------------------------------------------------------------------------------------
# sniffing
# --------------------------------------------------------------------------------------------


def _first_record(path: str, head: bytes) -> Any:
    from treeprep.formats._sniff import first_record

    return first_record(path, head)


def _parquet_columns(path: str) -> set[str]:
    import pyarrow.parquet as pq

    try:
        return set(pq.read_schema(path).names)
    except (OSError, ValueError):
        return set()


def looks_like_conversation(rec: Any, key: str) -> bool:
    """A record whose ``key`` is a list of turns with roles, and no logged completion."""
    if not isinstance(rec, dict) or not isinstance(rec.get(key), list) or not rec[key]:
        return False
    if any(k in rec for k in ("completion", "response", "choices", "raw_response")):
        return False  # a per-call log (openai-chat), not a dataset record
    turns = rec[key]
    return all(isinstance(m, dict) for m in turns) and any(
        canonical_role(aliased(m, "role") if _safe(m) else None) == "assistant" for m in turns
    )


def _safe(m: dict[str, Any]) -> bool:
    try:
        aliased(m, "role")
    except AliasError:
        return False
    return True


def sniff_dataset(path: str, head: bytes, key: str, looks: Callable[[Any], bool]) -> bool:
    """A Parquet file with a ``key`` column, or a JSON(L) file whose first record ``looks`` so."""
    if _is_parquet(path):
        return head.startswith(b"PAR1") and key in _parquet_columns(path)
    return looks(_first_record(path, head))


def _sniffer(key: str):  # type: ignore[no-untyped-def]
    def sniff(path: str, head: bytes) -> bool:
        return sniff_dataset(path, head, key, lambda rec: looks_like_conversation(rec, key))

    return sniff


FORMATS = [
    FormatSpec(name=MESSAGES, sniff=_sniffer("messages"), read=_reader(MESSAGES), priority=58),
    FormatSpec(name=SHAREGPT, sniff=_sniffer("conversations"), read=_reader(SHAREGPT), priority=58),
]
FORMAT = FORMATS[0]
