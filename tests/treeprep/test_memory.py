"""The memory model (treeprep.memory) against hand-computed terms, and the dry run's choice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from treeprep.dry_run import BuildFacts, dry_run, step_seconds
from treeprep.errors import TreeprepError
from treeprep.flops import ModelShape
from treeprep.memory import (
    GPUS,
    MemorySetup,
    handoff_bytes_per_path_token,
    kv_bytes_per_path_token,
    layer_activation_bytes,
    lm_head_bytes,
    peak,
    terms,
)

# H 8, Hq 8, Hkv 4, I 16, 2 layers, vocab 10, untied: params 2 * 240 + 2 * 80 = 640
TINY = ModelShape("tiny", layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4,
                  vocab=10, qk_norm=True)  # fmt: skip
#: what one TINY layer saves per token in float32 (test_terms_float32_by_hand)
LAYER_F32 = 668


def test_params_of_the_tiny_shape() -> None:
    # attention 64 + 32 + 32 + 64 = 192, MLP 3 * 8 * 16 = 384 per layer; embeddings 2 * 80
    assert TINY.params_total == 2 * (192 + 384) + 160


def test_terms_float32_by_hand() -> None:
    s = MemorySetup(precision="float32", parallel="ddp", activation_checkpointing=False)
    # per layer per token (bytes): two RMSNorms' input, 1/rms and normalized input 2 (4H + 4 +
    # 4H) = 136; the q/k/v and gate/up inputs (the two norm outputs) 2 x 4H = 64; the q/k norms'
    # input and normalized input (4 + 4)(Hq + Hkv) = 96 and 1/rms per head 4 x 3 = 12;
    # attention's q, k, v, output 2 x 4 (Hq + Hkv) = 96 and log-sum-exp 4 x 2 = 8; SwiGLU 4 x 4I
    # = 256: 668
    assert layer_activation_bytes(TINY, s) == LAYER_F32
    # K, V and an accumulator each, 2 layers x 4 values x 4 bytes x 4
    assert handoff_bytes_per_path_token(TINY, s) == 2 * 4 * 16
    assert kv_bytes_per_path_token(TINY, s) == 2 * 2 * 4 * 4
    t = terms(TINY, s, budget=100, path=300)
    p = 1312 * 4
    assert t["parameters"] == t["gradients"] == p and t["optimizer"] == 2 * p
    assert t["activations"] == 100 * (2 * LAYER_F32 + 3 * 8 * 4)
    assert t["handoff"] == (300 - 100) * 128  # the last part's rows are never stored
    assert t["lm_head_chunk"] == 100 * 10 * 12  # the logits and two f32 blocks (a block: 100 rows)
    assert t["layer_backward"] == 100 * LAYER_F32 // 2
    assert t["autocast_weights"] == t["fsdp_gathered"] == 0
    # the head's weight gradient of a chunk, before autograd adds it into .grad: vocab x hidden
    assert t["head_weight_gradient"] == 10 * 8 * 4
    static = 4 * p + t["handoff"] + t["activations"]
    head = t["lm_head_chunk"] + t["head_weight_gradient"]
    assert peak(t) == static + max(head, t["layer_backward"])
    assert terms(TINY, s, budget=400, path=300)["handoff"] == 0  # one part: nothing handed over


def test_the_lm_head_chunk_by_hand() -> None:
    """The loss's head chunk: its logits and their gradient, and one block of float32
    temporaries (two in the forward, one in the backward, two with an entropy gradient);
    Qwen3's vocabulary, 4,096 bf16 rows: 110 rows a block, 2.4 GiB (the whole chunk's float32
    log-softmax chain: 9.3 GiB)."""
    vocab, rows = 151_936, 4096
    assert lm_head_bytes(vocab, rows, 2) == 2 * rows * vocab * 2 + 4 * 110 * vocab
    assert lm_head_bytes(vocab, rows, 2, entropy=True) == 2 * rows * vocab * 2 + 8 * 110 * vocab
    assert lm_head_bytes(vocab, rows, 4) == 2 * rows * vocab * 4 + 4 * 110 * vocab
    assert lm_head_bytes(vocab, 64, 2) == 64 * vocab * 2 + 2 * 4 * 64 * vocab  # one block
    assert lm_head_bytes(10, 100, 8) == 100 * 10 * 8 + 2 * 8 * 100 * 10  # float64
    s = MemorySetup(precision="bfloat16", parallel="ddp")
    t = terms(replace(TINY, vocab=vocab), s, budget=8192, path=8192)
    te = terms(replace(TINY, vocab=vocab), replace(s, entropy=True), budget=8192, path=8192)
    assert te["lm_head_chunk"] - t["lm_head_chunk"] == 4 * 110 * vocab


def test_bf16_autocast_fsdp_and_checkpointing() -> None:
    s = MemorySetup(precision="bfloat16", world_size=4, parallel="fsdp",
                    activation_checkpointing=True, handoff_accumulate="float32")  # fmt: skip
    t = terms(TINY, s, budget=100, path=300)
    p = 1312 * 4  # float32 master weights
    assert t["parameters"] == p // 4 and t["optimizer"] == 2 * p // 4
    # FSDP2 gathers the layers in bf16: two layers' bf16 weights, one layer's float32 gradient;
    # and its root group (embeddings and the untied head, 2 x 80) stays gathered in float32,
    # with its full float32 gradients
    assert t["fsdp_gathered"] == 576 * (2 * 2 + 4) + 2 * 160 * 4
    assert t["autocast_weights"] == 2 * 10 * 8  # only the root's LM head is cast (vocab x hidden)
    ddp = terms(TINY, replace(s, parallel="ddp"), budget=100, path=300)
    assert ddp["fsdp_gathered"] == 0
    assert ddp["autocast_weights"] == 2 * 576  # no weight cache: one layer's copies at a time
    no_ckpt = replace(s, parallel="ddp", activation_checkpointing=False)
    # all matmul weights: the layers and the untied head, not the embedding table (a lookup)
    assert terms(TINY, no_ckpt, budget=100, path=300)["autocast_weights"] == 2 * (1312 - 80)
    # keys and values stored in bf16 (attention computes in it), both accumulators float32
    assert handoff_bytes_per_path_token(TINY, s) == 2 * 4 * (2 + 2 + 4 + 4)
    assert t["activations"] == 100 * (2 * 8 * 4 + 3 * 8 * 4)
    model_acc = MemorySetup(precision="bfloat16", handoff_accumulate="model")
    assert handoff_bytes_per_path_token(TINY, model_acc) == 2 * 4 * (2 + 2 + 2 + 2)
    # with checkpointing the weight copies die with the forward's autocast region
    base = sum(t[k] for k in ("parameters", "gradients", "optimizer", "fsdp_gathered"))
    base += t["handoff"] + t["activations"]
    head = t["lm_head_chunk"] + t["head_weight_gradient"]
    want = max(t["autocast_weights"], head, t["layer_backward"])
    assert peak(t, checkpointing=True) == base + want


def test_the_lm_head_is_cast_a_block_at_a_time(monkeypatch) -> None:
    """Autocast's copy of the LM head is one block of vocabulary rows
    (:mod:`treeprep.trainer.objective.cast_head`): 3 of TINY's 10 rows here."""
    from treeprep.schemas import parts

    monkeypatch.setattr(parts, "HEAD_WEIGHT_BLOCK_ELEMENTS", 3 * 8)
    s = MemorySetup(precision="bfloat16", world_size=4, parallel="fsdp",
                    activation_checkpointing=True)  # fmt: skip
    assert terms(TINY, s, budget=100, path=300)["autocast_weights"] == 2 * 3 * 8
    no_ckpt = replace(s, parallel="ddp", activation_checkpointing=False)
    # the layers' copies (all matmul weights less the head and the embedding) and one block
    assert terms(TINY, no_ckpt, budget=100, path=300)["autocast_weights"] == 2 * (
        1312 - 80 - 80 + 3 * 8
    )
    # with checkpointing: one layer's copies (576 weights) or the head's block, the larger
    ckpt = replace(s, parallel="ddp")
    assert terms(TINY, ckpt, budget=100, path=300)["autocast_weights"] == 2 * 576
    monkeypatch.setattr(parts, "HEAD_WEIGHT_BLOCK_ELEMENTS", 90 * 8)
    assert terms(replace(TINY, vocab=100), ckpt, budget=100, path=300)["autocast_weights"] == (
        2 * 90 * 8
    )


