"""The FLOP model: preset shapes match the published parameter counts, configs parse, the
formula is the documented one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treeprep.errors import TreeprepError
from treeprep.flops import PRESETS, ModelShape, from_config, load_model

# published sizes (model cards): total parameters, and non-embedding / activated where given
PUBLISHED = {
    "qwen3-0.6b": (0.6e9, 0.44e9),
    "qwen3-1.7b": (1.7e9, 1.4e9),
    "qwen3-4b": (4.0e9, 3.6e9),
    "qwen3-8b": (8.2e9, 6.95e9),
    "qwen3-32b": (32.8e9, 31.2e9),
    "llama-3.1-8b": (8.03e9, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_match_the_model_cards(name: str) -> None:
    total, nonemb = PUBLISHED[name]
    m = PRESETS[name]
    assert m.params_total == pytest.approx(total, rel=0.03)
    if nonemb:
        assert m.params_nonembedding_active == pytest.approx(nonemb, rel=0.03)


def test_moe_counts_active_parameters() -> None:
    m = PRESETS["qwen3-30b-a3b"]
    assert m.params_total == pytest.approx(30.5e9, rel=0.02)
    active = m.params_nonembedding_active + 2 * m.vocab * m.hidden  # embeddings + LM head
    assert active == pytest.approx(3.3e9, rel=0.03)


def test_flops_formula_is_the_documented_one() -> None:
    m = ModelShape("tiny", layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4,
                   vocab=10)  # fmt: skip
    attn = 8 * 8 + 2 * 8 * 4 + 8 * 8  # q, k+v, o
    mlp = 3 * 8 * 16
    assert m.params_nonembedding_active == 2 * (attn + mlp)
    assert m.flops_per_token == 6 * 2 * (attn + mlp) + 6 * 8 * 10
    assert m.flops_per_pair == 12 * 2 * 2 * 4
    assert m.flops(5, 15) == 5 * m.flops_per_token + 15 * m.flops_per_pair
    assert sum(m.breakdown(5, 15).values()) == m.flops(5, 15)


def test_config_json_and_presets_load(tmp_path: Path) -> None:
    cfg = {
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(tmp_path))
    p = PRESETS["qwen3-30b-a3b"]
    assert (m.params_total, m.flops_per_token, m.flops_per_pair) == (
        p.params_total,
        p.flops_per_token,
        p.flops_per_pair,
    )
    assert load_model("Qwen/Qwen3-8B") is PRESETS["qwen3-8b"]
    llama = from_config({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                         "num_attention_heads": 4, "vocab_size": 100})  # fmt: skip
    assert (llama.kv_heads, llama.head_dim) == (4, 16)


def test_bad_model_specs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TreeprepError, match="unknown model 'gpt-9'"):
        load_model("gpt-9")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(TreeprepError, match="not a readable JSON"):
        load_model(str(bad))
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(TreeprepError, match=r"config.json: model config has none of"):
        load_model(str(bad))


def test_family_presets_window_linear_attention_and_moe() -> None:
    oss = PRESETS["gpt-oss-120b"]
    assert 110e9 < oss.params_total < 125e9 and oss.params_nonembedding_active < 6e9
    q35 = PRESETS["qwen3.5-35b-a3b"]
    assert 33e9 < q35.params_total < 36e9 and q35.params_nonembedding_active < 3e9
    tokens, pairs = 10_000, 40_000_000  # long paths: most pairs lie beyond a 128-token window
    # windowed layers read at most `window` keys per query; exact window pairs override the bound
    assert oss.attention_flops(tokens, pairs) < 0.6 * oss.attention_flops(tokens, pairs, pairs)
    assert oss.attention_flops(tokens, pairs, 1_000) < oss.attention_flops(tokens, pairs)
    # a hybrid pays attention pairs on a quarter of its layers and a per-token state cost instead
    hyb = PRESETS["qwen3.5-hybrid-9b"]
    assert hyb.full_layers == 8 and hyb.linear_state_flops_per_token > 0
    assert hyb.flops(tokens, pairs) - tokens * hyb.flops_per_token == pairs * hyb.flops_per_pair


def test_from_config_reads_layer_types() -> None:
    cfg = {
        "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    }  # fmt: skip
    m = from_config(cfg)
    assert (m.linear_layers, m.full_layers, m.window_layers) == (3, 1, 0)
    oss = dict(cfg, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8)
    m = from_config(oss)
    assert (m.linear_layers, m.window_layers, m.window) == (0, 2, 8)
