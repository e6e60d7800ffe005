"""trainer/models/presets.py: the full-size presets take their shapes from the one table of
published shapes (treeprep.flops.PRESETS), and a preset's config reads back as that shape."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from treeprep.flops import PRESETS as SHAPES  # noqa: E402
from treeprep.flops import from_config  # noqa: E402
from treeprep.trainer.models.presets import PRESETS, REAL_PRESETS, real_preset  # noqa: E402


@pytest.mark.parametrize("name", sorted(REAL_PRESETS))
def test_a_real_preset_has_the_published_shape(name: str) -> None:
    shape = from_config(PRESETS[name].hf_config().to_dict(), name=name)
    assert shape == SHAPES[name]


def test_only_dense_shapes_map_onto_a_preset() -> None:
    with pytest.raises(ValueError, match="only dense"):
        real_preset("qwen3-30b-a3b", "qwen3_moe")
