"""The per-row version guard and tombstones (apply.lsn_guard, default on).

CES delivers at least once: duplicates, repeats, and older events after newer ones. With the guard,
a change takes effect only when it is newer than the row, and a delete leaves a tombstone that keeps
an older insert of the same key out. So *any* order of the same events must end in the same state:
the tests replay generated streams (with primary-key changes and re-inserted keys) shuffled,
reversed and duplicated, through replay and through the broker, and compare with the generator's
expectation. With the guard off, the reversed stream must end wrong, which shows the guard is what
makes the difference.
"""

import random
import re

import pytest

from harness.daemon import parse_replay_summary, run_replay
from harness.events import disorder, generate, read_records, write_records
from harness.mockbroker import PacedProducer, produce_placed
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match, quote_ident, split_table

GROUP = "ces2pg-test"
GEN_ARGS = ["--pk-changes", "--reuse-deleted-keys"]


def test_resend_mode_in_replay(tmp_path, db):
    """ces-gen --resend: duplicates at once, old events resent long after newer ones, older inserts
    of keys deleted since."""
    expect = generate(tmp_path, seed=30, events=4000, extra_args=GEN_ARGS + ["--resend", "0.05"])
    rc, out, err = run_replay(db, [expect["_out"]])
    assert rc == 0, err
    total, applied, dead = parse_replay_summary(out)
    assert (total, dead) == (expect["records"], 0)
    assert total > expect["events"], "the stream must carry resent records"
    assert_tables_match(db, expect)


def test_resend_mode_needs_the_guard(tmp_path, db):
    expect = generate(tmp_path, seed=30, events=4000, extra_args=GEN_ARGS + ["--resend", "0.05"])
    rc, out, err = run_replay(db, [expect["_out"]],
                              apply_extra=["lsn_guard = false;", "dedup_window = 0;"])
    assert rc == 0, err
    with pytest.raises(AssertionError):
        assert_tables_match(db, expect)


@pytest.mark.parametrize("how", ["reversed", "shuffled", "resent"])
def test_any_order_converges_in_replay(tmp_path, db, how):
    expect = generate(tmp_path, seed=31, events=4000, extra_args=GEN_ARGS)
    records = disorder(read_records(expect["_out"]), how)
    path = tmp_path / f"{how}.jsonl"
    write_records(path, records)
    rc, out, err = run_replay(db, [path])
    assert rc == 0, err
    total, applied, dead = parse_replay_summary(out)
    assert (total, dead) == (len(records), 0)
    assert_tables_match(db, expect)
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM ces2pg.tombstones")
        assert cur.fetchone()[0] > 0, "deletes must leave tombstones"


def test_without_guard_order_matters(tmp_path, db):
    expect = generate(tmp_path, seed=31, events=4000, extra_args=GEN_ARGS)
    records = disorder(read_records(expect["_out"]), "reversed")
    path = tmp_path / "reversed.jsonl"
    write_records(path, records)
    rc, out, err = run_replay(db, [path], apply_extra=["lsn_guard = false;"])
    assert rc == 0, err
    with pytest.raises(AssertionError):
        assert_tables_match(db, expect)


def test_resent_stream_through_the_broker(tmp_path, db, broker, ces2pg):
    b = broker(partitions=3)
    expect = generate(tmp_path, seed=32, events=3000, extra_args=GEN_ARGS + ["--resend", "0.05"])
    records = disorder(read_records(expect["_out"]), "resent")
    rng = random.Random(3)
    parts = [rng.randrange(3) for _ in records]  # no order at all, like partition scheme None
    daemon = ces2pg(db, b, group=GROUP)
    producer = PacedProducer(b, db, GROUP, "ces", records, parts).start()
    producer.finish(timeout=120, daemons=[daemon])
    wait_applied(db, GROUP, producer.counts, timeout=60, daemons=[daemon])
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert daemon.terminate() == 0
    # Most resent events are recognised before they reach PostgreSQL (the guard is the second
    # line of defence).
    m = re.search(r"stopped: (\d+) records, (\d+) events applied, (\d+) dead letters, "
                  r"(\d+) duplicates skipped", daemon.log())
    assert m, daemon.log()[-2000:]
    received, applied, _, duplicates = map(int, m.groups())
    assert received == len(records)
    assert duplicates > 0 and applied + duplicates == received


def test_backfilled_table_is_adopted(tmp_path, db):
    """A table loaded before ces2pg (no version column) gets one; its rows (NULL version) are older
    than any event."""
    expect = generate(tmp_path, seed=33, events=1500)
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("CREATE SCHEMA dbo")
        cur.execute("CREATE TABLE dbo.customers AS SELECT * FROM (VALUES (1, 'backfilled')) "
                    "v(customerid, fullname)")
        cur.execute("ALTER TABLE dbo.customers ALTER customerid TYPE integer, "
                    "ALTER fullname TYPE varchar(50), ADD PRIMARY KEY (customerid)")
    rc, out, err = run_replay(db, [expect["_out"]])
    assert rc == 0, err
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema = 'dbo' "
                    "AND table_name = 'customers' AND column_name = '_ces_lsn'")
        assert cur.fetchone()[0] == 1
    assert_tables_match(db, expect)


