"""A 5 MB row split into 128 KB segments, scattered over 4 partitions
(partition scheme None: round-robin per record), shuffled and duplicated,
arrives intact; late duplicates of its segments change nothing.

CES truncates every value to 1 MB at the source, so a real 5 MB row needs
several big columns; ces-gen puts it in one nvarchar(max) value, so the
tests raise decode.max_value_bytes (default 2 MiB) to 8 MiB. The other
bounds (128 KB records under decode.max_record_bytes, 5 MB under
decode.max_event_bytes and reassembly.max_bytes, ~45 segments under
reassembly.max_segments) hold with their defaults. Everything produced
stays below the mock broker's 5 MiB per partition.
"""

import random

from harness.events import generate, read_records
from harness.mockbroker import produce_placed
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match

GROUP = "ces2pg-test"
TOPIC = "ces"
PARTITIONS = 4
VALUE_SIZE = 5 * 1024 * 1024
DECODE = "decode = { max_value_bytes = 8388608; };"


def big_row(tmp_path, seed):
    """One INS of dbo.Customers whose Notes is about 5 MB, as 128 KB
    segments; returns (expect, segments in segmentindex order)."""
    expect = generate(tmp_path, seed=seed, events=1, tables=1,
                      extra_args=["--value-size", str(VALUE_SIZE),
                                  "--max-message-size-kb", "128"])
    segments = read_records(expect["_out"])
    assert len(segments) >= 40, f"{len(segments)} segments"
    assert all(len(s) <= 128 * 1024 for s in segments)
    return expect, segments


def scatter(segments, rng, duplicates):
    """Shuffles segments round-robin over the partitions and adds
    `duplicates` extra copies of random segments (the first and the final
    one among them). Each copy goes to a random partition, before that
    partition's last original, so whatever order ces2pg reads the
    partitions in, every copy is read before the group is complete.
    Returns {partition: [records]}."""
    order = list(range(len(segments)))
    rng.shuffle(order)
    lists = {p: [] for p in range(PARTITIONS)}
    for i, s in enumerate(order):
        lists[i % PARTITIONS].append(s)
    copies = [0, len(segments) - 1] + [
        rng.randrange(len(segments)) for _ in range(duplicates - 2)]
    for s in copies:
        p = rng.randrange(PARTITIONS)
        lists[p].insert(rng.randrange(len(lists[p])), s)
    return {p: [segments[s] for s in lst] for p, lst in lists.items()}


def produce_lists(broker, lists):
    records, parts = [], []
    for p, lst in lists.items():
        records += lst
        parts += [p] * len(lst)
    return produce_placed(broker, TOPIC, records, parts)


def add_counts(total, more):
    for p, n in more.items():
        total[p] = total.get(p, 0) + n
    return total


def test_big_row_shuffled_duplicated_segments(tmp_path, db, broker, ces2pg):
    b = broker(partitions=PARTITIONS)
    expect, segments = big_row(tmp_path, seed=5150)
    lists = scatter(segments, random.Random(5150), duplicates=8)
    counts = produce_lists(b, lists)
    assert sum(counts.values()) == len(segments) + 8
    daemon = ces2pg(db, b, group=GROUP, extra_config=DECODE)
    wait_applied(db, GROUP, counts, timeout=90, daemons=[daemon])
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert daemon.terminate() == 0


def test_big_row_late_duplicates(tmp_path, db, broker, ces2pg):
    """After the row is applied, the whole event is sent again (segments
    shuffled and scattered anew), then three single segments of it once
    more. Both are resent duplicates of an applied event: nothing changes,
    nothing is dead-lettered, and the positions move past them."""
    b = broker(partitions=PARTITIONS)
    expect, segments = big_row(tmp_path, seed=6160)
    rng = random.Random(6160)
    counts = produce_lists(b, scatter(segments, rng, duplicates=4))
    # A short reassembly timeout, so that a stale segment that ces2pg keeps
    # waiting for the rest of shows up as a dead letter within the test.
    daemon = ces2pg(db, b, group=GROUP, extra_config=DECODE + (
        "\nreassembly = { timeout_ms = 3000; };"))
    wait_applied(db, GROUP, counts, timeout=90, daemons=[daemon])
    assert_tables_match(db, expect)

    # The whole event again.
    add_counts(counts, produce_lists(b, scatter(segments, rng, duplicates=2)))
    wait_applied(db, GROUP, counts, timeout=60, daemons=[daemon])
    assert_tables_match(db, expect)
    assert dead_letters(db) == []

    # Single segments of it: the first, one in the middle, the final one.
    singles = [segments[0], segments[len(segments) // 2], segments[-1]]
    add_counts(counts, produce_placed(b, TOPIC, singles, [0, 1, 2]))
    wait_applied(db, GROUP, counts, timeout=60, daemons=[daemon])
    assert_tables_match(db, expect)
    late = [(d["partition"], d["offset"], d["reason"])
            for d in dead_letters(db)]
    assert late == [], (
        f"late duplicate segments of an applied event were dead-lettered: "
        f"{late}")
    assert daemon.terminate() == 0
