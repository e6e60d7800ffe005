"""Random-weight model presets: tiny ones for tests, full-size shapes for benchmarks.

A :class:`Preset` holds the generic shape of a decoder (width, layers, heads, experts) plus the
family's own config keys in ``extra`` (sliding windows, layer types, linear-attention widths, MLA
ranks). :data:`.families.FAMILIES` maps it onto the family's transformers config class, so a preset
never imports a model class and a family is data, not code.

The tiny presets (``tiny-<family>``: 2-4 layers, hidden 64) exist so that every supported family
runs end to end in seconds on a CPU; their sliding windows (4 tokens) are shorter than the test
trees, so that windows matter. The full-size presets (``qwen3-0.6b`` ... ``qwen3-8b``) take their
shapes from the one table of published shapes, :data:`treeprep.flops.PRESETS`, which the
pipeline's cost model reads too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from treeprep.flops import PRESETS as SHAPES
from treeprep.trainer.models.families import FAMILIES, build_config


@dataclass(frozen=True)
class Preset:
    """The shape of a random-weight model. Fields map to the Hugging Face config of ``family``."""

    #: model family: a key of :data:`FAMILIES`
    family: str
    #: residual width
    hidden_size: int
    #: MLP width (per expert for MoE)
    intermediate_size: int
    #: decoder layers
    num_hidden_layers: int
    #: query heads
    num_attention_heads: int
    #: key/value heads (GQA when fewer than query heads)
    num_key_value_heads: int
    #: per-head width
    head_dim: int
    #: vocabulary (151936 covers the Qwen tokenizers)
    vocab_size: int = 151936
    #: share input embedding and LM head
    tie_word_embeddings: bool = False
    #: rotary base
    rope_theta: float = 1_000_000.0
    #: MoE experts (MoE families only)
    num_experts: int = 0
    #: experts per token (MoE families only)
    num_experts_per_tok: int = 0
    #: family-specific config keys, passed to the config class as they are
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; expected one of {list(FAMILIES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if "moe" in FAMILIES[self.family] and not (
            0 < self.num_experts_per_tok <= self.num_experts
        ):
            raise ValueError(f"{self.family} presets need 0 < num_experts_per_tok <= num_experts")

    def hf_config(self, vocab_size: int | None = None) -> Any:
        if self.family == "qwen2" and self.hidden_size // self.num_attention_heads != self.head_dim:
            raise ValueError("qwen2 derives head_dim = hidden_size / num_attention_heads")
        base = {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": vocab_size or self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": 131072,
            "rope_theta": self.rope_theta,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
        }
        return build_config(self.family, base, dict(self.extra))


class _Shape(TypedDict):
    """The shape keywords shared by the tiny presets (spread into :class:`Preset`)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int


class _MoeShape(_Shape):
    """The shape keywords of the tiny MoE presets (spread into :class:`Preset`)."""

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int


_TINY: _Shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
#: the tiny MoE presets: 4 experts of width 32, 2 per token
_TINY_MOE: _MoeShape = {
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
}
#: the linear-attention (Gated DeltaNet) layers of the tiny hybrid presets
_TINY_LINEAR = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}
#: the window of the tiny presets' sliding layers: shorter than the test trees
TINY_WINDOW = 4
PRESETS: dict[str, Preset] = {
    "tiny-qwen3": Preset(
        "qwen3", **_TINY, num_attention_heads=4, num_key_value_heads=2, head_dim=16
    ),
    "tiny-llama": Preset(
        "llama",
        **_TINY,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=500_000.0,
    ),
    "tiny-qwen2": Preset(
        "qwen2", **_TINY, num_attention_heads=4, num_key_value_heads=2, head_dim=16
    ),
    "tiny-qwen3-moe": Preset("qwen3_moe", **_TINY_MOE),
    # one tiny model per family (windows of TINY_WINDOW depths, shorter than the test trees)
    "tiny-mistral": Preset(
        "mistral",
        **_TINY,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        extra={"sliding_window": TINY_WINDOW},
    ),
    "tiny-gemma3": Preset(
        "gemma3_text",
        **_TINY,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        extra={
            "sliding_window": TINY_WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 16,
        },
    ),
    "tiny-gpt-oss": Preset(
        "gpt_oss",
        **_TINY_MOE,
        extra={
            "sliding_window": TINY_WINDOW,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "tiny-deepseek-v3": Preset(
        "deepseek_v3",
        64,
        64,
        2,
        4,
        4,
        8,
        num_experts=4,
        num_experts_per_tok=2,
        extra={
            "kv_lora_rank": 16,
            "q_lora_rank": 24,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 12,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "n_shared_experts": 1,
        },
    ),
    "tiny-glm4-moe": Preset(
        "glm4_moe",
        **_TINY_MOE,
        extra={"first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "n_shared_experts": 1},
    ),
    "tiny-qwen3-5": Preset(
        "qwen3_5_text",
        64,
        128,
        4,
        4,
        2,
        16,
        extra={
            "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            **_TINY_LINEAR,
        },
    ),
    "tiny-qwen3-5-moe": Preset(
        "qwen3_5_moe_text",
        **_TINY_MOE,
        extra={
            "layer_types": ["linear_attention", "full_attention"],
            **_TINY_LINEAR,
            "shared_expert_intermediate_size": 32,
        },
    ),
    # about 50M parameters without the embeddings: the CPU benchmark model
    "small-qwen3": Preset("qwen3", 512, 1536, 8, 8, 4, 64),
}


def real_preset(name: str, family: str) -> Preset:
    """The random-weight preset of a real model, from its published shape in the one table of
    them, :data:`treeprep.flops.PRESETS` (dense models; the family names its config class)."""
    m = SHAPES[name]
    if m.experts or m.linear_layers or m.window_layers:
        raise ValueError(f"{name}: only dense full-attention shapes map onto a preset")
    return Preset(
        family, m.hidden, m.intermediate, m.layers, m.heads, m.kv_heads, m.head_dim,
        vocab_size=m.vocab, tie_word_embeddings=m.tie_embeddings,
    )  # fmt: skip


#: the real models a random-weight preset exists for (their shapes: :data:`treeprep.flops.PRESETS`)
REAL_PRESETS = {
    "qwen3-0.6b": "qwen3",
    "qwen3-1.7b": "qwen3",
    "qwen3-4b": "qwen3",
    "qwen3-8b": "qwen3",
}
PRESETS.update({name: real_preset(name, family) for name, family in REAL_PRESETS.items()})


def preset_dict(name: str) -> dict:
    """A preset's fields (for logs and manifests)."""
    return asdict(PRESETS[name])
