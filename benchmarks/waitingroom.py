"""The waiting room on one Redis: joins/s, polls/s, admissions/s, and the cost of a pass.

One process, one private redis-server, no database (the rooms are built from a
``RoomSpec``, the units left passed in). Each figure is calls per second of one
client for a few seconds, with this process's CPU per call:

- join: a new visitor's visit (a ticket, a place at the end of its lane);
- poll: a waiting visitor's visit (its place and ETA, one admission step, closed
  by "sold out" here so that the queue stays as long);
- admission: steps of ``WaitingRoom.admit`` over a long queue, each taking up to
  ``--batch`` visitors (admitted visitors per second);
- pass check: an admitted request's check, without Redis (the signature alone, and
  the decorator's whole path on a request carrying the pass cookie), in
  microseconds of CPU per request; the target is under 50;
- ETA: a queue admitted at a steady 10 visitors/s (an admission step every 20 ms);
  after a warm-up, visitors at several places are told their ETA, then the real
  wait until each is admitted is measured; the target is within 20%.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time

from . import support

TARGET_PASS_US = 50.0  # microseconds of CPU per pass check, at most
TARGET_ETA_ERROR = 0.20  # the told ETA within this fraction of the real wait
ETA_RATE = 10  # admissions per second in the ETA run
ETA_STEP = 0.02  # seconds between admission steps in the ETA run


def eta_run(warm_up: float, samples: list[int]) -> list[tuple[int, float, float]]:
    """(places ahead, ETA told, real wait) of a visitor at each of ``samples`` places
    ahead, told after ``warm_up`` seconds of steady admission."""
    from stock_locks.waitingroom import RoomSpec, WaitingRoom

    spec = RoomSpec(
        slug="bench-eta", start=dt.datetime(2020, 1, 1, tzinfo=dt.UTC), max_active=10**6,
        admit_per_minute=ETA_RATE * 60, queue_ttl=3600, session_ttl=3600,
    )  # fmt: skip
    room = WaitingRoom(spec)
    room.clear()
    count = int(warm_up * ETA_RATE) + max(samples) + 20
    tickets = [room.visit(f"e{i}", remaining=0).ticket for i in range(count)]
    client = room.backend.client
    began = time.perf_counter()
    while time.perf_counter() - began < warm_up:
        room.admit(remaining=-1)
        time.sleep(ETA_STEP)
    head = int(room.stats().admitted_total)
    told: dict[int, tuple[int, float, float]] = {}  # index -> (ahead, eta, told at)
    for ahead in samples:
        index = head + ahead
        status = room.visit(f"e{index}", remaining=-1)
        told[index] = (status.ahead or 0, status.eta or float("nan"), time.perf_counter())
    results = []
    while told:
        room.admit(remaining=-1)
        for index in list(told):
            if client.zscore(room.keys.active, tickets[index]) is not None:
                ahead, eta, at = told.pop(index)
                results.append((ahead, eta, time.perf_counter() - at))
        time.sleep(ETA_STEP)
    room.clear()
    return sorted(results)


def parse_args(argv: list[str]):
    parser = support.parser("waitingroom", __doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement (3)")
    parser.add_argument("--batch", type=int, default=100, help="admissions per step (100)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds = 0.5
    return args


def main(argv: list[str]) -> str:
    args = parse_args(argv)
    load_before = support.load_average()
    with support.private_redis() as server:
        support.setup_django(server.url)
        from django.test import RequestFactory

        from stock_locks.waitingroom import RoomSpec, WaitingRoom, issue_pass
        from stock_locks.waitingroom.gate import admitted_pass, cookie_name
        from stock_locks.waitingroom.passes import check_pass

        lines = support.header(
            "Waiting room: one Redis, one client process", server, ["Django", "redis"],
            args.quick,
        )  # fmt: skip
        past = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
        spec = RoomSpec(slug="bench", start=past, max_active=10**9,
                        admit_per_minute=60 * 10**9, session_ttl=3600)  # fmt: skip
        room = WaitingRoom(spec)
        room.clear()
        counter = itertools.count()
        support.progress("joins")
        joins, join_cpu = support.timed_calls(
            lambda: room.visit(f"v{next(counter)}", remaining=0), args.seconds
        )
        joined = next(counter)
        polled = itertools.cycle(range(joined))
        support.progress("polls")
        polls, poll_cpu = support.timed_calls(
            lambda: room.visit(f"v{next(polled)}", remaining=0), args.seconds
        )
        support.progress("admissions")
        override = support.configure_stock_locks(WAITING_ROOM_MAX_POPS=args.batch)
        try:
            admitted, began = 0, time.perf_counter()
            cpu = time.process_time()
            steps = 0
            while True:
                got = room.admit(remaining=-1)
                admitted += got
                steps += 1
                elapsed = time.perf_counter() - began
                if elapsed >= args.seconds or not got:
                    break
            admit_rate = admitted / elapsed
            admit_cpu = (time.process_time() - cpu) / max(admitted, 1) * 1e6
        finally:
            override.disable()
        support.progress("pass checks")
        token = issue_pass("bench", "session-key", 1, 1234)
        checks, check_cpu = support.timed_calls(
            lambda: check_pass(token, "bench", "session-key", 3600), args.seconds, batch=500
        )
        status = room.visit("admitted-visitor", remaining=-1)
        assert status.state == "admitted", status
        cookie = issue_pass("bench", "session-key", status.ticket, status.born)
        request = RequestFactory().get("/", HTTP_COOKIE=f"{cookie_name('bench')}={cookie}")
        assert admitted_pass(request, room, "session-key") == cookie
        gates, gate_cpu = support.timed_calls(
            lambda: admitted_pass(request, room, "session-key"), args.seconds, batch=500
        )
        room.clear()
        support.progress("ETA at a steady rate")
        warm_up = 3.0 if args.quick else 12.0
        samples = [5, 10, 20] if args.quick else [10, 20, 40, 60, 80]
        etas = eta_run(warm_up, samples)
    errors = [abs(eta - wait) / wait for _, eta, wait in etas]
    worst = max(errors)
    eta_rows = [
        [ahead, f"{eta:.1f}", f"{wait:.1f}", f"{error:.0%}"]
        for (ahead, eta, wait), error in zip(etas, errors, strict=True)
    ]
    rows = [
        ["join (new visitor)", f"{joins:,.0f}", f"{join_cpu:.0f}", ""],
        ["poll (waiting visitor)", f"{polls:,.0f}", f"{poll_cpu:.0f}", ""],
        [f"admission (steps of {args.batch})", f"{admit_rate:,.0f}", f"{admit_cpu:.1f}",
         f"{steps} steps"],
        ["pass check (signature)", f"{checks:,.0f}", f"{check_cpu:.1f}",
         f"target < {TARGET_PASS_US:.0f} us: {support.verdict(check_cpu < TARGET_PASS_US)}"],
        ["pass check (decorator path)", f"{gates:,.0f}", f"{gate_cpu:.1f}",
         f"target < {TARGET_PASS_US:.0f} us: {support.verdict(gate_cpu < TARGET_PASS_US)}"],
    ]  # fmt: skip
    support.figure("joins_per_s", joins)
    support.figure("polls_per_s", polls)
    support.figure("admissions_per_s", admit_rate)
    support.figure("pass_check_us", check_cpu)
    support.figure("eta_worst_error", worst)
    lines.append(f"{joined:,} visitors joined; {args.seconds:g} s per measurement")
    lines.append("")
    lines.append(support.table(["call", "per second", "CPU us/call", "note"], rows))
    lines.append("")
    lines.append("A pass check makes no Redis round trip (a fresh pass of the state this "
                 "process knows).")  # fmt: skip
    lines.append("")
    lines.append(f"ETA at a steady {ETA_RATE} admissions/s (told after {warm_up:g} s):")
    lines.append(support.table(["ahead", "ETA told (s)", "real wait (s)", "error"], eta_rows))
    lines.append(
        f"worst error {worst:.0%}, target within {TARGET_ETA_ERROR:.0%}: "
        f"{support.verdict(worst <= TARGET_ETA_ERROR)}"
    )
    lines.append(support.load_line(load_before))
    return "\n".join(lines)
