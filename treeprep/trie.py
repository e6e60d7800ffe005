"""Token tries: every sequence of one group inserted once, shared prefixes stored once.

Construction sorts the group's distinct token sequences lexicographically and walks them with a
stack, using the longest common prefix (LCP) of neighbours: the path of sequence i shares exactly
``lcp(i-1, i)`` tokens with the path of sequence i-1, so each insertion pops the stack down to that
depth, splits at most one node and appends one new node. With LCPs computed by numpy the whole
build is O(sum of lengths) vectorized work plus O(sequences) Python steps, and it never touches a
token twice in Python.

Nodes are laid out in DFS pre-order with children in ascending first-token order, so a tree's bytes
depend only on its set of sequences (and, for branch reasons, their input order), never on hash
order. Exact duplicates (same tokens, loss spans, reward, advantage, log-probs, reference
log-probs, trajectory) merge into one
sequence entry with a count; sequences with the same tokens but other loss spans or advantages stay
separate entries ending at the same node, so every normalization can be restored.

Branch reasons: at a node with several children (or a group with several roots) the child holding
the earliest input sequence is the main continuation; each other child is a branch whose reason is
the adapter's hint on the earliest sequence that took it. Two runs of one task (a later tau-bench
trial, another GRPO sample) part where their tokens first differ, which is often a call after the
one that started the run: such a branch, whose earliest sequence has no hint and belongs to
another trajectory than the main continuation's, takes the run's reason (:data:`RUN_REASONS`)
from the hint on its trajectory's first sequence. ``unknown`` when neither says why.

Input order is file order, which need not be the order the agent worked in: a sub-agent's file,
a continuation or a branch of a session can sort before the session's own file (Gemini CLI's
``chats/<session id>/`` before ``chats/session-*.jsonl``, ATIF's ``trajectory.cont-1.json``
before ``trajectory.json``, gptme's ``branches/`` before ``conversation.jsonl``). Then the
hinted call that left the session comes first and holds the main continuation, and the session
itself would part from it with no hint. So where the main child's earliest sequence carries a
hint that has named no branch above (its sequence never left an earlier one), the earliest
sibling of the same trajectory whose earliest sequence has no hint is the main continuation
instead, and the hinted child is the branch, with its hint (:func:`_main_child`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from treeprep.sequence import Sequence, common_prefix
from treeprep.treeindex import path_to_root


@dataclass
class Tree:
    """One group's trie in the shard layout (see :mod:`treeprep.schemas.shard`)."""

    group_id: str
    source_format: str
    input_ids: np.ndarray
    node_parent: np.ndarray
    node_offset: np.ndarray
    node_length: np.ndarray
    node_depth: np.ndarray
    node_last: np.ndarray
    node_branch_reason: list[str]
    node_num_sequences: np.ndarray
    seq_node: np.ndarray
    seq_length: np.ndarray
    seq_count: np.ndarray
    seq_loss_spans: list[list[int]]
    seq_logprobs: list[list[float] | None]
    seq_reward: list[float | None]
    seq_advantage: list[float | None]
    seq_agent_id: list[str]
    seq_call_id: list[str]
    seq_source: list[str]
    seq_trajectory_id: list[str]
    seq_ref_logprobs: list[list[float] | None]

    @property
    def num_nodes(self) -> int:
        return len(self.node_parent)

    @property
    def num_sequences(self) -> int:
        return len(self.seq_node)

    @property
    def tokens_tree(self) -> int:
        return len(self.input_ids)

    @property
    def tokens_linear(self) -> int:
        return int((self.seq_length.astype(np.int64) * self.seq_count).sum())

    def to_row(self) -> dict:
        return {
            "group_id": self.group_id,
            "source_format": self.source_format,
            "num_nodes": self.num_nodes,
            "num_sequences": self.num_sequences,
            "tokens_tree": self.tokens_tree,
            "tokens_linear": self.tokens_linear,
            "input_ids": self.input_ids,
            "node_parent": self.node_parent,
            "node_offset": self.node_offset,
            "node_length": self.node_length,
            "node_depth": self.node_depth,
            "node_last": self.node_last,
            "node_branch_reason": self.node_branch_reason,
            "node_num_sequences": self.node_num_sequences,
            "seq_node": self.seq_node,
            "seq_length": self.seq_length,
            "seq_count": self.seq_count,
            "seq_loss_spans": self.seq_loss_spans,
            "seq_logprobs": self.seq_logprobs,
            "seq_reward": self.seq_reward,
            "seq_advantage": self.seq_advantage,
            "seq_agent_id": self.seq_agent_id,
            "seq_call_id": self.seq_call_id,
            "seq_source": self.seq_source,
            "seq_trajectory_id": self.seq_trajectory_id,
            "seq_ref_logprobs": self.seq_ref_logprobs,
        }

    @classmethod
    def from_row(cls, row: dict) -> Tree:
        def a(k: str) -> np.ndarray:
            return np.asarray(row[k], dtype=np.int32)

        return cls(
            group_id=row["group_id"],
            source_format=row["source_format"],
            input_ids=a("input_ids"),
            node_parent=a("node_parent"),
            node_offset=a("node_offset"),
            node_length=a("node_length"),
            node_depth=a("node_depth"),
            node_last=a("node_last"),
            node_branch_reason=list(row["node_branch_reason"]),
            node_num_sequences=a("node_num_sequences"),
            seq_node=a("seq_node"),
            seq_length=a("seq_length"),
            seq_count=a("seq_count"),
            seq_loss_spans=[list(s) for s in row["seq_loss_spans"]],
            seq_logprobs=[None if x is None else list(x) for x in row["seq_logprobs"]],
            seq_reward=list(row["seq_reward"]),
            seq_advantage=list(row["seq_advantage"]),
            seq_agent_id=list(row["seq_agent_id"]),
            seq_call_id=list(row["seq_call_id"]),
            seq_source=list(row["seq_source"]),
            seq_trajectory_id=list(row["seq_trajectory_id"]),
            seq_ref_logprobs=[None if x is None else list(x) for x in row["seq_ref_logprobs"]],
        )

    def node_tokens(self, i: int) -> np.ndarray:
        o = int(self.node_offset[i])
        return self.input_ids[o : o + int(self.node_length[i])]

    def path_nodes(self, node: int) -> list[int]:
        """Pre-order indices from the root down to ``node``."""
        return path_to_root(self.node_parent, node).tolist()

    def sequence_tokens(self, s: int) -> np.ndarray:
        nodes = self.path_nodes(int(self.seq_node[s]))
        return np.concatenate([self.node_tokens(i) for i in nodes])

    def iter_sequences(self) -> Iterator[dict]:
        """Every input sequence back out (duplicates repeated ``seq_count`` times)."""
        for s in range(self.num_sequences):
            ids = self.sequence_tokens(s)
            mask = np.zeros(len(ids), dtype=np.int8)
            spans = self.seq_loss_spans[s]
            for a, b in zip(spans[0::2], spans[1::2], strict=True):
                mask[a:b] = 1
            rec = {
                "group_id": self.group_id,
                "agent_id": self.seq_agent_id[s],
                "call_id": self.seq_call_id[s],
                "trajectory_id": self.seq_trajectory_id[s],
                "input_ids": ids.tolist(),
                "loss_mask": mask.tolist(),
            }
            if self.seq_logprobs[s] is not None:
                rec["logprobs"] = self.seq_logprobs[s]
            if self.seq_ref_logprobs[s] is not None:
                rec["ref_logprobs"] = self.seq_ref_logprobs[s]
            if self.seq_reward[s] is not None:
                rec["reward"] = self.seq_reward[s]
            if self.seq_advantage[s] is not None:
                rec["advantage"] = self.seq_advantage[s]
            for _ in range(int(self.seq_count[s])):
                yield rec


