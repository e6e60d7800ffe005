"""Model shapes and the FLOP model behind ``treeprep stats --model`` and the packer's cost model.

The model (forward + backward, per training step; norms, rotary, softmax and the optimizer are
ignored: they are a few percent of the total and scale like the linear term):

* **Linear layers** (attention projections and MLP/experts): ``6 * P`` FLOPs per token fed, where
  ``P`` are the non-embedding parameters a token actually multiplies (for a mixture of experts,
  the *active* ones: ``experts_per_token`` experts plus the router). 2 FLOPs per multiply-add
  forward, twice that backward (input and weight gradients).
* **Attention scores and values**: a query at depth ``d`` (0-based) reads ``d + 1`` keys. Per
  layer, ``Q K^T`` and ``A V`` cost ``2 * heads * head_dim`` FLOPs each per (query, key) pair, so
  ``4 * layers * heads * head_dim`` per pair forward and three times that forward + backward:
  ``12 * layers * heads * head_dim`` per pair. (NOTES.md writes ``hidden`` for ``heads * head_dim``;
  the two differ for Qwen3-0.6B/1.7B/30B-A3B, and we use the exact product.)
* **LM head**: ``6 * hidden * vocab`` FLOPs per token it runs on (tied embeddings do not change
  the compute). treeprep's trainer runs it on the predecessors of the trained targets only, ``K``
  of them (the unique trained tokens in a tree; every copy, duplicates counted, in the linear
  layout); a trainer that computes full logits runs it on every fed token (``K = T``).

A layout that feeds ``T`` tokens with ``A`` attention pairs and ``K`` head tokens costs
``T * 6 P + K * 6 hidden vocab + A * 12 layers heads head_dim``. The estimated speedup of tree
training over linear training is the ratio of the two costs, with ``T = tokens_linear`` and
``A = sum_s L_s (L_s + 1) / 2`` for the linear trainer and ``T = tokens_tree`` (or the packed
token count) and ``A = sum over fed tokens of (depth + 1)`` for the tree.

Shapes are the published Hugging Face ``config.json`` values; :func:`load_model` also reads any
``config.json`` (dense or MoE, Qwen/Llama/Mistral/Mixtral key names).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from treeprep.errors import TreeprepError


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only transformer, enough to count its training FLOPs."""

    name: str
    layers: int
    hidden: int
    #: dense MLP width (SwiGLU: gate, up and down projections)
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    #: routed experts (0 for a dense model) and experts each token uses
    experts: int = 0
    experts_per_token: int = 0
    #: width of one expert's MLP
    moe_intermediate: int = 0
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, k) <= 0:
                raise TreeprepError(f"model {self.name!r}: {k} must be > 0, got {getattr(self, k)}")
        if self.experts and not (0 < self.experts_per_token <= self.experts):
            raise TreeprepError(
                f"model {self.name!r}: experts_per_token must be in 1..{self.experts}"
            )

    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o

    @property
    def mlp_params_per_layer_active(self) -> int:
        if self.experts:
            router = self.hidden * self.experts
            return self.experts_per_token * 3 * self.hidden * self.moe_intermediate + router
        return 3 * self.hidden * self.intermediate

    @property
    def mlp_params_per_layer_total(self) -> int:
        if self.experts:
            return (
                self.experts * 3 * self.hidden * self.moe_intermediate + self.hidden * self.experts
            )
        return 3 * self.hidden * self.intermediate

    @property
    def params_nonembedding_active(self) -> int:
        """Non-embedding parameters one token multiplies (active ones for a MoE)."""
        return self.layers * (self.attn_params_per_layer + self.mlp_params_per_layer_active)

    @property
    def params_total(self) -> int:
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * (self.attn_params_per_layer + self.mlp_params_per_layer_total) + emb

    @property
    def flops_per_token(self) -> int:
        """Forward + backward FLOPs per token fed: linear layers and LM head."""
        return 6 * self.params_nonembedding_active + 6 * self.hidden * self.vocab

    @property
    def flops_per_pair(self) -> int:
        """Forward + backward FLOPs per (query, key) attention pair, all layers."""
        return 12 * self.layers * self.heads * self.head_dim

    @property
    def flops_per_body_token(self) -> int:
        """Forward + backward FLOPs per token fed through the layers (projections, MLP)."""
        return 6 * self.params_nonembedding_active

    @property
    def flops_per_head_token(self) -> int:
        """Forward + backward FLOPs per token the LM head runs on."""
        return 6 * self.hidden * self.vocab

    def flops(self, tokens: int, pairs: int, head_tokens: int | None = None) -> int:
        """Training FLOPs of a layout feeding ``tokens`` tokens with ``pairs`` attention pairs
        and running the LM head on ``head_tokens`` of them (default: all ``tokens``)."""
        return sum(self.breakdown(tokens, pairs, head_tokens).values())

    def breakdown(self, tokens: int, pairs: int, head_tokens: int | None = None) -> dict[str, int]:
        head = tokens if head_tokens is None else head_tokens
        return {
            "linear": tokens * self.flops_per_body_token,
            "lm_head": head * self.flops_per_head_token,
            "attention": pairs * self.flops_per_pair,
        }

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params_total"] = self.params_total
        d["params_nonembedding_active"] = self.params_nonembedding_active
        return d


