"""The lagging-partition bank over a real broker, in Event Hubs mode: the
adaptive reorder window stops tearing transactions once it has seen how late
a partition's events come (tests/integration/test_torn.py has the rest)."""

from harness.lagbank import run_lagging_bank
from harness.metrics import metric, metric_sum

GROUP = "ces2pg-test"


def test_adaptive_window_over_a_real_broker(tmp_path, db, kafka, topic, eventhubs_daemon):
    t = topic(2)

    def start_daemon(port):
        return eventhubs_daemon(db, t, group=GROUP, http_listen=f"127.0.0.1:{port}")

    reader, _, torn, m, started = run_lagging_bank(
        tmp_path, db, lambda: kafka.producer(**{"linger.ms": 0}), start_daemon, t, GROUP,
        accounts=50, transfers=3000, rate=150, lag=(0.3, 0.5))
    assert torn > 0, "partition 1's silences never tore a transaction"
    assert metric(m, "ces2pg_transactions_torn_total", topic=t, partition="1") == torn
    assert metric_sum(m, "ces2pg_transactions_torn_total") == torn
    assert metric(m, "ces2pg_late_events_total") == torn
    assert 0.5 <= metric(m, "ces2pg_reorder_window_seconds") <= 5.0
    bad = reader.bad_since(started)
    first = min(bad) if bad else started
    # ... which is where the first silences longer than the start window come.
    assert first < started + 10, f"the first partial total {first - started:.1f} s in"
    assert all(t_ < first + 5 for t_ in bad), \
        f"partial totals from {first - started:.1f} s to {max(bad) - started:.1f} s"
    assert len(reader.complete_since(first + 5)) >= 2000, len(reader.reads)
