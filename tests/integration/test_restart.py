"""Stopping ces2pg in the middle of a stream loses and duplicates nothing.

The generated stream has inserts, updates and deletes of the same keys, so
a record skipped, or applied again after a newer one, makes the end state
differ from the generator's expectation; offsets are also watched throughout
and must never move backwards.
"""

import pytest

from harness.common import wait_until
from harness.events import generate, read_records, stream_partitions
from harness.mockbroker import PacedProducer
from harness.progress import OffsetMonitor, dead_letters, wait_applied
from harness.tables import assert_tables_match

GROUP = "ces2pg-test"


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_in_the_middle(tmp_path, db, broker, ces2pg, how):
    b = broker(partitions=4)
    expect = generate(tmp_path, seed=4242 if how == "sigterm" else 4343,
                      events=20000)
    records = read_records(expect["_out"])
    total = len(records)
    parts = stream_partitions(records, 4, "table")
    monitor = OffsetMonitor(db, GROUP)

    # The producer runs throughout, at most ~2 MB per partition ahead of
    # what is applied, and simply waits while no daemon runs.
    producer = PacedProducer(b, db, GROUP, "ces", records, parts).start()
    try:
        # Small batches so that progress is gradual.
        first = ces2pg(db, b, group=GROUP, batch_max_events=10,
                       batch_max_ms=20)

        def some_progress():
            first.check_alive()
            monitor.poll()
            return monitor.total() >= total // 10

        wait_until(some_progress, 60, interval=0.01,
                   message=lambda: f"10% of {total} records applied "
                   f"(offsets {monitor.last})")
        if how == "sigterm":
            assert first.terminate() == 0
        else:
            assert first.kill9() == -9
        monitor.poll()
        done = monitor.total()
        print(f"{how}: stopped at {done}/{total} records, offsets "
              f"{monitor.last}, {producer.produced} produced")
        assert total // 10 <= done <= total * 9 // 10, (
            f"stopped at {done} of {total} records: not in the middle "
            f"(offsets {monitor.last})")

        second = ces2pg(db, b, group=GROUP)
        producer.finish(timeout=120, daemons=[second])
    finally:
        producer.stop()
    wait_applied(db, GROUP, producer.counts, timeout=60, daemons=[second],
                 monitor=monitor)
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert second.terminate() == 0
    assert monitor.polls > 10
