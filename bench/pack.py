"""bench/pack: planning time and ERR of ``treeprep pack`` on a synthetic forest.

The forest is generated in memory (no shards, no tokenizer) straight into the planner's
:class:`~treeprep.pack.Forest` arrays, shaped like agent data:

* **agent sessions**: a system prompt, then 10-40 calls; call k's prompt is call k-1's prompt plus
  its completion plus a tool result, so the main thread is one long chain of nodes. Each call's
  trained completion (rendered with its reasoning, which later turns drop) is a short side branch
  off the chain, and one session in four starts a sub-agent (a second root with its own chain).
* **GRPO groups**: one prompt with 8 or 16 sampled completions (a fan).

It prints the forest's size and POR, then for several budgets the planning time, ERR, recomputed
tokens, padding waste and predicted rank imbalance, and finally planning time against forest size
(it should grow linearly with the number of nodes).

The forests above carry no token ids, so the packer's count of the tokens a micro-batch's trees
share (:mod:`treeprep.pack.openings`: each micro-batch's whole trees merged from their ids) has
nothing to merge. The last section times it: a forest of tasks that open alike
(:func:`shared_forest`: one system prompt with tool schemas, one of four domain policies, the
task's request, then sampled rollouts), planned with its trees' token ids and without them
(``tree_ids`` and the openings None, as a forest loaded without tokens): the difference is the
cost of the sharing count (the ids are held in memory here, so reading shards is not in it), and
the ERR gained is what it counts.

    python bench/pack.py                 # >= 10 million unique tokens
    python bench/pack.py --scale 0.2     # quicker
    python bench/pack.py --only-shared   # the sharing count alone
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from treeprep.pack import Forest, PackConfig, plan_forest


def _session(
    rng: np.random.Generator, parent, length, depth, seq_node, seq_len, fine: int = 1
) -> None:
    """Append one agent thread (a root and its chain with side branches), pre-order. ``fine``
    multiplies the calls and divides the node lengths: the same tokens in ``fine`` x the nodes."""
    base = len(parent)
    v = base
    parent.append(-1)
    length.append(int(rng.integers(1500, 3000)))
    depth.append(0)
    for _ in range(int(rng.integers(10, 41)) * fine):
        d = depth[v] + length[v]
        # side branch: the trained completion with its reasoning (a leaf), then the chain goes on
        side = len(parent)
        parent.append(v - base)
        length.append(max(1, int(rng.integers(80, 500)) // fine))
        depth.append(d)
        seq_node.append(side - base)
        seq_len.append(d + length[side])
        nxt = len(parent)
        parent.append(v - base)
        length.append(max(1, int(rng.integers(150, 900)) // fine))  # completion + tool result
        depth.append(d)
        v = nxt


def _forest(group: str, nodes: tuple, seqs: tuple, **extra: Any) -> Forest:
    """A one-shard forest of the node columns (offsets, parents, lengths, depths) and sequence
    columns (offsets, nodes, lengths) as lists; trees named ``<group><i>``."""
    node_off, parent, length, depth = nodes
    seq_off, seq_node, seq_len = seqs
    nt = len(node_off) - 1
    return Forest(
        shard_names=["synthetic"],
        tree_shard=np.zeros(nt, dtype=np.int32),
        tree_row=np.arange(nt),
        group_id=[f"{group}{i}" for i in range(nt)],
        node_off=np.array(node_off),
        node_parent=np.array(parent),
        node_length=np.array(length),
        node_depth=np.array(depth),
        seq_off=np.array(seq_off),
        seq_node=np.array(seq_node),
        seq_count=np.ones(len(seq_node), dtype=np.int64),
        seq_length=np.array(seq_len),
        **extra,
    )


def synthetic_forest(scale: float = 1.0, seed: int = 0, fine: int = 1) -> Forest:
    rng = np.random.default_rng(seed)
    n_sessions = int(280 * scale)
    n_grpo = int(500 * scale)
    parent: list[int] = []
    length: list[int] = []
    depth: list[int] = []
    seq_node: list[int] = []
    seq_len: list[int] = []
    node_off, seq_off = [0], [0]
    for _ in range(n_sessions):
        _session(rng, parent, length, depth, seq_node, seq_len, fine)
        if rng.random() < 0.25:  # a sub-agent: its own root and chain in the same tree
            off = len(parent)
            sub_p, sub_l, sub_d, sub_s, sub_sl = [], [], [], [], []
            _session(rng, sub_p, sub_l, sub_d, sub_s, sub_sl, fine)
            local0 = off - node_off[-1]
            parent.extend(p if p < 0 else p + local0 for p in sub_p)
            length.extend(sub_l)
            depth.extend(sub_d)
            seq_node.extend(s + local0 for s in sub_s)
            seq_len.extend(sub_sl)
        node_off.append(len(parent))
        seq_off.append(len(seq_node))
    for _ in range(n_grpo):
        p_len = int(rng.integers(300, 2500))
        parent.append(-1)
        length.append(p_len)
        depth.append(0)
        for _ in range(int(rng.choice([8, 16]))):
            c_len = int(rng.integers(200, 2500))
            seq_node.append(len(parent) - node_off[-1])
            parent.append(0)
            length.append(c_len)
            depth.append(p_len)
            seq_len.append(p_len + c_len)
        node_off.append(len(parent))
        seq_off.append(len(seq_node))
    nodes = (node_off, parent, length, depth)
    return _forest("g", nodes, (seq_off, seq_node, seq_len))


def shared_forest(trees: int, seed: int = 0, system: int = 3000) -> Forest:
    """``trees`` tasks, each one tree: a root holding the opening (``system`` tokens shared by
    every task, one of four 500-token domain policies, a 100-300 token request), then 4-8
    rollouts of 200-1500 tokens each (a fan); with every tree's opening token ids and its whole
    ids (``tree_ids``, held in memory)."""
    rng = np.random.default_rng(seed)
    head = rng.integers(32, 32000, system, dtype=np.int32)
    policies = [rng.integers(32, 32000, 500, dtype=np.int32) for _ in range(4)]
    parent: list[int] = []
    length: list[int] = []
    depth: list[int] = []
    seq_node: list[int] = []
    seq_len: list[int] = []
    node_off, seq_off = [0], [0]
    openings: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    for t in range(trees):
        task = rng.integers(32, 32000, int(rng.integers(100, 301)), dtype=np.int32)
        opening = np.concatenate([head, policies[t % 4], task])
        openings.append(opening)
        pieces = [opening]
        parent.append(-1)
        length.append(len(opening))
        depth.append(0)
        for _ in range(int(rng.integers(4, 9))):
            c_len = int(rng.integers(200, 1501))
            seq_node.append(len(parent) - node_off[-1])
            parent.append(0)
            length.append(c_len)
            pieces.append(rng.integers(32, 32000, c_len, dtype=np.int32))
            pieces.append(rng.integers(32, 32000, c_len, dtype=np.int32))
            depth.append(len(opening))
            seq_len.append(len(opening) + c_len)
        node_off.append(len(parent))
        seq_off.append(len(seq_node))
        ids.append(np.concatenate(pieces))  # the tree's nodes in pre-order
    lens = np.array([len(o) for o in openings], dtype=np.int64)

    def tree_ids(which: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        for t in np.asarray(which).tolist():
            yield t, ids[t]

    return _forest(
        "task",
        (node_off, parent, length, depth),
        (seq_off, seq_node, seq_len),
        open_off=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
        open_ids=np.concatenate(openings),
        tree_ids=tree_ids,
    )


def bench_shared(trees: int, world_size: int, steps_of: int, repeat: int = 3) -> None:
    """Planning CPU time with and without the sharing count (best of ``repeat``), per budget."""
    f = shared_forest(trees)
    bare = dataclasses.replace(f, open_off=None, open_ids=None, tree_ids=None)
    tt, tl = int(f.tokens_tree().sum()), int(f.tokens_linear().sum())
    opening = len(f.open_ids) if f.open_ids is not None else 0
    print(
        f"shared openings: {f.num_trees:,} trees, {len(f.node_parent):,} nodes, opening tokens "
        f"{opening:,}, tokens_tree {tt:,}, POR {1 - tt / tl:.4f}"
    )
    print(
        f"{'budget':>8} {'trees/mb':>8} {'plan s':>7} {'+count s':>8} {'count':>8} "
        f"{'shared tokens':>13} {'ERR':>7} {'ERR, no count':>13}"
    )
    for budget in (16_384, 32_768, 65_536):
        cfg = PackConfig(budget=budget, world_size=world_size, steps_of=steps_of)
        times: dict[str, float] = {}
        out = {}
        for name, forest in (("bare", bare), ("count", f)) * repeat:
            t0 = time.process_time()  # this process's CPU time: steady on a loaded machine
            out[name] = plan_forest(forest, cfg).summary
            dt = time.process_time() - t0
            times[name] = min(times.get(name, dt), dt)
        s, b = out["count"], out["bare"]
        print(
            f"{budget:>8,} {f.num_trees / s.micro_batches:>8.1f} {times['bare']:>7.3f} "
            f"{times['count']:>8.3f} {times['count'] - times['bare']:>7.3f}s "
            f"{s.tokens_shared:>13,} {s.err:>7.4f} {b.err:>13.4f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--steps-of", type=int, default=4)
    ap.add_argument("--shared-trees", type=int, default=4000, help="trees of the sharing bench")
    ap.add_argument("--only-shared", action="store_true", help="only the sharing-count bench")
    args = ap.parse_args()
    if args.only_shared:
        bench_shared(args.shared_trees, args.world_size, args.steps_of)
        return

    t0 = time.perf_counter()
    f = synthetic_forest(args.scale)
    gen = time.perf_counter() - t0
    tt, tl = int(f.tokens_tree().sum()), int(f.tokens_linear().sum())
    longest = int(f.longest_path().max())
    print(
        f"forest: {f.num_trees:,} trees, {len(f.node_parent):,} nodes, {len(f.seq_node):,} "
        f"sequences, tokens_tree {tt:,}, tokens_linear {tl:,}, POR {1 - tt / tl:.4f}, "
        f"longest path {longest:,} (generated in {gen:.1f} s)"
    )
    print(
        f"{'budget':>8} {'plan s':>7} {'split':>6} {'parts':>7} {'steps':>6} {'ERR':>7} "
        f"{'POR-ERR':>8} {'recomp %':>9} {'padding':>8} {'imb mean':>9} {'imb max':>8}"
    )
    for budget in (32_768, 49_152, 65_536, 131_072):
        if budget < longest:
            continue
        cfg = PackConfig(budget=budget, world_size=args.world_size, steps_of=args.steps_of)
        t0 = time.perf_counter()
        s = plan_forest(f, cfg).summary
        dt = time.perf_counter() - t0
        print(
            f"{budget:>8,} {dt:>7.2f} {s.split_trees:>6,} {s.parts:>7,} {s.steps:>6,} "
            f"{s.err:>7.4f} {s.por - s.err:>8.4f} {100 * s.tokens_recomputed / tt:>8.2f}% "
            f"{s.padding_waste:>8.3f} {s.imbalance_mean:>9.3f} {s.imbalance_max:>8.3f}"
        )
    print("scaling (budget 32,768: many trees are cut):")
    for fine in (1, 10):
        for sc in (args.scale / 4, args.scale / 2, args.scale):
            g = synthetic_forest(sc, seed=1, fine=fine)
            budget = max(32_768, int(g.longest_path().max()))
            cfg = PackConfig(budget=budget, world_size=args.world_size, steps_of=args.steps_of)
            t0 = time.perf_counter()
            s = plan_forest(g, cfg).summary
            dt = time.perf_counter() - t0
            n = len(g.node_parent)
            print(
                f"  {int(g.tokens_tree().sum()):>12,} unique tokens {n:>9,} nodes "
                f"{s.split_trees:>5,} split  ERR {s.err:.4f} (POR {s.por:.4f})  {dt:6.2f} s  "
                f"{1e6 * dt / n:6.1f} us/node"
            )
    bench_shared(args.shared_trees, args.world_size, args.steps_of)


if __name__ == "__main__":
    main()
