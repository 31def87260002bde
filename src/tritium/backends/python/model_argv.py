"""The sys.argv model code sees: Triton's stub embeds Python without arguments."""

from __future__ import annotations

import sys

# An embedded interpreter given no arguments has sys.argv == [""] (Python adds the empty
# string so that argv is never empty); that is what models find under Triton, so
# argparse and unittest.main() in a model do not parse the server's command line.
MODEL_ARGV: list[str] = [""]

server_argv: list[str] | None = None


def install() -> None:
    """Give model code its own sys.argv, once; the server's stays in ``server_argv``."""
    global server_argv
    if server_argv is None:
        server_argv = list(sys.argv)
        sys.argv = list(MODEL_ARGV)
