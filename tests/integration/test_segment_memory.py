"""Held segments are counted by what they cost, not by their data.

A segment whose `data` is one character may carry a large attribute
beside it (here JSON arrays, about 800 KB): its record is that large,
and its decoded envelope several times larger. Segment groups that never
complete are held until reassembly.max_bytes is reached; those past it
are dead letters (reassembly_limit), and an ordinary event after them is
applied. ces2pg's peak memory (VmHWM) then exceeds that of a run without
the segments by no more than reassembly.max_bytes plus a stated overhead:
decoding the large records themselves (each one's envelope is decoded,
then only what a held segment needs is kept) and the dead letters on
their way to PostgreSQL. Counting the data alone held every group, each
with its decoded envelope: about 400 MB more, and no dead letter.
"""

import contextlib
import json
import os

from harness.common import wait_until
from harness.events import example_record, generate, read_records
from harness.mockbroker import produce_placed
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match

MB = 1024 * 1024
PARTITIONS = 8
GROUPS = 24  # 3 records of ~800 KB a partition: below the mock's 5 MiB
MAX_BYTES = 8 * MB
# Past reassembly.max_bytes: the record being decoded (decode.threads = 1: one
# at a time; its envelope's tree takes tens of MB for these records) and the
# dead letters not yet written (a batch of them and one in flight), with
# malloc's slack. Measured: about 28 MB past max_bytes, 32 MB on the
# sanitizer build.
OVERHEAD = 48 * MB
CONFIG = f"reassembly = {{ max_bytes = {MAX_BYTES}; }};"


def big_segment(i):
    """The first segment (index 0, not final) of a group that never
    completes: data "{", and ~800 KB of arrays in another attribute."""
    env = json.loads(example_record("current-insert"))
    env["logicalid"] = (f"5e9d0c1a-0000-4000-8000-{i:012d}:"
                        f"0000002A00000F10{i:04X}:{i:020d}")
    env["id"] = f"segment-memory-{i}"
    env["segmentindex"] = 0
    env["finalsegment"] = False
    env["data"] = "{"
    # Arrays of arrays: no JSON array or object over decode.max_columns.
    env["padding"] = [[i % 10] * 100] * 4000
    return json.dumps(env, separators=(",", ":")).encode()


def _commitlsn(record):
    return json.loads(json.loads(record)["data"])["eventsource"][
        "transaction"]["commitlsn"]


def ordinary_halves(tmp_path):
    """Ordinary events cut in two at a transaction boundary: the first half
    for the run without segments, the second for the run with them.
    Returns (expect after both, first, second)."""
    expect = generate(tmp_path, seed=4242, events=40, tables=1)
    lines = read_records(expect["_out"])
    cut = len(lines) // 2
    while _commitlsn(lines[cut - 1]) == _commitlsn(lines[cut]):
        cut += 1
    assert 0 < cut < len(lines)
    return expect, lines[:cut], lines[cut:]


def dead_letter_classes(db):
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT class, count(*) FROM ces2pg.dead_letters GROUP BY class")
        return dict(cur.fetchall())


