"""``python -m tritium``."""

from tritium.cli import main

raise SystemExit(main())
