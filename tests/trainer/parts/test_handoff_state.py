"""Issue 24 (memory) and issue 26 items 14-15: what a hand-off part holds, and that it is exact.

* The path's keys and values are held once: the stores keep only the rows descendants read, in
  the run's dtype; descendants read them in place (no gathered prefix, no prefix ``.grad``), and
  their gradients go straight into one accumulator per stored tensor. Measured with the exact
  live-bytes tracker: the peak grows by at most twice the path's K/V bytes per path token (plus
  one layer's prefix gradient while it is added in, and the mask's index vectors).
* Accumulators are in the stored dtype (bf16 in bf16, float32 in float32, float64 in float64), or
  float32 on request in 16-bit runs.
* Parts are float64-exact (1e-10); Qwen3.5's linear-attention state gradients sum in the run's
  dtype (they were summed in float32: 2e-9..5e-8); and a model with final logit soft-capping
  runs in parts (the schedule read ``head.weight``, which the soft-capped head lacks).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainer_fixtures import VOCAB, group_tree, rows_of  # noqa: E402

from treeprep.sequence import Sequence  # noqa: E402
from treeprep.trainer import TreeBatch, load_model, verify_gradients  # noqa: E402
from treeprep.trainer.models import PRESETS  # noqa: E402
from treeprep.trainer.models.load import model_from_config  # noqa: E402
from treeprep.trainer.objective.loss import LossConfig  # noqa: E402
from treeprep.trainer.parts import KVStore, run_parts, schedule  # noqa: E402
from treeprep.trainer.parts.state import accumulator_dtype  # noqa: E402
from treeprep.trainer.run.memtrack import LiveBytes  # noqa: E402
from treeprep.trie import build_tree  # noqa: E402


def _model(name: str, dtype: torch.dtype, **config: object) -> torch.nn.Module:
    cfg = PRESETS[name].hf_config(VOCAB)
    for k, v in config.items():
        setattr(cfg, k, v)
    if "num_hidden_layers" in config and getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[0]] * int(config["num_hidden_layers"])  # type: ignore[index]
    return model_from_config(cfg, dtype=dtype, seed=3)


def _float64_norms(model: torch.nn.Module) -> None:
    """transformers' RMSNorms compute in float32 whatever the weights' dtype, which caps a float64
    run near 1e-8 (tree against linear too; see tests/trainer/objective/test_rl.py): the same
    formulas kept
    in float64, for the norms of the families checked here."""

    def rms(h: torch.Tensor, eps: float) -> torch.Tensor:
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)

    def plain(self, h):  # noqa: ANN001, ANN202
        return self.weight * rms(h, self.variance_epsilon)

    forms = {"Qwen3RMSNorm": plain, "LlamaRMSNorm": plain}
    for mod in model.modules():
        name = type(mod).__name__
        if "RMSNorm" in name:
            assert name in forms, f"no float64 form for {name}"
            mod.forward = forms[name].__get__(mod)  # type: ignore[method-assign]


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
def test_parts_are_float64_exact(name: str) -> None:
    rows = rows_of(group_tree(31, n_seq=6, roots=2), group_tree(32, n_seq=5))
    model = _model(name, torch.float64)
    _float64_norms(model)
    rep = verify_gradients(model, rows, loss="sft", norm="sum", attn="nodes", budget=5)
    assert rep.worst_rel < 1e-10 and rep.loss_rel < 1e-10, (rep.worst_rel, rep.loss_rel)


@pytest.mark.parametrize("mode", ["recompute", "keep"])
def test_final_logit_softcapping_runs_in_parts(mode: str) -> None:
    rows = rows_of(group_tree(33, n_seq=6, roots=2))
    model = _model("tiny-gemma3", torch.float32, final_logit_softcapping=3.0)
    rep = verify_gradients(
        model, rows, loss="grpo", norm="sequence-mean", budget=6, part_graph=mode
    )
    assert rep.ok and rep.worst_rel < 1e-5, rep.to_dict()
    # the cap changes the loss: the wrapper is really in the path
    plain = _model("tiny-gemma3", torch.float32)
    b = TreeBatch.from_trees(rows, norm="sequence-mean")
    capped = run_parts(model, b, LossConfig("sft"), budget=6).loss
    assert float(capped) != pytest.approx(
        float(run_parts(plain, b, LossConfig("sft"), budget=6).loss)
    )


def _chain_row(tokens: int) -> dict:
    """One path, every token trained: each part feeds the LM head the same number of rows."""
    toks = np.random.default_rng(0).integers(0, VOCAB, tokens).astype(np.int32)
    return build_tree([Sequence("s", toks, [(1, tokens)])]).to_row()


def _peak(model: torch.nn.Module, tokens: int, budget: int, **kw: object) -> int:
    b = TreeBatch.from_trees([_chain_row(tokens)], norm="sum")
    model.zero_grad(set_to_none=True)
    with LiveBytes() as mem:
        run_parts(model, b, LossConfig("sft"), budget=budget, attn="nodes", **kw)  # type: ignore[arg-type]
    return mem.peak


@pytest.mark.parametrize(("dtype", "accumulate"), [(torch.float32, "model"),
                                                    (torch.bfloat16, "model"),
                                                    (torch.bfloat16, "float32")])  # fmt: skip
def test_the_path_state_grows_by_twice_its_kv_bytes(dtype: torch.dtype, accumulate: str) -> None:
    layers = 8
    model = _model("tiny-qwen3", dtype, num_hidden_layers=layers)
    cfg = model.config
    item = torch.tensor([], dtype=dtype).element_size()
    kv = layers * 2 * cfg.num_key_value_heads * cfg.head_dim * item  # the path's K/V per token
    acc = kv if accumulate == "model" else kv * 4 // item
    budget, short, long = 128, 512, 1024
    _peak(model, 64, budget)  # warm up (rotary caches and the like)
    slope = (
        _peak(model, long, budget, accumulate=accumulate)
        - _peak(model, short, budget, accumulate=accumulate)
    ) / (long - short)
    # stored K/V + one accumulator each, and the part's mask vectors (its TreeMask holds four
    # int64 per prefix row, and building them a few more: measured 7); nothing else grows with
    # the path (the fused kernel adds each prefix block's gradient into its store, so not even
    # one layer's prefix gradient is held at once; before that, 1/layers of the K/V more)
    bound = kv + acc + 8 * 8
    assert slope <= bound, (slope, kv, acc)
    assert slope >= kv + acc  # the state really is held (the measure sees it)


def test_joined_backends_hold_no_prefix_gradient_per_layer() -> None:
    """``dense`` (as ``flex`` and ``flash`` on a GPU) joins [prefix; own] keys per layer, so its
    reads of the stores go through autograd. Recorded before the first layer, they ran after
    every layer's backward and each layer's prefix gradient waited until then: one more copy
    of the path's K/V (+16 GiB on an H200, Qwen3-1.7B, 126k path). Recorded when the layer asks,
    the path state grows as with ``nodes``: the stores and their accumulators, and the dense
    mask's [T, P] row per path token (a budget's worth of bytes, one layer at a time)."""
    layers = 8
    model = _model("tiny-qwen3", torch.float32, num_hidden_layers=layers)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cfg = model.config
    kv = layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    budget, short, long = 128, 512, 1024

    def peak(tokens: int) -> int:
        b = TreeBatch.from_trees([_chain_row(tokens)], norm="sum")
        model.zero_grad(set_to_none=True)
        with LiveBytes() as mem:
            run_parts(model, b, LossConfig("sft"), budget=budget, attn="dense")
        return mem.peak

    peak(64)
    slope = (peak(long) - peak(short)) / (long - short)
    # stored K/V, one accumulator each, and one layer's dense score column per key (float32,
    # budget x heads: measured 0.7 of it); before, 7/8 of the K/V more (6,616 against 4,824)
    assert slope <= 2 * kv + 4 * budget * cfg.num_attention_heads, (slope, kv)


def test_linear_state_gradients_sum_in_the_run_dtype() -> None:
    """Qwen3.5's handed-over conv and recurrent states: their gradients were summed in float32,
    which capped float64 parts at 2e-9..5e-8. (transformers' own gated-delta-rule fallback casts
    to float32 inside, so a whole Qwen3.5 model cannot show 1e-10 in float64 either way.)"""
    from treeprep.trainer.parts import LinearState

    conv, rec = torch.zeros(3, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    st = LinearState({7: (conv, rec)})
    tiny_ = torch.tensor([1e-12, 1.0, 0.0], dtype=torch.float64)
    st.add_grad(7, tiny_, torch.ones(2, dtype=torch.float64))
    st.add_grad(7, tiny_, torch.ones(2, dtype=torch.float64))
    assert st.grads[7][0].dtype == torch.float64 and float(st.grads[7][0][0]) == 2e-12
    bf = LinearState({1: (conv.bfloat16(), rec.bfloat16())}, accumulate="float32")
    bf.add_grad(1, torch.ones(3, dtype=torch.bfloat16), torch.ones(2, dtype=torch.bfloat16))
    assert bf.grads[1][0].dtype == torch.float32


def test_accumulators_follow_the_run_dtype() -> None:
    assert accumulator_dtype(torch.bfloat16, "model") == torch.bfloat16
    assert accumulator_dtype(torch.bfloat16, "float32") == torch.float32
    assert accumulator_dtype(torch.float32, "float32") == torch.float32
    assert accumulator_dtype(torch.float64, "model") == torch.float64
    assert accumulator_dtype(torch.float64, "float32") == torch.float64
    seen: list[tuple[torch.dtype, torch.dtype | None]] = []
    drop = schedule._Runner.drop

    def spy(self, c: int) -> None:  # noqa: ANN001
        for st in self.states[c]:
            if isinstance(st, KVStore):
                seen.append((st.k.dtype, None if st.gk is None else st.gk.dtype))
        drop(self, c)

    model = _model("tiny-qwen3", torch.float64)
    b = TreeBatch.from_trees([_chain_row(100)], norm="sum")
    schedule._Runner.drop = spy  # type: ignore[method-assign]
    try:
        run_parts(model, b, LossConfig("sft"), budget=16)
    finally:
        schedule._Runner.drop = drop  # type: ignore[method-assign]
    assert seen and all(k == g == torch.float64 for k, g in seen)


def test_a_part_stores_only_the_rows_its_descendants_read() -> None:
    """A side branch inside a part is not stored: only the rows on a descendant's path."""
    b = TreeBatch.from_trees(rows_of(group_tree(7, n_seq=8)), norm="sum")
    model = load_model("tiny-qwen3", vocab_size=VOCAB, attn="nodes", seed=1)
    kept: list[tuple[int, int]] = []
    drop = schedule._Runner.drop

    def spy(self, c: int) -> None:  # noqa: ANN001
        st = self.states[c][0]
        kept.append((int(st.k.shape[2]), self.layout.parts[c].num_tokens))
        drop(self, c)

    schedule._Runner.drop = spy  # type: ignore[method-assign]
    try:
        run_parts(model, b, LossConfig("sft"), budget=11)
    finally:
        schedule._Runner.drop = drop  # type: ignore[method-assign]
    assert kept and all(s <= n for s, n in kept)
    assert any(s < n for s, n in kept)