def peak_rss(daemon):
    with open(f"/proc/{daemon.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def test_held_segments_with_large_envelopes_stay_within_max_bytes(
        tmp_path, db, broker, ces2pg, monkeypatch):
    # On the sanitizer build, AddressSanitizer keeps freed memory aside (its
    # quarantine, 256 MB) to catch a use after free: the decoded envelopes
    # freed one after the other would fill it, and the peak would measure
    # that. Without it the allocator is still AddressSanitizer's (redzones
    # and all), within the same overhead.
    asan = os.environ.get("ASAN_OPTIONS")
    monkeypatch.setenv("ASAN_OPTIONS", (asan + ":" if asan else "")
                       + "quarantine_size_mb=0")
    expect, first, second = ordinary_halves(tmp_path)

    # Without the segments: the first half of the ordinary events.
    b1 = broker(partitions=PARTITIONS)
    base = ces2pg(db, b1, group="base", extra_config=CONFIG, decode_threads=1)
    counts = produce_placed(b1, "ces", first, [0] * len(first))
    wait_applied(db, "base", counts, timeout=60, daemons=[base])
    base_peak = peak_rss(base)
    assert base.terminate() == 0

    # With them: every group's first segment, then the second half.
    b2 = broker(partitions=PARTITIONS)
    records = [big_segment(i) for i in range(GROUPS)]
    assert all(700_000 < len(r) < 1_000_000 for r in records)
    produce_placed(b2, "ces", records, [i % PARTITIONS for i in range(GROUPS)])
    produce_placed(b2, "ces", second, [0] * len(second))
    daemon = ces2pg(db, b2, group="mem", extra_config=CONFIG, decode_threads=1)

    # The ordinary events after the segments are applied ...
    def applied():
        try:
            assert_tables_match(db, expect)
            return True
        except AssertionError:
            daemon.check_alive()
            return False
    wait_until(applied, 90, interval=0.5,
               message="the ordinary events after the segments")
    # ... and the groups past max_bytes are dead letters; the others are held.
    wait_until(lambda: dead_letters(db), 30, message="dead letters")
    dead = dead_letters(db)
    assert all("reassembly.max_bytes" in d["reason"] for d in dead), dead[0]
    assert dead_letter_classes(db) == {"reassembly_limit": len(dead)}
    logicalids = {d["logicalid"] for d in dead}
    assert len(logicalids) == len(dead)  # one segment each
    # ~800 KB each: 8 MB holds about 9 of them, and not all 24.
    assert 4 <= GROUPS - len(dead) <= 10, f"{len(dead)} dead letters"

    grown = peak_rss(daemon) - base_peak
    print(f"peak RSS: {base_peak / MB:.1f} MB without the segments, "
          f"{grown / MB:+.1f} MB with them")
    assert grown <= MAX_BYTES + OVERHEAD, (
        f"peak RSS grew by {grown / MB:.1f} MB with the held segments, more "
        f"than reassembly.max_bytes ({MAX_BYTES // MB} MB) + "
        f"{OVERHEAD // MB} MB")
    assert daemon.terminate() == 0


def test_overlong_logicalid_is_a_dead_letter_at_once(tmp_path, db, broker, ces2pg):
    """A segment whose logicalid is longer than ces2pg joins on (512 bytes)
    is not held: it is a dead letter at once, its partition's position moves
    past it, and the events after it are applied."""
    expect = generate(tmp_path, seed=4343, events=10, tables=1)
    ordinary = read_records(expect["_out"])
    env = json.loads(example_record("current-insert"))
    env["logicalid"] = "L" * 600
    env["segmentindex"] = 0
    env["finalsegment"] = False
    env["data"] = "{"
    segment = json.dumps(env, separators=(",", ":")).encode()
    b = broker(partitions=1)
    counts = produce_placed(b, "ces", [segment] + ordinary, [0] * (1 + len(ordinary)))
    daemon = ces2pg(db, b, group="long")
    wait_applied(db, "long", counts, timeout=60, daemons=[daemon])
    assert_tables_match(db, expect)
    [dl] = dead_letters(db)
    assert (dl["partition"], dl["offset"]) == (0, 0)
    assert "logicalid is longer than 512 bytes" in dl["reason"], dl["reason"]
    assert dl["payload"] == segment
    assert dead_letter_classes(db) == {"reassembly_limit": 1}
    assert daemon.terminate() == 0


def test_the_caps_are_configured(tmp_path, db, broker, ces2pg):
    """reassembly.max_logicalid_bytes and reassembly.max_groups set the caps:
    a 100-byte logicalid is too long at 64, and of 20 groups that never
    complete, those past 16 open ones are dead letters at once."""
    expect = generate(tmp_path, seed=4344, events=10, tables=1)
    ordinary = read_records(expect["_out"])
    env = json.loads(example_record("current-insert"))
    env.update(logicalid="L" * 100, segmentindex=0, finalsegment=False, data="{")
    long_id = json.dumps(env, separators=(",", ":")).encode()
    groups = []
    for i in range(20):
        env.update(logicalid=f"g-{i:04d}", id=f"group-cap-{i}")
        groups.append(json.dumps(env, separators=(",", ":")).encode())
    b = broker(partitions=1)
    records = [long_id] + groups + ordinary
    produce_placed(b, "ces", records, [0] * len(records))
    daemon = ces2pg(db, b, group="caps", extra_config="reassembly = { max_groups = 16; "
                    "max_logicalid_bytes = 64; timeout_ms = 600000; };")
    wait_until(lambda: len(dead_letters(db)) >= 5, 60, message="the capped segments")
    dead = dead_letters(db)
    assert "logicalid is longer than 64 bytes" in dead[0]["reason"], dead[0]["reason"]
    assert [d["offset"] for d in dead] == [0, 17, 18, 19, 20], [d["reason"] for d in dead]
    assert dead_letter_classes(db) == {"reassembly_limit": 5}
    assert daemon.terminate() == 0
