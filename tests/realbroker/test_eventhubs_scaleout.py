"""Scale-out: several ces2pg instances in one consumer group share a topic's
partitions. One is killed with kill -9 in the middle of the stream and one
joins later; every event is still applied exactly once."""

import json
import re
import threading
import time
import zlib

import pytest

from harness.common import wait_until
from harness.events import generate, read_records
from harness.progress import OffsetMonitor, dead_letters, wait_applied
from harness.realkafka import DAEMON_PROPERTIES
from harness.tables import assert_tables_match

GROUP = "ces2pg-scaleout"
PARTITIONS = 6


def column_partitions(records, nparts):
    """Partition of each record under CES's Column scheme, as ces-gen does
    it: crc32 of the first primary key value. Every change of a row lands in
    one partition (the generator makes no key changes by default), so the
    row's order holds whichever instance owns the partition."""
    by_logicalid = {}
    parts = []
    for rec in records:
        event = json.loads(rec)
        try:
            data = json.loads(event["data"])
        except ValueError:  # a later segment: a slice of the data
            parts.append(by_logicalid[event["logicalid"]])
            continue
        value = data["eventsource"]["pkkey"][0]["value"]
        p = zlib.crc32(str(value).encode()) % nparts
        by_logicalid[event["logicalid"]] = p
        parts.append(p)
    return parts


class SteadyProducer:
    """Produces records to their partitions in a thread, at about rate
    records per second, so that the stream goes on while instances come and
    go."""

    def __init__(self, kafka, topic, records, partitions, rate):
        self.kafka, self.topic = kafka, topic
        self.records, self.partitions = records, partitions
        self.rate = rate
        self.produced = 0
        self.error = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="steady-producer")

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        try:
            producer = self.kafka.producer()
            errors = []

            def on_delivery(err, msg):
                if err is not None:
                    errors.append(err)

            started = time.monotonic()
            chunk = max(1, self.rate // 20)
            for i in range(0, len(self.records), chunk):
                for rec, p in zip(self.records[i:i + chunk],
                                  self.partitions[i:i + chunk]):
                    while True:
                        try:
                            producer.produce(self.topic, value=rec,
                                             partition=p,
                                             on_delivery=on_delivery)
                            break
                        except BufferError:
                            producer.poll(0.05)
                producer.poll(0)
                self.produced = min(i + chunk, len(self.records))
                ahead = started + self.produced / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            left = producer.flush(60)
            assert left == 0, f"{left} record(s) not delivered"
            assert not errors, errors[:5]
        except BaseException as e:  # reported by finish()
            self.error = e

    def finish(self, timeout):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "producer still running"
        if self.error is not None:
            raise self.error


def assigned_now(daemon, cooperative):
    """Partitions a daemon holds according to its log. Eager protocol: an
    assignment replaces the last one and a revocation empties it;
    cooperative: both are increments."""
    held = 0
    for m in re.finditer(r"(assigned|revoked) (\d+) partition",
                         daemon.log()):
        n = int(m.group(2))
        if m.group(1) == "assigned":
            held = held + n if cooperative else n
        else:
            held = max(0, held - n) if cooperative else 0
    return held


@pytest.mark.parametrize("strategy", ["range,roundrobin", "cooperative-sticky"])
def test_three_instances_one_killed_one_added(tmp_path, db, kafka, topic,
                                              eventhubs_daemon, strategy):
    t = topic(PARTITIONS)
    expect = generate(tmp_path, seed=6006, events=24000, tables=4)
    records = read_records(expect["_out"])
    parts = column_partitions(records, PARTITIONS)
    counts = {}
    for p in parts:
        counts[p] = counts.get(p, 0) + 1
    assert len(counts) == PARTITIONS, counts
    total = len(records)
    monitor = OffsetMonitor(db, GROUP, t)

    cooperative = strategy.startswith("cooperative")
    properties = DAEMON_PROPERTIES + (
        f"partition.assignment.strategy={strategy}",)

    def start():
        # Sharing partitions is partition order's: transaction order has one writer
        # (test_writer_takeover.py).
        return eventhubs_daemon(db, t, group=GROUP, batch_max_events=200,
                                properties=properties,
                                apply_extra=['ordering = "partition";'])

    # All three start together: they also race to create the target tables.
    daemons = [start(), start(), start()]

    def all_assigned():
        for d in daemons:
            d.check_alive()
        held = [assigned_now(d, cooperative) for d in daemons]
        return sum(held) == PARTITIONS and all(held) and held

    held = wait_until(all_assigned, 60, interval=0.1,
                      message="6 partitions spread over 3 instances")
    print(f"partitions per instance: {held}")

    producer = SteadyProducer(kafka, t, records, parts, rate=2000).start()

    def progress(fraction, alive):
        def reached():
            for d in alive:
                d.check_alive()
            monitor.poll()
            return monitor.total() >= total * fraction
        return reached

    wait_until(progress(0.25, daemons), 60, interval=0.05,
               message=lambda: f"25% applied (offsets {monitor.last})")
    victim = daemons.pop(1)
    assert victim.kill9() == -9
    print(f"killed one instance at {monitor.total()}/{total}")

    wait_until(progress(0.5, daemons), 90, interval=0.05,
               message=lambda: f"50% applied (offsets {monitor.last})")
    daemons.append(start())
    print(f"added one instance at {monitor.total()}/{total}")

    producer.finish(timeout=120)
    wait_applied(db, GROUP, counts, timeout=120, topic=t, daemons=daemons,
                 monitor=monitor)
    dls = [(d["partition"], d["offset"], d["reason"]) for d in dead_letters(db)]
    assert dls == [], f"dead letters: {dls}"
    assert_tables_match(db, expect)
    # The late instance got a share.
    wait_until(lambda: assigned_now(daemons[-1], cooperative) > 0, 30,
               message="the added instance to hold partitions")
    for d in daemons:
        assert d.terminate() == 0
    assert monitor.poll() == counts
