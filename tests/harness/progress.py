"""What ces2pg recorded in PostgreSQL: its stored offsets (ces2pg.offsets),
waiting for them to reach the end of a stream, and its dead letters.
"""

import contextlib
import time

from harness.common import Background, wait_until


def read_offsets_conn(conn, group, topic):
    """read_offsets() on an open connection (a poller keeps its own)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('ces2pg.offsets') IS NOT NULL")
        if not cur.fetchone()[0]:
            return {}
        cur.execute(
            "SELECT partition, next_offset FROM ces2pg.offsets "
            "WHERE group_id = %s AND topic = %s", (group, topic))
        return {int(p): int(o) for p, o in cur.fetchall()}


def read_offsets(db, group, topic="ces"):
    """{partition: next_offset} from ces2pg.offsets ({} before it exists)."""
    with contextlib.closing(db.connect()) as conn:
        return read_offsets_conn(conn, group, topic)


class OffsetMonitor:
    """Polls ces2pg.offsets and asserts that no offset ever moves backwards."""

    def __init__(self, db, group, topic="ces"):
        self.db, self.group, self.topic = db, group, topic
        self.last = {}
        self.polls = 0

    def poll(self):
        now = read_offsets(self.db, self.group, self.topic)
        for p, prev in self.last.items():
            cur = now.get(p)
            assert cur is not None, (
                f"offsets row for partition {p} vanished (was {prev})")
            assert cur >= prev, (
                f"offset of partition {p} moved backwards: {prev} -> {cur}")
        self.last = now
        self.polls += 1
        return now

    def total(self):
        return sum(self.last.values())


def _norm_counts(expected):
    return {int(p): int(n) for p, n in expected.items()}


def wait_applied(db, group, expected_records_per_partition, timeout=60,
                 topic="ces", daemons=(), monitor=None, interval=0.05):
    """Waits until next_offset == records produced, for every partition.

    Partitions that received no record may have no row. Fails at once if an
    offset passes the number of records (nothing can be there) or moves
    backwards, or if one of daemons exits. Returns the final offsets.
    """
    expected = _norm_counts(expected_records_per_partition)
    monitor = monitor or OffsetMonitor(db, group, topic)

    def done():
        for d in daemons:
            d.check_alive()
        got = monitor.poll()
        for p, n in got.items():
            assert n <= expected.get(p, 0), (
                f"partition {p}: next_offset {n} is past the "
                f"{expected.get(p, 0)} record(s) produced")
        return all(got.get(p, 0) == n for p, n in expected.items())

    wait_until(done, timeout, interval=interval,
               message=lambda: f"offsets {monitor.last} to reach {expected}")
    return monitor.last


def dead_letters(db):
    """All rows of ces2pg.dead_letters as dicts, by id."""
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass('ces2pg.dead_letters') IS NOT NULL")
        if not cur.fetchone()[0]:
            return []
        cur.execute(
            'SELECT id, topic, partition, "offset", reason, logicalid, payload '
            "FROM ces2pg.dead_letters ORDER BY id")
        cols = [c.name for c in cur.description]
        rows = []
        for r in cur.fetchall():
            row = dict(zip(cols, r))
            if row["payload"] is not None:
                row["payload"] = bytes(row["payload"])
            rows.append(row)
        return rows


class BackgroundOffsetMonitor(Background):
    """Polls ces2pg.offsets every interval seconds in a thread; an offset
    that moves backwards (OffsetMonitor's assertion) is raised by stop()."""

    def __init__(self, db, group, interval=0.02, topic="ces"):
        super().__init__("offset-monitor")
        self.monitor = OffsetMonitor(db, group, topic)
        self.interval = interval

    def run(self):
        while not self.stopping():
            self.monitor.poll()
            time.sleep(self.interval)
