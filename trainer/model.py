"""Hugging Face causal LMs on trees: load a local folder or a preset, run it with tree attention.

No model code is copied. treeprep registers one attention function (:func:`hf_tree_attention`)
with transformers' ``AttentionInterface`` under the name ``"treeprep"`` and sets the model's
``attn_implementation`` to it. The decoder is then called with ``position_ids`` = depths and the
batch's :class:`~treeprep.trainer.attention.TreeMask` as an extra keyword, which transformers
passes down to every attention call. Because ``"treeprep"`` has no entry in transformers' mask
interface, transformers builds no causal mask of its own (and does not try to detect packed
sequences from the position ids).

Only the decoder runs over all T packed tokens; the LM head runs on the K predecessors of trained
targets (see :mod:`treeprep.trainer.loss`), which is where a tree saves the vocabulary-sized work.

Presets are random-weight models of a known shape (seeded): tiny ones for tests (2 layers, hidden
64) and full-size shapes for benchmarks. A folder is loaded with ``local_files_only=True``:
nothing is ever downloaded. Supported families: Llama, Qwen2, Qwen3, Qwen3-MoE (any decoder-only
model whose attention goes through ``ALL_ATTENTION_FUNCTIONS`` works the same way).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from treeprep.errors import TreeprepError
from treeprep.trainer.attention import ATTN_NAME, TreeMask, register_attention

Family = Literal["qwen3", "llama", "qwen2", "qwen3_moe"]


@dataclass(frozen=True)
class Preset:
    """The shape of a random-weight model. Fields map to the Hugging Face config of ``family``."""

    #: model family: selects the transformers config class
    family: Family
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
    #: MoE experts (qwen3_moe only)
    num_experts: int = 0
    #: experts per token (qwen3_moe only)
    num_experts_per_tok: int = 0

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.family == "qwen3_moe" and not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ValueError("qwen3_moe presets need 0 < num_experts_per_tok <= num_experts")

    def hf_config(self, vocab_size: int | None = None) -> Any:
        import transformers as tf

        kw = {
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
        }
        if self.family == "qwen3":
            return tf.Qwen3Config(**kw)
        if self.family == "qwen2":
            kw.pop("head_dim")
            if self.hidden_size // self.num_attention_heads != self.head_dim:
                raise ValueError("qwen2 derives head_dim = hidden_size / num_attention_heads")
            return tf.Qwen2Config(**kw)
        if self.family == "llama":
            return tf.LlamaConfig(**kw)
        return tf.Qwen3MoeConfig(
            **kw,
            num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            moe_intermediate_size=self.intermediate_size,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )


_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
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
    "tiny-qwen3-moe": Preset(
        "qwen3_moe", 64, 32, 2, 4, 2, 16, num_experts=4, num_experts_per_tok=2
    ),
    # about 50M parameters without the embeddings: the CPU benchmark model
    "small-qwen3": Preset("qwen3", 512, 1536, 8, 8, 4, 64),
    "qwen3-0.6b": Preset("qwen3", 1024, 3072, 28, 16, 8, 128, tie_word_embeddings=True),
    "qwen3-1.7b": Preset("qwen3", 2048, 6144, 28, 16, 8, 128, tie_word_embeddings=True),
    "qwen3-4b": Preset("qwen3", 2560, 9728, 36, 32, 8, 128, tie_word_embeddings=True),
    "qwen3-8b": Preset("qwen3", 4096, 12288, 36, 32, 8, 128),
}


def load_model(
    spec: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn: str = "auto",
    seed: int = 0,
    vocab_size: int | None = None,
) -> torch.nn.Module:
    """A causal LM running tree attention: a preset name (random weights) or a local HF folder.

    ``attn`` is the default backend for this model (``auto``, ``dense``, ``nodes``, ``flex``,
    ``flash``), stored as ``model.treeprep_attn`` and overridable per call. ``vocab_size``
    overrides a preset's vocabulary (ignored for folders).
    """
    import transformers as tf

    register_attention()
    if spec in PRESETS:
        cfg = PRESETS[spec].hf_config(vocab_size)
        cfg._attn_implementation = ATTN_NAME
        gen = torch.random.fork_rng(devices=[])
        with gen:
            torch.manual_seed(seed)
            model = tf.AutoModelForCausalLM.from_config(
                cfg, attn_implementation=ATTN_NAME, dtype=dtype
            )
    elif os.path.isdir(spec):
        if not os.path.exists(os.path.join(spec, "config.json")):
            raise TreeprepError(f"{spec}: not a model folder (no config.json)")
        try:
            model = tf.AutoModelForCausalLM.from_pretrained(
                spec, dtype=dtype, attn_implementation=ATTN_NAME, local_files_only=True
            )
        except (OSError, ValueError, KeyError) as e:
            raise TreeprepError(f"{spec}: cannot load the model: {e}") from e
    else:
        raise TreeprepError(
            f"unknown model {spec!r}: expected a model folder or one of {', '.join(PRESETS)}"
        )
    model.to(device)
    model.treeprep_attn = attn
    model.treeprep_spec = spec if spec in PRESETS else os.path.abspath(spec)
    return model


def preset_dict(name: str) -> dict:
    """A preset's fields (for logs and manifests)."""
    return asdict(PRESETS[name])


def run_decoder(
    model: torch.nn.Module,
    input_ids_T: torch.Tensor,
    position_ids_T: torch.Tensor,
    tree_mask: TreeMask,
) -> torch.Tensor:
    """The decoder over packed tokens under ``tree_mask``; final (normed) hidden states h_TE."""
    if model.config._attn_implementation != ATTN_NAME:
        register_attention()
        model.set_attn_implementation(ATTN_NAME)
    out = model.get_decoder()(
        input_ids=input_ids_T[None],
        position_ids=position_ids_T[None],
        use_cache=False,
        tree_mask=tree_mask,
    )
    return out.last_hidden_state[0]


def decoder_hidden(model: torch.nn.Module, batch: Any, attn: str | None = None) -> torch.Tensor:
    """Run the decoder over the packed trees; returns the final hidden states h_TE (normed)."""
    tm = TreeMask.from_batch(batch, attn or getattr(model, "treeprep_attn", "auto"))
    return run_decoder(model, batch.input_ids, batch.position_ids, tm)


def tree_logits(
    model: torch.nn.Module,
    batch: Any,
    positions: torch.Tensor | None = None,
    attn: str | None = None,
) -> torch.Tensor:
    """Logits at ``positions`` of the packed batch (all tokens when None), float32, [P, V]."""
    h = decoder_hidden(model, batch, attn)
    if positions is not None:
        h = h.index_select(0, positions)
    return model.get_output_embeddings()(h).float()
