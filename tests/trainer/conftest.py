"""Puts this folder and the rooms' test folders (run/, objective/) on ``sys.path`` so tests in any
subfolder import ``trainer_fixtures`` and each other's helpers exactly as the flat ones do.

pytest's default ``prepend`` import mode only adds a test file's own folder; the helpers stay a
plain module with a unique name (not fixtures here), so this file does nothing else.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# this folder, and the rooms' test folders, whose modules others import (``test_train``'s build
# fixture, ``test_rl``'s float64 model): test module names are unique across the folders
for _folder in (_HERE, _HERE / "run", _HERE / "objective"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