_Q3_VOCAB = 151936

#: Published shapes (Hugging Face config.json of each model).
PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("qwen3-0.6b", 28, 1024, 3072, 16, 8, 128, _Q3_VOCAB, tie_embeddings=True),
        ModelShape("qwen3-1.7b", 28, 2048, 6144, 16, 8, 128, _Q3_VOCAB, tie_embeddings=True),
        ModelShape("qwen3-4b", 36, 2560, 9728, 32, 8, 128, _Q3_VOCAB, tie_embeddings=True),
        ModelShape("qwen3-8b", 36, 4096, 12288, 32, 8, 128, _Q3_VOCAB),
        ModelShape("qwen3-32b", 64, 5120, 25600, 64, 8, 128, _Q3_VOCAB),
        ModelShape(
            "qwen3-30b-a3b",
            48,
            2048,
            6144,
            32,
            4,
            128,
            _Q3_VOCAB,
            experts=128,
            experts_per_token=8,
            moe_intermediate=768,
        ),
        ModelShape("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256),
    )
}

#: the packer's default cost model
DEFAULT_MODEL = "qwen3-8b"


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").removeprefix("qwen/").removeprefix("meta-llama/")


def from_config(config: dict, *, name: str = "config", source: str | None = None) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` dict (dense or MoE)."""
    cfg = config.get("text_config", config) if "num_hidden_layers" not in config else config

    def need(*keys: str) -> int:
        for k in keys:
            if cfg.get(k) is not None:
                return int(cfg[k])
        raise TreeprepError(f"{source or name}: model config has none of {', '.join(keys)}")

    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    experts = int(
        cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0
    )
    per_tok = int(cfg.get("num_experts_per_tok") or 0) if experts else 0
    moe_inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    return ModelShape(
        name=name,
        layers=need("num_hidden_layers", "n_layer"),
        hidden=hidden,
        intermediate=need("intermediate_size", "n_inner") if not experts else moe_inter,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        vocab=need("vocab_size"),
        experts=experts,
        experts_per_token=per_tok,
        moe_intermediate=moe_inter if experts else 0,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )


def load_model(spec: str) -> ModelShape:
    """A preset name (``qwen3-8b``, ``Qwen/Qwen3-30B-A3B``, ...), a ``config.json`` path, or a
    folder holding one."""
    key = _norm(spec)
    if key in PRESETS:
        return PRESETS[key]
    p = Path(spec)
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        try:
            cfg = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise TreeprepError(f"{p}: not a readable JSON model config ({e})") from e
        if not isinstance(cfg, dict):
            raise TreeprepError(f"{p}: expected a JSON object (a Hugging Face config.json)")
        return from_config(cfg, name=p.parent.name or p.stem, source=str(p))
    raise TreeprepError(
        f"unknown model {spec!r}: give a config.json path or one of {', '.join(PRESETS)}"
    )
