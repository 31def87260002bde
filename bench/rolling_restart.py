"""Requests lost in a rolling restart: two replicas behind HAProxy (deploy/haproxy/tritium.cfg,
health checks on /v2/health/ready), client threads sending inferences through it in a loop;
one replica gets SIGTERM (and its lame duck), is started again on the same ports once it has
exited and is back in HAProxy's rotation, then the other. Prints requests sent and failed
(goal: 0 failed), and what the failures were. Needs haproxy (or nginx) installed.

    python bench/rolling_restart.py [--seconds 20] [--http-clients 3] [--grpc-clients 1]
                                    [--lame-duck-secs 5]   # 0: no lame duck
                                    [--without-retries]    # HAProxy's retry-on line removed
                                    [--proxy nginx]        # nginx instead (passive checks only)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.proxies import HAProxy, Nginx, Proxy, build_replica_repository
from tests.e2e.steady_load import Replica, SteadyLoad, wait_up

RETRY_LINE = "    retry-on conn-failure empty-response 503\n"


def without_retries(config: str) -> str:
    assert RETRY_LINE in config
    return config.replace(RETRY_LINE, "")


def back_in_rotation(proxy: Proxy, server: str, offset: int) -> None:
    """HAProxy's checks passed again; nginx (passive checks only) is given its fail_timeout
    (1 s) and a second more."""
    if isinstance(proxy, HAProxy):
        wait_up(proxy, server, offset)
    else:
        time.sleep(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--http-clients", type=int, default=3)
    parser.add_argument("--grpc-clients", type=int, default=1)
    parser.add_argument("--lame-duck-secs", type=float, default=5.0)
    parser.add_argument("--without-retries", action="store_true",
                        help="remove retry-on from HAProxy's configuration")
    parser.add_argument("--proxy", choices=("haproxy", "nginx"), default="haproxy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = build_replica_repository(root / "repo", root)
        replicas = [Replica(repo, "--lame-duck-secs", str(args.lame_duck_secs))
                    for _ in range(2)]
        processes = [r.process for r in replicas]
        proxy: Proxy = (Nginx(root / "nginx", processes) if args.proxy == "nginx" else
                        HAProxy(root / "haproxy", processes,
                                edit=without_retries if args.without_retries else None))
        proxy.start()
        started = time.monotonic()
        try:
            with SteadyLoad(proxy, args.http_clients, args.grpc_clients) as load:
                time.sleep(2)
                for number, replica in enumerate(replicas, start=1):
                    offset = len(proxy.log())
                    down, up = replica.restart()
                    back_in_rotation(proxy, f"replica{number}", offset)
                    print(f"replica{number}: exited {down:.1f} s after SIGTERM, ready again "
                          f"{up:.1f} s later, back in rotation "
                          f"{time.monotonic() - started:.1f} s into the run", flush=True)
                time.sleep(max(args.seconds - (time.monotonic() - started), 1))
        finally:
            log = proxy.log()
            proxy.stop()
            for replica in replicas:
                replica.stop()
        elapsed, tally = time.monotonic() - started, load.tally
        print(f"{args.proxy}, lame duck {args.lame_duck_secs:g} s, retries "
              f"{'off' if args.without_retries else 'on'}")
        for protocol in sorted(tally.sent):
            clients = args.http_clients if protocol == "HTTP" else args.grpc_clients
            print(f"{protocol:5s} requests sent {tally.sent[protocol]:6d}  failed "
                  f"{tally.failed[protocol]:4d}  in {elapsed:.1f} s, {clients} client(s)")
        for reason, count in tally.reasons.most_common():
            print(f"  {count:4d} x {reason}")
        if sum(tally.failed.values()):  # what the proxy said of the replicas, for the why
            for line in [line for line in log.splitlines() if "upstream" in line][-10:]:
                print(f"  proxy: {line}")


if __name__ == "__main__":
    main()
