"""The model families treeprep trains exactly: one plain dict per family, no class hierarchy.

Each entry says, as data, what the rest of the trainer needs to know about a family:

* ``config``: the transformers config class that builds a random model of the family (tests,
  presets, benchmarks);
* ``mixers``: every token-mixing module class of the family and how treeprep handles it:
  ``"attention"`` (the layer calls transformers' attention interface, which treeprep replaces with
  tree attention; sliding windows, sinks and soft-capping arrive as keywords) or ``"linear"``
  (a linear-attention layer run node by node from its parent's state, :mod:`.hybrid`). The guard
  (:mod:`.guard`) refuses a model holding any other module whose class name marks it as a token
  mixer, whatever the probe says;
* ``moe``: the config keys of the expert count, experts per token and expert width (a preset's
  ``num_experts``, ``num_experts_per_tok`` and ``intermediate_size`` map onto them);
* ``drop``: generic preset keys the config does not take; ``fixed``: config keys every preset of
  the family sets.

Adding a family is adding an entry here (and a tiny preset in :mod:`.presets` for its tests);
the probe decides whether it trains exactly.
"""

from __future__ import annotations

from typing import Any

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {
        "config": "LlamaConfig",
        "mixers": {"LlamaAttention": "attention"},
    },
    "qwen2": {
        "config": "Qwen2Config",
        "mixers": {"Qwen2Attention": "attention"},
        "drop": ("head_dim",),
    },
    "qwen3": {
        "config": "Qwen3Config",
        "mixers": {"Qwen3Attention": "attention"},
    },
    "qwen3_moe": {
        "config": "Qwen3MoeConfig",
        "mixers": {"Qwen3MoeAttention": "attention"},
        "moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
        "fixed": {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True},
    },
    "mistral": {
        "config": "MistralConfig",
        "mixers": {"MistralAttention": "attention"},
    },
    "gemma3_text": {
        "config": "Gemma3TextConfig",
        "mixers": {"Gemma3Attention": "attention"},
        "drop": ("rope_theta",),
    },
    "gpt_oss": {
        "config": "GptOssConfig",
        "mixers": {"GptOssAttention": "attention"},
        "moe": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
        "drop": ("rope_theta",),
        "fixed": {"rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}},
    },
    "deepseek_v3": {
        "config": "DeepseekV3Config",
        "mixers": {"DeepseekV3Attention": "attention"},
        "moe": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"),
    },
    "glm4_moe": {
        "config": "Glm4MoeConfig",
        "mixers": {"Glm4MoeAttention": "attention"},
        "moe": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"),
    },
    "qwen3_5_text": {
        "config": "Qwen3_5TextConfig",
        "mixers": {"Qwen3_5Attention": "attention", "Qwen3_5GatedDeltaNet": "linear"},
        "drop": ("rope_theta",),
    },
    "qwen3_5_moe_text": {
        "config": "Qwen3_5MoeTextConfig",
        "mixers": {"Qwen3_5MoeAttention": "attention", "Qwen3_5MoeGatedDeltaNet": "linear"},
        "moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
        "drop": ("rope_theta",),
    },
}

#: every token-mixing module class treeprep handles, over all families, and how
HANDLED_MIXERS: dict[str, str] = {
    name: how for fam in FAMILIES.values() for name, how in fam["mixers"].items()
}


def family_of(config: Any) -> str | None:
    """The family of a transformers config (its ``model_type``), or None when not listed."""
    mt = getattr(config, "model_type", None)
    return mt if mt in FAMILIES else None


def build_config(family: str, base: dict[str, Any], extra: dict[str, Any]) -> Any:
    """A transformers config of ``family`` from generic preset keys and family ``extra`` keys."""
    import transformers as tf

    fam = FAMILIES[family]
    kw = {k: v for k, v in base.items() if k not in fam.get("drop", ())}
    experts, per_tok = kw.pop("num_experts", 0), kw.pop("num_experts_per_tok", 0)
    if "moe" in fam:
        k_exp, k_tok, k_width = fam["moe"]
        kw[k_exp], kw[k_tok] = experts, per_tok
        kw[k_width] = kw["intermediate_size"]
    kw.update(fam.get("fixed", {}))
    kw.update(extra)
    return getattr(tf, fam["config"])(**kw)
