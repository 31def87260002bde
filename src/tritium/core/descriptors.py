"""How many connections a listener, and how many regions clients, may hold when no flag
says: a share of the open-file limit each."""

from __future__ import annotations

import resource

# Each listener takes at most this share of the process's open-file limit, so a flood of
# connections to one leaves descriptors for the other listeners, the models and the log.
CONNECTION_SHARE = 4
MIN_CONNECTIONS = 16


# Registered shared-memory regions each hold a descriptor too: an eighth of the limit, so
# that with both listeners full a quarter is left for models, logs and the repository.
REGION_SHARE = 8
MIN_REGIONS = 16
MAX_REGIONS = 1024


def default_connection_cap() -> int:
    return max(MIN_CONNECTIONS, _open_file_limit() // CONNECTION_SHARE)


def default_region_cap() -> int:
    """How many shared-memory regions clients may register when no flag says."""
    return min(MAX_REGIONS, max(MIN_REGIONS, _open_file_limit() // REGION_SHARE))


def _open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft
