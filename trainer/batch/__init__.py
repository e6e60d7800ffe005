"""The batch room: tree rows to one packed micro-batch, and what its losses read from it.

The lowest rung of the trainer above the attention kernels: it imports no other room (the
dependency test holds the order). Each module imports only those before it:

* :mod:`.advantages`: rewards to advantages over a group's trajectories, and a row's trained
  targets;
* :mod:`.targets`: :class:`~.targets.Targets`, the trained targets and their restored
  coefficients, the slice of a batch that everything after the decoder reads;
* :mod:`.assembly`: tree rows to the packed arrays of a micro-batch, on the host, in numpy;
* :mod:`.tree_batch`: :class:`~.tree_batch.TreeBatch`, those arrays on the device.

``from treeprep.trainer.batch import TreeBatch`` (and :class:`~.assembly.Missing`) hands on the
batch; import everything else from its module.
"""

from treeprep.trainer.batch.tree_batch import Missing, TreeBatch

__all__ = ["Missing", "TreeBatch"]