def _logprobs_list(lp: np.ndarray | None) -> list[float] | None:
    return None if lp is None else lp.tolist()


@dataclass
class _Entries:
    """A group's sequences with exact duplicates merged, in input order of first occurrence."""

    entries: list[Sequence]
    counts: list[int]
    #: input index of each entry's first occurrence
    orders: list[int]


@dataclass
class _Trie:
    """The trie under construction: nodes hold a slice ``[start, end)`` of a distinct sequence."""

    src: list[int] = field(default_factory=list)  # which distinct sequence holds the tokens
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    children: list[list[int]] = field(default_factory=list)
    ends: list[list[int]] = field(default_factory=list)  # distinct sequences ending here
    roots: list[int] = field(default_factory=list)
    #: per token source, the depth of its first token (0: the source is a whole sequence)
    src_depth: list[int] = field(default_factory=list)

    def tokens(self, v: int, sources: list[np.ndarray]) -> np.ndarray:
        """Node ``v``'s tokens, a slice of its source."""
        o = self.src_depth[self.src[v]] if self.src_depth else 0
        return sources[self.src[v]][self.start[v] - o : self.end[v] - o]

    def new_node(self, src: int, start: int, end: int, parent: int) -> int:
        self.src.append(src)
        self.start.append(start)
        self.end.append(end)
        self.parent.append(parent)
        self.children.append([])
        self.ends.append([])
        return len(self.src) - 1

    def split(self, top: int, depth: int) -> None:
        """Split node ``top`` at ``depth``: its tail becomes its only child."""
        y = self.new_node(self.src[top], depth, self.end[top], top)
        self.children[y] = self.children[top]
        for c in self.children[y]:
            self.parent[c] = y
        self.ends[y] = self.ends[top]
        self.children[top] = [y]
        self.ends[top] = []
        self.end[top] = depth


