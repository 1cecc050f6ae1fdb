"""`ces2pg adopt`: tables copied by another tool, marked with the source snapshot's LSN.

A replica is made the way README's "Starting from existing data" says: the source's tables as
they were at a commit LSN (the generator's expectation for the stream up to that transaction)
are loaded into PostgreSQL with COPY, adopted at that LSN, and then the whole stream, from
before the snapshot to after it, is applied. A reader looks at the tables the whole time: no
row may ever carry a change older than the snapshot, nor a key the snapshot did not have come
back, and at the end the rows are the stream's.
"""

import contextlib
import io
import json
import re
import threading

import psycopg2

from harness.common import Background
from harness.daemon import make_config, run_ces2pg, run_replay, write_config
from harness.events import generate, read_records, write_records
from harness.tables import assert_tables_match

EX_USAGE, EX_CONFIG = 64, 78


def transaction(record):
    data = json.loads(json.loads(record)["data"])
    return data["eventsource"]["transaction"]["commitlsn"]


def event_key(record):
    event = json.loads(record)
    data = json.loads(event["data"])
    key = tuple(p["value"] for p in data["eventsource"]["pkkey"])
    return event["operation"], data["eventsource"]["tbl"].lower(), key


def ceiling(lsn):
    """The version a snapshot at lsn (VLF:block:slot) gives rows: the LSN as one number, then
    twenty nines."""
    vlf, block, slot = (int(x, 16) for x in lsn.split(":"))
    return str((vlf << 48) | (block << 16) | slot) + "9" * 20


def quote(name):
    return '"' + name.replace('"', '""') + '"'


def copy_text(value):
    if value is None:
        return "\\N"
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


def load_with_copy(db, expect):
    """Creates the expectation's tables (its column types, its key) and loads its rows with COPY,
    as a bulk loader would: no version column."""
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        for qualified, spec in expect["tables"].items():
            schema, table = qualified.split(".")
            cols = list(spec["columns"])
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(schema)}")
            cur.execute(f"CREATE TABLE {quote(schema)}.{quote(table)} ("
                        + ", ".join(f"{quote(c)} {t}" for c, t in spec["columns"].items())
                        + ", PRIMARY KEY (" + ", ".join(quote(k) for k in spec["key"]) + "))")
            data = "".join("\t".join(copy_text(r.get(c)) for c in cols) + "\n"
                           for r in spec["rows"])
            cur.execute("SET TimeZone = 'UTC'")
            cur.copy_expert(f"COPY {quote(schema)}.{quote(table)} ("
                            + ", ".join(quote(c) for c in cols) + ") FROM STDIN",
                            io.StringIO(data))


def snapshot_at_half(tmp_path, seed, events):
    """The stream, and the source's tables as of the end of the transaction that ends closest
    after its middle: (full expectation, records, snapshot expectation, index of the first record
    after the snapshot, the snapshot's commit LSN)."""
    fixed = ["--time", "2026-08-07T16:25:00Z"]  # both runs byte for byte alike
    full = generate(tmp_path / "full", seed=seed, events=events, extra_args=fixed)
    records = read_records(full["_out"])
    n = len(records) // 2
    while transaction(records[n - 1]) == transaction(records[n]):
        n += 1
    snap = generate(tmp_path / "snap", seed=seed, events=n, extra_args=fixed)
    # The generator's stream is the same up to there: its expectation is the snapshot.
    assert read_records(snap["_out"]) == records[:n]
    return full, records, snap, n, transaction(records[n - 1])


