"""The run's machinery: the training loop and its step, checkpoints and their identity, signals,
trackers, metrics, memory tracking, plots, the held-out evaluation and the model's export
(:mod:`.export`, ``treeprep export-model``). The micro-batch forward that DDP and FSDP2 wrap,
:class:`~.step.LossModule`, is the step's.

Nothing of :mod:`treeprep.trainer.objective` depends on this room; the loop reads the objective.
"""
