"""``treeprep show``: draw one token trie so people can see why their data branches.

A trie of an agent session is mostly long chains: call k's sequence ends at a node and call k+1
continues it, so a 150-call session is a chain of 150 single-child nodes with a few side branches
(a sub-agent, a compaction, a template that rewrites history). Drawing every node buries the
branches, so :func:`tree_view` first *collapses* every maximal run of nodes in which each node has
exactly one child and that child is its main continuation (no branch reason) into one **segment**.
A segment shows its token count, the sequences passing through its first node, how many sequences
end inside it, and a preview of its text (the first and last characters, newlines escaped). Branch
points stay visible, each child labelled with its branch reason (``sub-agent``, ``compaction``,
``reasoning-dropped``, ...; ``unknown`` where the adapter gave none).

Two outputs from one walk: :func:`tree_view` returns a JSON-able dict (for ``--json`` and tests),
:func:`render_view` turns it into a :class:`rich.tree.Tree`. ``max_nodes`` bounds the segments
drawn (breadth-first, so the top of the tree and every early branch survive); the rest are counted.
Decoding uses the tokenizer recorded in the manifest (``tokenizer.path``; None means the built-in
one) through :meth:`treeprep.render.Renderer.decode`; when that folder is gone and no
``tokenizer`` is given, previews show token ids.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from treeprep.errors import TreeprepError
from treeprep.schemas.manifest import load_manifest
from treeprep.shards import iter_trees
from treeprep.trie import Tree

Decode = Callable[[np.ndarray], str]


@dataclass(frozen=True)
class ShowConfig:
    """What ``treeprep show`` draws."""

    #: the build folder (holds manifest.json and shards/)
    out: str
    #: the group (tree) to draw; None draws the largest tree by tokens_tree
    group: str | None = None
    #: tokenizer folder for previews; None uses the manifest's (or shows ids)
    tokenizer: str | None = None
    #: at most this many segments are drawn
    max_nodes: int = 60
    #: characters kept at each end of a preview
    preview_chars: int = 40

    def __post_init__(self) -> None:
        if self.max_nodes < 1:
            raise TreeprepError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if self.preview_chars < 1:
            raise TreeprepError(f"preview_chars must be >= 1, got {self.preview_chars}")


def list_groups(out: str) -> list[dict[str, Any]]:
    """Every tree of a build: group id, format, sequences, nodes, tokens (largest first)."""
    rows: list[dict[str, Any]] = []
    for t in iter_trees(out):
        rows.append(
            {
                "group_id": t.group_id,
                "source_format": t.source_format,
                "sequences": int(t.seq_count.sum()),
                "nodes": t.num_nodes,
                "tokens_tree": t.tokens_tree,
                "tokens_linear": t.tokens_linear,
            }
        )
    rows.sort(key=lambda r: (-r["tokens_tree"], r["group_id"]))
    return rows


def load_tree(out: str, group: str | None) -> Tree:
    """The tree of ``group``, or the largest tree (by tokens_tree) when group is None."""
    if group is not None:
        for t in iter_trees(out, groups=[group]):
            return t
        known = [r["group_id"] for r in list_groups(out)[:10]]
        raise TreeprepError(
            f"{out}: no tree for group {group!r}; largest groups: {', '.join(known) or 'none'}"
        )
    best: Tree | None = None
    for t in iter_trees(out):
        if best is None or t.tokens_tree > best.tokens_tree:
            best = t
    if best is None:
        raise TreeprepError(f"{out}: the build holds no trees")
    return best


def make_decoder(out: str, tokenizer: str | None) -> tuple[Decode | None, str]:
    """A token decoder for previews and a word on where it came from (None: show ids)."""
    from treeprep.render import Renderer

    path = tokenizer
    if path is None:
        tok = load_manifest(out).tokenizer
        path = tok.path
        if path is None and tok.name not in ("builtin-bytes", "builtin"):
            return None, f"tokenizer {tok.name!r} has no recorded path; pass --tokenizer"
        if path is not None and not os.path.isdir(path):
            return None, f"tokenizer folder {path} is gone; pass --tokenizer"
    r = Renderer.load(path)
    return r.decode, r.identity.name


def _preview(text: str, n: int) -> str:
    esc = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if len(esc) <= 2 * n + 3:
        return esc
    return f"{esc[:n]} … {esc[-n:]}"


def _ids_preview(ids: np.ndarray, n: int) -> str:
    k = max(2, n // 8)
    if len(ids) <= 2 * k:
        return " ".join(str(int(i)) for i in ids)
    return " ".join(str(int(i)) for i in ids[:k]) + " … " + " ".join(str(int(i)) for i in ids[-k:])


def tree_view(
    tree: Tree, *, decode: Decode | None, max_nodes: int = 60, preview_chars: int = 40
) -> dict[str, Any]:
    """A JSON-able view of ``tree`` with single-child chains collapsed into segments."""
    n = tree.num_nodes
    children: list[list[int]] = [[] for _ in range(n)]
    roots: list[int] = []
    for i in range(n):
        p = int(tree.node_parent[i])
        (roots if p < 0 else children[p]).append(i)
    ends = np.zeros(n, dtype=np.int64)
    np.add.at(ends, tree.seq_node.astype(np.int64), tree.seq_count.astype(np.int64))

    def segment(start: int) -> tuple[dict[str, Any], list[int]]:
        nodes = [start]
        cur = start
        while len(children[cur]) == 1 and not tree.node_branch_reason[children[cur][0]]:
            cur = children[cur][0]
            nodes.append(cur)
        ids = np.concatenate([tree.node_tokens(v) for v in nodes]) if nodes else np.zeros(0)
        text = decode(ids) if decode is not None else None
        seg: dict[str, Any] = {
            "node": start,
            "last_node": cur,
            "nodes": len(nodes),
            "depth": int(tree.node_depth[start]),
            "tokens": int(sum(int(tree.node_length[v]) for v in nodes)),
            "sequences": int(tree.node_num_sequences[start]),
            "sequences_ending": int(ends[nodes].sum()),
            "branch_reason": tree.node_branch_reason[start] or None,
            "preview": _preview(text, preview_chars)
            if text is not None
            else _ids_preview(ids, preview_chars),
            "children": [],
        }
        return seg, children[cur]

    top: list[dict[str, Any]] = []
    shown = 0
    hidden_nodes = 0
    queue: deque[tuple[int, list[dict[str, Any]]]] = deque((r, top) for r in roots)
    while queue:
        v, into = queue.popleft()
        if shown >= max_nodes:
            hidden_nodes += _subtree_size(v, children)
            continue
        seg, kids = segment(v)
        into.append(seg)
        shown += 1
        for c in kids:
            queue.append((c, seg["children"]))

    reasons: dict[str, int] = {}
    for i in range(n):
        r = tree.node_branch_reason[i]
        if r:
            reasons[r] = reasons.get(r, 0) + 1
    agents = sorted(set(tree.seq_agent_id))
    return {
        "group_id": tree.group_id,
        "source_format": tree.source_format,
        "nodes": n,
        "roots": len(roots),
        "sequences": int(tree.seq_count.sum()),
        "tokens_tree": tree.tokens_tree,
        "tokens_linear": tree.tokens_linear,
        "ideal_speedup": tree.tokens_linear / tree.tokens_tree if tree.tokens_tree else 0.0,
        "agents": agents,
        "branches": dict(sorted(reasons.items())),
        "segments_shown": shown,
        "nodes_hidden": hidden_nodes,
        "tree": top,
    }


def _subtree_size(v: int, children: list[list[int]]) -> int:
    count = 0
    stack = [v]
    while stack:
        x = stack.pop()
        count += 1
        stack.extend(children[x])
    return count


def show(cfg: ShowConfig) -> dict[str, Any]:
    """Load the build's tree for ``cfg.group`` (or the largest) and return :func:`tree_view`."""
    tree = load_tree(cfg.out, cfg.group)
    decode, decoder = make_decoder(cfg.out, cfg.tokenizer)
    view = tree_view(tree, decode=decode, max_nodes=cfg.max_nodes, preview_chars=cfg.preview_chars)
    view["decoder"] = decoder if decode is not None else None
    if decode is None:
        view["decoder_note"] = decoder
    return view