class SnapshotReader(Background):
    """Looks at every table in one snapshot of PostgreSQL, again and again. A row must carry the
    snapshot's version or a later one; a row at the snapshot's version must be the snapshot's
    row; a key of the snapshot that is gone must have a tombstone newer than the snapshot."""

    def __init__(self, db, snap, floor):
        super().__init__("snapshot-reader")
        self.db, self.snap, self.floor = db, snap, floor
        self.looks, self.violations = 0, []

    def run(self):
        with contextlib.closing(self.db.connect()) as conn:
            conn.set_session(isolation_level="REPEATABLE READ", autocommit=False)
            while not self.stopping():
                with conn.cursor() as cur:
                    cur.execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; "
                                "SET extra_float_digits = 1")
                    for qualified, spec in self.snap["tables"].items():
                        self.look(cur, qualified, spec)
                conn.rollback()
                self.looks += 1

    def look(self, cur, qualified, spec):
        schema, table = qualified.split(".")
        cols, key = list(spec["columns"]), list(spec["key"])
        name = f"{quote(schema)}.{quote(table)}"
        cur.execute(f"SELECT count(*) FROM {name} WHERE _ces_lsn IS NULL OR _ces_lsn < %s",
                    (self.floor,))
        older = cur.fetchone()[0]
        if older:
            self.violations.append(f"{qualified}: {older} row(s) older than the snapshot")
        cur.execute("SELECT " + ", ".join(f"{quote(c)}::text" for c in cols) +
                    f", _ces_lsn = %s FROM {name}", (self.floor,))
        rows = {tuple(r[cols.index(k)] for k in key): (r[:-1], r[-1]) for r in cur.fetchall()}
        for srow in spec["rows"]:
            k = tuple(srow[c] for c in key)
            if k in rows:
                values, at_snapshot = rows[k]
                if at_snapshot and list(values) != [srow.get(c) for c in cols]:
                    self.violations.append(f"{qualified} {k}: {values} is not the snapshot's row")
                continue
            cur.execute(f"SELECT count(*) FROM ces2pg.tombstones WHERE relid = %s::regclass "
                        "AND key = %s::text[] AND version > %s", (name, list(k), self.floor))
            if cur.fetchone()[0] == 0:
                self.violations.append(f"{qualified} {k}: gone without a newer delete")


def key_deleted_before(records, n, snap):
    """A key inserted and deleted before the snapshot and absent from it: (table, key, index of
    its delete)."""
    present = {(q.split(".")[1], tuple(r[c] for c in spec["key"]))
               for q, spec in snap["tables"].items() for r in spec["rows"]}
    inserted = {}
    for i, rec in enumerate(records[:n]):
        op, table, key = event_key(rec)
        if op == "INS":
            inserted[(table, key)] = i
        elif op == "DEL" and (table, key) in inserted and (table, key) not in present:
            return table, key, i
    raise AssertionError("no key inserted and deleted before the snapshot")


def test_copied_tables_adopted_at_the_snapshot_lsn(tmp_path, db):
    full, records, snap, n, lsn = snapshot_at_half(tmp_path, seed=9090, events=1600)
    load_with_copy(db, snap)
    vlf, block, slot = lsn.split(":")
    rc, out, err = run_ces2pg(["adopt", "-c", write_config(tmp_path, make_config(db)), "--all",
                               "--lsn", f"0x{vlf}{block}{slot}"])
    assert rc == 0, f"{out}\n{err}"
    for qualified, spec in snap["tables"].items():
        assert f"adopt: {qualified}: {len(spec['rows'])} rows marked with the version of {lsn}" \
            in out, out
    assert re.search(rf"adopt: {len(snap['tables'])} table\(s\) adopted, "
                     rf"{sum(len(s['rows']) for s in snap['tables'].values())} rows marked", out)
    floor = ceiling(lsn)
    assert db.query("SELECT lsn, version::text FROM ces2pg.adoptions") == \
        [(lsn, floor)] * len(snap["tables"])

    reader = SnapshotReader(db, snap, floor).start()
    try:
        # Up to just before a delete of a key the snapshot never had: its insert (older than
        # the snapshot) must not bring it in, though no row or tombstone stands in its way.
        table, key, delete_at = key_deleted_before(records, n, snap)
        rc, out, err = run_replay(db, [write_records(tmp_path / "before.jsonl",
                                                     records[:delete_at])])
        assert rc == 0, err
        spec = snap["tables"][f"dbo.{table}"]
        where = " AND ".join(f"{quote(c)}::text = %s" for c in spec["key"])
        assert db.scalar(f"SELECT count(*) FROM dbo.{quote(table)} WHERE {where}", key) == 0
        assert_tables_match(db, snap)  # nothing older than the snapshot changed anything
        # Then everything, from the topic's start, in four parts cut between transactions (an
        # event's segments stay together), the reader looking while each is applied (the whole
        # at once can end before it looks at all).
        looks = reader.looks
        cuts = [0]
        for quarter in (1, 2, 3):
            i = quarter * len(records) // 4
            while transaction(records[i - 1]) == transaction(records[i]):
                i += 1
            cuts.append(i)
        cuts.append(len(records))
        for part, (start, end) in enumerate(zip(cuts, cuts[1:])):
            rc, out, err = run_replay(db, [write_records(tmp_path / f"part{part}.jsonl",
                                                         records[start:end])])
            assert rc == 0, err
        assert reader.looks > looks, "the reader never looked while the stream was applied"
    finally:
        reader.stop()
    assert not reader.violations, reader.violations[:5]
    assert_tables_match(db, full)


