"""treeprep.trainer: exact tree training of Hugging Face causal LMs (torch, pyarrow; never polars).

A tree must train exactly like its linearized sequences. The public API, small on purpose::

    from treeprep.trainer import TreeBatch, load_model, tree_loss

    model = load_model("tiny-qwen3", dtype=torch.float32, device="cpu", attn="auto")
    batch = TreeBatch.from_trees(rows, norm="sequence-mean", layout="tree")   # shard rows
    out = tree_loss(model, batch, loss="sft")          # or "ppo", "grpo", "gspo"
    out.loss.backward()

* :class:`TreeBatch` (``batch.py``): packed tokens in DFS order, depth positions, node pre-order
  and subtree ends, predecessors of the trained targets, restored loss weights (``sum``,
  ``sequence-mean``, ``token-mean``), RL coefficients and old log-probs. ``layout="linear"`` is the
  baseline (every sequence on its own) through the same code.
* :func:`load_model` (``models/``): a local Hugging Face folder (Llama, Qwen2, Qwen3, Qwen3-MoE)
  or a preset from :data:`PRESETS` (``tiny-qwen3``, ``tiny-llama``, ``tiny-qwen2``,
  ``tiny-qwen3-moe``, ``small-qwen3``, ``qwen3-0.6b``, ``qwen3-1.7b``, ...), running tree attention
  through transformers' attention interface. Never downloads.
* attention backends (``attention.py``): ``dense`` (exact reference, CPU), ``nodes`` (node by node,
  memory-safe on CPU), ``flex`` (FlexAttention block mask, GPU), ``flash`` (flash-attn varlen,
  optional); ``auto`` chooses by device and size.
* :func:`tree_loss`, :func:`token_logprobs`, :func:`sequence_logprobs` (``loss.py``).
* :func:`verify_gradients` (``verify.py``): tree versus linear gradients per parameter group.
"""

from treeprep.trainer.attention import TreeMask, choose_backend, tree_attention
from treeprep.trainer.batch import TreeBatch
from treeprep.trainer.models import PRESETS, Preset, decoder_hidden, load_model, tree_logits
from treeprep.trainer.objective.loss import LossOutput, sequence_logprobs, token_logprobs, tree_loss
from treeprep.trainer.verify import VerifyReport, verify_gradients

__all__ = [
    "PRESETS",
    "LossOutput",
    "Preset",
    "TreeBatch",
    "TreeMask",
    "VerifyReport",
    "choose_backend",
    "decoder_hidden",
    "load_model",
    "sequence_logprobs",
    "token_logprobs",
    "tree_attention",
    "tree_logits",
    "tree_loss",
    "verify_gradients",
]