def test_fsdp_casts_at_most_two_layers_at_8b() -> None:
    """Issue 37 item 5's bar: Qwen3-8B under FSDP2 in bf16 (8 ranks, the Claude Code session's
    budget of 1,024) holds autocast copies of at most two decoder layers' bf16 weights."""
    from treeprep.flops import PRESETS

    m = PRESETS["qwen3-8b"]
    layer = (m.params_total - 2 * m.vocab * m.hidden) // m.layers
    for ckpt in (False, True):
        s = MemorySetup(precision="bfloat16", world_size=8, parallel="fsdp",
                        activation_checkpointing=ckpt)  # fmt: skip
        t = terms(m, s, budget=1024, path=126_189)
        assert 0 < t["autocast_weights"] <= 2 * 2 * layer, t


def test_keep_counts_the_ancestors_graphs_by_hand() -> None:
    """keep: the running part's ancestors' saved activations and the gradients of their final
    hidden states (their heads ran their backward at their forward: no log-softmax is held);
    their stores are the saved keys and values (float32), the accumulators come on top; the
    ancestors that do not keep their graph store the rows their descendants read, as in
    recompute."""
    s = MemorySetup(precision="float32", parallel="ddp", part_graph="keep")
    t = terms(TINY, s, budget=100, path=300, kept=(300, 200, 0))
    # the running part, as in recompute
    assert t["activations"] == 100 * (2 * LAYER_F32 + 3 * 8 * 4)
    assert t["kept_graphs"] == 300 * (2 * LAYER_F32 + 3 * 8 * 4) + 200 * 8 * 4
    assert t["handoff"] == 300 * 2 * 4 * 2 * 4  # accumulators only
    static = sum(t[k] for k in ("parameters", "gradients", "optimizer", "fsdp_gathered"))
    assert peak(t) == static + t["handoff"] + t["activations"] + t["kept_graphs"] + max(
        t["lm_head_chunk"] + t["head_weight_gradient"], t["layer_backward"]
    )
    stored = terms(TINY, s, budget=100, path=300, kept=(300, 200, 40))
    assert stored["handoff"] == t["handoff"] + 40 * handoff_bytes_per_path_token(TINY, s)
    # without the stack: every other token of the tree, each in a part with targets, up to the
    # path less one part (keep_cap); the rest of the path stored
    d = terms(TINY, s, budget=100, path=300, tree_tokens=500)
    assert d["kept_graphs"] == 200 * (2 * LAYER_F32 + 3 * 8 * 4) + 200 * 8 * 4
    assert d["handoff"] == 200 * 2 * 4 * 2 * 4
    few = terms(TINY, replace(s, keep_tokens=50), budget=100, path=300, tree_tokens=500)
    assert few["kept_graphs"] == 50 * (2 * LAYER_F32 + 3 * 8 * 4) + 50 * 8 * 4
    assert few["handoff"] == 50 * 2 * 4 * 2 * 4 + 150 * handoff_bytes_per_path_token(TINY, s)
    # checkpointing: the layer inputs, the keys and values the exchange holds, the h gradients
    ck = terms(TINY, MemorySetup(precision="float32", parallel="ddp", part_graph="keep",
                                 activation_checkpointing=True), budget=100, path=300,
               kept=(300, 200, 0))  # fmt: skip
    assert ck["kept_graphs"] == 300 * (2 * 8 + 2 * 4 * 2 + 3 * 8) * 4 + 200 * 8 * 4
    # autocast: attention takes bf16 keys, so the stores are the saved keys and values as in
    # the other precisions: bf16 accumulators only
    mixed = MemorySetup(precision="bfloat16", parallel="ddp", part_graph="keep")
    assert terms(TINY, mixed, budget=100, path=300, kept=(300, 0, 0))["handoff"] == 300 * (
        2 * 4 * 2 * 2
    )
    assert terms(TINY, s, budget=400, path=300, kept=(300, 200, 0))["kept_graphs"] == 0