def test_adopt_marks_only_older_rows_and_refuses_what_it_cannot(tmp_path, db):
    cfg = write_config(tmp_path, make_config(db))
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute('CREATE SCHEMA dbo; CREATE TABLE dbo.items (id int PRIMARY KEY, name text);'
                    "INSERT INTO dbo.items SELECT g, 'item ' || g FROM generate_series(1, 5) g;"
                    'CREATE TABLE dbo.audit (at timestamptz, what text)')

    def adopt(*args):
        return run_ces2pg(["adopt", "-c", cfg] + list(args))

    rc, out, err = adopt("--table", "DBO.Items", "--lsn", "0000002A:000001F0:0003")
    assert rc == 0 and "adopt: dbo.items: 5 rows marked with the version of 0000002A:000001F0:0003" \
        in out, out + err
    high = ceiling("0000002A:000001F0:0003")
    # A row a later change reached keeps its version; adopting again at an earlier LSN lowers
    # nothing and keeps the trigger at the later one.
    db.query("UPDATE dbo.items SET _ces_lsn = _ces_lsn + 1 WHERE id = 1")
    rc, out, err = adopt("--table", "dbo.items", "--lsn", "0x00000029000000010001")
    assert rc == 0 and "0 rows marked" in out and "earlier adoption at a later LSN" in out, out
    assert db.query("SELECT id, _ces_lsn::text FROM dbo.items ORDER BY id") == \
        [(1, str(int(high) + 1))] + [(i, high) for i in range(2, 6)]
    assert high in db.scalar("SELECT pg_get_triggerdef(oid) FROM pg_trigger "
                             "WHERE tgname = 'ces2pg_adopted'")
    # The trigger skips an insert at or before the snapshot, whoever makes it; a later one goes.
    db.query("INSERT INTO dbo.items VALUES (6, 'old', %s::numeric), (7, 'new', %s::numeric + 1)",
             (high, high))
    assert db.query("SELECT id FROM dbo.items WHERE id > 5") == [(7,)]

    rc, out, err = adopt("--table", "dbo.AUDIT", "--lsn", "0x00000029000000010001")
    assert rc == 1 and "no primary key" in err, out + err
    rc, out, err = adopt("--table", "dbo.nothing", "--lsn", "0x00000029000000010001")
    assert rc == 1 and "dbo.nothing: no such table" in err, err
    rc, out, err = adopt("--all", "--lsn", "0x0000002B000000010001")
    assert rc == 0 and "adopt: dbo.audit: no primary key" in out and "1 table(s) adopted" in out, out

    for bad in (["--all"], ["--lsn", "0x1"], ["--all", "--table", "dbo.items", "--lsn", "1:2:3"],
                ["--all", "--lsn", "0x0000002A000001F0000"], ["--all", "--lsn", "2A 1F0 3"]):
        rc, out, err = adopt(*bad)
        assert rc == EX_USAGE, (bad, out, err)
    rc, _, err = run_ces2pg(["adopt", "-c", write_config(tmp_path, make_config(
        db, apply_extra=("lsn_guard = false;",))), "--all", "--lsn", "1:2:3"])
    assert rc == EX_CONFIG and "lsn_guard is off" in err, err
