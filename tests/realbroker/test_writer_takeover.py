"""Transaction order with a writer and two warm standbys on Apache Kafka: a
bank whose every transfer is one source transaction with an event on each of
two partitions, a reader checking the total money as fast as it can, and the
writer killed (kill -9) five times and stopped (SIGTERM) twice at random
moments. Rows end exact, no snapshot shows a transaction in part, no change is
applied twice, and each takeover (from the writer's end to the next change
applied) takes at most 5 s: the standby gets the role as soon as the writer's
session is gone, and joins under the writer's static membership, which Kafka
hands over at once."""

import random
import time

from harness.common import wait_until
from harness.lagbank import (LAG_DDL, LAG_TORN_QUERY, LAG_TWICE_QUERY, InvariantReader,
                             LaggingProducer, lag_bank_stream)
from harness.progress import BackgroundOffsetMonitor, dead_letters, read_offsets, wait_applied
from harness.tables import assert_tables_match

GROUP = "ces2pg-writers"


def applied(db, topic):
    return sum(read_offsets(db, GROUP, topic).values())


def test_writer_killed_and_stopped_standbys_take_over(tmp_path, db, kafka, topic,
                                                      eventhubs_daemon):
    t = topic(2)
    accounts, transfers = 20, 4000
    a, b, total, expect = lag_bank_stream(tmp_path, accounts, transfers, seed=4401)
    db.query(LAG_DDL)
    started = []

    def instance():
        # A transfer's second event comes at most 0.1 s after its first: a window of 1 s leaves
        # room for a loaded machine's stalls, so that what this test counts is the takeovers'
        # doing, not the window's bet (tests/realbroker/test_eventhubs_torn.py tests that).
        d = eventhubs_daemon(db, t, group=GROUP, apply_extra=("reorder_window_ms = 1000;",))
        started.append(d)
        return d

    # Both partitions busy at once (a little lag on the second): a transfer's two events arrive
    # on two partitions, one writer must hold them both. The stream starts first: a writer that
    # found a partition idle for longer than its window would take it for caught up and quiet,
    # and tear the first transfers whatever the takeovers do (harness/lagbank.py says why).
    producer = LaggingProducer(kafka.producer, t, a, b, 0, 1, rate=60, lag=(0.02, 0.1)).start()
    wait_until(lambda: producer.sent_b > 0 or producer.errors, 30, message="both partitions fed")
    writer = instance()
    writer.wait_log(r"writer of group", timeout=60)
    standbys = [instance(), instance()]
    for s in standbys:
        s.wait_log(r"standby for group", timeout=60)
    reader = InvariantReader(db, accounts, total)
    watcher = BackgroundOffsetMonitor(db, GROUP, interval=0.05, topic=t)
    rng = random.Random(4402)
    takeovers = []
    try:
        wait_until(lambda: applied(db, t) > 100, 60, message="the writer applies")
        reader.start()
        watcher.start()
        for how in ["kill9"] * 5 + ["sigterm"] * 2:
            time.sleep(rng.uniform(1.0, 3.0))
            assert producer.sent_a < len(a), "the stream ended before the last round"
            ended = time.monotonic()
            if how == "kill9":
                writer.kill9()
            else:
                assert writer.terminate() == 0
            # The old writer is gone: what is applied after a standby has the role is the
            # new writer's.
            wait_until(lambda: any("writer of group" in s.log() for s in standbys), 10,
                       interval=0.02, message=f"a standby takes the role after {how}")
            writer = next(s for s in standbys if "writer of group" in s.log())
            standbys.remove(writer)
            at_role = applied(db, t)
            wait_until(lambda: applied(db, t) > at_role, 10, interval=0.02,
                       message=f"the new writer applies after the old one's {how}")
            took = time.monotonic() - ended
            print(f"round {len(takeovers) + 1} ({how}): takeover in {took:.2f} s")
            takeovers.append((how, took))
            standbys.append(instance())
            standbys[-1].wait_log(r"standby for group", timeout=60)
        producer.finish(300)
        wait_applied(db, GROUP, {0: len(a), 1: len(b)}, timeout=120, topic=t,
                     daemons=[writer])
    finally:
        producer.finish(300)
        if reader.started():
            reader.stop()
        if watcher.started():
            watcher.stop()
    print("takeovers: " + ", ".join(f"{h} {s:.2f} s" for h, s in takeovers))
    assert all(took <= 5.0 for _, took in takeovers), takeovers
    torn = db.scalar(LAG_TORN_QUERY)
    print(f"partial snapshots: {len(reader.bad_since())}, source transactions committed in "
          f"parts: {torn}")
    assert reader.bad_since() == [], "a reader saw part of a source transaction"
    assert torn == 0, "a source transaction was committed in parts"
    assert len(reader.complete_since()) > 100
    assert db.scalar(LAG_TWICE_QUERY) == 0, "a change was applied twice"
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    for d in [writer] + standbys:
        assert d.terminate() == 0
