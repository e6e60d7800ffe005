"""treeprep.trainer: exact tree training of Hugging Face causal LMs (torch, pyarrow; never polars).

A tree must train exactly like its linearized sequences. The public API, small on purpose::

    from treeprep.trainer import TreeBatch, load_model, tree_loss

    model = load_model("tiny-qwen3", dtype=torch.float32, device="cpu", attn="auto")
    batch = TreeBatch.from_trees(rows, norm="sequence-mean", layout="tree")   # shard rows
    out = tree_loss(model, batch, loss="sft")          # any of modes.Loss
    out.loss.backward()

* :class:`TreeBatch` (:mod:`.batch`): packed tokens in depth-first order, depth positions, the
  predecessors of the trained targets, restored loss weights (one per
  :class:`~treeprep.modes.Norm`), RL coefficients and old log-probs. ``layout="linear"`` is the
  baseline (every sequence on its own) through the same code.
* :func:`load_model` (:mod:`.models`): a local Hugging Face folder of a family of
  :data:`~treeprep.trainer.models.families.FAMILIES` or a preset of :data:`PRESETS`, running
  tree attention through transformers' attention interface. Never downloads.
* :func:`choose_backend`, :func:`tree_attention` (:mod:`.attention`): the backends of
  :data:`~treeprep.trainer.attention.BACKENDS` (one of :class:`~treeprep.modes.Attn`); ``auto``
  chooses by device and size.
* :func:`tree_loss`, :func:`token_logprobs`, :func:`sequence_logprobs` (:mod:`.objective`), one
  of :class:`~treeprep.modes.Loss`.
* :func:`verify_gradients` (:mod:`.verify`): tree versus linear gradients per parameter group.

The in-memory API for online RL (``docs/training.md``, ``examples/grpo_loop.py``)::

    from treeprep.trainer import LossConfig, Rollout, build_step

    step = build_step(rollouts, norm="token-mean", adv_norm="grpo", budget=8192)
    loss, metrics = step.backward(model, LossConfig("grpo", clip_eps=0.2))

* :class:`Rollout`, :func:`build_step`, :class:`OnlineStep` (:mod:`.online`): token rollouts as
  Python lists to one optimizer step's restored tree losses.
* :class:`LossConfig` (:mod:`.config`): the loss settings that :func:`tree_loss` and
  ``OnlineStep.backward`` take.

The rooms (a top-level module or folder here) form a ladder: each imports, at the top or lazily,
only the rooms below it (``test_trainer_rooms_import_only_those_below_them`` in
``tests/test_dependency_rule.py``). Bottom to top:

* ``attention/`` (the tree mask and its backends), ``distributed.py`` (ranks, DDP and FSDP2 applied
  from outside the model) and ``reference.py`` (what ``verify`` checks against, sharing no code
  with it) import no other room;
* ``batch/``: tree rows to one packed micro-batch (advantages, targets, assembly, the batch);
* ``models/``: presets, families, loading, the decoder run, the guard;
* ``config.py``: :class:`TrainConfig` and the settings it hands each component (``LossConfig``,
  ``DataConfig``), torch-free checks included (the loss's ``--cp`` fact);
* ``objective/``: the losses and the LM head; ``context.py``: ``--cp``; ``parts/``: hand-off parts;
* ``data/``: a build's plans, rows and steps, and the rewarded-only filter;
* ``run/``: the loop, its step (with the micro-batch forward, ``LossModule``), checkpoints and
  the model's export;
* ``online.py``, ``verify.py``, then ``loss.py`` (a deprecated alias) and this facade.

This package is the one stable place to import these names from: the modules that define them
move as the trainer's rooms are rearranged, the names here do not (``tests/trainer/
test_public_api.py`` lists them). A module that moves keeps a deprecated alias for a release
(:mod:`.loss`, the loss's home before it moved into ``objective/``). Modules inside the trainer
import the defining module, never this facade.
"""

from treeprep.trainer.attention import TreeMask, choose_backend, tree_attention
from treeprep.trainer.batch.tree_batch import TreeBatch
from treeprep.trainer.config import LossConfig
from treeprep.trainer.models import PRESETS, Preset, decoder_hidden, load_model, tree_logits
from treeprep.trainer.objective.loss import (
    LossOutput,
    sequence_logprobs,
    token_logprobs,
    tree_loss,
)
from treeprep.trainer.online import OnlineStep, Rollout, build_step
from treeprep.trainer.verify import VerifyReport, verify_gradients

__all__ = [
    "PRESETS",
    "LossConfig",
    "LossOutput",
    "OnlineStep",
    "Preset",
    "Rollout",
    "TreeBatch",
    "TreeMask",
    "VerifyReport",
    "build_step",
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