@pytest.mark.parametrize("mode", ["recompute", "keep"])
def test_frozen_keys_get_no_accumulator(mode: str) -> None:
    """LoRA on queries and values only: layer 0's keys come from frozen weights and need no
    gradient, so their store keeps no accumulator (it allocated one, and summed into it, for
    nothing); every other stored tensor does. Gradients still verify at 1e-5."""
    from treeprep.trainer.models.lora import apply_lora

    pm = apply_lora(load_model("tiny-qwen3", vocab_size=VOCAB, attn="nodes", seed=1), r=4,
                    targets=["q_proj", "v_proj"])  # fmt: skip
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
    seen: list[tuple[bool, ...]] = []
    drop = schedule._Runner.drop

    def spy(self, c: int) -> None:  # noqa: ANN001
        seen.append(tuple(t is not None for st in self.states[c] for t in (st.gk, st.gv)))
        drop(self, c)

    b = TreeBatch.from_trees([_chain_row(100)], norm="sum")
    schedule._Runner.drop = spy  # type: ignore[method-assign]
    try:
        run_parts(pm, b, LossConfig("sft"), budget=16, mode=mode)
    finally:
        schedule._Runner.drop = drop  # type: ignore[method-assign]
    assert seen and all(s == (False, True, True, True) for s in seen), seen
    rows = rows_of(group_tree(21, n_seq=6, roots=2), group_tree(22, n_seq=5))
    rep = verify_gradients(pm, rows, loss="sft", norm="sum", attn="nodes", budget=5,
                           part_graph=mode)  # fmt: skip
    assert rep.ok and rep.worst_rel < 1e-5, rep.to_dict()


