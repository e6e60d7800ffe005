"""What a step optimizes: the tree loss and its RL terms, target log-probabilities, the LM head
(cast a block at a time under autocast, or Liger's fused head).

Above ``batch/`` (targets and advantages, which it reads), ``models/`` and ``config.py`` (whose
torch-free :class:`~treeprep.trainer.config.LossConfig` ``objective.loss`` hands on); it imports
nothing of :mod:`treeprep.trainer.run` (the dependency test checks it).
"""
