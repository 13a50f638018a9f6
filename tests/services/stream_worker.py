"""A verifier-like consumer run as its own process by the SIGKILL test (python -m tests.services.stream_worker).

It takes `--take` result entries (groups of samples), forwards the first `--forward` of them as reward
groups (written and acked together), writes rewards for the next `--write-unacked` without acking (as a
worker that dies between its write and its ack would), prints "HOLDING <entries>" and then sleeps,
holding the rest un-acked, until it is killed.
"""

from __future__ import annotations

import argparse
import sys
import time

from services.streams.topology import open_queue
from services.redis_server import make_client
from tests.services.pipeline import verify_entry


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--url", "--run", "--consumer"):
        parser.add_argument(name, required=True)
    for name in ("--take", "--forward", "--write-unacked"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args()
    client = make_client(args.url)
    results = open_queue(client, args.run, "rollout_results", args.consumer, max_in_flight=args.take)
    rewards = open_queue(client, args.run, "rewards", args.consumer)
    held = []
    while len(held) < args.take:
        held += results.take(args.take - len(held))
    forwarded, unacked = held[:args.forward], held[args.forward:args.forward + args.write_unacked]
    results.forward(forwarded, rewards, [verify_entry(d) for d in forwarded])
    rewards.put([verify_entry(d) for d in unacked])
    print(f"HOLDING {len(held) - len(forwarded)}", flush=True)
    time.sleep(600)
    sys.exit(1)


if __name__ == "__main__":
    main()
