"""Gaps at the source: the position stored in PostgreSQL is gone from the
broker (retention ran out while ces2pg was stopped, or the topic was
recreated). ces2pg must never pass one silently: it logs an ERROR with the
facts, counts it, and by default stops with exit status 65; with
kafka.on_source_gap = "continue" it records the gap in ces2pg.source_gaps in
the transaction that moves past it and goes on. A first start with no stored
position is not a gap.

The mock broker keeps at most 5 MiB per partition and drops the oldest
records beyond that: producing a few MB after ces2pg stopped removes the
records at its stored position, as retention would.
"""

import re

from harness.common import free_port, wait_until
from harness.events import generate, read_records
from harness.metrics import metric, scrape
from harness.mockbroker import produce_placed, watermarks
from harness.progress import dead_letters, read_offsets, wait_applied

GROUP = "ces2pg-test"
EX_SOURCE_GAP = 65
FIRST = 50       # records applied before the gap
EVICTING = 5000  # records produced while ces2pg is stopped: about 6 MB


def low_watermark(b, partition=0):
    return watermarks(b, "ces", [partition])[partition][0]


def stream_with_gap(tmp_path, db, b, ces2pg):
    """Applies FIRST records, stops ces2pg, then produces EVICTING more, so
    that the broker drops the records at the stored position. Returns the
    broker's new low watermark."""
    first = read_records(generate(tmp_path, seed=61, events=FIRST, tables=1)["_out"])
    rest = read_records(generate(tmp_path, seed=62, events=EVICTING, tables=1)["_out"])
    produce_placed(b, "ces", first, [0] * len(first))
    daemon = ces2pg(db, b, group=GROUP)
    wait_applied(db, GROUP, {0: FIRST}, daemons=[daemon])
    assert daemon.terminate() == 0
    produce_placed(b, "ces", rest, [0] * len(rest))
    low = low_watermark(b)
    assert low > FIRST, f"the broker still holds offset {FIRST} (low watermark {low})"
    return low


def test_gap_stops_by_default(tmp_path, db, broker, ces2pg):
    b = broker(partitions=1)
    low = stream_with_gap(tmp_path, db, b, ces2pg)
    daemon = ces2pg(db, b, group=GROUP)
    assert daemon.wait(60) == EX_SOURCE_GAP
    log = daemon.log()
    m = re.search(r"ERROR source gap on ces\[0\]: PostgreSQL's stored position is (\d+), but "
                  r"reading resumes at (\d+): .*; (\d+) record\(s\) were never read", log)
    assert m, log[-3000:]
    assert (int(m[1]), int(m[2]), int(m[3])) == (FIRST, low, low - FIRST)
    assert 'kafka.on_source_gap = "continue"' in log and "re-seed" in log
    # Nothing moved past the gap, and nothing was recorded.
    assert read_offsets(db, GROUP) == {0: FIRST}
    assert db.scalar("SELECT count(*) FROM ces2pg.source_gaps") == 0
    assert dead_letters(db) == []
    # It stops again at the same place: a restart cannot pass it.
    again = ces2pg(db, b, group=GROUP)
    assert again.wait(60) == EX_SOURCE_GAP


def test_gap_recorded_when_continuing(tmp_path, db, broker, ces2pg):
    b = broker(partitions=1)
    low = stream_with_gap(tmp_path, db, b, ces2pg)
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}",
                    kafka_extra=['on_source_gap = "continue";'])
    daemon.wait_log(r"ERROR source gap on ces\[0\]")
    wait_applied(db, GROUP, {0: FIRST + EVICTING}, daemons=[daemon], timeout=120)
    rows = db.query("SELECT group_id, topic, partition, stored_position, resumed_at, "
                    "skipped_records FROM ces2pg.source_gaps")
    assert rows == [(GROUP, "ces", 0, FIRST, low, low - FIRST)]
    m = scrape(port)
    assert metric(m, "ces2pg_source_gaps_total") == 1
    assert metric(m, "ces2pg_source_gap_records_total") == low - FIRST
    assert dead_letters(db) == []
    # Accepted once: a restart finds no gap.
    assert daemon.terminate() == 0
    again = ces2pg(db, b, group=GROUP)
    again.wait_log(r"ces\[0\]: resuming at offset %d" % (FIRST + EVICTING))
    assert again.terminate() == 0
    assert "source gap" not in again.log()
    assert db.scalar("SELECT count(*) FROM ces2pg.source_gaps") == 1


