"""Records that cannot be applied go to ces2pg.dead_letters, raw and with
their position, and do not stop the records after them."""

import json

from harness.daemon import parse_replay_summary, run_replay
from harness.events import example_record, generate, read_records, write_records
from harness.mockbroker import PacedProducer
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match, fetch_table

BAD = b"not json at all"
GROUP = "ces2pg-test"


def _commitlsn(record):
    event = json.loads(record)
    data = json.loads(event["data"])
    return data["eventsource"]["transaction"]["commitlsn"]


def stream_with_bad_record(tmp_path, seed, events=2000):
    """Generator records with BAD inserted between two source transactions
    near the middle. Returns (expect, records, index of BAD)."""
    expect = generate(tmp_path, seed=seed, events=events)
    lines = read_records(expect["_out"])
    assert len(lines) == expect["records"] > 10
    cut = len(lines) // 2
    while _commitlsn(lines[cut - 1]) == _commitlsn(lines[cut]):
        cut += 1
    return expect, lines[:cut] + [BAD] + lines[cut:], cut


def test_dead_letter_through_broker(tmp_path, db, broker, ces2pg):
    expect, records, bad_index = stream_with_bad_record(tmp_path, seed=515)
    b = broker(partitions=1)
    daemon = ces2pg(db, b, group=GROUP)
    producer = PacedProducer(b, db, GROUP, "ces", records,
                             [0] * len(records)).start()
    producer.finish(timeout=120, daemons=[daemon])
    assert producer.placed[bad_index] == (0, bad_index)
    wait_applied(db, GROUP, {0: len(records)}, timeout=60, daemons=[daemon])

    [dl] = dead_letters(db)
    assert dl["payload"] == BAD
    assert (dl["topic"], dl["partition"], dl["offset"]) == ("ces", 0,
                                                            bad_index)
    assert dl["reason"] and dl["reason"].strip(), dl
    assert_tables_match(db, expect)  # everything else, before and after
    assert daemon.terminate() == 0


def test_dead_letter_replay(tmp_path, db):
    expect, records, bad_index = stream_with_bad_record(tmp_path, seed=616)
    path = write_records(tmp_path / "with-bad.jsonl", records)
    rc, out, err = run_replay(db, [path])
    assert rc == 0, f"replay exited {rc}:\n{err}"
    assert parse_replay_summary(out) == (len(records), len(records) - 1, 1)

    [dl] = dead_letters(db)
    assert dl["payload"] == BAD
    # Replay positions: the file path, partition 0, 1-based line number.
    assert (dl["topic"], dl["partition"], dl["offset"]) == (str(path), 0,
                                                            bad_index + 1)
    assert dl["reason"] and dl["reason"].strip(), dl
    assert_tables_match(db, expect)


def test_unsupported_event_type_replay(tmp_path, db):
    good = example_record("current-insert")
    event = json.loads(good)
    event["type"] = "com.microsoft.SQL.CES.DML.V2"
    # A later change of the same row: applying it would show.
    event["logicalid"] = event["logicalid"].replace("00000A100004:", "00000A100009:")
    event["data"] = event["data"].replace("00000A10:0004", "00000A10:0009")
    event["data"] = event["data"].replace('"Jonas Berg', '"Wrong')
    bad = json.dumps(event, separators=(",", ":")).encode()
    assert b"Wrong" in bad and b"00000A100009:" in bad and b"00000A10:0009" in bad
    path = write_records(tmp_path / "v2.jsonl", [good, bad])
    rc, out, err = run_replay(db, [path])
    assert rc == 0, err
    assert parse_replay_summary(out) == (2, 1, 1)

    [dl] = dead_letters(db)
    assert dl["payload"] == bad
    assert (dl["topic"], dl["partition"], dl["offset"]) == (str(path), 0, 2)
    assert "unsupported event type" in dl["reason"].lower(), dl
    assert fetch_table(db, "sales.orders", ["orderid", "customer"], ["orderid"]) == [
        {"orderid": "2048", "customer": "Jonas Berg"}]