def test_tombstones_are_purged(tmp_path, db):
    expect = generate(tmp_path, seed=34, events=1500)
    rc, out, err = run_replay(db, [expect["_out"]],
                              apply_extra=['tombstone_retention = "1 s";'])
    assert rc == 0, err
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM ces2pg.tombstones")
        before = cur.fetchone()[0]
        assert before > 0
        cur.execute("UPDATE ces2pg.tombstones SET deleted_at = now() - interval '1 hour'")
    # Another replay (its events are all old: nothing changes) runs the purge after its batch.
    rc, out, err = run_replay(db, [expect["_out"]],
                              apply_extra=['tombstone_retention = "1 s";'])
    assert rc == 0, err
    assert "purged" in err
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM ces2pg.tombstones WHERE deleted_at < now() - interval '1 minute'")
        assert cur.fetchone()[0] == 0
    assert_tables_match(db, expect)


def spoil_rows(db, expect):
    """Makes every row older than its events and gives its text columns other values."""
    with db.connect() as conn, conn.cursor() as cur:
        for qualified, spec in sorted(expect["tables"].items()):
            texts = [c for c, t in spec["columns"].items()
                     if c not in spec["key"] and ("char" in t or t == "text")]
            assert texts, f"{qualified} has no text column to spoil"
            sets = ", ".join(f'"{c}" = \'spoilt\'' for c in texts)
            schema, table = split_table(qualified)
            cur.execute(f"UPDATE {quote_ident(schema)}.{quote_ident(table)} "
                        f"SET _ces_lsn = 0, {sets}")
            assert cur.rowcount == len(spec["rows"])
        conn.commit()
    with pytest.raises(AssertionError):
        assert_tables_match(db, expect)


def test_inserts_of_taken_keys(tmp_path, db):
    """An INS of a new key goes as a plain INSERT. When its key is taken after all (rows loaded
    before ces2pg, a replay), the batch goes again as upserts, with the version guard's outcome;
    and the table then sends upserts for a while, instead of failing batch after batch."""
    expect = generate(tmp_path, seed=33, events=1500, extra_args=["--mix", "100,0,0"])
    config = dict(log_level="debug", batch_max_events=20)
    rc, out, err = run_replay(db, [expect["_out"]], **config)
    assert rc == 0, err
    assert "found a key taken" not in err, "new keys must go in at once"
    assert_tables_match(db, expect)

    # Every row older than its INS, with other values: the second pass finds every key taken, and
    # only the upserts it falls back to can put the rows right.
    spoil_rows(db, expect)

    rc, out, err = run_replay(db, [expect["_out"]], **config)
    assert rc == 0, err
    total, applied, dead = parse_replay_summary(out)
    assert (total, dead) == (expect["records"], 0)
    assert_tables_match(db, expect)
    # 75 batches: each table falls back on its first taken key, and at most once more, 64
    # attempts later (then it waits 128).
    taken = err.count("found a key taken")
    assert len(expect["tables"]) <= taken <= 2 * len(expect["tables"]), err


def test_taken_keys_in_big_batches_through_the_broker(tmp_path, db, broker, ces2pg):
    """The daemon sends a batch without waiting and reads its results as they come. When a plain
    INSERT finds its key taken, the error can be read before the rest of the batch's results:
    they must all be read, to the batch's end, before the batch goes again as upserts, or the next
    attempt takes them for its own answers (and, on the old code, ended in a loop of retries
    about every other run of this test)."""
    expect = generate(tmp_path, seed=34, events=3000,
                      extra_args=["--mix", "100,0,0", "--value-size", "3000"])
    rc, out, err = run_replay(db, [expect["_out"]])
    assert rc == 0, err
    spoil_rows(db, expect)

    # Three partitions: the mock broker drops a partition's oldest records past a few MB (one
    # partition of these 10 MB started at offset 1905).
    b = broker(partitions=3)
    records = read_records(expect["_out"])
    counts = produce_placed(b, "ces", records, [i % 3 for i in range(len(records))])
    daemon = ces2pg(db, b, group=GROUP, log_level="debug")
    wait_applied(db, GROUP, counts, timeout=90, daemons=[daemon])
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    log = daemon.log()
    assert log.count("found a key taken") >= 2, "the batches must have started as plain INSERTs"
    assert "retrying the batch" not in log and "reconnecting" not in log, log[-3000:]
