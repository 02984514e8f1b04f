"""What a per-request hop to a scheduler actor would cost, against the routing decision the
root process makes itself. In a root process set up as `greenroom serve`'s (its tractor root
and actor tree, the demo model loaded; no HTTP), it times:

- a tractor round trip to an actor of the tree — StatusQuery → Status over the actor's session
  stream, the path a per-request "ask the scheduler" would take (`--actor`, default the
  steering coordinator, whose loop answers status as the scheduler actor's did);
- the in-process decision: `routing.route` over the model's placements, and
  `Lifecycle.client_for` on the loaded model (route, the keep-alive rearm, the client);
- the hop a request with a `profile` or a `steering_intensity` takes: `ResolveRequestSteering`
  to the steering coordinator and its answer (`tree.steering`, the relay's path; the demo SAE
  attached, a dial resolved against the store).

Prints the median and p90 of each and the ratio.

    .venv/bin/python bench/scheduler_hop.py [--trips 200] [--calls 5000] [--actor steering]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from greenroom.actors import runtime  # noqa: E402
from greenroom.config import load_config  # noqa: E402
from greenroom.protocol import ResolveRequestSteering  # noqa: E402
from greenroom.supervisor.routing import route  # noqa: E402
from greenroom.supervisor.slots import SlotState  # noqa: E402
from greenroom.supervisor.tree import Tree  # noqa: E402

MODEL = "bench"


def _summary(name: str, seconds: list[float]) -> tuple[float, str]:
    us = sorted(s * 1e6 for s in seconds)
    median, p90 = statistics.median(us), us[int(0.9 * (len(us) - 1))]
    return median, f"{name}: median {median:9.1f} µs   p90 {p90:9.1f} µs   ({len(us)} calls)"


async def _measure(args: argparse.Namespace) -> None:
    cfg = Path(tempfile.mkdtemp()) / "bench.toml"
    cfg.write_text(
        f'defaults = false\nlog_level = "warning"\nnpu_actors = []\n[[models]]\nid = "{MODEL}"\n'
        'source = "demo:tiny"\nsae = "demo:tiny"\n'
    )
    config = load_config(cfg, env={})
    async with runtime.open_root("supervisor", runtime.tractor_loglevel(config.log_level)):
        tree = Tree(config)
        async with trio.open_nursery() as nursery:
            await nursery.start(tree.run)
            slot = tree.slots[args.actor]
            with trio.fail_after(config.ready_timeout_s):
                while slot.state != SlotState.READY:
                    await trio.sleep(0.1)
            await tree.lifecycle.client_for(MODEL)  # loads it: what follows is the loaded model's path

            resolve = ResolveRequestSteering(MODEL, None, 0.5)
            for _ in range(20):  # warm every path
                await slot.client.status()
                await tree.lifecycle.client_for(MODEL)
                await tree.steering(resolve)
            trips, resolves = [], []
            for _ in range(args.trips):
                start = time.perf_counter()
                assert await slot.client.status() is not None, f"{args.actor} did not answer its status"
                trips.append(time.perf_counter() - start)
                start = time.perf_counter()
                await tree.steering(resolve)
                resolves.append(time.perf_counter() - start)
            replicas = tree.table.replicas_of(MODEL)
            routes, clients = [], []
            for _ in range(args.calls):
                start = time.perf_counter()
                route(replicas)
                routes.append(time.perf_counter() - start)
                start = time.perf_counter()
                await tree.lifecycle.client_for(MODEL)
                clients.append(time.perf_counter() - start)
            nursery.cancel_scope.cancel()

    hop, hop_line = _summary(f"round trip to {args.actor!r} (StatusQuery → Status)", trips)
    routing, route_line = _summary("routing.route                          ", routes)
    decision, client_line = _summary("Lifecycle.client_for (loaded model)    ", clients)
    _, resolve_line = _summary("a request's steering resolved (ResolveRequestSteering)", resolves)
    print(hop_line, route_line, client_line, resolve_line, sep="\n")
    print(f"ratio of the medians: hop / client_for {hop / decision:.0f}x, hop / route {hop / routing:.0f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trips", type=int, default=200)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--actor", default="steering", help="the actor whose session the round trips go over")
    trio.run(_measure, ap.parse_args())


if __name__ == "__main__":
    main()
