"""The operator commands: `ces2pg dead-letters list|show|retry|purge` and `ces2pg status`.

Dead letters are made the way production makes them: a value PostgreSQL rejects (a string longer
than its column), a record that is not JSON. Retrying puts them through the daemon's own decode,
guard and apply path: what applies leaves the table in its batch's transaction, what fails again
keeps its row with the new reason, and an old event never overwrites a newer row.
"""

import json
import re

from harness.daemon import make_config, run_ces2pg, write_config
from harness.events import generate, read_records
from harness.mockbroker import produce_placed
from harness.progress import dead_letters, wait_applied
from test_apply import ces_record, replay_records, text_query

GROUP = "ces2pg-test"
COLS = [("Id", "int"), ("Code", "varchar(3)")]
EX_USAGE = 64


def codes(i, code, op="INS", lsn=None):
    current = {"Id": str(i), "Code": code}
    return ces_record("Codes", COLS, op, current, old=current if op != "INS" else None,
                      pk=["Id"], lsn=lsn)


def command(db, *args, config=None, timeout=120):
    """Runs `ces2pg ARGS...` with -c (a replay-mode config for db unless given); returns
    (exit status, stdout, stderr)."""
    if config is None:
        config = write_config(db.tmp_path, make_config(db))
    args = list(args)
    return run_ces2pg(args[:1] + ["-c", config] + args[1:], timeout=timeout, cwd=db.tmp_path)


def dead_letter_list(db, *extra):
    rc, out, err = command(db, "dead-letters", "list", "--json", *extra)
    assert rc == 0, err
    return json.loads(out)


RETRY_SUMMARY = re.compile(r"^retry: records=(\d+) applied=(\d+) dead_letters=(\d+)$", re.M)


def retry(db, *extra):
    rc, out, err = command(db, "dead-letters", "retry", *extra)
    m = RETRY_SUMMARY.search(out)
    assert m, f"exit {rc}, no summary line:\n{out}\n{err}"
    return rc, tuple(int(x) for x in m.groups()), out, err


