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

* **Family extras** (gpt-oss, Gemma 3, Qwen3.5): a *sliding-window* layer reads at most ``window``
  keys per query, so its pairs are ``min(A, T * window)`` (an upper bound that is tight once
  paths are much longer than the window; pass the exact count as ``window_pairs`` when known);
  a *linear-attention* layer (Gated DeltaNet) has no pairs: per token and value head it decays,
  reads, updates and reads its ``dk x dv`` state, about ``8 dk dv`` FLOPs forward, ``24 dk dv``
  forward + backward, plus its projections (counted in ``P``); *shared experts* add to the active
  MLP parameters.

A layout that feeds ``T`` tokens with ``A`` attention pairs and ``K`` head tokens costs
``T * 6 P + K * 6 hidden vocab + A * 12 layers heads head_dim``; with activation checkpointing
the layers' forward runs twice, adding a third of the first and last terms. The estimated speedup
of tree training over linear training is the ratio of the two costs, with ``T = tokens_linear`` and
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
    #: width of the always-active shared expert(s), summed (0: none)
    shared_intermediate: int = 0
    #: sliding-window attention: the window (keys per query) and how many layers use it
    window: int = 0
    window_layers: int = 0
    #: linear-attention (Gated DeltaNet) layers and their head shapes
    linear_layers: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    #: the linear-attention layers' causal convolution width (their conv state keeps kernel - 1)
    linear_conv_kernel: int = 4
    #: per-head RMSNorm on queries and keys (Qwen3, Qwen3.5, Gemma 3): activation memory only
    qk_norm: bool = False

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
    def linear_attn_params_per_layer(self) -> int:
        """A Gated DeltaNet layer's projections: q, k, v, gate z, beta and decay inputs, output."""
        kd = self.linear_key_heads * self.linear_key_dim
        vd = self.linear_value_heads * self.linear_value_dim
        return self.hidden * (2 * kd + 2 * vd + 2 * self.linear_value_heads) + vd * self.hidden

    @property
    def mlp_params_per_layer_active(self) -> int:
        shared = 3 * self.hidden * self.shared_intermediate
        if self.experts:
            router = self.hidden * self.experts
            return (
                self.experts_per_token * 3 * self.hidden * self.moe_intermediate + router + shared
            )
        return 3 * self.hidden * self.intermediate

    @property
    def mlp_params_per_layer_total(self) -> int:
        shared = 3 * self.hidden * self.shared_intermediate
        if self.experts:
            return (
                self.experts * 3 * self.hidden * self.moe_intermediate
                + self.hidden * self.experts
                + shared
            )
        return 3 * self.hidden * self.intermediate

    @property
    def mixer_params(self) -> int:
        """Token-mixer parameters over all layers (softmax attention and linear attention)."""
        soft = (self.layers - self.linear_layers) * self.attn_params_per_layer
        return soft + self.linear_layers * self.linear_attn_params_per_layer

    @property
    def params_nonembedding_active(self) -> int:
        """Non-embedding parameters one token multiplies (active ones for a MoE)."""
        return self.mixer_params + self.layers * self.mlp_params_per_layer_active

    @property
    def params_total(self) -> int:
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.mixer_params + self.layers * self.mlp_params_per_layer_total + emb

    @property
    def linear_state_flops_per_token(self) -> int:
        """Forward + backward FLOPs per token of the linear-attention states, all such layers."""
        per = self.linear_value_heads * self.linear_key_dim * self.linear_value_dim
        return 24 * self.linear_layers * per

    @property
    def flops_per_token(self) -> int:
        """Forward + backward FLOPs per token fed, the LM head on every token (the plan's cost
        model): linear layers, linear-attention states, head."""
        return self.flops_per_body_token + self.flops_per_head_token

    @property
    def full_layers(self) -> int:
        """Softmax-attention layers without a window."""
        return self.layers - self.linear_layers - self.window_layers

    @property
    def flops_per_pair(self) -> int:
        """Forward + backward FLOPs per (query, key) pair of one softmax-attention layer, times
        the full-attention layers (windowed layers are counted by :meth:`attention_flops`)."""
        return 12 * self.full_layers * self.heads * self.head_dim

    @property
    def flops_per_body_token(self) -> int:
        """Forward + backward FLOPs per token fed through the layers (projections, MLP and the
        linear-attention states)."""
        return 6 * self.params_nonembedding_active + self.linear_state_flops_per_token

    @property
    def flops_per_head_token(self) -> int:
        """Forward + backward FLOPs per token the LM head runs on."""
        return 6 * self.hidden * self.vocab

    def attention_flops(self, tokens: int, pairs: int, window_pairs: int | None = None) -> int:
        """Score and value FLOPs of all softmax-attention layers (see the module docstring)."""
        per_layer_pair = 12 * self.heads * self.head_dim
        total = pairs * self.full_layers * per_layer_pair
        if self.window_layers:
            wp = window_pairs if window_pairs is not None else min(pairs, tokens * self.window)
            total += wp * self.window_layers * per_layer_pair
        return total

    def flops(
        self,
        tokens: int,
        pairs: int,
        head_tokens: int | None = None,
        window_pairs: int | None = None,
        *,
        checkpointing: bool = False,
    ) -> int:
        """Training FLOPs of a layout feeding ``tokens`` tokens with ``pairs`` attention pairs
        and running the LM head on ``head_tokens`` of them (default: all ``tokens``); with
        ``checkpointing``, the decoder layers' forward once more (:meth:`breakdown`)."""
        return sum(self.breakdown(tokens, pairs, head_tokens, window_pairs, checkpointing).values())

    def breakdown(
        self,
        tokens: int,
        pairs: int,
        head_tokens: int | None = None,
        window_pairs: int | None = None,
        checkpointing: bool = False,
    ) -> dict[str, int]:
        """The FLOPs by term. ``checkpointing`` (activation checkpointing of every decoder layer)
        adds ``recompute``: the layers' forward run again in the backward, a third of their
        forward + backward (the linear layers' ``2 P`` per token, the attention's forward, the
        linear-attention states' forward); the LM head is outside the layers and runs once.

        >>> m = PRESETS["qwen3-0.6b"]
        >>> b = m.breakdown(1000, 500_500, checkpointing=True)
        >>> b["recompute"] * 3 == b["linear"] + b["attention"]
        True
        """
        head = tokens if head_tokens is None else head_tokens
        out = {
            "linear": tokens * 6 * self.params_nonembedding_active,
            "lm_head": head * self.flops_per_head_token,
            "attention": self.attention_flops(tokens, pairs, window_pairs),
        }
        if self.linear_layers:
            out["linear_attention_state"] = tokens * self.linear_state_flops_per_token
        if checkpointing:
            layers = out["linear"] + out["attention"] + out.get("linear_attention_state", 0)
            out["recompute"] = layers // 3
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params_total"] = self.params_total
        d["params_nonembedding_active"] = self.params_nonembedding_active
        return d


