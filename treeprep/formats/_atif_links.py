"""How ATIF files point at each other: sub-agent references, continuations, and which file of a
folder a trajectory hangs from.

A trajectory names itself by ``trajectory_id`` (ATIF v1.7; sibling sub-agents may share a
``session_id``) and, before v1.7, by ``session_id``. An observation result's
``subagent_trajectory_ref`` names a sub-agent by ``trajectory_id`` and/or ``session_id`` and,
optionally, ``trajectory_path`` (a file); ``continued_trajectory_ref`` names the file a run went
on in. Links are looked up leniently (a malformed reference links nothing; the file itself is
checked when it is read), and only within a file's own folder, whose size is bounded by
:data:`MAX_SIBLINGS`.

One rule matches a reference to a trajectory, in both directions: any of the reference's values
(or a path's file name) is one of the trajectory's names (its ids, its file's name and path). So
a file that links itself to its parent is the file the parent finds (:func:`finder`), and never
one the parent reports absent (:func:`absent_refs`): Harbor writes a reference's path as the
file name it gave the sub-agent, which a renamed copy (Harbor's own golden files) or another
machine's absolute path no longer names, while the session id still does.

A run's group is its root's session id (else its name) qualified by a digest of the root
trajectory (:func:`~treeprep.formats._fields.content_digest`): session ids are not unique
across files (Harbor's golden files normalize them to one value; agent-data-protocol reuses a
task's id for every run of it), and two trials of one task are two groups, while a copy of one
file is the same group (and the build's deduplication leaves it out).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import orjson

from treeprep.formats._fields import content_digest
from treeprep.io import reads
from treeprep.io.paths import open_regular

__all__ = [
    "MAX_SIBLINGS",
    "Ref",
    "absent_refs",
    "array_parent",
    "finder",
    "folder_parent",
    "identity",
    "lineage",
    "names_of",
    "objects",
    "subagent_refs",
]

#: folders with more JSON files than this are not scanned for a file's parent or children
MAX_SIBLINGS = 2000
#: the keys a sub-agent reference may name its trajectory by, v1.7's first
REF_KEYS = ("trajectory_id", "session_id", "trajectory_path")
#: the order :func:`finder` tries them in: v1.7 resolves by id or path, ``session_id`` is
#: informational there (sibling sub-agents may share one) and the key before v1.7
_FIND_ORDER = ("trajectory_id", "trajectory_path", "session_id")

#: (where in the document, the reference object)
Ref = tuple[str, dict[str, Any]]


def objects(v: Any) -> list[dict[str, Any]]:
    """The objects of ``v`` when it is a list (nothing otherwise)."""
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def identity(doc: dict[str, Any]) -> str | None:
    """What a trajectory is named by: its ``trajectory_id`` (v1.7), else its ``session_id``."""
    for key in ("trajectory_id", "session_id"):
        v = doc.get(key)
        if isinstance(v, str) and v:
            return v
    return None


def subagent_refs(doc: dict[str, Any]) -> list[Ref]:
    """Every sub-agent reference of a trajectory's steps, with the step it is on."""
    out: list[Ref] = []
    steps = doc.get("steps")
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        obs = step.get("observation") if isinstance(step, dict) else None
        for j, res in enumerate(objects(obs.get("results") if isinstance(obs, dict) else None)):
            for ref in objects(res.get("subagent_trajectory_ref")):
                out.append((f"steps[{i}].observation.results[{j}].subagent_trajectory_ref", ref))
    return out


