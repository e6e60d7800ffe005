"""The data side of training: from a finished build to each step's micro-batches on the device.

Each module imports only those before it:

* :mod:`.reader`: the build (manifest, shards, tree rows) and the model checked against it
  (:func:`~.reader.model_for_build`, shared by ``treeprep train`` and ``treeprep verify``);
* :mod:`.plans`: plans (loaded from ``treeprep pack`` or made in memory) and epochs of them;
* :mod:`.rows`: a planned part, or one sequence, as a small tree row;
* :mod:`.steps`: the steps walked in order, each built into micro-batches with global normalizers;
* :mod:`.prefetch`: the next step built in a background thread while the current one runs;
* :mod:`.rewarded`: an RL run's scan of the build for trees without advantages or rewards.

The room takes its own settings, :class:`~treeprep.trainer.config.DataConfig` (the run builds it
from its :class:`~treeprep.trainer.config.TrainConfig`), never the whole config.

Import from the modules; this package re-exports nothing.
"""