def test_position_past_the_end_is_a_gap(tmp_path, db, broker, ces2pg):
    """A recreated topic: the stored position is beyond anything the broker
    holds, and reading starts over at its first record."""
    b = broker(partitions=1)
    records = read_records(generate(tmp_path, seed=63, events=20, tables=1)["_out"])
    produce_placed(b, "ces", records, [0] * len(records))
    daemon = ces2pg(db, b, group=GROUP)
    wait_applied(db, GROUP, {0: 20}, daemons=[daemon])
    assert daemon.terminate() == 0
    db.query("UPDATE ces2pg.offsets SET next_offset = 100000")
    daemon = ces2pg(db, b, group=GROUP)
    assert daemon.wait(60) == EX_SOURCE_GAP
    assert re.search(r"source gap on ces\[0\]: PostgreSQL's stored position is 100000, but "
                     r"reading resumes at \d+: the stored position is past the end of the "
                     r"partition .*; an unknown number of records were never read",
                     daemon.log()), daemon.log()[-3000:]
    assert read_offsets(db, GROUP) == {0: 100000}
    # Accepted: the positions of the partition as it is now are stored (the old one was the
    # fence), with the gap, and a restart finds none.
    daemon = ces2pg(db, b, group=GROUP, kafka_extra=['on_source_gap = "continue";'])
    daemon.wait_log(r"ERROR source gap on ces\[0\]")
    wait_until(lambda: read_offsets(db, GROUP) == {0: 20}, 60,
               message="the position of the partition's end stored")
    assert db.query("SELECT stored_position, resumed_at, skipped_records FROM "
                    "ces2pg.source_gaps") == [(100000, 0, None)]
    assert daemon.terminate() == 0
    again = ces2pg(db, b, group=GROUP)
    again.wait_log(r"ces\[0\]: resuming at offset 20")
    assert again.terminate() == 0
    assert "source gap" not in again.log()


def test_out_of_range_with_reset_error(tmp_path, db, broker, ces2pg):
    """auto.offset.reset=error: librdkafka stops the partition and says so;
    that is a gap too."""
    b = broker(partitions=1)
    low = stream_with_gap(tmp_path, db, b, ces2pg)
    daemon = ces2pg(db, b, group=GROUP,
                    properties=("fetch.wait.max.ms=50", "session.timeout.ms=4000",
                                "heartbeat.interval.ms=500", "auto.offset.reset=error"))
    assert daemon.wait(60) == EX_SOURCE_GAP
    m = re.search(r"source gap on ces\[0\]: PostgreSQL's stored position is (\d+), but "
                  r"reading resumes at (\d+): the broker holds no record at the stored position",
                  daemon.log())
    assert m, daemon.log()[-3000:]
    assert (int(m[1]), int(m[2])) == (FIRST, low)


def test_first_start_is_not_a_gap(tmp_path, db, broker, ces2pg):
    """No stored position: reading starts at the broker's first record,
    whatever was dropped before."""
    b = broker(partitions=1)
    records = read_records(generate(tmp_path, seed=64, events=EVICTING + 200, tables=1)["_out"])
    produce_placed(b, "ces", records, [0] * len(records))
    low = low_watermark(b)
    assert low > 0
    daemon = ces2pg(db, b, group=GROUP)
    wait_applied(db, GROUP, {0: len(records)}, daemons=[daemon], timeout=120)
    assert "source gap" not in daemon.log()
    assert db.scalar("SELECT count(*) FROM ces2pg.source_gaps") == 0
