"""Generated streams through the mock broker end exactly as the generator
predicts."""

from harness.events import generate, read_records, stream_partitions
from harness.mockbroker import PacedProducer
from harness.progress import OffsetMonitor, dead_letters, wait_applied
from harness.tables import assert_tables_match

GROUP = "ces2pg-test"


def test_stream_10k_events_4_partitions(tmp_path, db, broker, ces2pg):
    b = broker(partitions=4)
    expect = generate(tmp_path, seed=20260807, events=10000, tables=3)
    records = read_records(expect["_out"])
    assert len(records) == expect["records"]
    # Partition scheme "table", as ces-gen --brokers would place them.
    parts = stream_partitions(records, 4, "table")
    assert len(set(parts)) >= 2, "the stream should use several partitions"

    daemon = ces2pg(db, b, group=GROUP)
    # The harness's default: records decoded ahead by a second thread.
    daemon.wait_log(r"decoding records on 2 thread\(s\) \(decode\.threads = 2\)")
    # Produced while the daemon joins and applies, at its pace (the mock
    # keeps only 5 MiB per partition).
    producer = PacedProducer(b, db, GROUP, "ces", records, parts).start()
    producer.finish(timeout=120, daemons=[daemon])
    monitor = OffsetMonitor(db, GROUP)
    wait_applied(db, GROUP, producer.counts, timeout=60, daemons=[daemon],
                 monitor=monitor)
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert daemon.terminate() == 0
    # A clean stop keeps everything (and moves no offset).
    assert monitor.poll() == producer.counts


def bounded_stream(tmp_path, db, broker, ces2pg, seed, events, txn_size, apply_extra):
    """Streams generated transactions round robin over 4 partitions (so that they span all of them)
    through a daemon with apply_extra; returns the daemon once every row matches."""
    b = broker(partitions=4)
    expect = generate(tmp_path, seed=seed, events=events, tables=3,
                      extra_args=["--txn-size", txn_size])
    records = read_records(expect["_out"])
    parts = stream_partitions(records, 4, "none")
    daemon = ces2pg(db, b, group=GROUP, apply_extra=apply_extra)
    producer = PacedProducer(b, db, GROUP, "ces", records, parts).start()
    producer.finish(timeout=120, daemons=[daemon])
    wait_applied(db, GROUP, producer.counts, timeout=60, daemons=[daemon])
    assert_tables_match(db, expect)
    return daemon


def test_memory_bound_never_stalls_the_stream(tmp_path, db, broker, ces2pg):
    """A tight bound on held events (apply.max_pending_events) pauses partitions again and
    again while transactions span all of them. A paused partition that the oldest held
    transaction comes to need must be resumed at once: the backlog cannot halve before it moves,
    so waiting for that stalled the stream for good."""
    daemon = bounded_stream(tmp_path, db, broker, ces2pg, 20261202, 8000, "1-20",
                            ["max_pending_events = 100;"])
    assert daemon.terminate() == 0


def test_byte_bounds_never_stall_the_stream(tmp_path, db, broker, ces2pg):
    """The same in bytes, at their smallest (64 KB): apply.max_pending_bytes pauses partitions
    again and again, apply.batch_max_bytes closes batches of a few dozen events, and source
    transactions of up to 300 events (about 1 MB) are larger than a batch in bytes though not in
    events, so they are streamed into one PostgreSQL transaction each."""
    daemon = bounded_stream(tmp_path, db, broker, ces2pg, 20261203, 6000, "1-300",
                            ["max_pending_bytes = 65536;", "batch_max_bytes = 65536;"])
    assert dead_letters(db) == []
    assert "is larger than a batch" in daemon.log()
    assert daemon.terminate() == 0
