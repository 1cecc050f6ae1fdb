"""Transaction order with more than one instance: one writer, warm standbys
(apply/writer.h). A standby is connected and ready but not in the consumer
group; it takes over when the writer is killed (kill -9), stopped (SIGTERM) or
frozen (SIGSTOP, past its lease), and a writer that lost the role applies
nothing more: its batches are fenced on its epoch in their own transaction.
Rows end exact and no stored position ever moves backwards. (Against Apache
Kafka, with a bank across partitions and a reader: tests/realbroker/
test_writer_takeover.py.)"""

import json
import os
import re
import signal
import time

from harness.common import free_port, wait_until
from harness.daemon import run_ces2pg
from harness.events import event_record
from harness.metrics import http_get, metric, parse_metrics
from harness.progress import BackgroundOffsetMonitor, read_offsets, wait_applied
from harness.proxy import CuttableProxy
from harness.tables import record_applied_changes

GROUP = "ces2pg-ha"
LEASE_MS = 3000


def rows(start, n):
    return [event_record("Orders", [("OrderId", "int"), ("Customer", "nvarchar(50)")],
                         {"OrderId": str(i), "Customer": f"c{i}"}, ["OrderId"])
            for i in range(start, start + n)]


def instance(ces2pg, db, b, **kw):
    port = free_port()
    d = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}",
               extra_config=f"ha = {{ lease_ms = {LEASE_MS}; }};", **kw)
    d.port = port
    return d


def role(d):
    status, body = http_get(f"http://127.0.0.1:{d.port}/metrics")
    return metric(parse_metrics(body), "ces2pg_writer") if status == 200 else None


def window_seconds(d):
    status, body = http_get(f"http://127.0.0.1:{d.port}/metrics")
    return metric(parse_metrics(body), "ces2pg_reorder_window_seconds")


def readyz(d):
    return http_get(f"http://127.0.0.1:{d.port}/readyz")


def assert_rows(db, n):
    got = db.query("SELECT orderid FROM dbo.orders ORDER BY orderid")
    assert [r[0] for r in got] == list(range(n)), got[-5:]


def applied_within(db, b, start, seconds, daemons):
    """Produces row start, waits until it is applied; returns how long it took."""
    began = time.monotonic()
    b.produce("ces", rows(start, 1), partition=start % 2)
    wait_until(lambda: db.scalar("SELECT count(*) FROM dbo.orders WHERE orderid = %s",
                                 (start,)) == 1, seconds, interval=0.02,
               message=f"row {start} applied within {seconds} s")
    return time.monotonic() - began


def writer_and_standby(ces2pg, db, b):
    """A writer, then a standby, and rows 0-9 applied by the writer."""
    a = instance(ces2pg, db, b)
    a.wait_log(r"writer of group")
    s = instance(ces2pg, db, b)
    s.wait_log(r"standby for group")
    b.produce("ces", rows(0, 10), partition=0)
    wait_applied(db, GROUP, {0: 10}, daemons=[a, s])
    return a, s


def stop(d):
    assert d.terminate() == 0


def takeover(db, b, end_writer, standby, epoch, row, how):
    """Ends the writer; the standby must have the role (epoch) within 1.5 s and then apply
    row."""
    ended = time.monotonic()
    end_writer()
    standby.wait_log(r"writer of group 'ces2pg-ha' \(epoch %d, " % epoch, timeout=10)
    role_taken = time.monotonic() - ended
    took = applied_within(db, b, row, 15, [standby])
    print(f"takeover after {how}: role in {role_taken:.2f} s, applying after "
          f"{role_taken + took:.2f} s")
    assert role_taken <= 1.5, role_taken


