"""What a step optimizes: the tree loss and its RL terms, target log-probabilities, the fused LM
head, targets, advantages and the rewarded-only filter.

This room imports nothing of :mod:`treeprep.trainer.run` (the dependency test checks it).
"""
