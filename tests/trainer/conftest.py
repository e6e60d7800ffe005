"""Puts this folder on ``sys.path`` so tests in its subfolders (attention/, parts/, models/) import
``trainer_fixtures`` exactly as the flat ones do.

pytest's default ``prepend`` import mode only adds a test file's own folder; the helpers stay a
plain module with a unique name (not fixtures here), so this file does nothing else.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