def test_rejected_value_is_retried_after_the_column_is_widened(tmp_path, db):
    records = [codes(i, "ab") for i in range(1, 11)]
    records.insert(5, codes(99, "toolong"))
    (total, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (total, applied, dead) == (11, 10, 1), err

    [dl] = dead_letter_list(db)
    assert dl["class"] == "rejected_by_postgres"
    assert dl["source_table"] == "dbo.Codes"
    assert "SQLSTATE 22001" in dl["reason"], dl
    assert dl["retried_at"] is None
    assert dl["payload_bytes"] == len(records[5])

    # Text listing, and the filters.
    rc, out, err = command(db, "dead-letters", "list")
    assert rc == 0, err
    assert re.search(rf"^{dl['id']}\s+.*rejected_by_postgres\s+.*dbo\.Codes: .*22001", out, re.M), out
    assert out.rstrip().endswith("(1 dead letter)"), out
    assert dead_letter_list(db, "--class", "decode") == []
    assert [d["id"] for d in dead_letter_list(db, "--class", "rejected_by_postgres")] == [dl["id"]]
    assert [d["id"] for d in dead_letter_list(db, "--table", "DBO.codes")] == [dl["id"]]
    assert dead_letter_list(db, "--table", "dbo.Other") == []

    # show: the record itself, as replay reads it.
    rc, out, err = command(db, "dead-letters", "show", str(dl["id"]))
    assert rc == 0, err
    assert f"id:           {dl['id']}" in out and "reason:       " in out, out
    assert out.splitlines()[-1].encode() == records[5]
    rc, out, err = command(db, "dead-letters", "show", str(dl["id"]), "--json")
    assert rc == 0, err
    shown = json.loads(out)
    assert (shown["payload_encoding"], shown["payload"].encode()) == ("text", records[5])
    assert (shown["topic"], shown["partition"], shown["offset"]) == (dl["topic"], 0, 6)
    rc, out, err = command(db, "dead-letters", "show", "424242")
    assert rc == 1 and "no dead letter has id 424242" in err, (rc, err)

    # Retried before the fix: it fails again and keeps its row (same id), with the new reason.
    rc, summary, out, err = retry(db)
    assert (rc, summary) == (0, (1, 0, 1)), err
    [again] = dead_letter_list(db)
    assert again["id"] == dl["id"] and again["created_at"] == dl["created_at"]
    assert again["retried_at"] is not None and "22001" in again["reason"]
    assert text_query(db, "SELECT count(*) FROM dbo.codes") == [(10,)]

    # Widened, retried: it applies, and leaves the table.
    db.query("ALTER TABLE dbo.codes ALTER COLUMN code TYPE varchar(10)")
    rc, summary, out, err = retry(db, str(dl["id"]))
    assert (rc, summary) == (0, (1, 1, 0)), err
    assert dead_letters(db) == []
    assert text_query(db, "SELECT code FROM dbo.codes WHERE id = 99") == [("toolong",)]
    assert text_query(db, "SELECT count(*) FROM dbo.codes") == [(11,)]
    # Nothing of a retry reaches the stored positions.
    assert text_query(db, "SELECT count(*) FROM ces2pg.offsets") == [(0,)]


def test_a_retried_old_event_never_overwrites_a_newer_row(tmp_path, db):
    records = [codes(1, "ab", lsn=0x5000),
               codes(1, "old-and-long", op="UPD", lsn=0x5001),  # rejected
               codes(1, "new", op="UPD", lsn=0x5002)]
    (total, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (total, applied, dead) == (3, 2, 1), err
    db.query("ALTER TABLE dbo.codes ALTER COLUMN code TYPE varchar(20)")
    rc, summary, out, err = retry(db)
    assert (rc, summary) == (0, (1, 1, 0)), err
    # The guard made the old update a no-op, and it is handled: it leaves the table.
    assert text_query(db, "SELECT code FROM dbo.codes WHERE id = 1") == [("new",)]
    assert dead_letters(db) == []


def test_retry_by_class_and_what_fails_again(tmp_path, db):
    good_later = codes(7, "ok")
    records = [b"not json at all", codes(5, "toolong"), good_later]
    (total, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (total, applied, dead) == (3, 1, 2), err
    by_class = {d["class"]: d for d in dead_letter_list(db)}
    assert set(by_class) == {"decode", "rejected_by_postgres"}
    assert by_class["decode"]["source_table"] is None

    # --class picks only its own; the other is not touched.
    rc, summary, out, err = retry(db, "--class", "decode")
    assert (rc, summary) == (0, (1, 0, 1)), err
    after = {d["class"]: d for d in dead_letter_list(db)}
    assert after["decode"]["retried_at"] is not None
    assert after["rejected_by_postgres"]["retried_at"] is None
    assert after["decode"]["reason"] == by_class["decode"]["reason"]

    # A binary payload is shown in base64, as replay reads binary records.
    db.query("UPDATE ces2pg.dead_letters SET payload = '\\x00ff0a'::bytea "
                   f"WHERE id = {after['decode']['id']}")
    rc, out, err = command(db, "dead-letters", "show", str(after["decode"]["id"]))
    assert rc == 0 and out.splitlines()[-1] == "AP8K", out
    # So are bytes that only look like UTF-8 (an encoded surrogate, which PostgreSQL and JSON
    # refuse as text).
    db.query("UPDATE ces2pg.dead_letters SET payload = '\\xeda080'::bytea "
                   f"WHERE id = {after['decode']['id']}")
    rc, out, err = command(db, "dead-letters", "show", str(after["decode"]["id"]))
    assert rc == 0 and out.splitlines()[-1] == "7aCA", out

    # Duplicates in one retry: both apply through the guard (the second is a no-op or skipped),
    # and both leave the table.
    db.query("INSERT INTO ces2pg.dead_letters (topic, partition, \"offset\", reason, payload,"
                   " class) SELECT topic, partition, \"offset\", reason, payload, class FROM"
                   " ces2pg.dead_letters WHERE class = 'rejected_by_postgres'")
    db.query("ALTER TABLE dbo.codes ALTER COLUMN code TYPE text")
    rc, summary, out, err = retry(db, "--class", "rejected_by_postgres")
    assert rc == 0 and summary[0] == 2 and summary[2] == 0, (out, err)
    assert [d["class"] for d in dead_letter_list(db)] == ["decode"]
    assert text_query(db, "SELECT code FROM dbo.codes ORDER BY id") == [("toolong",), ("ok",)]


def test_usage_errors(tmp_path, db):
    for args in (["dead-letters"], ["dead-letters", "frobnicate"], ["dead-letters", "show"],
                 ["dead-letters", "show", "abc"], ["dead-letters", "purge"],
                 ["dead-letters", "retry", "--class", "decode", "3"],
                 ["status", "extra"], ["status", "--max-lag", "lots"]):
        rc, out, err = command(db, *args)
        assert rc == EX_USAGE, (args, rc, out, err)
        assert err.strip(), args
    rc, out, err = run_ces2pg(["dead-letters", "list"])
    assert rc == EX_USAGE and "-c FILE" in err
    for args in (["dead-letters", "--help"], ["status", "-h"]):
        rc, out, err = run_ces2pg(args)
        assert rc == 0 and "dead-letters -c FILE retry" in out, (args, rc, err)


def test_purge_before(tmp_path, db):
    records = [b"bad one", b"bad two", codes(1, "ab")]
    replay_records(db, tmp_path, records)
    assert len(dead_letters(db)) == 2
    ids = [d["id"] for d in dead_letters(db)]
    db.query(f"UPDATE ces2pg.dead_letters SET created_at = now() - interval '40 days' "
                   f"WHERE id = {ids[0]}")
    rc, out, err = command(db, "dead-letters", "purge", "--before", "30 days")
    assert rc == 0 and "purged 1 dead letter made before now minus 30 days" in out, (out, err)
    assert [d["id"] for d in dead_letters(db)] == ids[1:]
    rc, out, err = command(db, "dead-letters", "purge", "--before", "not a time")
    assert rc == 1 and "not a time" in err, (out, err)
    rc, out, err = command(db, "dead-letters", "purge", "--before", "2999-01-01")
    assert rc == 0 and "purged 1 dead letter " in out, (out, err)
    assert dead_letters(db) == []


# ------------------------------------------------------------------------------------------------
# status
# ------------------------------------------------------------------------------------------------


def status(db, config, *extra):
    rc, out, err = command(db, "status", "--json", *extra, config=config)
    assert rc in (0, 1, 2, 3), (rc, out, err)
    return rc, (json.loads(out) if out.strip() else None), err


def test_status_follows_the_daemon(tmp_path, db, broker, ces2pg):
    b = broker(partitions=2)
    expect = generate(tmp_path, seed=2201, events=300, tables=2)
    records = read_records(expect["_out"])
    parts = [i % 2 for i in range(len(records))]
    produce_placed(b, "ces", records, parts)
    counts = {0: parts.count(0), 1: parts.count(1)}
    config = write_config(tmp_path, make_config(db, b, group=GROUP), name="status.conf")

    # Before any ces2pg ran: everything is waiting and nothing was ever applied. (The mock cluster
    # cannot list groups: the members are unknown here; tests/realbroker counts them.)
    rc, st, err = status(db, config)
    assert rc == 2 and st["health"] == "CRITICAL", (st, err)
    assert st["members"] is None and st["reason"].startswith("stalled: 300 records waiting")
    assert {p["partition"]: p["lag"] for p in st["partitions"]} == counts
    assert all(p["stored_position"] is None for p in st["partitions"])
    assert st["last_commit_lsn"] is None

    daemon = ces2pg(db, b, group=GROUP)
    wait_applied(db, GROUP, counts, daemons=[daemon])
    rc, st, err = status(db, config)
    assert (rc, st["health"]) == (0, "OK"), (st, err)
    assert {p["partition"]: (p["stored_position"], p["high_watermark"], p["lag"])
            for p in st["partitions"]} == {k: (v, v, 0) for k, v in counts.items()}
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{4}", st["last_commit_lsn"] or ""), st
    assert st["last_commit_time"] and st["seconds_since_last_commit"] < 120
    assert st["reorder_window_ms"] == 200  # the default; nothing came late
    assert st["dead_letters"] == {} and st["source_gaps"] == []

    rc, out, err = command(db, "status", config=config)
    assert rc == 0, err
    assert re.search(r"^group ces2pg-test: members unknown", out, re.M), out
    assert re.search(r"^ces\[0\]\s+%d\s+%d\s+0\s" % (counts[0], counts[0]), out, re.M), out
    assert re.search(r"^last commit applied: LSN [0-9A-F:]+, committed at the source ", out, re.M)
    assert re.search(r"^reorder window: \d+ ms", out, re.M), out
    assert out.rstrip().splitlines()[-1].startswith("health: OK: 0 records waiting"), out

    # A dead letter is a WARNING (exit 1), counted by class.
    produce_placed(b, "ces", [b"not json"], [0])
    counts[0] += 1
    wait_applied(db, GROUP, counts, daemons=[daemon])
    rc, st, err = status(db, config)
    assert (rc, st["health"], st["dead_letters"]) == (1, "WARNING", {"decode": 1}), st
    # Records waiting: more than --max-lag is a WARNING; with no commit for longer than
    # --stale-after, the replication has stalled (CRITICAL).
    assert daemon.terminate() == 0
    rc, out, err = command(db, "dead-letters", "purge", "--before", "2999-01-01", config=config)
    assert rc == 0, err
    produce_placed(b, "ces", records[:5], [1] * 5)
    rc, st, err = status(db, config)
    assert (rc, st["health"]) == (0, "OK"), st
    assert {p["partition"]: p["lag"] for p in st["partitions"]} == {0: 0, 1: 5}
    rc, st, err = status(db, config, "--max-lag", "3")
    assert (rc, st["health"], st["reason"]) == (1, "WARNING", "5 records waiting (--max-lag 3)")
    rc, st, err = status(db, config, "--stale-after", "0")
    assert (rc, st["health"]) == (2, "CRITICAL"), st
    assert st["reason"].startswith("stalled: 5 records waiting and no commit for "), st


def test_status_says_unknown_when_it_cannot_ask(tmp_path, db, broker):
    b = broker(partitions=1)
    bad_pg = make_config(db, b, group=GROUP, conninfo="host=127.0.0.1 port=1 dbname=x "
                                                      "connect_timeout=2")
    rc, out, err = command(db, "status", config=write_config(tmp_path, bad_pg))
    assert rc == 3 and "ces2pg: status:" in err and out == "", (rc, out, err)
    bad_kafka = make_config(db, "127.0.0.1:1", group=GROUP,
                            properties=["socket.connection.setup.timeout.ms=2000"])
    rc, out, err = command(db, "status", config=write_config(tmp_path, bad_kafka), timeout=60)
    assert rc == 3 and "ces2pg: status:" in err, (rc, out, err)
