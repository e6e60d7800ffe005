"""The run's machinery: the training loop and its step, checkpoints and their identity, signals,
trackers, metrics, memory tracking, plots and the held-out evaluation.

Nothing of :mod:`treeprep.trainer.objective` depends on this room; the loop reads the objective.
"""