def test_keep_recomputes_beyond_its_tokens_in_the_step_time() -> None:
    """keep's parts skip their second forward up to ``keep_tokens`` (default: the path less one
    part, all of the inner parts the model counts); beyond it they recompute, as recompute's do."""
    shape = TINY
    gpu = GPUS["h100"]
    kw = dict(tokens=9000, pairs=9000 * 2500, path=5000, budget=1024)

    def sec(**s: object) -> float:
        return step_seconds(shape, MemorySetup(precision="float32", parallel="ddp", **s), gpu, **kw)  # type: ignore[arg-type]

    keep, rec = sec(part_graph="keep"), sec(part_graph="recompute")
    assert keep < rec
    assert sec(part_graph="keep", keep_tokens=0) == pytest.approx(rec)
    assert keep < sec(part_graph="keep", keep_tokens=2000) < rec


def test_bad_setup_is_refused() -> None:
    with pytest.raises(
        TreeprepError,
        match="^memory: handoff_accumulate .float16.; expected one of model, float32$",
    ):
        MemorySetup(handoff_accumulate="float16")


def _facts(path: int, tokens: int) -> BuildFacts:
    return BuildFacts(1, tokens, path, tokens, tokens * path // 2, ((tokens, tokens * path // 2),))


def test_dry_run_takes_the_largest_budget_that_fits() -> None:
    s = MemorySetup(precision="float32", parallel="ddp")
    b = _facts(path=5000, tokens=9000)
    roomy = dry_run(TINY, s, b, GPUS["h100"])
    assert roomy["fits"] and roomy["suggested_budget"] == 9216  # the whole tree, rounded up
    assert roomy["budget"] == 9216 and roomy["budget_source"] == "suggested"
    # room for about 3000 tokens of activations beyond the rest at budget 1024
    t1 = terms(TINY, s, budget=1024, path=5000, tree_tokens=9000)
    per = (2 * 168 + 3 * 8) * 4 + 168 * 2  # activations + layer backward per token
    tight = dry_run(TINY, s, b, GPUS["h100"], gpu_memory=peak(t1) + 2048 * per)
    assert tight["suggested_budget"] in (2048, 3072)
    assert tight["predicted_peak_bytes"] <= tight["gpu_memory_bytes"]
    none = dry_run(TINY, s, b, GPUS["h100"], gpu_memory=1000)
    assert not none["fits"] and none["suggested_budget"] is None
    given = dry_run(TINY, s, b, GPUS["h100"], budget=2048)
    assert given["budget"] == 2048 and given["budget_source"] == "given"


def test_dry_run_steers_keep_to_recompute_where_its_graphs_do_not_fit() -> None:
    b = _facts(path=5000, tokens=9000)
    keep = MemorySetup(precision="float32", parallel="ddp", part_graph="keep")
    rec = MemorySetup(precision="float32", parallel="ddp")
    fits_recompute = peak(terms(TINY, rec, budget=1024, path=5000, tree_tokens=9000))
    assert peak(terms(TINY, keep, budget=1024, path=5000, tree_tokens=9000)) > fits_recompute
    # (without checkpointing: with it, keep at budget 1024 holds the path's layer inputs only,
    # which fit here)
    d = dry_run(TINY, keep, b, GPUS["h100"], gpu_memory=fits_recompute, checkpointing_given=True)
    assert d["fits"] and d["part_graph"] == d["suggested_part_graph"] == "recompute"
    given = dry_run(TINY, keep, b, GPUS["h100"], gpu_memory=fits_recompute, budget=1024,
                    checkpointing_given=True)  # fmt: skip
    assert not given["fits"] and given["part_graph"] == "keep"
    assert given["suggested_part_graph"] == "recompute"
    roomy = dry_run(TINY, keep, b, GPUS["h100"])
    assert roomy["part_graph"] == roomy["suggested_part_graph"] == "keep"


def test_the_handoff_term_counts_the_stacks_stored_rows() -> None:
    """A compacted session: a shared prompt (6), a first context of five 12-token calls and a
    second of five 4-token calls. At budget 16 the stack stores at most the prompt and the first
    context above its last call (6 + 48 rows); a smaller tree is skipped; the dry run's handoff
    term is those rows' keys, values and accumulators (the path would say 60)."""
    import numpy as np

    from treeprep.schemas.parts import stored_rows_peak

    ln = np.array([6, 12, 12, 12, 12, 12, 4, 4, 4, 4, 4])
    par = np.array([-1, 0, 1, 2, 3, 4, 0, 6, 7, 8, 9])
    small = (np.array([10, 5]), np.array([-1, 0]))
    b = BuildFacts(2, 101, 66, 86, 0, ((86, 0), (15, 0)), tree_nodes=((ln, par), small))
    assert stored_rows_peak(ln, par, 16) == b.stored_rows(16) == 6 + 4 * 12
    assert b.stored_rows(200) == 0  # no tree is cut
    assert _facts(path=66, tokens=86).stored_rows(16) is None  # no nodes: the path stands in
    s = MemorySetup(precision="float32", parallel="ddp")
    per_row = handoff_bytes_per_path_token(TINY, s)
    t = terms(TINY, s, budget=16, path=66, tree_tokens=86, stored_rows=b.stored_rows(16))
    assert t["handoff"] == 54 * per_row
    assert terms(TINY, s, budget=16, path=66, tree_tokens=86)["handoff"] == (66 - 16) * per_row


def test_context_parallelism_splits_the_tokens_and_the_heads() -> None:
    """``--cp 2``: each rank feeds half of a part's tokens and stores half of the key/value
    heads; the states sharded over the world are unchanged."""
    one = MemorySetup(precision="float32", world_size=2, parallel="fsdp")
    two = replace(one, cp=2)
    shape = replace(TINY, kv_heads=2, heads=4)
    t1 = terms(shape, one, budget=100, path=300)
    t2 = terms(shape, two, budget=100, path=300)
    assert handoff_bytes_per_path_token(shape, two) * 2 == handoff_bytes_per_path_token(shape, one)
    assert t2["handoff"] * 2 == t1["handoff"]
    assert t2["activations"] * 2 == t1["activations"]
    assert t2["layer_backward"] * 2 == t1["layer_backward"]
    for k in ("parameters", "gradients", "optimizer", "fsdp_gathered"):
        assert t2[k] == t1[k], k
    with pytest.raises(TreeprepError, match="cp 3"):
        replace(one, cp=3)


def test_every_gpu_choice_has_its_figures() -> None:
    """``--gpu``'s choices (:class:`treeprep.modes.Gpu`) and the figures the dry run reads
    (``GPUS``) name the same cards."""
    from treeprep.modes import Gpu

    assert sorted(GPUS) == sorted(g.value for g in Gpu)
    assert all(GPUS[g].name == g for g in Gpu)
