"""`ces2pg replay --capture`: rebuilding tables from Event Hubs Capture files.

The Capture files are written here by Apache Avro's Python library (Debian's
python3-avro) with the EventData schema Microsoft documents ("Explore captured
Avro files in Azure Event Hubs"), null and deflate codecs, laid out as Capture
names them ({Namespace}/{EventHub}/{PartitionId}/{Year}/.../{Second}.avro).
The CES records in their bodies come from tools/ces-gen, placed on partitions
as the hub would place them, and split into files that overlap, with an
event's segments across two files, a window captured twice, a truncated copy
and a file that is not Avro at all. The final rows must equal the generator's
expectation, the daemon's stored positions must not move, and a body that is
not CES must become a dead letter named by its Capture position.
"""

import contextlib
import io
import json
import os
import pty
import random
import re
import select
import subprocess
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import avro.datafile
import avro.io
import avro.schema

from harness.common import CES2PG, ROOT, child_env, wait_until
from harness.daemon import make_config, parse_replay_summary, run_replay, write_config
from harness.events import generate, read_records, stream_partitions
from harness.mockbroker import PacedProducer
from harness.progress import dead_letters, read_offsets, wait_applied
from harness.rules import assert_history_complete, forget_soft_deleted
from harness.tables import assert_tables_match

NAMESPACE, HUB = "shopns", "ces"
TOPIC = f"capture:{NAMESPACE}/{HUB}"
START = datetime(2026, 3, 1, 10, 0, 0, tzinfo=timezone.utc)
EX_DATAERR = 65
CAPTURE_SUMMARY = re.compile(
    r"^capture: files=(\d+) read=(\d+) failed=(\d+) duplicates_skipped=(\d+) "
    r"out_of_order=(\d+) sequence_gaps=(\d+)$", re.M)


def event_data_schema(properties_null):
    """EventData as Capture writes it (tests/fixtures/capture/EventData.avsc, as Microsoft
    documents it); Properties' union ends in "null" in some files."""
    schema = json.loads((ROOT / "tests/fixtures/capture/EventData.avsc").read_text())
    if properties_null:
        schema["fields"][4]["type"]["values"].append("null")
    return avro.schema.parse(json.dumps(schema))


def capture_path(root, partition, when):
    return (Path(root) / NAMESPACE / HUB / str(partition) / f"{when:%Y/%m/%d/%H/%M/%S}.avro")