def build_tree(seqs: list[Sequence], group_id: str | None = None) -> Tree:
    """Insert every sequence of one group into a trie. ``seqs`` are in input order."""
    if not seqs:
        raise ValueError("build_tree needs at least one sequence")
    gid = group_id if group_id is not None else seqs[0].group_id
    if any(s.prefix >= 0 for s in seqs):
        return _build_chained(seqs, gid)
    empty = next((s for s in seqs if len(s.tokens) == 0), None)
    if empty is not None:
        raise ValueError(f"empty sequence in group {gid!r} ({empty.source})")
    ent = _merge_duplicates(seqs, [s.key() for s in seqs])
    uniq, uniq_entries = _distinct(ent.entries)
    trie = _insert_sorted(uniq)
    return _finish(gid, seqs, trie, uniq, uniq_entries, ent)


def _finish(
    gid: str,
    seqs: list[Sequence],
    trie: _Trie,
    sources: list[np.ndarray],
    uniq_entries: list[list[int]],
    ent: _Entries,
) -> Tree:
    """4-6. Layout, aggregates, branch reasons and the shard row of a built trie."""
    preorder, pre = _preorder(trie)
    uniq_count = [sum(ent.counts[e] for e in es) for es in uniq_entries]
    uniq_first = [min(ent.orders[e] for e in es) for es in uniq_entries]
    last, nseq, first = _subtree_aggregates(trie, preorder, pre, uniq_count, uniq_first)
    reason = _branch_reasons(trie, preorder, first, seqs)
    return _to_tree(gid, trie, preorder, pre, sources, uniq_entries, ent, last, nseq, reason)


def _merge_duplicates(seqs: list[Sequence], keys: list[tuple]) -> _Entries:
    """1. Merge exact duplicates (equal ``keys``); entries keep input order of their first
    occurrence."""
    entry_index: dict[tuple, int] = {}
    out = _Entries([], [], [])
    for i, (s, k) in enumerate(zip(seqs, keys, strict=True)):
        j = entry_index.get(k)
        if j is None:
            entry_index[k] = len(out.entries)
            out.entries.append(s)
            out.counts.append(1)
            out.orders.append(i)
        else:
            out.counts[j] += 1
    return out


