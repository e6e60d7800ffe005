"""schemas/shard.py ``validate_tree_row``: a row of the shard layout passes, and each way a row can
break the layout is refused with a ShardError that names the tree and the column."""

from __future__ import annotations

from typing import Any

import pytest

from treeprep.errors import ShardError
from treeprep.schemas.shard import validate_tree_row


def _row() -> dict[str, Any]:
    """A root of 3 tokens with two children of 2 and 1 tokens; a sequence ends on each child."""
    return {
        "input_ids": [1, 2, 3, 4, 5, 6],
        "node_parent": [-1, 0, 0],
        "node_offset": [0, 3, 5],
        "node_length": [3, 2, 1],
        "node_depth": [0, 3, 3],
        "node_last": [2, 1, 2],
        "seq_node": [1, 2],
        "seq_count": [1, 2],
        "seq_loss_spans": [[3, 5], [1, 2, 3, 4]],
        "seq_logprobs": [[-0.1, -0.2], None],
        "seq_advantage": [None, 1.0],
        "seq_ref_logprobs": [None, [-0.5, -0.5]],
    }


def test_a_row_of_the_layout_passes() -> None:
    validate_tree_row(_row(), "t")
    row = _row()
    del row["seq_ref_logprobs"]  # optional
    validate_tree_row(row, "t")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"node_depth": [0, 3]}, "node_\\* columns disagree in length"),
        ({"node_length": [3, 3, 0], "node_offset": [0, 3, 6]}, "a node has no tokens"),
        ({"node_offset": [0, 2, 5]}, "nodes are not contiguous in DFS order"),
        ({"input_ids": [1, 2, 3, 4, 5]}, "nodes are not contiguous in DFS order"),
        ({"node_parent": [-1, 0, 2]}, "node_parent must point to an earlier node"),
        ({"node_last": [2, 0, 2]}, "node_last out of range"),
        ({"node_depth": [0, 3, 2]}, "node_depth is not the parent's depth plus its length"),
        ({"seq_count": [1]}, "seq_\\* columns disagree in length"),
        ({"seq_ref_logprobs": [None]}, "seq_ref_logprobs disagrees in length"),
        ({"seq_node": [1, 3]}, "seq_node out of range"),
        ({"seq_loss_spans": [[3, 5, 6], [1, 2]]}, "sequence 0 has an odd number of loss span"),
        ({"seq_logprobs": [[-0.1], None]}, "sequence 0 has 1 log-probs for 2 trained tokens"),
        ({"seq_ref_logprobs": [None, [-1.0]]}, "sequence 1 has 1 reference log-probs for 2"),
    ],
)
def test_a_broken_row_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ShardError, match=f"^tree 7: {message}"):
        validate_tree_row(_row() | change, "tree 7")