_REASON_STYLE = {
    "sub-agent": "bold magenta",
    "compaction": "bold yellow",
    "reasoning-dropped": "cyan",
    "elided-history": "cyan",
    "new-trial": "green",
    "retry": "red",
    "parallel-tools": "blue",
    "sampling": "blue",
    "unknown": "dim",
}


#: what each branch reason means, for the legend under a drawn tree (docs/building.md too)
REASON_MEANING = {
    "sub-agent": "a sub-agent's calls start from their own prompt",
    "compaction": "the agent summarised its history and went on from the summary",
    "reasoning-dropped": "the template (or the agent, as mini-swe-agent does) drops earlier "
    "turns' reasoning, so later calls differ",
    "elided-history": "the agent cut old turns (tool output, messages, gptme's ephemeral notes) "
    "from later prompts",
    "new-trial": "another attempt at the same task from its start (tau-bench trials): the "
    "trials part where their conversations first differ",
    "retry": "a call sent again after an error, or the user went back to an earlier point of "
    "the conversation and went on differently (a Pi fork, a Gemini CLI rewind, a gptme branch)",
    "parallel-tools": "calls made side by side on one prompt",
    "sampling": "another sample of the same prompt (a GRPO group's rollouts, best-of-n): the "
    "samples part where their tokens first differ",
    "unknown": "the sequence leaves the earlier one's prefix and its format does not say why, "
    "most often a chat template that renders history differently from call to call, or a log "
    "edited between calls; it trains like any branch and costs only the tokens no longer "
    "shared. To name it: --chat-template with a template that renders history the same way "
    "each call, or a branch_reason field on OpenAI chat or Responses JSONL records",
}