def _distinct(entries: list[Sequence]) -> tuple[list[np.ndarray], list[list[int]]]:
    """2. Distinct token sequences, and the entries holding each."""
    by_tokens: dict[bytes, int] = {}
    uniq: list[np.ndarray] = []
    uniq_entries: list[list[int]] = []
    for e, s in enumerate(entries):
        kb = s.tokens.tobytes()
        u = by_tokens.get(kb)
        if u is None:
            by_tokens[kb] = len(uniq)
            uniq.append(s.tokens)
            uniq_entries.append([e])
        else:
            uniq_entries[u].append(e)
    return uniq, uniq_entries


def _insert_sorted(uniq: list[np.ndarray]) -> _Trie:
    """3. Stack construction over the distinct sequences sorted lexicographically (big-endian
    uint32 bytes sort like the ids)."""
    sort_keys = [t.astype(">u4").tobytes() for t in uniq]
    order = sorted(range(len(uniq)), key=sort_keys.__getitem__)
    trie = _Trie()
    stack: list[int] = []
    prev: np.ndarray | None = None
    for u in order:
        toks = uniq[u]
        lcp = 0 if prev is None else common_prefix(prev, toks)
        while stack and trie.start[stack[-1]] >= lcp:
            stack.pop()
        parent = -1
        if stack:
            top = stack[-1]
            if trie.end[top] > lcp:
                trie.split(top, lcp)
            parent = top
        x = trie.new_node(u, lcp, len(toks), parent)
        if parent >= 0:
            trie.children[parent].append(x)
        else:
            trie.roots.append(x)
        trie.ends[x].append(u)
        stack.append(x)
        prev = toks
    return trie


def _preorder(trie: _Trie) -> tuple[list[int], np.ndarray]:
    """4. Pre-order layout: the nodes in pre-order, and each node's pre-order index."""
    pre = np.empty(len(trie.src), dtype=np.int64)
    preorder: list[int] = []
    todo = list(reversed(trie.roots))
    while todo:
        v = todo.pop()
        pre[v] = len(preorder)
        preorder.append(v)
        todo.extend(reversed(trie.children[v]))
    return preorder, pre


