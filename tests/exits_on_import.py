"""A module no worker may import: importing it exits the process, as ``venv.__main__`` does.

``tests/test_task_resolution.py`` forges task rows naming ``tests.exits_on_import.boom``.
``tests`` is not an installed app and nothing imports this module at startup, so
``resolve_task`` must refuse such a row without importing it. Importing it first drops
the marker file ``exits-on-import-ran`` into ``DTP_TEST_MARKERS``; the tests assert that
the marker never appears.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MARKER = "exits-on-import-ran"

_folder = os.environ.get("DTP_TEST_MARKERS")
if _folder:
    (Path(_folder) / MARKER).touch()
sys.exit(2)
