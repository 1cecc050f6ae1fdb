"""Transaction order on Apache Kafka: a writer whose consumer Kafka fences. The
writer is cut off from PostgreSQL (its path only) with a batch read: its
advisory lock ends with its session, the standby takes the role at once and
joins under the writer's static membership name, and Kafka fences the old
writer's consumer while that writer still retries PostgreSQL, long before its
lease runs out. When its path comes back, the old writer must commit nothing
(its epoch is fenced), stay alive and stand by; the new writer applies
everything once; and when the new writer dies, the old one writes again, in a
new term. (The chaos suite met both after PostgreSQL crashes: the old writer
exited 1, first on its fenced consumer, then on the partitions that consumer
never gave back.)"""

from harness.events import event_record
from harness.progress import read_offsets, wait_applied
from harness.proxy import CuttableProxy
from harness.tables import record_applied_changes

GROUP = "ces2pg-fenced"
# Long, so that the old writer's own deadline (70% of it without a renewal) comes long after
# Kafka fences it: the standby takes over by the lock at once, not by the lease.
HA = "ha = { lease_ms = 30000; };"


def rows(start, n):
    return [event_record("Orders", [("OrderId", "int"), ("Customer", "nvarchar(50)")],
                         {"OrderId": str(i), "Customer": f"c{i}"}, ["OrderId"])
            for i in range(start, start + n)]


def produce(kafka, t, start, n, partition):
    kafka.produce(t, rows(start, n), [partition] * n)


def test_a_writer_fenced_by_kafka_stands_by(tmp_path, db, kafka, topic, eventhubs_daemon):
    t = topic(2)
    proxy = CuttableProxy(db.server)
    try:
        old = eventhubs_daemon(db, t, group=GROUP, extra_config=HA,
                               conninfo=proxy.conninfo(db.conninfo))
        old.wait_log(r"writer of group", timeout=60)
        new = eventhubs_daemon(db, t, group=GROUP, extra_config=HA)
        new.wait_log(r"standby for group", timeout=60)
        produce(kafka, t, 0, 10, 0)
        wait_applied(db, GROUP, {0: 10}, timeout=60, topic=t, daemons=[old, new])
        record_applied_changes(db)

        # The cut closes the writer's sessions; PostgreSQL ends them (and the advisory lock) when
        # it notices, which is made certain here rather than left to its timing.
        ports = proxy.server_ports()
        proxy.cut()
        db.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE client_port = ANY(%s)", (ports,))
        produce(kafka, t, 10, 10, 1)
        old.wait_log(r"rolling back and retrying the batch|cannot connect to PostgreSQL",
                     timeout=30)
        new.wait_log(r"writer of group '%s' \(epoch 2, " % GROUP, timeout=30)
        old.wait_log(r"Static consumer fenced", timeout=30)
        # It steps down for the fence (now, or once PostgreSQL answers again), not for its lease.
        assert "could not be renewed" not in old.log(), \
            "the old writer stepped down for its lease before Kafka fenced it"
        proxy.restore()
        old.wait_log(r"another instance joined the consumer group as the writer: "
                     r"stepping down", timeout=30)
        old.wait_log(r"stepped down: a standby again", timeout=30)
        old.wait_log(r"standby for group '%s'" % GROUP, timeout=30)

        wait_applied(db, GROUP, {0: 10, 1: 10}, timeout=60, topic=t, daemons=[old, new])
        produce(kafka, t, 20, 10, 0)
        wait_applied(db, GROUP, {0: 20, 1: 10}, timeout=60, topic=t, daemons=[old, new])
        # The old writer writes again, in a new term with a new consumer: nothing of the fenced
        # one (records read, a batch refused, partitions it never gave back) may be in its way.
        new.kill9()
        old.wait_log(r"writer of group '%s' \(epoch 3, " % GROUP, timeout=30)
        produce(kafka, t, 30, 10, 1)
        wait_applied(db, GROUP, {0: 20, 1: 20}, timeout=60, topic=t, daemons=[old])
    finally:
        proxy.cut()
    got = db.query("SELECT orderid FROM dbo.orders ORDER BY orderid")
    assert [r[0] for r in got] == list(range(40)), got[-5:]
    # Each change after the cut was applied once.
    assert db.query("SELECT orderid, count(*) FROM public.applied GROUP BY 1 ORDER BY 1") == \
        [(i, 1) for i in range(10, 40)]
    assert read_offsets(db, GROUP, t) == {0: 20, 1: 20}
    assert old.alive()
    assert old.terminate() == 0
