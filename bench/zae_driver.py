#!/usr/bin/env python3
"""zae-limiter on DynamoDB Local, measured the way tollgate's own DynamoDB benches measure.

Run by ``scripts/bench-peers dynamodb`` inside ``bench/.venv`` (zae-limiter from PyPI). It
creates its own table on the endpoint (no CloudFormation: the table alone, through
``Repository.create_table``; then ``Repository.builder()`` without infrastructure options,
which only registers the namespace and the version record), stores the limits as resource
defaults, and prints one ``ROW`` line per measurement:

* ``hot`` rows mirror ``crates/tollgate-dynamodb/benches/dynamodb.rs``: all tasks acquire 1
  from one warm entity (20 warm-up acquires first) of a 10,000,000-per-second limit, in a
  loop for ``--seconds``; p50/p99/max latency, throughput, store requests per acquire and
  this process's CPU per acquire.
* ``spread`` rows mirror the ``acquire`` row of ``benches/client_cpu.rs``: one entity per
  task (``cpu-0`` ... ``cpu-63``, each opened by one acquire of 5,000,000 of a
  10,000,000-per-hour limit), 200 warm-up calls, then ``--calls`` acquires of 1 spread
  evenly over the tasks; CPU per acquire and calls per second.

Store requests are counted with botocore's ``before-call`` event on the repository's client
(one count per API call the library makes, not per HTTP retry). CPU is ``getrusage`` of this
process (user + system, every thread); DynamoDB Local runs in another process. The library
runs with its defaults, as an application would get it (aiobotocore's default pool of 10
connections, the default asyncio event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import sys
import time
from collections import Counter

from botocore.exceptions import ClientError

import zae_limiter
from zae_limiter import Limit, RateLimiter, Repository

HOT_RESOURCE = "bench"
SPREAD_RESOURCE = "cpu"
LIMIT = "rps"
WARMUP_CALLS = 200
READS = {"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"}
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}


class Calls:
    """Counts the DynamoDB API calls the library's client makes."""

    def __init__(self) -> None:
        self.by_op: Counter[str] = Counter()

    def hook(self, model=None, **_kwargs) -> None:  # botocore event handler signature
        if model is not None:
            self.by_op[model.name] += 1

    def snapshot(self) -> Counter[str]:
        return Counter(self.by_op)


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank, as the Rust benches compute it."""
    if not sorted_values:
        return 0.0
    i = min(max(math.ceil(len(sorted_values) * p), 1), len(sorted_values)) - 1
    return sorted_values[i]


def ops(delta: Counter[str]) -> str:
    """``GetItem:2,UpdateItem:40`` (no spaces: the script splits ROW lines on them)."""
    return ",".join(f"{op}:{n}" for op, n in sorted(delta.items())) or "-"


def split(delta: Counter[str]) -> tuple[int, int, int]:
    reads = sum(n for op, n in delta.items() if op in READS)
    writes = sum(n for op, n in delta.items() if op in WRITES)
    other = sum(delta.values()) - reads - writes
    return reads, writes, other


async def acquire_one(limiter: RateLimiter, entity: str, resource_name: str, amount: int) -> None:
    async with limiter.acquire(entity_id=entity, resource=resource_name, consume={LIMIT: amount}):
        pass


async def hot_row(limiter: RateLimiter, calls: Calls, tasks: int, seconds: float) -> str:
    entity = f"hot-{tasks}"
    for _ in range(20):
        await acquire_one(limiter, entity, HOT_RESOURCE, 1)
    before = calls.snapshot()
    cpu0 = cpu_seconds()
    start = time.perf_counter()
    deadline = start + seconds
    errors: list[str] = []

    async def worker() -> list[float]:
        lat: list[float] = []
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            try:
                await acquire_one(limiter, entity, HOT_RESOURCE, 1)
            except Exception as e:  # noqa: BLE001 - any failure is counted and reported
                if not errors:
                    print(f"zae_driver: acquire failed: {type(e).__name__}: {e}", file=sys.stderr)
                errors.append(type(e).__name__)
                continue
            lat.append(time.perf_counter() - t)
        return lat

    results = await asyncio.gather(*(worker() for _ in range(tasks)))
    wall = time.perf_counter() - start
    cpu = cpu_seconds() - cpu0
    delta = calls.snapshot() - before
    lat = sorted(x for r in results for x in r)
    n = max(len(lat), 1)
    reads, writes, other = split(delta)
    return (
        f"ROW mode=hot tasks={tasks} acquires={len(lat)} acq_s={len(lat) / wall:.1f} "
        f"p50_ms={percentile(lat, 0.50) * 1e3:.2f} p99_ms={percentile(lat, 0.99) * 1e3:.2f} "
        f"max_ms={(lat[-1] if lat else 0.0) * 1e3:.2f} reads_per_acq={reads / n:.3f} "
        f"writes_per_acq={writes / n:.3f} other_per_acq={other / n:.3f} errors={len(errors)} "
        f"cpu_us_per_acq={cpu * 1e6 / n:.1f} ops={ops(delta)}"
    )


async def drive_spread(limiter: RateLimiter, tasks: int, total: int) -> None:
    async def worker(i: int, n: int) -> None:
        for _ in range(n):
            await acquire_one(limiter, f"cpu-{i}", SPREAD_RESOURCE, 1)

    await asyncio.gather(
        *(worker(i, total // tasks + (1 if i < total % tasks else 0)) for i in range(tasks))
    )


async def spread_row(limiter: RateLimiter, calls: Calls, tasks: int, total: int) -> str:
    await drive_spread(limiter, tasks, WARMUP_CALLS)
    before = calls.snapshot()
    cpu0 = cpu_seconds()
    start = time.perf_counter()
    await drive_spread(limiter, tasks, total)
    wall = time.perf_counter() - start
    cpu = cpu_seconds() - cpu0
    delta = calls.snapshot() - before
    reads, writes, other = split(delta)
    return (
        f"ROW mode=spread tasks={tasks} acquires={total} acq_s={total / wall:.1f} "
        f"reads_per_acq={reads / total:.3f} writes_per_acq={writes / total:.3f} "
        f"other_per_acq={other / total:.3f} cpu_us_per_acq={cpu * 1e6 / total:.1f} "
        f"ops={ops(delta)}"
    )


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True, help="DynamoDB Local URL (loopback)")
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per hot row")
    ap.add_argument("--calls", type=int, default=4000, help="acquires per spread row")
    ap.add_argument("--tasks", default="1,64", help="comma-separated task counts")
    ap.add_argument("--modes", default="hot,spread", help="hot, spread or both")
    args = ap.parse_args()
    tasks_list = [int(t) for t in args.tasks.split(",") if t.strip()]
    modes = {m.strip() for m in args.modes.split(",") if m.strip()}
    if max(tasks_list, default=0) > 64:
        print("zae_driver: at most 64 tasks (the spread entities)", file=sys.stderr)
        return 2

    stack = f"zae-bench-{int(time.time() * 1000) % 10**9}"
    # The table alone: a Repository without stack options never touches CloudFormation.
    bare = Repository(
        stack, region=args.region, endpoint_url=args.endpoint, _skip_deprecation_warning=True
    )
    await bare.create_table()
    await bare.close()
    repo = await (
        Repository.builder()
        .stack(stack)
        .region(args.region)
        .endpoint_url(args.endpoint)
        .build()
    )
    calls = Calls()
    client = await repo._get_client()
    client.meta.events.register("before-call.dynamodb", calls.hook)
    limiter = RateLimiter(repository=repo)
    try:
        await limiter.set_resource_defaults(HOT_RESOURCE, [Limit.per_second(LIMIT, 10_000_000)])
        await limiter.set_resource_defaults(SPREAD_RESOURCE, [Limit.per_hour(LIMIT, 10_000_000)])
        print(f"INFO zae-limiter {zae_limiter.__version__} table {stack}", flush=True)
        if "hot" in modes:
            for tasks in tasks_list:
                print(await hot_row(limiter, calls, tasks, args.seconds), flush=True)
        if "spread" in modes:
            for i in range(max(tasks_list)):
                # Half the hour's allowance, as client_cpu.rs: the row never drains it.
                await acquire_one(limiter, f"cpu-{i}", SPREAD_RESOURCE, 5_000_000)
            for tasks in tasks_list:
                print(await spread_row(limiter, calls, tasks, args.calls), flush=True)
    finally:
        try:
            await client.delete_table(TableName=stack)
        except ClientError as e:
            print(f"zae_driver: could not delete table {stack}: {e}", file=sys.stderr)
        await limiter.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