def legend(view: dict[str, Any]) -> list[str]:
    """The lines under a drawn tree: what ``@N`` and ``xN`` are, and each branch reason the
    tree shows."""
    lines = [
        "@N: the segment starts at token N of its sequences (its depth); xN: N sequences pass "
        "through it (each trains its own continuation); 'K end': K of them end inside it"
    ]
    return lines + reason_legend(view["branches"])


def reason_legend(reasons: Iterable[str]) -> list[str]:
    """One line per branch reason: what it means (``show`` under its drawing, ``stats`` under its
    table of reasons)."""
    return [f"{r}: {REASON_MEANING.get(r, 'a reason its format named')}" for r in reasons]


def render_view(view: dict[str, Any]):  # -> rich.tree.Tree
    """A rich renderable of a :func:`tree_view` dict."""
    from rich.markup import escape
    from rich.tree import Tree as RichTree

    branches = ", ".join(f"{k} {v}" for k, v in view["branches"].items()) or "none"
    head = (
        f"[bold]{escape(view['group_id'])}[/] [dim]({escape(view['source_format'])})[/]  "
        f"{view['sequences']} sequences, {view['nodes']} nodes, {view['roots']} root(s), "
        f"{view['tokens_tree']:,} tree / {view['tokens_linear']:,} linear tokens "
        f"({view['ideal_speedup']:.2f}x)  branches: {branches}"
    )
    root = RichTree(head, guide_style="dim")

    def label(seg: dict[str, Any]) -> str:
        r = seg["branch_reason"]
        tag = f"[{_REASON_STYLE.get(r, 'bold')}]{escape(r)}[/] " if r else ""
        chain = f" in {seg['nodes']} nodes" if seg["nodes"] > 1 else ""
        ending = f", {seg['sequences_ending']} end" if seg["sequences_ending"] else ""
        return (
            f"{tag}[bold]{seg['tokens']:,}[/] tok{chain} @{seg['depth']:,} "
            f"[dim]x{seg['sequences']}{ending}[/]  [italic]{escape(seg['preview'])}[/]"
        )

    def add(parent: Any, segs: list[dict[str, Any]]) -> None:
        for s in segs:
            add(parent.add(label(s)), s["children"])

    add(root, view["tree"])
    if view["nodes_hidden"]:
        root.add(f"[dim]… {view['nodes_hidden']} more nodes (raise --max-nodes)[/]")
    return root