def test_one_writer_and_a_standby_that_takes_over(tmp_path, db, broker, ces2pg):
    b = broker(partitions=2)
    watcher = BackgroundOffsetMonitor(db, GROUP).start()
    try:
        a = instance(ces2pg, db, b)
        a.wait_log(r"writer of group 'ces2pg-ha' \(epoch 1, as ")
        s = instance(ces2pg, db, b)
        s.wait_log(r"standby for group 'ces2pg-ha': .* writes; taking over when it stops")
        wait_until(lambda: role(s) == 0 and role(a) == 1, 10, message="roles on /metrics")
        status, body = readyz(s)
        assert status == 200 and "standby" in body, body
        # ces2pg status says which instance writes and which stands by, and since when.
        rc, out, err = run_ces2pg(["status", "--json", "-c", a.config_path])
        roles = {(i["role"], i["holder"].split("/")[-1]) for i in json.loads(out)["instances"]}
        assert roles == {("writer", str(a.proc.pid)), ("standby", str(s.proc.pid))}, out + err
        rc, out, err = run_ces2pg(["status", "-c", a.config_path])
        assert re.search(r"^instances: writer \S+/%d since .*, standby \S+/%d since " %
                         (a.proc.pid, s.proc.pid), out, re.M), out
        b.produce("ces", rows(0, 20), partition=0)
        wait_applied(db, GROUP, {0: 20}, daemons=[a, s])
        assert "assigned" not in s.log(), "a standby joined the consumer group"

        # kill -9: the writer's session ends, its advisory lock with it: the standby has the
        # role within a second. librdkafka's mock cluster then waits for the dead member's
        # session (session.timeout.ms, 4 s here) where Apache Kafka replaces its static
        # membership at once (tests/realbroker/test_writer_takeover.py holds that to 5 s).
        # What the writer's reorder window learned about the partitions' lag goes with the
        # stream: the next writer starts from the window stored with the last commit (set here
        # in its place: growing it takes torn transactions, tests/realbroker/
        # test_eventhubs_torn.py). The writer is idle: no commit overwrites it.
        db.query("UPDATE ces2pg.progress SET reorder_window_ms = 1500 WHERE group_id = %s",
                 (GROUP,))
        takeover(db, b, lambda: a.kill9(), s, epoch=2, row=20, how="kill -9")
        s.wait_log(r"reorder window: \d+ ms -> 1500 ms, as the stream's last writer left it")
        assert window_seconds(s) == 1.5

        # SIGTERM: the writer gives the role up at once.
        c = instance(ces2pg, db, b)
        c.wait_log(r"standby for group")
        takeover(db, b, lambda: stop(s), c, epoch=3, row=21, how="SIGTERM")
    finally:
        watcher.stop()
    assert watcher.monitor.polls > 20
    assert_rows(db, 22)
    assert c.terminate() == 0