_Q3_VOCAB = 151936
#: ``model_type`` prefixes of the families with a per-head query/key RMSNorm
QK_NORM_TYPES = ("qwen3", "gemma3", "olmo2", "olmo3")

#: Published shapes (Hugging Face config.json of each model).
PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            "qwen3-0.6b", 28, 1024, 3072, 16, 8, 128, _Q3_VOCAB, tie_embeddings=True, qk_norm=True
        ),
        ModelShape(
            "qwen3-1.7b", 28, 2048, 6144, 16, 8, 128, _Q3_VOCAB, tie_embeddings=True, qk_norm=True
        ),
        ModelShape(
            "qwen3-4b", 36, 2560, 9728, 32, 8, 128, _Q3_VOCAB, tie_embeddings=True, qk_norm=True
        ),
        ModelShape("qwen3-8b", 36, 4096, 12288, 32, 8, 128, _Q3_VOCAB, qk_norm=True),
        ModelShape("qwen3-32b", 64, 5120, 25600, 64, 8, 128, _Q3_VOCAB, qk_norm=True),
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
            qk_norm=True,
        ),
        ModelShape("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256),
        # gpt-oss: every other layer a 128-token sliding window, attention sinks, MoE
        ModelShape(
            "gpt-oss-20b", 24, 2880, 2880, 64, 8, 64, 201088,
            experts=32, experts_per_token=4, moe_intermediate=2880,
            window=128, window_layers=12,
        ),
        ModelShape(
            "gpt-oss-120b", 36, 2880, 2880, 64, 8, 64, 201088,
            experts=128, experts_per_token=4, moe_intermediate=2880,
            window=128, window_layers=18,
        ),
        # Qwen3.5: three Gated DeltaNet layers to one full-attention layer. The MoE shape is
        # Qwen3.5-35B-A3B's (transformers' Qwen3_5MoeTextConfig defaults: 34.6B parameters);
        # the dense one is transformers' Qwen3_5TextConfig default shape (8.8B parameters)
        ModelShape(
            "qwen3.5-hybrid-9b", 32, 4096, 12288, 16, 4, 256, 248320,
            linear_layers=24, linear_key_heads=16, linear_value_heads=32,
            linear_key_dim=128, linear_value_dim=128, qk_norm=True,
        ),
        ModelShape(
            "qwen3.5-35b-a3b", 40, 2048, 512, 16, 2, 256, 248320,
            experts=256, experts_per_token=8, moe_intermediate=512, shared_intermediate=512,
            linear_layers=30, linear_key_heads=16, linear_value_heads=32,
            linear_key_dim=128, linear_value_dim=128, qk_norm=True,
        ),
    )
}  # fmt: skip

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
    types = list(cfg.get("layer_types") or [])
    n_layers = need("num_hidden_layers", "n_layer")
    window = int(cfg.get("sliding_window") or 0)
    if types:
        window_layers = sum(t == "sliding_attention" for t in types) if window else 0
    else:  # Mistral style: one window for every layer
        window_layers = n_layers if window and cfg.get("use_sliding_window", True) else 0
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    if not shared and cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * moe_inter
    return ModelShape(
        name=name,
        layers=n_layers,
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
        shared_intermediate=shared if experts else 0,
        window=window if window_layers else 0,
        window_layers=window_layers,
        linear_layers=sum(t == "linear_attention" for t in types),
        linear_key_heads=int(cfg.get("linear_num_key_heads") or 0),
        linear_value_heads=int(cfg.get("linear_num_value_heads") or 0),
        linear_key_dim=int(cfg.get("linear_key_head_dim") or 0),
        linear_value_dim=int(cfg.get("linear_value_head_dim") or 0),
        linear_conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4),
        qk_norm=str(cfg.get("model_type", "")).startswith(QK_NORM_TYPES),
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