def _subtree_aggregates(
    trie: _Trie,
    preorder: list[int],
    pre: np.ndarray,
    uniq_count: list[int],
    uniq_first: list[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node, in reverse pre-order: last pre-order index of its subtree, sequences through it,
    earliest input index below it."""
    nn = len(trie.src)
    last = np.empty(nn, dtype=np.int64)
    nseq = np.zeros(nn, dtype=np.int64)
    first = np.full(nn, np.iinfo(np.int64).max, dtype=np.int64)
    for v in reversed(preorder):
        kids = trie.children[v]
        last[v] = max([pre[v]] + [last[c] for c in kids])
        nseq[v] = sum(uniq_count[u] for u in trie.ends[v]) + sum(nseq[c] for c in kids)
        first[v] = min([uniq_first[u] for u in trie.ends[v]] + [first[c] for c in kids])
    return last, nseq, first


#: hints that name why a whole run (trajectory) differs from the group's others: on a run's first
#: call, they also explain where a later call of the run leaves another run's path
RUN_REASONS = frozenset({"new-trial", "sampling"})


def _branch_reasons(
    trie: _Trie, preorder: list[int], first: np.ndarray, seqs: list[Sequence]
) -> list[str]:
    """The main continuation of each sibling set (:func:`_main_child`); every other child gets
    the hint of the earliest sequence that took it, else the run's reason of that sequence's
    trajectory when it parts from another trajectory (see the module docstring), else
    ``unknown``. Sibling sets are visited top-down, so a hint names a branch at most once."""
    reason = [""] * len(trie.src)
    runs: dict[str, str | None] | None = None  # trajectory -> hint of its first sequence
    named: set[int] = set()  # sequences whose hint named a branch
    for sibs in [trie.roots] + [trie.children[v] for v in preorder]:
        if len(sibs) < 2:
            continue
        main = _main_child(sibs, first, seqs, named)
        for c in sibs:
            if c == main:
                continue
            seq = seqs[int(first[c])]
            hint = seq.branch_reason
            if hint:
                named.add(int(first[c]))
            elif seq.trajectory_id != seqs[int(first[main])].trajectory_id:
                if runs is None:
                    runs = {}
                    for s in seqs:  # input order: the first of each trajectory
                        runs.setdefault(s.trajectory_id, s.branch_reason)
                run = runs.get(seq.trajectory_id)
                hint = run if run in RUN_REASONS else None
            reason[c] = hint or "unknown"
    return reason


def _main_child(sibs: list[int], first: np.ndarray, seqs: list[Sequence], named: set[int]) -> int:
    """The child holding the earliest input sequence; but when that sequence's hint has named no
    branch yet (``named``), the earliest sibling of its trajectory whose earliest sequence has
    no hint: the hinted sequence came first in input order only (see the module docstring)."""
    by_order = sorted(sibs, key=lambda c: first[c])
    m = seqs[int(first[by_order[0]])]
    if m.branch_reason and int(first[by_order[0]]) not in named:
        for c in by_order[1:]:
            s = seqs[int(first[c])]
            if not s.branch_reason and s.trajectory_id == m.trajectory_id:
                return c
    return by_order[0]


def _to_tree(
    gid: str,
    trie: _Trie,
    preorder: list[int],
    pre: np.ndarray,
    uniq: list[np.ndarray],
    uniq_entries: list[list[int]],
    ent: _Entries,
    last: np.ndarray,
    nseq: np.ndarray,
    reason: list[str],
) -> Tree:
    """5-6. The shard layout: node arrays in pre-order, sequence entries by end node then input
    order."""
    nn = len(preorder)
    lengths = np.array([trie.end[v] - trie.start[v] for v in preorder], dtype=np.int32)
    offsets = np.zeros(nn, dtype=np.int32)
    if nn > 1:
        np.cumsum(lengths[:-1], out=offsets[1:])
    input_ids = np.concatenate([trie.tokens(v, uniq) for v in preorder]).astype(np.int32)
    parent_arr = np.array(
        [-1 if trie.parent[v] < 0 else int(pre[trie.parent[v]]) for v in preorder], dtype=np.int32
    )
    rows = sorted(
        (int(pre[v]), ent.orders[e], e)
        for v in preorder
        for u in trie.ends[v]
        for e in uniq_entries[u]
    )
    entries = [ent.entries[r[2]] for r in rows]
    formats = sorted({s.source_format for s in ent.entries})
    return Tree(
        group_id=gid,
        source_format=formats[0] if len(formats) == 1 else "mixed",
        input_ids=input_ids,
        node_parent=parent_arr,
        node_offset=offsets,
        node_length=lengths,
        node_depth=np.array([trie.start[v] for v in preorder], dtype=np.int32),
        node_last=np.array([last[v] for v in preorder], dtype=np.int32),
        node_branch_reason=[reason[v] for v in preorder],
        node_num_sequences=np.array([nseq[v] for v in preorder], dtype=np.int32),
        seq_node=np.array([r[0] for r in rows], dtype=np.int32),
        seq_length=np.array([s.length for s in entries], dtype=np.int32),
        seq_count=np.array([ent.counts[r[2]] for r in rows], dtype=np.int32),
        seq_loss_spans=[[x for sp in s.loss_spans for x in sp] for s in entries],
        seq_logprobs=[_logprobs_list(s.logprobs) for s in entries],
        seq_reward=[s.reward for s in entries],
        seq_advantage=[s.advantage for s in entries],
        seq_agent_id=[s.agent_id for s in entries],
        seq_call_id=[s.call_id for s in entries],
        seq_source=[s.source for s in entries],
        seq_trajectory_id=[s.trajectory_id or gid for s in entries],
        seq_ref_logprobs=[_logprobs_list(s.ref_logprobs) for s in entries],
    )


# --------------------------------------------------------------------------------------------
# sequences that share a prefix with an earlier one (Sequence.prefix): inserted one by one
# --------------------------------------------------------------------------------------------


def _build_chained(seqs: list[Sequence], gid: str) -> Tree:
    """The same tree as the sorted construction, for sequences that hold only the tokens after
    an earlier sequence's prefix: each is inserted from the node where that prefix ends, so no
    whole sequence is ever put together (memory grows with the tree, not with the sum of the
    sequences' lengths). Duplicates are the sequences that end at the same node."""
    chain = _Chain(gid)
    for s in seqs:
        chain.insert(s)
    trie, at = chain.trie, chain.at
    trie.ends = [[] for _ in trie.ends]
    # the end node stands for the tokens
    ent = _merge_duplicates(seqs, [(at[i], *s.key()[1:]) for i, s in enumerate(seqs)])
    entry_node = [at[i] for i in ent.orders]
    node_uniq: dict[int, int] = {}
    uniq_entries: list[list[int]] = []
    for e, v in enumerate(entry_node):
        u = node_uniq.get(v)
        if u is None:
            node_uniq[v] = len(uniq_entries)
            trie.ends[v].append(len(uniq_entries))
            uniq_entries.append([e])
        else:
            uniq_entries[u].append(e)
    for kids in [trie.roots, *trie.children]:  # ascending first token, as the sorted build
        kids.sort(key=lambda c: int(trie.tokens(c, chain.sources)[0]) & 0xFFFFFFFF)
    return _finish(gid, seqs, trie, chain.sources, uniq_entries, ent)


class _Chain:
    """A trie built one sequence at a time, each from the node where its shared prefix ends."""

    def __init__(self, gid: str) -> None:
        self.gid = gid
        self.trie = _Trie()
        self.sources: list[np.ndarray] = []
        self.first: dict[int, dict[int, int]] = {-1: {}}  # node -> first token -> child
        #: the node each inserted sequence ends at (kept right when a node is split)
        self.at: list[int] = []

    def insert(self, s: Sequence) -> None:
        i = len(self.at)
        if s.length == 0:
            raise ValueError(f"empty sequence in group {self.gid!r} ({s.source})")
        trie, node, d = self.trie, -1, 0
        if s.prefix >= 0:
            if not 0 <= s.prefix < i or s.prefix_len > trie.end[self.at[s.prefix]]:
                raise ValueError(f"sequence {i} of group {self.gid!r}: bad prefix {s.prefix}")
            node, d = self.at[s.prefix], s.prefix_len
            while node >= 0 and trie.start[node] >= d:
                node = trie.parent[node]
        self.sources.append(s.tokens)
        trie.src_depth.append(d)
        end = self._insert_rest(len(self.sources) - 1, node, d)
        self.at.append(end)
        trie.ends[end].append(i)

    def _insert_rest(self, src: int, node: int, d: int) -> int:
        """Insert source ``src`` (the sequence's tokens from depth ``d`` on), starting at depth
        ``d`` inside ``node`` (-1: the root); the node the sequence ends at."""
        trie, rest, k = self.trie, self.sources[src], 0
        while True:
            if node >= 0 and d < trie.end[node]:  # inside a node: follow its tokens
                seg = trie.tokens(node, self.sources)[d - trie.start[node] :]
                m = common_prefix(seg, rest[k:])
                k, d = k + m, d + m
                if m < len(seg):  # the sequence ends or leaves the node at depth d
                    self._split(node, d)
                    return node if k == len(rest) else self._leaf(src, node, d, len(rest) - k)
            if k == len(rest):
                return node
            child = self.first[node].get(int(rest[k]))
            if child is None:
                return self._leaf(src, node, d, len(rest) - k)
            node = child

    def _split(self, v: int, d: int) -> None:
        """Split node ``v`` at depth ``d``: its tail (and what ended there) becomes its child."""
        self.trie.split(v, d)
        tail = self.trie.children[v][0]
        for j in self.trie.ends[tail]:
            self.at[j] = tail
        self.first[tail] = self.first[v]
        self.first[v] = {int(self.trie.tokens(tail, self.sources)[0]): tail}

    def _leaf(self, src: int, parent: int, d: int, n: int) -> int:
        """A new node of the ``n`` tokens of source ``src`` from depth ``d`` on."""
        trie = self.trie
        x = trie.new_node(src, d, d + n, parent)
        self.first[x] = {}
        (trie.roots if parent < 0 else trie.children[parent]).append(x)
        self.first[parent][int(trie.tokens(x, self.sources)[0])] = x
        return x
