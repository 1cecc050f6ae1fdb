"""Torn transactions and the adaptive reorder window (transaction mode).

A source transaction is released when every partition has passed it or is
caught up and quiet for the reorder window. Here every transaction touches
one account on partition 0 and one on partition 1, and partition 1 runs
behind in bursts: with a window shorter than its silences, transactions are
committed in parts (torn). Each test counts torn transactions exactly, from
PostgreSQL's side (a trigger records which PostgreSQL transaction each
change went in), and compares them with ces2pg's metrics, while a reader
checks the bank's total in every snapshot it can take.
"""

import time

from confluent_kafka import Producer

from harness.lagbank import run_lagging_bank
from harness.metrics import metric, metric_sum

GROUP = "ces2pg-test"
TOPIC = "ces"
ACCOUNTS = 50


def run_lagging(tmp_path, db, b, ces2pg, lag, transfers, rate, apply_extra=()):
    def make_producer():
        return Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True,
                         "linger.ms": 0})

    def start_daemon(port):
        return ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}",
                      apply_extra=list(apply_extra))

    return run_lagging_bank(tmp_path, db, make_producer, start_daemon, TOPIC, GROUP,
                            ACCOUNTS, transfers, rate, lag)


def test_adaptive_window_stops_tearing(tmp_path, db, broker, ces2pg):
    """Partition 1 lags 300-500 ms in bursts. The first silences longer than
    the window tear transactions; the window grows to cover the lateness seen,
    and from then on no reader sees a partial total."""
    b = broker(partitions=2)
    reader, producer, torn, m, started = run_lagging(
        tmp_path, db, b, ces2pg, lag=(0.3, 0.5), transfers=3000, rate=150)
    assert producer.longest_lag >= 0.3
    # Torn transactions happened, and ces2pg counted each one, by the
    # partition whose event came late, and each late event.
    assert torn > 0, "partition 1's silences never tore a transaction"
    assert metric_sum(m, "ces2pg_transactions_torn_total") == torn
    assert metric(m, "ces2pg_transactions_torn_total", topic=TOPIC, partition="1") == torn
    assert metric(m, "ces2pg_late_events_total") == torn  # one event of B per transaction
    # The window grew to cover partition 1's lag (up to 500 ms between
    # bursts), and no further than apply.reorder_window_max_ms.
    window = metric(m, "ces2pg_reorder_window_seconds")
    assert 0.5 <= window <= 5.0, (window, producer.longest_lag)
    # Partial totals only while the window adapted, in the first seconds of
    # the stream; none after that, over thousands of complete reads.
    bad = reader.bad_since(started)
    first = min(bad) if bad else started
    # ... which is where the first silences longer than the start window come.
    assert first < started + 10, f"the first partial total {first - started:.1f} s in"
    assert all(t < first + 5 for t in bad), \
        f"partial totals from {first - started:.1f} s to {max(bad) - started:.1f} s"
    assert len(reader.complete_since(first + 5)) >= 2000, len(reader.reads)


def test_fixed_window_counts_every_torn_transaction(tmp_path, db, broker, ces2pg):
    """apply.reorder_window_adaptive = false: the window stays at 200 ms,
    transactions keep being torn, and the counter rises with every one."""
    b = broker(partitions=2)
    reader, _, torn, m, started = run_lagging(
        tmp_path, db, b, ces2pg, lag=(0.3, 0.5), transfers=1000, rate=150,
        apply_extra=["reorder_window_adaptive = false;"])
    assert torn > 5
    assert metric(m, "ces2pg_transactions_torn_total", topic=TOPIC, partition="1") == torn
    assert metric(m, "ces2pg_late_events_total") == torn
    assert metric(m, "ces2pg_reorder_window_seconds") == 0.2
    assert reader.bad_since(started + 2), "a reader saw no partial total"


def test_lag_within_the_window_tears_nothing(tmp_path, db, broker, ces2pg):
    """Partition 1 lags 50-100 ms, within the default window: nothing is torn,
    nothing is late, the window stays where it starts."""
    b = broker(partitions=2)
    reader, _, torn, m, _ = run_lagging(
        tmp_path, db, b, ces2pg, lag=(0.05, 0.1), transfers=1000, rate=150)
    assert torn == 0
    assert metric_sum(m, "ces2pg_transactions_torn_total") == 0
    assert metric(m, "ces2pg_late_events_total") == 0
    assert metric(m, "ces2pg_reorder_window_seconds") == 0.2
    assert reader.bad_since() == []
    assert len(reader.complete_since()) > 100


def test_partition_mode_counts_nothing(tmp_path, db, broker, ces2pg):
    """apply.ordering = "partition" promises no atomicity: no window, and
    nothing is counted as torn or late however far partition 1 lags."""
    b = broker(partitions=2)
    _, _, torn, m, _ = run_lagging(
        tmp_path, db, b, ces2pg, lag=(0.3, 0.5), transfers=300, rate=150,
        apply_extra=['ordering = "partition";'])
    assert torn > 0  # transactions were applied in parts, as promised
    assert metric_sum(m, "ces2pg_transactions_torn_total") == 0
    assert metric(m, "ces2pg_late_events_total") == 0
    assert metric(m, "ces2pg_reorder_window_seconds") is None
