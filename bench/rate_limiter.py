"""What the rate limiter costs per identity inference, in user-space CPU instructions
(valgrind's callgrind, see bench/instructions.py), over HTTP:

- ``off`` (the default) on this checkout and on the checkouts given with ``--tree`` (e.g. a
  worktree of the commit before the rate limiter): the same count means off costs nothing;
- ``execution_count`` with identity naming no resource (every batch is staged and allocated);
- ``execution_count`` with identity needing one resource of its own (taken and given back).

    python bench/rate_limiter.py [--requests 500] [--tree PATH ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instructions import ROOT, measure

LIMITED = ("--rate-limit", "execution_count")
GROUP = "instance_group [{ count: 1 kind: KIND_CPU }]"
WITH_RESOURCE = ('instance_group [{ count: 1 kind: KIND_CPU '
                 'rate_limiter { resources [ { name: "R" count: 1 } ] } }]')


def needs_a_resource(config: str) -> str:
    assert GROUP in config, config
    return config.replace(GROUP, WITH_RESOURCE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--tree", type=Path, nargs="*", default=[],
                        help="other checkouts to measure with the rate limiter off")
    args = parser.parse_args()
    for tree in [ROOT, *args.tree]:
        count = measure(tree.resolve(), "http", args.requests)
        print(f"http  {count:9,d} instructions/infer  off                        ({tree})",
              flush=True)
    for label, edit in (("execution_count, no resource", None),
                        ("execution_count, one resource", needs_a_resource)):
        count = measure(ROOT, "http", args.requests, flags=LIMITED, edit_config=edit)
        print(f"http  {count:9,d} instructions/infer  {label:26s} ({ROOT})", flush=True)


if __name__ == "__main__":
    main()