def test_a_frozen_writer_is_replaced_and_writes_nothing_more(tmp_path, db, broker, ces2pg):
    """SIGSTOP while a batch waits on a lock the test holds: the batch was sent, so the frozen
    writer "still holds a batch" when the standby takes over past the lease. The lock goes; the
    new writer applies; the old one's batch is refused by its epoch. SIGCONT: the old writer
    finds the role gone, steps down and becomes a standby."""
    b = broker(partitions=2)
    a, s = writer_and_standby(ces2pg, db, b)
    record_applied_changes(db)
    watcher = BackgroundOffsetMonitor(db, GROUP).start()
    holder = db.connect()
    try:
        holder.autocommit = False
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE dbo.orders IN ACCESS EXCLUSIVE MODE")
        b.produce("ces", rows(10, 5), partition=1)
        wait_until(lambda: db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query NOT LIKE '%%pg_stat_activity%%'") > 0, 30,
            message="the writer's batch waits on the lock")
        os.kill(a.proc.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        s.wait_log(r"writer of group 'ces2pg-ha' \(epoch 2, ", timeout=LEASE_MS / 1000 + 10)
        print(f"takeover of a frozen writer: {time.monotonic() - frozen:.2f} s "
              f"(lease {LEASE_MS} ms)")
        holder.rollback()
        wait_applied(db, GROUP, {0: 10, 1: 5}, daemons=[s])
        os.kill(a.proc.pid, signal.SIGCONT)
        a.wait_log(r"stepping down", timeout=30)
        a.wait_log(r"standby for group 'ces2pg-ha'", timeout=30)
        b.produce("ces", rows(15, 5), partition=0)
        wait_applied(db, GROUP, {0: 15, 1: 5}, daemons=[s, a])
    finally:
        holder.close()
        watcher.stop()
    assert_rows(db, 20)
    # The old writer's batch never committed: each change was applied once, by the new writer.
    assert db.query("SELECT orderid, count(*) FROM public.applied GROUP BY 1 ORDER BY 1") == \
        [(i, 1) for i in range(10, 20)]
    assert role(a) == 0 and role(s) == 1
    assert s.terminate() == 0
    assert a.terminate() == 0


def test_partition_order_has_no_writer(tmp_path, db, broker, ces2pg):
    b = broker(partitions=2)
    a = ces2pg(db, b, group=GROUP, apply_extra=['ordering = "partition";'])
    a.wait_log(r"assigned \d+ partition")
    assert "writer of group" not in a.log() and "standby" not in a.log()
    assert db.scalar("SELECT count(*) FROM ces2pg.writers") == 0
    assert a.terminate() == 0


def test_a_writer_that_owns_part_of_the_partitions_says_so(tmp_path, db, broker, ces2pg):
    """Something else joins the group (here an instance in partition order): the writer then owns
    only some partitions, and atomicity across them is gone. It says so once, and /metrics counts
    the partitions it does not own."""
    b = broker(partitions=4)
    a = instance(ces2pg, db, b)
    a.wait_log(r"writer of group")
    a.wait_log(r"assigned 4 partition")
    other = ces2pg(db, b, group=GROUP, apply_extra=['ordering = "partition";'])
    other.wait_log(r"assigned \d+ partition")
    a.wait_log(r"transaction order: this writer of group 'ces2pg-ha' owns [0-3] of the 4 "
               r"partitions of its topics", timeout=30)

    def unowned():
        body = http_get(f"http://127.0.0.1:{a.port}/metrics")[1]
        return metric(parse_metrics(body), "ces2pg_partitions_not_owned")
    wait_until(lambda: (unowned() or 0) > 0, 15, message="ces2pg_partitions_not_owned > 0")
    assert other.terminate() == 0
    assert a.terminate() == 0


def test_a_writer_cut_off_from_kafka_steps_down(tmp_path, db, broker, ces2pg):
    """No broker answers the writer for longer than a lease: it gives the role up (a standby with
    a working path could write), and waits a lease before it competes again. When the broker is
    back, whichever instance writes applies the rest exactly."""
    b = broker(partitions=2, control=True)
    a, s = writer_and_standby(ces2pg, db, b)
    b.command("down 1")
    down = time.monotonic()
    a.wait_log(r"no Kafka broker could be reached for \d+ ms: stepping down",
               timeout=LEASE_MS / 1000 + 30)
    print(f"the writer stepped down {time.monotonic() - down:.1f} s after the broker went down")
    b.command("up 1")
    b.produce("ces", rows(10, 10), partition=1)
    wait_applied(db, GROUP, {0: 10, 1: 10}, daemons=[a, s], timeout=90)
    assert_rows(db, 20)
    assert s.terminate() == 0
    assert a.terminate() == 0


def test_a_standby_cut_off_from_postgresql_stays_a_standby(tmp_path, db, broker, ces2pg):
    b = broker(partitions=2)
    a = instance(ces2pg, db, b)
    a.wait_log(r"writer of group")
    proxy = CuttableProxy(db.server)
    try:
        s = instance(ces2pg, db, b, conninfo=proxy.conninfo(db.conninfo))
        s.wait_log(r"standby for group")
        proxy.cut()
        s.wait_log(r"standby for group 'ces2pg-ha': cannot ask PostgreSQL who writes: ",
                   timeout=30)
        wait_until(lambda: readyz(s)[0] == 503, 15, message="the standby not ready")
        b.produce("ces", rows(0, 10), partition=0)
        wait_applied(db, GROUP, {0: 10}, daemons=[a, s])
        time.sleep(LEASE_MS / 1000 + 1)  # longer than a lease: it must not take the role
        assert "writer of group" not in s.log()
        assert s.alive() and role(s) == 0
        proxy.restore()
        wait_until(lambda: readyz(s)[0] == 200, 30, message="the standby ready again")
        assert "writer of group" not in s.log()
        assert s.terminate() == 0
    finally:
        proxy.cut()
    assert_rows(db, 10)
    assert a.terminate() == 0


def test_postgresql_restarting_under_a_writer_and_a_standby(tmp_path, db, broker, ces2pg):
    """PostgreSQL restarts: every session ends, the writer's advisory lock
    with it, so the standby may take the role. Whichever writes afterwards applies the rest
    exactly, and the other stands by."""
    b = broker(partitions=2)
    a, s = writer_and_standby(ces2pg, db, b)
    for n in range(2):
        db.server.restart(2.6)
        b.produce("ces", rows(10 + 10 * n, 10), partition=1)
        wait_applied(db, GROUP, {0: 10, 1: 10 * (n + 1)}, daemons=[a, s], timeout=60)
    assert_rows(db, 30)
    wait_until(lambda: sorted([role(a), role(s)]) == [0, 1], 30, message="one writer")
    assert s.terminate() == 0
    assert a.terminate() == 0
