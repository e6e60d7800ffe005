"""Hand-off parts: a tree larger than the budget runs as parts that hand keys and values over.

:mod:`.plan` cuts a one-tree batch into parts, :mod:`.state` is what a part hands over per layer,
:mod:`.schedule` runs them depth-first with gradients injected on the way back.
"""

from treeprep.trainer.parts.plan import PartLayout, PartSpec, part_layout
from treeprep.trainer.parts.schedule import PartsOutput, run_parts
from treeprep.trainer.parts.state import HandOff, KVStore, LinearState

__all__ = [
    "HandOff",
    "KVStore",
    "LinearState",
    "PartLayout",
    "PartSpec",
    "PartsOutput",
    "part_layout",
    "run_parts",
]
