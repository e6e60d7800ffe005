"""``treeprep pack``: cut and bin-pack trees into micro-batches, steps and ranks.

The plan's on-disk contract (columns, the meaning of a part, how the trainer rebuilds a
micro-batch) is documented in :mod:`treeprep.schemas.plan`. This module makes it, in four passes,
each linear in the number of nodes (plus sorts over trees and parts):

1. **Load** the planning columns of every tree into one flat :class:`Forest`
   (:mod:`treeprep.pack.forest`). A tree with a root-to-node path longer than the budget cannot be
   trained under that budget by recomputation: :class:`~treeprep.errors.PackError` names the
   group and the length.
2. **Cut** each tree larger than the budget into connected parts (:mod:`treeprep.pack.cut`).
3. **Steps** and 4. **ranks**: parts into micro-batches and optimizer steps, micro-batches onto
   ranks, and the plan on disk (:mod:`treeprep.pack.plan`).

The plan is deterministic: only the seeded shuffle is random, and every sort is stable.
"""

from treeprep.errors import PackError
from treeprep.pack.cut import TreeCut, cut_tree
from treeprep.pack.forest import Forest, load_forest
from treeprep.pack.plan import (
    PackConfig,
    Plan,
    pack,
    plan_build,
    plan_forest,
    read_plan_summary,
    write_plan,
)
from treeprep.schemas.manifest import manifest_sha256

__all__ = [
    "Forest",
    "PackConfig",
    "PackError",
    "Plan",
    "TreeCut",
    "cut_tree",
    "load_forest",
    "manifest_sha256",
    "pack",
    "plan_build",
    "plan_forest",
    "read_plan_summary",
    "write_plan",
]