def test_a_checkpointed_part_holds_one_recomputed_layer_at_a_time() -> None:
    """Activation checkpointing recomputes each layer inside the part's backward, and the
    recomputation calls the exchange again. Recording the recomputed keys and values as the
    part's own kept every recomputed layer's tensors (its input norm, its projections) until the
    part ended: 776,832 bytes per layer here. Holding the forward's own keys and values for the
    descendants' gradients cost 2 x kv per part token and layer more (410,240); they now join
    inside the layer's backward (344,708). What a layer adds to the peak: its gradients (twice
    their bytes: measured, they are summed into across parts), the stored rows' keys and values
    with an accumulator each, and per part token its checkpointed input; bf16, where the norms'
    float32 copies would show."""
    from treeprep.schemas.parts import stored_rows_peak

    tokens, budget = 1024, 512

    def peak(layers: int) -> tuple[int, torch.nn.Module]:
        model = _model("tiny-qwen3", torch.bfloat16, num_hidden_layers=layers)
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        _peak(model, 64, 32)  # warm up (rotary caches and the like)
        return _peak(model, tokens, budget), model

    (p4, _), (p8, model) = peak(4), peak(8)
    cfg = model.config
    kv = cfg.num_key_value_heads * cfg.head_dim * 2  # bytes of one row's keys (or values)
    row = _chain_row(tokens)
    stored = stored_rows_peak(
        np.asarray(row["node_length"]), np.asarray(row["node_parent"]), budget
    )
    grads = sum(p.numel() * 2 for p in model.model.layers[0].parameters())
    per_layer = 2 * grads + stored * 2 * kv * 2 + budget * cfg.hidden_size * 2
    slope = (p8 - p4) / 4
    assert slope <= 1.02 * per_layer, (slope, per_layer)


@pytest.mark.parametrize("mode", ["recompute", "keep"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_nothing_of_a_run_outlives_it(mode: str, checkpointing: bool) -> None:
    """No exchange or store survives ``run_parts``, garbage collector or not. A first version of
    the own-gradient node held its exchange in its context while the exchange held the node's
    outputs: a cycle through autograd, which the collector cannot see, so every part's exchange
    and the stores it read stayed alive (7 exchanges and 12 stores more per run here)."""
    import gc

    from treeprep.trainer.parts import HandOff

    model = _model("tiny-qwen3", torch.float32)
    if checkpointing:
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    b = TreeBatch.from_trees(rows_of(group_tree(7, n_seq=8)), norm="token-mean")

    def alive() -> tuple[int, int]:
        objs = gc.get_objects()
        return sum(isinstance(o, HandOff) for o in objs), sum(isinstance(o, KVStore) for o in objs)

    gc.collect()
    before = alive()
    gc.disable()
    try:
        for _ in range(2):
            run_parts(model, b, LossConfig("sft"), budget=9, mode=mode)
        now = alive()  # (others' objects may be freed meanwhile, never made)
        assert now[0] <= before[0] and now[1] <= before[1], (now, before)
    finally:
        gc.enable()
