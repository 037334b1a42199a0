"""Run as a separate process by the tests: enqueue one task per dedup key, in random order.

python -m tests.enqueue_keys --keys 100 --seed 3
"""

from __future__ import annotations

import argparse
import random

import django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    options = parser.parse_args()
    django.setup()
    from tests import tasks

    keys = list(range(options.keys))
    random.Random(options.seed).shuffle(keys)
    for key in keys:
        tasks.add.using(dedup_key=f"multi:{key}").enqueue(key, options.seed)


if __name__ == "__main__":
    main()
