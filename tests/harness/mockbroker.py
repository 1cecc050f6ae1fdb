"""librdkafka's mock cluster as a process (ces-mock-broker, built from
tools/ces-mock-broker.c with ces2pg), and producing to a broker: in order,
to given partitions, or paced by what ces2pg has applied so that the mock's
retention never drops unread data.
"""

import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import psycopg2

from harness.common import MOCK_BROKER, child_env, produce_all, require_binary
from harness.progress import read_offsets_conn
from harness.reports import attach_log, tail_text


def _readline_with_timeout(stream, timeout):
    """Reads one line from a pipe, or returns None after timeout seconds."""
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode()


class Broker:
    """A running ces-mock-broker process. With control, its control channel
    is open: command() sends it a command (down, up, errors, clear)."""

    def __init__(self, tmp_path, partitions, topics, brokers, request=None,
                 control=False):
        require_binary(MOCK_BROKER, "ces-mock-broker")
        self.topics = {t: partitions for t in topics}
        self.brokers = brokers
        self.log_path = Path(tmp_path) / f"mock-broker-{id(self):x}.log"
        args = [str(MOCK_BROKER), "--brokers", str(brokers)]
        for t in topics:
            args += ["--topic", f"{t}:{partitions}"]
        if control:
            args.append("--control")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self._log, env=child_env(),
            stdin=subprocess.PIPE if control else None,
        )
        if request is not None:
            attach_log(request, f"ces-mock-broker log ({self.log_path})",
                        self.log_path)
        line = _readline_with_timeout(self.proc.stdout, 20)
        if not line or not line.strip():
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"ces-mock-broker printed no bootstrap line "
                f"(exit {self.proc.returncode}):\n{tail_text(self.log_path)}"
            )
        self.bootstrap = line.strip()
        self._producer = None
        self.stopped = False

    def producer(self):
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,  # keeps per-partition order
                "linger.ms": 5,
                "message.timeout.ms": 30000,
            })
        return self._producer

    def produce(self, topic, values, partition=None, key=None):
        """Produces values (bytes or str) in order; waits for delivery.

        Returns a list of (partition, offset) per value, in input order.
        """
        parts = None if partition is None else [partition] * len(values)
        return produce_all(self.producer(), topic, values, parts, key)

    def consume(self, topic, count, group="harness-selftest", timeout=30):
        """Consumes count values from topic with a group consumer."""
        from confluent_kafka import Consumer

        consumer = Consumer({
            "bootstrap.servers": self.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 4000,
            "heartbeat.interval.ms": 500,
        })
        try:
            consumer.subscribe([topic])
            got = []
            deadline = time.monotonic() + timeout
            while len(got) < count and time.monotonic() < deadline:
                msg = consumer.poll(0.1)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                got.append((msg.partition(), msg.offset(), msg.value()))
            return got
        finally:
            consumer.close()

    def command(self, line, timeout=10):
        """Sends one command on the control channel (control=True) and waits
        for its reply; fails unless the reply is "ok"."""
        assert self.proc.stdin is not None, "broker started without control"
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        # One command at a time: the reply is the only line on the way.
        reply = _readline_with_timeout(self.proc.stdout, timeout)
        if reply is None or not reply.strip():
            raise AssertionError(
                f"ces-mock-broker: no reply to {line!r} within {timeout}s "
                f"(exit {self.proc.poll()}):\n{tail_text(self.log_path)[-2000:]}")
        assert reply.strip() == "ok", f"ces-mock-broker: {line!r}: {reply.strip()}"

    def stop(self):
        """SIGTERM; returns the exit code."""
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode


def watermarks(client, topic, partitions):
    """{partition: (low, high)}: where each partition's log starts and ends, asked of the broker.
    client is a broker fixture (its bootstrap) or a librdkafka client configuration."""
    from confluent_kafka import Consumer, TopicPartition

    config = client if isinstance(client, dict) else {"bootstrap.servers": client.bootstrap}
    c = Consumer(dict(config, **{"group.id": "watermarks", "log_level": 0}))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                for p in partitions}
    finally:
        c.close()


def produce_placed(broker, topic, records, partitions, producer_config=None):
    """Produces records[i] to partitions[i], in list order (so in order
    within each partition); waits for delivery. Returns {partition: count}.

    producer_config: more librdkafka properties for a producer of its own
    (e.g. {"batch.num.messages": 16} for small message sets).
    """
    counts = {}
    for p in partitions:
        counts[p] = counts.get(p, 0) + 1
    if producer_config:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": broker.bootstrap,
                             "enable.idempotence": True, "linger.ms": 5,
                             **producer_config})
    else:
        producer = broker.producer()
    produce_all(producer, topic, records, partitions)
    return counts


