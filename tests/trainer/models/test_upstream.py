"""Issue 26 (first part): the upstream code treeprep calls into or stands in for, pinned by name.

treeprep runs transformers' own linear-attention forward segment by segment with a stand-in cache
(:class:`~treeprep.trainer.models.hybrid.SegmentCache`), registers its own function through
transformers' attention interface, and takes Liger's fused head only where it has the per-row
backward (pinned in ``tests/trainer/objective/test_fused_head.py``, which imports Liger under
Triton's
interpreter). A new release that renames an argument or calls a new cache method must fail here, by
name, before it can change or break training (transformers 5.24 renamed ``cache_params`` to
``cache``; nothing caught it until every Qwen3.5 run died). When one of these fails: check the
new release against the equivalence tests, then update the pinned names and constraints.txt.
"""

from __future__ import annotations

import inspect
import re
import types

import pytest

torch = pytest.importorskip("torch")

from treeprep.errors import TreeprepError  # noqa: E402
from treeprep.trainer.models import hybrid  # noqa: E402
from treeprep.trainer.models.hybrid import (  # noqa: E402
    CACHE_ARG_NAMES,
    SegmentCache,
    cache_arg_name,
    tree_linear_forward,
)


def _gated_deltanet() -> type:
    mod = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    return mod.Qwen3_5GatedDeltaNet


def test_linear_attention_forward_signature_is_the_verified_one() -> None:
    params = list(inspect.signature(_gated_deltanet().forward).parameters)
    assert params == ["self", "hidden_states", "cache", "attention_mask", "kwargs"]
    assert cache_arg_name(_gated_deltanet().forward) == "cache"


def test_the_decoder_layer_passes_the_cache_by_the_name_treeprep_reads() -> None:
    mod = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    src = inspect.getsource(mod.Qwen3_5DecoderLayer.forward)
    call = src[src.index("self.linear_attn(") :]
    call = call[: call.index(")") + 1]
    names = set(re.findall(r"(\w+)=", call))
    assert names & set(CACHE_ARG_NAMES) == {"cache"}, call


def test_segment_cache_has_every_method_the_layer_calls() -> None:
    src = inspect.getsource(_gated_deltanet().forward)
    called = set(re.findall(r"cache\.(\w+)\(", src))
    assert called, "the layer no longer reads a cache: treeprep cannot hand it a node's state"
    missing = sorted(m for m in called if not callable(getattr(SegmentCache, m, None)))
    assert not missing, f"SegmentCache lacks {missing}"


def test_attention_interface_signature_is_the_verified_one() -> None:
    sdpa = pytest.importorskip("transformers.integrations.sdpa_attention")
    params = list(inspect.signature(sdpa.sdpa_attention_forward).parameters)
    assert params[:7] == [
        "module",
        "query",
        "key",
        "value",
        "attention_mask",
        "dropout",
        "scaling",
    ]


def test_a_forward_without_a_cache_argument_is_refused_by_name() -> None:
    def forward(self, hidden_states, state=None, attention_mask=None, **kwargs):  # noqa: ANN001
        return hidden_states

    with pytest.raises(TreeprepError, match="cache_params"):
        cache_arg_name(forward)


class _Recorder(torch.nn.Module):
    """A linear-attention stand-in with the pre-5.24 signature (``cache_params``)."""

    layer_idx = 0

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[object] = []

    def forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):  # noqa: ANN001
        self.seen.append(cache_params)
        return hidden_states * 2


class _Recorder524(_Recorder):
    """The same with the 5.24 signature (``cache``)."""

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):  # noqa: ANN001
        self.seen.append(cache)
        return hidden_states * 2


@pytest.mark.parametrize("cls", [_Recorder, _Recorder524])
@pytest.mark.parametrize("by", ["cache", "cache_params", "position"])
def test_tree_forward_hands_each_segment_a_cache_under_either_name(cls: type, by: str) -> None:
    layer = cls()
    fwd = types.MethodType(tree_linear_forward, layer)
    tm = types.SimpleNamespace(handoff=None, q_depth=None, _cache={})
    tm._cache["linear_segments"] = hybrid.Segments(
        start=[0, 2], length=[2, 3], parent=[-1, -1], head=[0, 1], last=[0, 1], save=[False, False]
    )
    x = torch.arange(5.0).reshape(1, 5, 1)
    if by == "position":
        y = fwd(x, None, None, tree_mask=tm)
    else:
        y = fwd(x, **{by: None}, attention_mask=None, tree_mask=tm)
    assert torch.equal(y, x * 2)
    assert len(layer.seen) == 2 and all(isinstance(c, SegmentCache) for c in layer.seen)
    # without a tree the layer's own forward runs untouched, whatever the caller's spelling
    layer.seen.clear()
    assert torch.equal(fwd(x), x * 2) and layer.seen == [None]
