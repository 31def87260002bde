"""How many connections a listener may hold when no flag says: a share of the open-file limit."""

from __future__ import annotations

import resource

# Each listener takes at most this share of the process's open-file limit, so a flood of
# connections to one leaves descriptors for the other listeners, the models and the log.
CONNECTION_SHARE = 4
MIN_CONNECTIONS = 16


def default_connection_cap() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MIN_CONNECTIONS, soft // CONNECTION_SHARE)