# librdkafka 2.0.2's mock cluster keeps at most 5 MiB (and 100,000
# messages) per partition: on append it drops the oldest message sets, read
# or not, and a consumer behind them gets OFFSET_OUT_OF_RANGE and jumps
# (auto.offset.reset). Streams bigger than that must be produced at the pace
# the daemon applies them.
MOCK_PARTITION_BYTES = 5 * 1024 * 1024


class PacedProducer:
    """Produces records in order in a background thread, never letting the
    bytes a partition holds beyond the group's applied offset (as stored in
    ces2pg.offsets) exceed max_backlog, so the mock never drops unread data.

    start() returns self; finish() waits for the end and raises the thread's
    error. counts: records per partition; placed[i]: (partition, offset).
    """

    def __init__(self, broker, db, group, topic, records, partitions,
                 max_backlog=2 * 1024 * 1024, stall_timeout=90):
        assert len(records) == len(partitions)
        self.broker, self.db, self.group, self.topic = broker, db, group, topic
        self.records = [r.encode() if isinstance(r, str) else r
                        for r in records]
        self.partitions = list(partitions)
        self.max_backlog = max_backlog
        self.stall_timeout = stall_timeout
        self.counts = {}
        for p in self.partitions:
            self.counts[p] = self.counts.get(p, 0) + 1
        self.placed = [None] * len(self.records)
        self.produced = 0
        self.error = None
        self.waits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="paced-producer")

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(30)

    def finish(self, timeout=120, daemons=()):
        """Waits until every record is delivered; fails early if one of
        daemons exits."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive():
            for d in daemons:
                if not d.alive():
                    self.stop()
                    d.check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"paced producer not done after {timeout}s: "
                    f"{self.produced}/{len(self.records)} produced")
            self._thread.join(0.1)
        if self.error is not None:
            raise self.error

    def _run(self):
        from confluent_kafka import Producer

        conn = None
        producer = Producer({
            "bootstrap.servers": self.broker.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 256 * 1024,  # small message sets: fine-grained trim
        })
        errors = []
        try:
            cum = {}  # partition -> cumulative bytes by offset
            for rec, p in zip(self.records, self.partitions):
                c = cum.setdefault(p, [0])
                c.append(c[-1] + len(rec))
            applied = {}
            next_offset = {}
            last_progress = time.monotonic()

            def on_delivery(index):
                def cb(err, msg):
                    if err is not None:
                        errors.append(f"record {index}: {err}")
                    else:
                        self.placed[index] = (msg.partition(), msg.offset())
                return cb

            for i, (rec, p) in enumerate(zip(self.records, self.partitions)):
                k = next_offset.get(p, 0)
                c = cum[p]
                while (k > applied.get(p, 0)
                       and c[k + 1] - c[applied.get(p, 0)] > self.max_backlog):
                    if self._stop.is_set():
                        return
                    left = producer.flush(30)
                    assert left == 0, f"{left} records not delivered"
                    before = dict(applied)
                    try:
                        if conn is None:
                            conn = self.db.connect()
                        applied = read_offsets_conn(conn, self.group, self.topic)
                    except psycopg2.OperationalError:
                        # The server may be restarted by the test: reconnect next round.
                        if conn is not None:
                            conn.close()
                        conn = None
                    if applied != before:
                        last_progress = time.monotonic()
                    elif time.monotonic() - last_progress > self.stall_timeout:
                        raise AssertionError(
                            f"no progress in ces2pg.offsets for "
                            f"{self.stall_timeout}s while producing "
                            f"(partition {p} at {applied.get(p, 0)}, "
                            f"{k} produced)")
                    self.waits += 1
                    time.sleep(0.05)
                while True:
                    try:
                        producer.produce(self.topic, value=rec, partition=p,
                                         on_delivery=on_delivery(i))
                        break
                    except BufferError:
                        producer.poll(0.1)
                producer.poll(0)
                next_offset[p] = k + 1
                self.produced = i + 1
                assert not errors, errors[:5]
            left = producer.flush(60)
            assert left == 0, f"{left} records not delivered"
            assert not errors, errors[:5]
            for i, pl in enumerate(self.placed):
                assert pl is not None, f"no delivery report for record {i}"
        except BaseException as e:  # reported by finish()
            self.error = e
        finally:
            if conn is not None:
                conn.close()
