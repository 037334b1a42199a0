"""One pgqueuer worker process: ``pgqueuer.run`` over ``pgqueuer_tasks.create_pgqueuer``.

This is the library's documented programmatic twin of ``pgq run pgqueuer_tasks:create_pgqueuer``
(the ``pgq run`` command itself crashed in 1.6.0), with its defaults.
"""

from __future__ import annotations

import asyncio
import logging

import pgqueuer

if __name__ == "__main__":
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    asyncio.run(pgqueuer.run("pgqueuer_tasks:create_pgqueuer"))