def write_capture(path, records, codec="deflate", properties_null=False, block=16):
    """A Capture file holding records [(sequence number, body)], block records a block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    w = avro.datafile.DataFileWriter(buf, avro.io.DatumWriter(),
                                     event_data_schema(properties_null), codec=codec)
    for i, (seq, body) in enumerate(records):
        w.append({
            "SequenceNumber": seq,
            "Offset": str(seq * 1024),
            "EnqueuedTimeUtc": f"{START + timedelta(milliseconds=seq):%m/%d/%Y %I:%M:%S %p}",
            "SystemProperties": {"x-opt-sequence-number": seq},
            "Properties": {"source": "ces", "absent": None} if properties_null else {},
            "Body": body,
        })
        if (i + 1) % block == 0:
            w.flush()
    w.flush()
    path.write_bytes(buf.getvalue())
    w.close()
    return path


def segment_cuts(bodies):
    """Indices i where bodies[i - 1] is a segment that is not its event's last: a file ending
    right before i splits the event across two files."""
    cuts = []
    for i, body in enumerate(bodies):
        if body is not None and body.startswith(b"{") and \
                json.loads(body).get("finalsegment") is False:
            cuts.append(i + 1)
    return cuts


def split_into_files(seqs, rng, first_cut=None):
    """[(start, end)] index ranges covering seqs, consecutive ones overlapping by 0-4 records;
    the first ends at first_cut (without overlap) when given."""
    ranges, start = [], 0
    while start < len(seqs):
        end = min(len(seqs), start + rng.randint(20, 70))
        if first_cut is not None and not ranges and 0 < first_cut < len(seqs):
            end = first_cut
        ranges.append((start, end))
        if end == len(seqs):
            break
        start = end if (first_cut is not None and len(ranges) == 1) else max(0, end - rng.randint(0, 4))
    return ranges


def write_partition(root, partition, records, rng, shuffle_windows=False):
    """Writes one partition's [(seq, body)] as overlapping files, alternating codecs, an event's
    segments across the first two files; with shuffle_windows the times in their names are in
    no order. Returns ([(path, [(seq, body)])] in sequence order, where the first file ends)."""
    cuts = segment_cuts([body for _, body in records])
    first_cut = next((c for c in cuts if 10 <= c < len(records) - 10), None)
    files = []
    offset = timedelta(seconds=7 * partition)
    ranges = split_into_files(records, rng, first_cut)
    windows = list(range(len(ranges)))
    if shuffle_windows:
        rng.shuffle(windows)
    for k, (a, b) in enumerate(ranges):
        when = START + offset + timedelta(minutes=5 * windows[k])
        path = write_capture(capture_path(root, partition, when), records[a:b],
                             codec="deflate" if k % 2 == 0 else "null",
                             properties_null=k % 3 == 0, block=rng.randint(3, 17))
        files.append((path, records[a:b]))
    return files, first_cut


def build_capture(tmp_path, seed, events, partitions=4, bad_body=None, shuffle_windows=False):
    """Generates a stream, places its records on partitions and writes them as Capture files.
    Returns (expect, root, files by partition, the bad body's (partition, seq))."""
    expect = generate(tmp_path, seed=seed, events=events,
                      extra_args=["--max-message-size-kb", "3"])
    records = read_records(expect["_out"])
    placed = stream_partitions(records, partitions, scheme="column")
    rng = random.Random(seed)
    root = tmp_path / "capture"
    by_partition, bad = {}, None
    for p in range(partitions):
        bodies = [r for r, q in zip(records, placed) if q == p]
        if bad_body is not None and p == 1:
            bodies.insert(len(bodies) // 3, bad_body)
        base = 1000 * p + 5  # a hub's sequence numbers do not start at 0 after retention
        seqs = [(base + i, body) for i, body in enumerate(bodies)]
        if bad_body is not None and p == 1:
            bad = (p, base + bodies.index(bad_body))
        by_partition[p] = write_partition(root, p, seqs, rng, shuffle_windows)
    return expect, root, by_partition, bad


def test_capture_files_rebuild_the_tables(tmp_path, db):
    bad_body = b"not a CES record"
    expect, root, by_partition, (bad_partition, bad_seq) = build_capture(
        tmp_path, seed=2323, events=1500, bad_body=bad_body)

    # The first two files of partition 0 split one event's segments between them.
    files0, cut = by_partition[0]
    assert cut is not None, "the generator made no segmented event on partition 0"
    last = json.loads(files0[0][1][-1][1])
    first = json.loads(files0[1][1][0][1])
    assert last["logicalid"] == first["logicalid"] and last["finalsegment"] is False

    # A window captured twice (a later copy of partition 2's second file), a truncated copy of
    # partition 3's first file, and a file that is not Avro at all.
    path2, recs2 = by_partition[2][0][1]
    write_capture(capture_path(root, 2, START + timedelta(hours=2)), recs2, codec="null")
    path3 = by_partition[3][0][0][0]
    data3 = path3.read_bytes()
    truncated = capture_path(root, 3, START + timedelta(hours=3))
    truncated.parent.mkdir(parents=True, exist_ok=True)
    truncated.write_bytes(data3[:len(data3) * 2 // 3])
    junk = capture_path(root, 1, START - timedelta(minutes=1))
    junk.parent.mkdir(parents=True, exist_ok=True)
    junk.write_bytes(b"these are not the Avro bytes you are looking for\n")

    # Positions the daemon stored: a capture replay must move none of them.
    rc, _, err = run_replay(db, [write_empty(tmp_path)])
    assert rc == 0, err
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO ces2pg.offsets (group_id, topic, partition, next_offset) "
                    "VALUES ('ces2pg-test', 'ces', 0, 111), ('ces2pg-test', 'ces', 3, 114), "
                    "('ces2pg-test', %s, 1, 7)", (TOPIC,))
        conn.commit()
    before = db.query("SELECT * FROM ces2pg.offsets ORDER BY topic, partition")

    # Given in shuffled order, some twice (the folder and files in it).
    paths = [root] + [f for files, _ in by_partition.values() for f, _ in files][:5]
    random.Random(7).shuffle(paths)
    rc, out, err = run_replay(db, paths, options=("--capture",), timeout=300)
    assert rc == EX_DATAERR, f"exit {rc}\n{out}\n{err}"
    assert re.search(rf"ERROR capture: {re.escape(str(truncated))}: truncated", err), err
    assert re.search(rf"ERROR capture: {re.escape(str(junk))}: not an Avro object container", err), err

    written = [recs for files_of_p, _ in by_partition.values() for _, recs in files_of_p]
    unique = len({(p, seq) for p, (files_of_p, _) in by_partition.items()
                  for _, recs in files_of_p for seq, _ in recs})
    overlaps = sum(len(recs) for recs in written) - unique
    files, read, failed, dups, disorder, gaps = map(int, CAPTURE_SUMMARY.search(out).groups())
    assert (files, read, failed, disorder, gaps) == (len(written) + 3, len(written) + 1, 2, 0, 0), out
    # Every copy beyond the first is skipped: the overlaps, the window captured twice, and what
    # the truncated copy held before its break.
    truncated_held = len(by_partition[3][0][0][1])
    assert overlaps + len(recs2) <= dups <= overlaps + len(recs2) + truncated_held, out
    records, applied, dead = parse_replay_summary(out)
    assert (records, applied, dead) == (unique, expect["events"], 1), out

    assert_tables_match(db, expect)
    [dl] = dead_letters(db)
    assert (dl["topic"], dl["partition"], dl["offset"]) == (TOPIC, bad_partition, bad_seq)
    assert dl["payload"] == bad_body
    assert db.query("SELECT * FROM ces2pg.offsets ORDER BY topic, partition") == before


def write_empty(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    return path


def test_capture_order_holds_without_the_version_guard(tmp_path, db):
    """Without the version guard an older change applied after a newer one would leave wrong
    rows: the merge alone must hand each partition's records over in sequence-number order,
    across overlapping files whose names' times are in no order."""
    expect, root, by_partition, _ = build_capture(tmp_path, seed=4747, events=1200,
                                                  shuffle_windows=True)
    # A second capture of every partition's second window, under a later name.
    for p, (files, _) in by_partition.items():
        if len(files) > 1:
            write_capture(capture_path(root, p, START + timedelta(hours=5)), files[1][1],
                          codec="deflate")
    rc, out, err = run_replay(db, [root], options=("--capture",), timeout=300,
                              apply_extra=("lsn_guard = false;",))
    assert rc == 0, f"exit {rc}\n{out}\n{err}"
    records, applied, dead = parse_replay_summary(out)
    assert (applied, dead) == (expect["events"], 0), out
    assert_tables_match(db, expect)


def test_capture_progress_on_a_terminal(tmp_path, db):
    """On a terminal, a progress line (records, rate, files, share done, ETA) is rewritten in
    place and ends with the totals; in a pipe there is none."""
    expect, root, _, _ = build_capture(tmp_path, seed=99, events=200, partitions=2)
    cfg = write_config(tmp_path, make_config(db))
    main, sub = pty.openpty()
    proc = subprocess.Popen([str(CES2PG), "replay", "-c", str(cfg), "--capture", str(root)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=sub,
                            env=child_env(), cwd=tmp_path)
    os.close(sub)
    seen = b""
    while True:
        ready, _, _ = select.select([main], [], [], 120)
        assert ready, f"no end of the progress output: {seen!r}"
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read().decode()
    assert proc.wait(60) == 0, out + seen.decode(errors="replace")
    os.close(main)
    text = seen.decode(errors="replace")
    records = parse_replay_summary(out)[0]
    assert re.search(rf"\rcapture: {records} records, \d+/s, files (\d+)/\1, 100%, ETA -\x1b\[K\r?\n",
                     text), text
    assert_tables_match(db, expect)

    rc, out, err = run_replay(db, [root], options=("--capture",))
    assert rc == 0 and "\r" not in err and "records, " not in err, err


def test_capture_layouts(tmp_path, db):
    """Another archive name format with --capture-layout; a path that does not match it, or a
    format that is not one, is refused with the reason."""
    expect = generate(tmp_path, seed=31, events=120)
    records = read_records(expect["_out"])
    layout = "{EventHub}@{Namespace}/{Year}-{Month}-{Day}/{Hour}{Minute}{Second}/p{PartitionId}"
    path = tmp_path / "cap" / "ces@shopns" / "2026-03-01" / "100000" / "p0.avro"
    write_capture(path, [(50 + i, r) for i, r in enumerate(records)])
    stray = write_capture(tmp_path / "cap" / "elsewhere.avro", [(1, records[0])])
    rc, out, err = run_replay(db, [tmp_path / "cap"],
                              options=("--capture", "--capture-layout", layout))
    assert rc == EX_DATAERR, f"exit {rc}\n{out}\n{err}"
    assert f"ERROR capture: {stray}: cannot tell its partition" in err, err
    assert parse_replay_summary(out) == (len(records), expect["events"], 0), out
    assert_tables_match(db, expect)

    rc, _, err = run_replay(db, [path], options=("--capture-layout", "{Namespace}/{EventHub}"))
    assert rc == 64 and "lacks {PartitionId}" in err, err
    rc, _, err = run_replay(db, [tmp_path / "nothing-here"], options=("--capture",))
    assert rc == EX_DATAERR and "nothing-here: No such file or directory" in err, err


def event_start(records, i):
    """The first index at or after i where an event starts (not inside a segmented one)."""
    while i < len(records) and json.loads(records[i]).get("segmentindex", 1) > 1:
        i += 1
    return i


def test_capture_beside_the_daemon_rebuilds_with_the_live_topic(tmp_path, db, broker, ces2pg):
    """README's rebuild: the hub's retention kept only the stream's last 60%, Capture holds its
    first 70%. The daemon reads the topic from its start while the Capture replay runs beside it;
    the version guard keeps every row at its newest change, whatever applies first, and the
    replay stores no position of its own."""
    group = "ces2pg-test"
    expect = generate(tmp_path, seed=8080, events=1500,
                      extra_args=["--max-message-size-kb", "3"])
    records = read_records(expect["_out"])
    placed = stream_partitions(records, 4, scheme="column")
    topic_from = event_start(records, len(records) * 2 // 5)
    capture_to = event_start(records, len(records) * 7 // 10)
    root = tmp_path / "capture"
    rng = random.Random(8080)
    for p in range(4):
        mine = [r for r, q in zip(records[:capture_to], placed) if q == p]
        write_partition(root, p, [(10 + i, r) for i, r in enumerate(mine)], rng)

    b = broker(partitions=4)
    daemon = ces2pg(db, b, group=group)
    producer = PacedProducer(b, db, group, "ces", records[topic_from:], placed[topic_from:],
                             max_backlog=40 * 1024).start()
    wait_until(lambda: sum(read_offsets(db, group).values()) > 0, 60,
               message="the daemon to apply its first batch")
    rc, out, err = run_replay(db, [root], options=("--capture",), timeout=300)
    assert rc == 0, f"exit {rc}\n{out}\n{err}"
    assert parse_replay_summary(out)[2] == 0, out
    live = read_offsets(db, group)
    assert sum(live.values()) < len(records) - topic_from, "the replay did not overlap the daemon"
    producer.finish(timeout=300, daemons=[daemon])
    wait_applied(db, group, producer.counts, timeout=120, daemons=[daemon])

    assert_tables_match(db, expect)
    assert db.query("SELECT count(*) FROM ces2pg.offsets WHERE topic LIKE 'capture:%'") == [(0,)]
    assert daemon.terminate() == 0


def test_capture_replay_follows_table_rules(tmp_path, db):
    """The per-table rules hold for a rebuild from Capture files as for the daemon: soft deletes
    leave the live rows the stream's end has, and every change is in its history once."""
    expect, root, _, _ = build_capture(tmp_path, seed=4848, events=800)
    rules = 'schema = { tables = ( { match = "*"; deletes = "soft"; history = "also"; } ); };\n'
    for _ in range(2):  # the second rebuild adds nothing: every change is there already
        rc, out, err = run_replay(db, [root], options=("--capture",), timeout=300,
                                  extra_config=rules)
        assert rc == 0, f"exit {rc}\n{out}\n{err}"
        assert parse_replay_summary(out)[2] == 0, out
    assert_history_complete(db, read_records(expect["_out"]))
    forget_soft_deleted(db, expect)
    assert_tables_match(db, expect)
