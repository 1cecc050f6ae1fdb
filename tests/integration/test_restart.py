"""Stopping ces2pg in the middle of a stream loses and duplicates nothing.

The generated stream has inserts, updates and deletes of the same keys, so
a record skipped, or applied again after a newer one, makes the end state
differ from the generator's expectation; offsets are also watched throughout
and must never move backwards.
"""

import re

import pytest

from harness.common import wait_until
from harness.daemon import DEFAULT_KAFKA_PROPERTIES
from harness.events import generate, read_records, stream_partitions
from harness.mockbroker import PacedProducer
from harness.progress import OffsetMonitor, dead_letters, read_offsets, wait_applied
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


@pytest.mark.parametrize("sync_errors", [2, 40])
def test_stopping_between_joining_and_the_first_assignment(tmp_path, db, broker, ces2pg,
                                                          sync_errors):
    """A consumer stopped after its group answered its JoinGroup and before a SyncGroup gave it
    an assignment (a writer told to stop right after it subscribed) exits cleanly: librdkafka
    before 2.3.0 aborts when such a consumer is destroyed. The broker fails SyncGroup to hold the
    consumer in that window (each failure costs the mock's group a rejoin of about 3 s). With 2
    failures ces2pg lets the join finish, takes nothing of the assignment, and destroys the
    consumer; with 40 the join does not finish within 10 s, and the client is left as it is."""
    b = broker(partitions=2, control=True)
    b.command(f"errors SyncGroup {sync_errors} REBALANCE_IN_PROGRESS")
    d = ces2pg(db, b, group=GROUP, log_level="debug",
               properties=DEFAULT_KAFKA_PROPERTIES + ("debug=cgrp",))
    d.wait_log(r"SyncGroup response: Broker: Group rebalance in progress", timeout=30)
    assert d.terminate(timeout=60) == 0
    assert not re.search(r"^INFO assigned ", d.log(), re.M), "nothing taken while stopping"
    left = "did not finish joining within 10 s; the Kafka client is left as it is" in d.log()
    assert left == (sync_errors == 40)
    assert dead_letters(db) == [] and read_offsets(db, GROUP) == {}
