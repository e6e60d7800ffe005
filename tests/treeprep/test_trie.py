"""The trie: exact round trips, the shard layout invariants, merge and branch-reason rules."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from treeprep.sequence import Sequence
from treeprep.trie import build_tree


def _seq(tokens, spans=None, **kw) -> Sequence:
    spans = spans if spans is not None else [(len(tokens) - 1, len(tokens))]
    return Sequence(group_id="g", tokens=np.array(tokens), loss_spans=spans, **kw)


def _as_multiset(records) -> Counter:
    return Counter(
        (
            tuple(r["input_ids"]),
            tuple(r["loss_mask"]),
            r.get("reward"),
            r.get("advantage"),
            tuple(r.get("logprobs") or ()),
        )
        for r in records
    )


def _check_layout(tree) -> None:
    n = tree.num_nodes
    assert tree.node_offset[0] == 0
    assert int(tree.node_length.sum()) == tree.tokens_tree
    for i in range(n):
        p = int(tree.node_parent[i])
        assert p < i  # parents before children (pre-order)
        if p >= 0:
            assert tree.node_depth[i] == tree.node_depth[p] + tree.node_length[p]
            assert tree.node_last[p] >= tree.node_last[i]
        else:
            assert tree.node_depth[i] == 0
        assert i <= tree.node_last[i] < n
        assert tree.node_length[i] > 0
    # node_last is exactly the subtree: j in (i, last_i] iff i is an ancestor of j
    for j in range(n):
        anc = set(tree.path_nodes(j))
        for i in range(n):
            assert (i in anc) == (i <= j <= tree.node_last[i])
    # siblings start with distinct tokens, in ascending order
    for i in range(-1, n):
        kids = [j for j in range(n) if tree.node_parent[j] == i]
        firsts = [int(tree.input_ids[tree.node_offset[j]]) for j in kids]
        assert firsts == sorted(set(firsts))


def test_prefix_sequence_ends_at_inner_node_and_duplicates_merge() -> None:
    seqs = [
        _seq([1, 2, 3], [(2, 3)]),
        _seq([1, 2, 3, 4, 5], [(3, 5)]),
        _seq([1, 2, 9, 9], [(2, 4)], branch_reason="retry"),
        _seq([1, 2, 3], [(2, 3)]),
        _seq([7, 8], [(1, 2)], branch_reason="sub-agent"),
    ]
    t = build_tree(seqs)
    assert t.input_ids.tolist() == [1, 2, 3, 4, 5, 9, 9, 7, 8]
    assert t.node_parent.tolist() == [-1, 0, 1, 0, -1]
    assert t.node_branch_reason == ["", "", "", "retry", "sub-agent"]
    assert t.seq_count.tolist() == [2, 1, 1, 1]
    assert t.node_num_sequences.tolist() == [4, 3, 1, 1, 1]
    assert t.tokens_linear == 3 + 5 + 4 + 3 + 2
    assert t.tokens_tree == 9
    _check_layout(t)
    assert _as_multiset(t.iter_sequences()) == _as_multiset(
        [{"input_ids": s.tokens.tolist(), "loss_mask": _mask(s)} for s in seqs]
    )


def _mask(s: Sequence) -> list[int]:
    m = [0] * len(s.tokens)
    for a, b in s.loss_spans:
        m[a:b] = [1] * (b - a)
    return m


def test_same_tokens_other_advantage_stay_separate_entries() -> None:
    t = build_tree([_seq([1, 2, 3], advantage=1.0), _seq([1, 2, 3], advantage=-1.0)])
    assert t.num_sequences == 2 and t.num_nodes == 1
    assert sorted(t.seq_advantage) == [-1.0, 1.0]


def test_main_continuation_is_the_earliest_sequence() -> None:
    # the later call branches off with its own hint, whatever the token order
    t = build_tree([_seq([1, 9, 9]), _seq([1, 2, 2], branch_reason="compaction")])
    reasons = {tuple(t.node_tokens(i).tolist()): t.node_branch_reason[i] for i in range(3)}
    assert reasons == {(1,): "", (9, 9): "", (2, 2): "compaction"}


def _reasons(t) -> dict[tuple[int, ...], str]:
    return {tuple(t.node_tokens(i).tolist()): t.node_branch_reason[i] for i in range(t.num_nodes)}


def test_a_later_run_parts_with_the_reason_its_first_call_names() -> None:
    """Issue 53 item 11: a second tau-bench trial (or GRPO sample) repeats the first one's
    opening call and parts from it at a later call, which carried no hint: ``unknown``. The
    branch takes the run's reason from the run's first call."""
    for why in ("new-trial", "sampling"):
        t = build_tree(
            [
                _seq([1, 2, 3], trajectory_id="t1"),
                _seq([1, 2, 3, 4, 5], trajectory_id="t1"),
                _seq([1, 2, 3], trajectory_id="t2", branch_reason=why),
                _seq([1, 2, 3, 6, 7], trajectory_id="t2"),
            ]
        )
        assert _reasons(t) == {(1, 2, 3): "", (4, 5): "", (6, 7): why}


def test_a_run_reason_explains_no_branch_inside_its_run() -> None:
    """Within one run, and for hints that are not about runs (a sub-agent's first call), the
    branch stays ``unknown``: the run's reason says why two runs differ, nothing more."""
    inside = build_tree(
        [
            _seq([1, 2], trajectory_id="t1"),
            _seq([1, 2], trajectory_id="t2", branch_reason="new-trial"),
            _seq([1, 2, 3, 4], trajectory_id="t2"),
            _seq([1, 2, 5, 6], trajectory_id="t2"),
        ]
    )
    assert _reasons(inside) == {(1, 2): "", (3, 4): "", (5, 6): "unknown"}
    other = build_tree(
        [
            _seq([1, 2, 3], trajectory_id="t1"),
            _seq([8], trajectory_id="t2", branch_reason="sub-agent"),
            _seq([1, 2, 4], trajectory_id="t2"),
        ]
    )
    assert _reasons(other) == {(1, 2): "", (3,): "", (4,): "unknown", (8,): "sub-agent"}
    named = build_tree(
        [_seq([1, 2, 3], trajectory_id="t1"), _seq([1, 2, 4], trajectory_id="t2")]
    )  # two runs, neither naming why
    assert _reasons(named) == {(1, 2): "", (3,): "", (4,): "unknown"}


def test_a_hinted_call_read_before_the_session_it_left_is_the_branch() -> None:
    """A sub-agent's (or a continuation's, or a branch's) file sorts before its session's, so
    the hinted call comes first in input order: the session, not the hinted call, is the main
    continuation, and the branch takes the hint (before: ``unknown`` on the session)."""
    t = build_tree(
        [
            _seq([1, 8, 8], branch_reason="sub-agent"),  # the sub-agent's file, read first
            _seq([1, 8, 8, 9]),
            _seq([1, 2, 3]),  # the session
            _seq([1, 2, 3, 4]),
        ]
    )
    assert _reasons(t) == {(1,): "", (2, 3): "", (4,): "", (8, 8): "sub-agent", (9,): ""}


def test_a_hint_that_named_its_branch_above_names_no_other() -> None:
    """Below the branch its hint named, the hinted call is the earliest again: a later call that
    parts from it there, for no given reason, stays ``unknown``. So does a call of another
    run (the run rules hold) and a sibling that carries its own hint."""
    named = build_tree(
        [
            _seq([1, 2, 3]),
            _seq([1, 5, 6, 7], branch_reason="compaction"),
            _seq([1, 5, 6, 9]),
        ]
    )
    assert _reasons(named) == {
        (1,): "",
        (2, 3): "",
        (5, 6): "compaction",
        (7,): "",
        (9,): "unknown",
    }
    runs = build_tree(
        [
            _seq([1, 2], trajectory_id="t1", branch_reason="sub-agent"),
            _seq([1, 3], trajectory_id="t2"),
        ]
    )
    assert _reasons(runs) == {(1,): "", (2,): "", (3,): "unknown"}
    both = build_tree(
        [_seq([1, 2], branch_reason="compaction"), _seq([1, 3], branch_reason="retry")]
    )
    assert _reasons(both) == {(1,): "", (2,): "", (3,): "retry"}


def test_build_is_deterministic_under_input_permutation_of_tokens() -> None:
    a = [_seq([1, 2, 3]), _seq([1, 2, 4]), _seq([5])]
    t1 = build_tree(a)
    t2 = build_tree([a[2], a[0], a[1]])
    assert t1.input_ids.tolist() == t2.input_ids.tolist()
    assert t1.node_parent.tolist() == t2.node_parent.tolist()


token_lists = st.lists(st.integers(0, 6), min_size=1, max_size=12)


@st.composite
def rollouts(draw):
    prefixes = draw(st.lists(token_lists, min_size=1, max_size=3))
    out = []
    for _ in range(draw(st.integers(1, 10))):
        p = draw(st.sampled_from(prefixes))
        g = draw(st.lists(st.integers(0, 6), min_size=0, max_size=6))
        toks = p + g
        a = draw(st.integers(0, len(toks) - 1))
        adv = draw(st.sampled_from([None, 1.0, -0.5]))
        lp = draw(st.booleans())
        logprobs = np.linspace(-1, 0, len(toks) - a).astype(np.float32) if lp else None
        out.append(_seq(toks, [(a, len(toks))], advantage=adv, logprobs=logprobs))
    return out


@settings(max_examples=150, deadline=None)
@given(rollouts())
def test_export_of_build_is_the_input_multiset(seqs) -> None:
    t = build_tree(seqs)
    _check_layout(t)
    expect = _as_multiset(
        [
            {
                "input_ids": s.tokens.tolist(),
                "loss_mask": _mask(s),
                "advantage": s.advantage,
                "logprobs": None if s.logprobs is None else s.logprobs.tolist(),
            }
            for s in seqs
        ]
    )
    assert _as_multiset(t.iter_sequences()) == expect
    # tokens_tree = sum(len) - sum(LCP of sorted distinct neighbours)
    uniq = sorted({tuple(s.tokens.tolist()) for s in seqs})
    lcp = 0
    for a, b in zip(uniq, uniq[1:], strict=False):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        lcp += k
    assert t.tokens_tree == sum(map(len, uniq)) - lcp
    assert t.tokens_linear == sum(len(s.tokens) for s in seqs)


# ---- issue 26 item 6: sequences that hold only what follows an earlier one's prefix -------------


def _rows_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        va, vb = a[k], b[k]
        if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            assert np.array_equal(np.asarray(va), np.asarray(vb)), k
        else:
            assert va == vb, k


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=1, max_size=9),
            st.integers(0, 20),  # which earlier sequence to share with
            st.floats(0, 1),  # how much of the shared prefix to use
            st.sampled_from([None, 1.0, -1.0]),  # reward: duplicates of tokens stay apart
            st.sampled_from([None, "dropped"]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_chained_sequences_build_the_same_tree_as_whole_ones(items) -> None:  # type: ignore[no-untyped-def]
    whole, chained = [], []
    for i, (toks, base, share, reward, why) in enumerate(items):
        kw = {"reward": reward, "branch_reason": why, "call_id": f"c{i}"}
        whole.append(_seq(toks, **kw))
        if i == 0 or share == 0:
            chained.append(_seq(toks, **kw))
            continue
        j = base % i
        other = whole[j].tokens
        m = min(len(other), len(toks))
        lcp = next((k for k in range(m) if other[k] != toks[k]), m)
        p = int(lcp * share)
        s = Sequence(group_id="g", tokens=np.array(toks[p:]), loss_spans=[(len(toks) - 1,
                     len(toks))], prefix=j, prefix_len=p, **kw)  # fmt: skip
        chained.append(s)
    _rows_equal(build_tree(whole).to_row(), build_tree(chained).to_row())