def _refnames_of(doc: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(sub-agent ids and paths, continuation paths) one trajectory references."""
    subs = {str(ref[k]) for _, ref in subagent_refs(doc) for k in REF_KEYS if ref.get(k)}
    cont = doc.get("continued_trajectory_ref")
    return subs, ({cont} if isinstance(cont, str) and cont else set())


def _named(refs: set[str], names: set[str]) -> bool:
    return any(r in names or os.path.basename(r) in names for r in refs)


def _siblings(path: str) -> list[str]:
    folder = os.path.dirname(path) or "."
    found = [f for f in reads.listdir(folder) if f.endswith(".json")]  # recorded: see reads
    if len(found) > MAX_SIBLINGS:
        return []
    me = os.path.abspath(path)
    return [p for f in found if os.path.abspath(p := os.path.join(folder, f)) != me]


def _load(path: str, needles: set[str] | None) -> Any:
    """The ATIF document of ``path`` when its bytes hold one of ``needles`` (else None; None:
    any ATIF document)."""
    try:
        with open_regular(path) as fh:  # a FIFO is refused, not waited on
            data = fh.read()
        if b'"ATIF-v' not in data:
            return None
        if needles is not None and not any(n.encode() in data for n in needles):
            return None
        return orjson.loads(data)
    except (OSError, orjson.JSONDecodeError):
        return None


#: (names of a trajectory) -> (its parent's key, the parent's document, link kind) or None
ParentOf = Callable[[set[str]], "tuple[str, dict[str, Any], str] | None"]


def _link(doc: dict[str, Any], names: set[str]) -> str:
    """How ``doc`` references a trajectory of ``names``: ``sub-agent``, ``compaction`` or ''."""
    subs, conts = _refnames_of(doc)
    return "sub-agent" if _named(subs, names) else "compaction" if _named(conts, names) else ""


def folder_parent(path: str) -> ParentOf:
    """The parent finder of a one-trajectory file: the file of its folder that references it."""

    def parent(names: set[str]) -> tuple[str, dict[str, Any], str] | None:
        for other in _siblings(path):
            doc = _load(other, names)
            if isinstance(doc, dict) and (kind := _link(doc, names)):
                return other, doc, kind
        return None

    return parent


def array_parent(docs: list[Any]) -> ParentOf:
    """The parent finder of the trajectories of one JSON array: the element that references."""

    def parent(names: set[str]) -> tuple[str, dict[str, Any], str] | None:
        for k, doc in enumerate(docs):
            if not isinstance(doc, dict) or names & names_of("", doc):
                continue
            if kind := _link(doc, names):
                return f"[{k}]", doc, kind
        return None

    return parent


def names_of(path: str, doc: dict[str, Any]) -> set[str]:
    """The names a trajectory can be referenced by (its ids; its file's name and path)."""
    ids = {str(doc[k]) for k in ("trajectory_id", "session_id") if isinstance(doc.get(k), str)}
    return {n for n in ids if n} | ({os.path.basename(path), path} if path else set())


def lineage(key: str, doc: dict[str, Any], parent_of: ParentOf) -> tuple[str, str, str, str | None]:
    """(group id, root, agent id, branch reason) of a trajectory: follows the trajectories that
    reference it up to the root, whose session id names the group (else its name, ``root``),
    qualified by the root's :func:`~treeprep.formats._fields.content_digest`
    (``<session>#<digest>``). ``key`` is the file's path (``parent_of``: :func:`folder_parent`)
    or the element's index (:func:`array_parent`)."""
    path = key if not key.startswith("[") else ""
    me = identity(doc) or os.path.basename(key)
    seen = {key}
    agent, reason = me, None
    cur_doc, cur_path, cur_id = doc, path, me
    first = True
    while (link := parent_of(names_of(cur_path, cur_doc))) is not None:
        nxt, nxt_doc, kind = link
        if nxt in seen:
            break
        seen.add(nxt)
        nxt_id = identity(nxt_doc) or os.path.basename(nxt)
        if first:
            reason = kind
            agent = me if kind == "sub-agent" else nxt_id
            first = False
        elif kind == "compaction" and agent == cur_id:
            agent = nxt_id  # a continuation of a continuation keeps the first's agent
        cur_doc, cur_path, cur_id = nxt_doc, (nxt if path else ""), nxt_id
        if path:
            parent_of = folder_parent(nxt)
    root = cur_doc.get("session_id") if isinstance(cur_doc.get("session_id"), str) else None
    gid = f"{root or cur_id}#{content_digest(cur_doc)}"
    return gid, cur_id, ("main" if agent == cur_id else agent), reason


def _ref_values(ref: dict[str, Any], keys: tuple[str, ...] = REF_KEYS) -> set[str]:
    return {str(ref[k]) for k in keys if isinstance(ref.get(k), str) and ref[k]}


def _matches(ref: dict[str, Any], keys: tuple[str, ...], path: str, doc: dict[str, Any]) -> bool:
    """Whether ``ref`` (its values under ``keys``) names the trajectory ``doc`` of ``path``."""
    return _named(_ref_values(ref, keys), names_of(path, doc))


def finder(path: str, scope: list[dict[str, Any]]) -> Callable[[dict[str, Any]], Any]:
    """The trajectory a sub-agent reference names: one of ``scope`` (embedded sub-agents, the
    elements of the same array), else a file of ``path``'s folder ('' : none). The reference's
    keys are tried in :data:`_FIND_ORDER`. None when nothing matches."""
    folder = os.path.dirname(path) or "."

    def find(ref: dict[str, Any]) -> dict[str, Any] | None:
        for key in _FIND_ORDER:
            if not _ref_values(ref, (key,)):
                continue
            for doc in scope:
                if _matches(ref, (key,), "", doc):
                    return doc
            if path and isinstance(doc := _in_folder(ref[key], key), dict):
                return doc
        return None

    def _in_folder(value: str, key: str) -> Any:
        if key == "trajectory_path":  # the file itself, else one of that name in the folder
            for p in (os.path.join(folder, value), os.path.join(folder, os.path.basename(value))):
                if reads.isfile(p) and isinstance(doc := _load(p, None), dict):
                    return doc
            return None
        for other in _siblings(path):
            doc = _load(other, {value})
            if isinstance(doc, dict) and value in names_of(other, doc):
                return doc
        return None

    return find


def absent_refs(path: str, doc: dict[str, Any], embedded: set[str]) -> list[tuple[str, str]]:
    """(where, what) for each sub-agent or continuation file ``doc`` references that is neither
    embedded (``embedded``: the ids of its ``subagent_trajectories``) nor in its folder, by the
    rule :func:`finder` and a child's :func:`lineage` share."""
    folder = os.path.dirname(path) or "."
    find = finder(path, [])
    out = []
    refs = subagent_refs(doc)
    cont = doc.get("continued_trajectory_ref")
    if isinstance(cont, str) and cont:
        refs.append(("continued_trajectory_ref", {"trajectory_path": cont}))
    for where, ref in refs:
        ids = _ref_values(ref, ("trajectory_id", "session_id"))
        p = ref.get("trajectory_path")
        p = p if isinstance(p, str) and p else None
        if ids & embedded or not (ids or p):
            continue
        if p and reads.isfile(p if os.path.isabs(p) else os.path.join(folder, p)):
            continue
        if find(ref) is None:
            out.append((where, f"the file {p!r}" if p else f"the trajectory {sorted(ids)[0]!r}"))
    return out
