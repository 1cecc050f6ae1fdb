"""Apply semantics: types, keys, identifiers, schema mapping and evolution, failure handling.

Records are built here by hand, as CES writes them (the shape of the documented examples), so that
each test controls exactly which values and names reach ces2pg.
"""

import contextlib
import json
import re
import socket
import threading
import time

import psycopg2
import pytest

from harness.common import free_port, wait_until
from harness.daemon import parse_replay_summary, run_replay
from harness.events import generate, read_records, write_records
from harness.metrics import metric, scrape
from harness.mockbroker import PacedProducer
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match, statement_calls, statement_sums

GROUP = "ces2pg-test"
_lsn = [0x1000]


def ces_record(table, cols, op, current=None, old=None, pk=None, db="Db", schema="dbo",
               sequence=1, lsn=None, pk_values=None):
    """One current-generation CES record (bytes). cols: [(name, sqlserver type)]; current/old:
    dicts of name -> value (str or None); pk: names of the key columns, whose values pkkey takes
    from the image, or from pk_values when given."""
    if lsn is None:
        _lsn[0] += 1
        lsn = _lsn[0]
    commit = "00000001:%08X:0001" % lsn
    image = pk_values if pk_values is not None else current if op != "DEL" else old
    pkkey = [{"columnname": k, "value": image[k]} for k in (pk or [])]
    data = {
        "eventsource": {
            "db": db, "schema": schema, "tbl": table,
            "cols": [{"name": n, "type": t, "index": i} for i, (n, t) in enumerate(cols)],
            "pkkey": pkkey,
            "transaction": {"commitlsn": commit, "beginlsn": commit, "sequencenumber": sequence,
                            "finalevent": False, "committime": "2026-08-07T16:25:00.890Z"},
        },
        "eventrow": {"old": json.dumps(old or {}), "current": json.dumps(current or {})},
    }
    envelope = {
        "specversion": "1.0", "type": "com.microsoft.SQL.CES.DML.V1", "source": "/",
        "id": "00000000-0000-0000-0000-%012d" % lsn,
        "logicalid": "11111111-2222-3333-4444-555555555555:00000001%08X0001:%020d" % (lsn, sequence),
        "time": "2026-08-07T16:25:00.890Z", "datacontenttype": "application/json",
        "operation": op, "segmentindex": 1, "finalsegment": True, "data": json.dumps(data),
    }
    return json.dumps(envelope).encode()


def replay_records(db, tmp_path, records, **kw):
    path = tmp_path / f"records-{_lsn[0]}.jsonl"
    write_records(path, records)
    rc, out, err = run_replay(db, [path], **kw)
    assert rc == 0, err
    return parse_replay_summary(out), out, err


def text_query(db, sql):
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; SET extra_float_digits = 1")
        cur.execute(sql)
        return cur.fetchall()


# SQL Server type, a realistic SQL Server rendering, PostgreSQL type, what PostgreSQL must hold.
TYPE_CASES = [
    ("bit", "1", "boolean", "true"),
    ("bit", "False", "boolean", "false"),
    ("tinyint", "255", "smallint", "255"),
    ("smallint", "-32768", "smallint", "-32768"),
    ("int", "2147483647", "integer", "2147483647"),
    ("bigint", "-9223372036854775808", "bigint", "-9223372036854775808"),
    ("decimal(10,2)", "12345678.90", "numeric(10,2)", "12345678.90"),
    ("numeric(38,10)", "-0.0000000001", "numeric(38,10)", "-0.0000000001"),
    ("money", "922337203685477.5807", "numeric(19,4)", "922337203685477.5807"),
    ("smallmoney", "-214748.3648", "numeric(10,4)", "-214748.3648"),
    ("real", "3.4028235E+38", "real", "3.4028235e+38"),
    ("float", "1.7976931348623157E+308", "double precision", "1.7976931348623157e+308"),
    ("float", "-2.5E-3", "double precision", "-0.0025"),
    ("date", "0001-01-01", "date", "0001-01-01"),
    ("time(7)", "16:25:00.8833336", "time(6) without time zone", "16:25:00.883334"),
    ("datetime", "2025-03-14 16:45:01.003", "timestamp(3) without time zone",
     "2025-03-14 16:45:01.003"),
    ("smalldatetime", "2025-03-14 16:45:00", "timestamp(0) without time zone",
     "2025-03-14 16:45:00"),
    ("datetime2(7)", "9999-12-31 23:59:59.9999994", "timestamp(6) without time zone",
     "9999-12-31 23:59:59.999999"),
    ("datetimeoffset(7)", "2026-08-07 16:25:00.8833333 +05:45", "timestamp(6) with time zone",
     "2026-08-07 10:40:00.883333+00"),
    ("char(5)", "ab   ", "character(5)", "ab"),
    ("nchar(3)", "日本語", "character(3)", "日本語"),
    ("varchar(10)", "it's \"q\"", "character varying(10)", "it's \"q\""),
    ("nvarchar(max)", "line\nbreak\ttab \\ back", "text", "line\nbreak\ttab \\ back"),
    ("binary(4)", "0xDEADBEEF", "bytea", "\\xdeadbeef"),
    ("varbinary(max)", "3q2+7w==", "bytea", "\\xdeadbeef"),
    ("uniqueidentifier", "6F9619FF-8B86-D011-B42D-00C04FD430C8", "uuid",
     "6f9619ff-8b86-d011-b42d-00c04fd430c8"),
    ("sql_variant", "anything", "text", "anything"),
]


def test_type_families(tmp_path, db):
    cols = [("Id", "int")] + [("c%d" % i, t) for i, (t, _, _, _) in enumerate(TYPE_CASES)]
    current = {"Id": "1"}
    current.update({"c%d" % i: v for i, (_, v, _, _) in enumerate(TYPE_CASES)})
    (records, applied, dead), _, err = replay_records(
        db, tmp_path, [ces_record("Types", cols, "INS", current, pk=["Id"])])
    assert (records, applied, dead) == (1, 1, 0), err
    types = dict(text_query(db, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                                "WHERE attrelid = 'dbo.types'::regclass AND attnum > 0"))
    row = text_query(db, "SELECT " + ", ".join("c%d::text" % i for i in range(len(TYPE_CASES)))
                     + " FROM dbo.types")[0]
    problems = []
    for i, (sstype, value, pgtype, want) in enumerate(TYPE_CASES):
        if types["c%d" % i] != pgtype:
            problems.append(f"{sstype}: column type {types['c%d' % i]}, expected {pgtype}")
        if row[i] != want:
            problems.append(f"{sstype} {value!r}: PostgreSQL holds {row[i]!r}, expected {want!r}")
    assert not problems, "\n".join(problems)
    assert "sql_variant" in err and "no mapping" in err  # unknown types warn


def test_hostile_identifiers_are_quoted(tmp_path, db):
    schema = 'we"ird; DROP SCHEMA ces2pg CASCADE; --'
    table = "t'a\"b); DELETE FROM ces2pg.offsets; --"
    cols = [("Id", "int"), ('"; DROP TABLE x; --', "nvarchar(20)"), ("Name With Space", "int"),
            ("Ünïcødé", "nvarchar(5)")]
    current = {"Id": "7", '"; DROP TABLE x; --': "v'1", "Name With Space": "3", "Ünïcødé": "ö"}
    (records, applied, dead), _, err = replay_records(
        db, tmp_path, [ces_record(table, cols, "INS", current, pk=["Id"], schema=schema)])
    assert (applied, dead) == (1, 0), err
    rows = text_query(db, "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
                          "ON n.oid = c.relnamespace WHERE c.relname LIKE 't''a%' AND c.relkind = 'r'")
    assert rows == [(schema.lower(), table.lower())]
    q = '"%s"."%s"' % (schema.lower().replace('"', '""'), table.lower().replace('"', '""'))
    got = text_query(db, 'SELECT id, """; drop table x; --", "name with space", "Ünïcødé" FROM ' + q)
    assert got == [(7, "v'1", 3, "ö")]
    assert db.table_exists("ces2pg.offsets") and db.table_exists("ces2pg.dead_letters")


def test_target_template_and_preserved_case(tmp_path, db):
    cols = [("Id", "int"), ("FirstName", "nvarchar(20)")]
    rec = ces_record("Employees", cols, "INS", {"Id": "1", "FirstName": "Ada"}, pk=["Id"],
                     db="HR")
    (_, applied, _), _, err = replay_records(
        db, tmp_path, [rec],
        extra_config='schema = { target = "{db}_{schema}.{table}"; identifier_case = "preserve"; };')
    assert applied == 1, err
    assert text_query(db, 'SELECT "Id", "FirstName" FROM "HR_dbo"."Employees"') == [(1, "Ada")]


def test_include_and_exclude(tmp_path, db):
    cols = [("Id", "int")]
    records = [ces_record("Keep", cols, "INS", {"Id": "1"}, pk=["Id"]),
               ces_record("Purchases", cols, "INS", {"Id": "1"}, pk=["Id"]),
               ces_record("PurchaseLines", cols, "INS", {"Id": "1"}, pk=["Id"]),
               ces_record("Other", cols, "INS", {"Id": "1"}, pk=["Id"], schema="audit")]
    (total, applied, dead), out, err = replay_records(
        db, tmp_path, records,
        extra_config='schema = { include = [ "dbo.*" ]; exclude = [ "DBO.purchase*" ]; };')
    assert (total, applied, dead) == (4, 1, 0), out + err
    assert "excluded=3" in out
    assert db.table_exists("dbo.keep")
    assert not db.table_exists("dbo.purchases") and not db.table_exists("audit.other")
    assert dead_letters(db) == []


def test_table_without_primary_key(tmp_path, db):
    cols = [("A", "int")]
    records = [ces_record("Heap", cols, "INS", {"A": str(i)}) for i in range(3)]
    records.append(ces_record("Keyed", [("Id", "int")], "INS", {"Id": "1"}, pk=["Id"]))
    (total, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (total, applied, dead) == (4, 1, 3)
    reasons = {d["reason"] for d in dead_letters(db)}
    assert reasons == {"table has no primary key (ces2pg applies changes by primary key)"}
    assert len(re.findall(r"WARNING table Db\.dbo\.Heap has no primary key", err)) == 1, err


def test_rejected_value_dead_letters_only_its_event(tmp_path, db):
    cols = [("Id", "int"), ("Code", "varchar(3)")]
    records = [ces_record("Codes", cols, "INS", {"Id": str(i), "Code": "ab"}, pk=["Id"])
               for i in range(1, 50)]
    bad = ces_record("Codes", cols, "INS", {"Id": "99", "Code": "toolong"}, pk=["Id"])
    records.insert(20, bad)
    records.append(ces_record("Codes", cols, "INS", {"Id": "100", "Code": "not-an-int"}, pk=["Id"]))
    records[-1] = records[-1].replace(b'\\"Id\\": \\"100\\"', b'\\"Id\\": \\"x100\\"')
    (total, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (total, applied, dead) == (51, 49, 2), err
    letters = dead_letters(db)
    assert sorted(bytes(d["payload"]) == bad for d in letters) == [False, True]
    assert all("SQLSTATE 22" in d["reason"] for d in letters), letters
    assert text_query(db, "SELECT count(*) FROM dbo.codes") == [(49,)]


def test_row_changes_go_in_bulk_statements(tmp_path, db):
    """A batch's changes of one table and shape are one statement over arrays, not one per row."""
    cols = [("Id", "int"), ("Name", "nvarchar(20)"), ("Note", "nvarchar(max)")]
    records = []
    for i in range(1, 601):
        table = "BulkA" if i % 2 else "BulkB"
        records.append(ces_record(table, cols, "INS", {"Id": str(i), "Name": "n%d" % i,
                                                       "Note": None if i % 7 == 0 else "x"},
                                  pk=["Id"]))
    for i in range(1, 601, 6):
        table = "BulkA" if i % 2 else "BulkB"
        records.append(ces_record(table, cols, "DEL", old={"Id": str(i), "Name": "n%d" % i,
                                                            "Note": "x"}, pk=["Id"]))
    (total, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (total, applied, dead) == (700, 700, 0), err
    assert text_query(db, "SELECT count(*), count(note), sum(id) FROM dbo.bulka") == [
        (200, 172, sum(i for i in range(1, 601, 2) if i % 6 != 1))]
    assert text_query(db, "SELECT count(*) FROM dbo.bulkb") == [(300,)]
    assert text_query(db, "SELECT count(*) FROM ces2pg.tombstones") == [(100,)]
    calls, rows = statement_calls(db, 'INSERT INTO "dbo"."bulk_"%unnest(%')
    assert rows == 600 and 2 <= calls <= 10, (calls, rows)
    calls, _ = statement_calls(db, 'WITH s AS (SELECT * FROM unnest(%DELETE FROM "dbo"."bulka"%')
    assert 1 <= calls <= 5, calls


def test_plans_made_on_small_tables_still_look_rows_up_by_key(tmp_path, db, broker, ces2pg):
    """A table and its tombstones analysed while small (as autovacuum does early on) and grown
    since, in one session: new keys are still looked for among the tombstones by key, and deletes
    find their rows by key. Statements prepared while both were small kept plans that scanned
    them (PostgreSQL keeps a generic plan after five executions): the tombstones whole for every
    new key, the table whole for every delete statement (in psql, 1,000 deletes took a minute in
    a table of 200,000 rows)."""
    cols = [("Id", "int"), ("Name", "nvarchar(20)")]

    def ins(i):
        return ces_record("Grown", cols, "INS", {"Id": str(i), "Name": "n%d" % i}, pk=["Id"])

    def delete(i):
        return ces_record("Grown", cols, "DEL", old={"Id": str(i), "Name": "n%d" % i}, pk=["Id"])

    b = broker(partitions=1)
    daemon = ces2pg(db, b, group=GROUP, batch_max_events=1000)
    produced = [0]

    def apply(records):
        # In pieces: the mock broker keeps about 5 MB of a partition.
        for at in range(0, len(records), 2_000):
            piece = records[at:at + 2_000]
            b.produce("ces", piece, partition=0)
            produced[0] += len(piece)
            wait_applied(db, GROUP, {0: produced[0]}, daemons=[daemon])

    apply([ins(1), ins(2), ins(3), delete(3)])
    # Analysed now, and not again before the end (autovacuum could come by while the test runs).
    for table in ("dbo.grown", "ces2pg.tombstones"):
        db.query(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        db.query(f"ANALYZE {table}")
    # While both are small, each statement runs more than five times on a hundred rows: new keys,
    # and deletes of keys never inserted (the same each time: the tombstones stay a hundred).
    keys = iter(range(100, 10**6))
    for _ in range(8):
        apply([ins(next(keys)) for _ in range(100)] + [delete(500_000 + i) for i in range(100)])
    # Both grow by 20,000 rows.
    grown = [next(keys) for _ in range(20_000)]
    apply([ins(i) for i in grown] + [delete(600_000 + i) for i in range(20_000)])
    inserts, pages = 'INSERT INTO "dbo"."grown"%', ("shared_blks_hit + shared_blks_read", "rows")
    blocks, rows = statement_sums(db, inserts, pages)
    # Large now: batches of new keys and deletes of existing ones.
    for n in range(8):
        apply([ins(next(keys)) for _ in range(100)] +
              [delete(i) for i in grown[n * 100:(n + 1) * 100]])
    blocks_after, rows_after = statement_sums(db, inserts, pages)
    assert rows_after - rows == 800
    # A lookup by key reads a few pages (the tombstones' index and the row's, the row's page);
    # scanning the tombstones reads all of theirs, more than a hundred.
    per_row = (blocks_after - blocks) / (rows_after - rows)
    assert per_row < 20, per_row
    assert daemon.terminate() == 0
    # Once its session has ended its counts are in. Deletes fetch a row per key deleted (800 in
    # the last phase) and, while the table was small, may have read it whole; a delete statement
    # whose plan takes the table for small once it has grown reads 20,000 rows or more.
    wait_until(lambda: db.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_type = 'client backend' AND pid <> pg_backend_pid()") == 0, 30,
        message="ces2pg's session must end")
    seq_read, fetched = db.query("SELECT seq_tup_read, coalesce(idx_tup_fetch, 0) FROM "
                                 "pg_stat_user_tables WHERE relid = 'dbo.grown'::regclass")[0]
    assert seq_read + fetched < len(grown), (seq_read, fetched)
    assert db.scalar("SELECT count(*) FROM dbo.grown") == 2 + 800 + 20_000 + 800 - 800


def test_changes_of_one_key_keep_their_order_inside_a_batch(tmp_path, db):
    """Partial updates (include_all_columns = 0: only changed columns and the key) of one key in
    one batch, whose shapes were first seen in the opposite order on another key: applied out of
    order, the version guard would drop the older one."""
    cols = [("Id", "int"), ("A", "nvarchar(10)"), ("B", "nvarchar(10)"), ("C", "nvarchar(10)")]
    full = {"A": "a", "B": "b", "C": "c"}
    first = [ces_record("Partial", cols, "INS", dict(full, Id=str(k)), pk=["Id"])
             for k in (1, 2, 3)]
    replay_records(db, tmp_path, first)
    batch = [
        ces_record("Partial", cols, "UPD", {"Id": "2", "C": "2c"}, pk=["Id"]),
        ces_record("Partial", cols, "UPD", {"Id": "1", "B": "1b"}, pk=["Id"]),
        ces_record("Partial", cols, "UPD", {"Id": "1", "C": "1c"}, pk=["Id"]),
        ces_record("Partial", cols, "DEL", old=dict(full, Id="3"), pk=["Id"]),
        ces_record("Partial", cols, "INS", {"Id": "3", "A": "3a"}, pk=["Id"]),
        ces_record("Partial", cols, "UPD", {"Id": "3", "B": "3b"}, pk=["Id"]),
        ces_record("Partial", cols, "UPD", {"Id": "2", "B": "2b"}, pk=["Id"]),
    ]
    (total, applied, dead), _, err = replay_records(db, tmp_path, batch)
    assert (total, applied, dead) == (7, 7, 0), err
    assert text_query(db, "SELECT id, a, b, c FROM dbo.partial ORDER BY id") == [
        (1, "a", "1b", "1c"), (2, "a", "2b", "2c"), (3, "3a", "3b", None)]


def test_upserts_of_alike_names_in_other_places(tmp_path, db):
    """The columns of an upsert are remembered by the names of its event, in order; events whose
    names read the same but sit in other places (the key in pkkey and not in the image, or in the
    image and no pkkey) take their own columns, in one batch."""
    cols = [("Id", "int"), ("Name", "nvarchar(20)")]
    batch = [
        ces_record("Places", cols, "INS", {"Id": "1", "Name": "one"}, pk=["Id"]),
        ces_record("Places", cols, "INS", {"Id": "2", "Name": "two"}, pk=["Id"]),
        ces_record("Places", cols, "UPD", {"Name": "uno"}, pk=["Id"], pk_values={"Id": "1"}),
        ces_record("Places", cols, "UPD", {"Name": "dos"}, pk=["Id"], pk_values={"Id": "2"}),
        ces_record("Places", cols, "INS", {"Id": "3", "Name": "three"}),
        ces_record("Places", cols, "INS", {"Id": "4", "Name": "four"}),
        ces_record("Places", cols, "UPD", {"Name": "tres"}, pk=["Id"], pk_values={"Id": "3"}),
    ]
    (total, applied, dead), _, err = replay_records(db, tmp_path, batch)
    assert (total, applied, dead) == (7, 7, 0), err
    assert text_query(db, "SELECT id, name FROM dbo.places ORDER BY id") == [
        (1, "uno"), (2, "dos"), (3, "tres"), (4, "four")]


def test_schema_evolves_mid_stream(tmp_path, db):
    v1 = [("Id", "int"), ("A", "nvarchar(10)")]
    v2 = v1 + [("B", "decimal(5,2)"), ("C", "datetime2(3)")]
    records = [ces_record("Evolving", v1, "INS", {"Id": "1", "A": "one"}, pk=["Id"]),
               ces_record("Evolving", v2, "INS", {"Id": "2", "A": "two", "B": "2.50",
                                                  "C": "2026-01-02 03:04:05.678"}, pk=["Id"]),
               ces_record("Evolving", v2, "UPD", {"Id": "1", "A": "uno", "B": "1.00", "C": None},
                          old={"Id": "1", "A": "one"}, pk=["Id"]),
               ces_record("Evolving", v1, "UPD", {"Id": "2", "A": "dos"},
                          old={"Id": "2", "A": "two"}, pk=["Id"])]
    (_, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (applied, dead) == (4, 0), err
    # The column only missing from the last event keeps its value (absent means unchanged).
    assert text_query(db, "SELECT id, a, b::text, c::text FROM dbo.evolving ORDER BY id") == [
        (1, "uno", "1.00", None), (2, "dos", "2.50", "2026-01-02 03:04:05.678")]
    types = dict(text_query(db, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                                " WHERE attrelid = 'dbo.evolving'::regclass AND attnum > 0"))
    assert types["b"] == "numeric(5,2)" and types["c"] == "timestamp(3) without time zone"


def test_type_conflict_is_dead_lettered(tmp_path, db):
    records = [ces_record("Conflict", [("Id", "int"), ("V", "int")], "INS",
                          {"Id": "1", "V": "5"}, pk=["Id"]),
               ces_record("Conflict", [("Id", "int"), ("V", "nvarchar(10)")], "INS",
                          {"Id": "2", "V": "five"}, pk=["Id"]),
               ces_record("Conflict", [("Id", "int"), ("V", "bigint")], "INS",
                          {"Id": "3", "V": "7"}, pk=["Id"]),
               # The catalog remembers the last shape (columns, types, image names) that passed:
               # a conflicting shape after it is judged again, and never remembered itself.
               ces_record("Conflict", [("Id", "int"), ("V", "nvarchar(10)")], "INS",
                          {"Id": "4", "V": "four"}, pk=["Id"]),
               ces_record("Conflict", [("Id", "int"), ("V", "nvarchar(10)")], "INS",
                          {"Id": "5", "V": "five"}, pk=["Id"]),
               ces_record("Conflict", [("Id", "int"), ("V", "bigint")], "INS",
                          {"Id": "6", "V": "6"}, pk=["Id"])]
    (_, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (applied, dead) == (3, 3), err
    assert text_query(db, "SELECT id FROM dbo.conflict ORDER BY id") == [(1,), (3,), (6,)]
    assert all("type conflict" in d["reason"] for d in dead_letters(db))
    assert len(re.findall("type conflict: column v is integer", err)) == 1, err


def test_key_change_without_old_image(tmp_path, db):
    cols = [("Id", "int"), ("V", "int")]
    records = [ces_record("Moves", cols, "INS", {"Id": "1", "V": "1"}, pk=["Id"]),
               ces_record("Moves", cols, "UPD", {"Id": "2", "V": "1"}, pk=["Id"]),
               ces_record("Moves", cols, "UPD", {"Id": "3", "V": "1"}, old={"Id": "2", "V": "1"},
                          pk=["Id"])]
    (_, applied, dead), _, err = replay_records(db, tmp_path, records)
    assert (applied, dead) == (3, 0), err
    # With an old image the row moves (2 -> 3); without one (1 -> 2) the old key stays: logged.
    assert text_query(db, "SELECT id FROM dbo.moves ORDER BY id") == [(1,), (3,)]
    assert "carry no old row image" in err


def test_rejected_change_inside_a_streamed_transaction(tmp_path, db):
    """One source transaction of 600 changes, streamed in parts of 100 (each sent while the next
    is read): the change PostgreSQL refuses (a CHECK constraint of the target table) becomes a dead
    letter, its part is applied again without it, and everything else commits together."""
    db.query("CREATE SCHEMA dbo")
    db.query("CREATE TABLE dbo.streamed (id integer PRIMARY KEY, v integer CHECK (v <> 13))")
    cols = [("Id", "int"), ("V", "int")]
    _lsn[0] += 1
    lsn = _lsn[0]
    values = [{"Id": str(i), "V": "13" if i == 250 else str(1000 + i)} for i in range(1, 601)]
    records = [ces_record("Streamed", cols, "INS", v, pk=["Id"], sequence=int(v["Id"]), lsn=lsn)
               for v in values]
    (total, applied, dead), _, err = replay_records(db, tmp_path, records, batch_max_events=100)
    assert (total, applied, dead) == (600, 599, 1), err
    assert "streaming it into one PostgreSQL transaction" in err
    assert "large source transaction committed (599 events" in err
    [dl] = dead_letters(db)
    assert dl["offset"] == 250 and "streamed_v_check" in dl["reason"], dl
    assert text_query(db, "SELECT count(*), sum(id) FROM dbo.streamed") == [
        (599, sum(range(1, 601)) - 250)]


def test_postgres_restart_mid_stream(tmp_path, pg, db, broker, ces2pg):
    b = broker(partitions=2)
    expect = generate(tmp_path, seed=51, events=6000)
    records = read_records(expect["_out"])
    parts = [i % 2 for i in range(len(records))]  # per-key order is kept by the version guard
    daemon = ces2pg(db, b, group=GROUP, batch_max_events=50)
    producer = PacedProducer(b, db, GROUP, "ces", records, parts).start()
    wait_until(lambda: daemon.check_alive() or sum_offsets(db) > len(records) // 5, 60,
               message="some progress before the restart")
    pg.restart(down_seconds=1.0)
    daemon.wait_log(r"retrying", timeout=30)
    producer.finish(timeout=120, daemons=[daemon])
    wait_applied(db, GROUP, producer.counts, timeout=90, daemons=[daemon])
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert daemon.terminate() == 0


LOCK_COLS = [("Id", "int"), ("V", "int")]


def lock_waiters(db):
    return db.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")


@contextlib.contextmanager
def batch_waiting_on_a_lock(db, b, daemon):
    """Applies a row of dbo.locked, locks it and sends an update of it: yields while ces2pg's
    batch waits for the lock (two records consumed), and releases the lock on exit."""
    b.produce("ces", [ces_record("Locked", LOCK_COLS, "INS", {"Id": "1", "V": "1"}, pk=["Id"])],
              partition=0)
    wait_applied(db, GROUP, {0: 1}, daemons=[daemon])
    blocker = db.connect()
    blocker.autocommit = False
    blocker.cursor().execute("SELECT * FROM dbo.locked WHERE id = 1 FOR UPDATE")
    try:
        b.produce("ces", [ces_record("Locked", LOCK_COLS, "UPD", {"Id": "1", "V": "2"},
                                     old={"Id": "1", "V": "1"}, pk=["Id"])], partition=0)
        wait_until(lambda: lock_waiters(db) == 1, 30,
                   message="ces2pg's batch waits for the row lock")
        yield
        assert lock_waiters(db) == 1, "the batch still waits"
    finally:
        blocker.rollback()
        blocker.close()


def inserts_behind(n):
    return [ces_record("Behind", LOCK_COLS, "INS", {"Id": str(i), "V": str(i)}, pk=["Id"])
            for i in range(n)]


def test_records_are_read_while_postgresql_executes_a_batch(tmp_path, db, broker, ces2pg):
    """A batch that PostgreSQL takes long to execute (here it waits for a row lock) does not stop
    ces2pg from reading on: the records behind it are consumed meanwhile, and applied after it."""
    b = broker(partitions=1)
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}")
    consumed = lambda: metric(scrape(port), "ces2pg_records_consumed_total")
    with batch_waiting_on_a_lock(db, b, daemon):
        b.produce("ces", inserts_behind(20), partition=0)
        wait_until(lambda: consumed() == 22, 30,
                   message="the records behind the waiting batch are consumed")
    wait_applied(db, GROUP, {0: 22}, daemons=[daemon])
    assert text_query(db, "SELECT v FROM dbo.locked") == [(2,)]
    assert db.scalar("SELECT count(*) FROM dbo.behind") == 20
    assert daemon.terminate() == 0


def test_a_batch_waiting_for_postgresql_bounds_what_is_read(tmp_path, db, broker, ces2pg):
    """In partition mode events go straight into the batch being read: while the batch before
    waits for PostgreSQL, that batch grows to twice apply.batch_max_events and no further."""
    b = broker(partitions=1)
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}", batch_max_events=10,
                    apply_extra=('ordering = "partition";',))
    consumed = lambda: metric(scrape(port), "ces2pg_records_consumed_total")
    with batch_waiting_on_a_lock(db, b, daemon):
        b.produce("ces", inserts_behind(100), partition=0)
        # Reading goes on past one batch...
        wait_until(lambda: consumed() >= 2 + 10, 30, message="a batch's worth read meanwhile")
        # ...and stops at two. (Unbounded, all 100 are read within milliseconds.)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert consumed() <= 2 + 20
            time.sleep(0.1)
    wait_applied(db, GROUP, {0: 102}, daemons=[daemon])
    assert text_query(db, "SELECT v FROM dbo.locked") == [(2,)]
    assert db.scalar("SELECT count(*) FROM dbo.behind") == 100
    assert daemon.terminate() == 0


def test_a_position_moved_by_another_instance_fences_the_batch(tmp_path, db, broker, ces2pg):
    """The fence: a batch commits only over the stored position its instance read. Here another
    instance (the test) moves it from 5 to 8: ces2pg's next batch (offsets 5-9) must roll back
    whole, and ces2pg goes on from 8, leaving 5-7 to the other instance."""
    cols = [("Id", "int"), ("V", "int")]
    rows = lambda ids: [ces_record("Fenced", cols, "INS", {"Id": str(i), "V": str(i)}, pk=["Id"])
                        for i in ids]
    b = broker(partitions=1)
    daemon = ces2pg(db, b, group=GROUP)
    b.produce("ces", rows(range(0, 5)), partition=0)
    wait_applied(db, GROUP, {0: 5}, daemons=[daemon])
    db.query("UPDATE ces2pg.offsets SET next_offset = 8 WHERE group_id = %s", (GROUP,))
    b.produce("ces", rows(range(5, 10)), partition=0)
    daemon.wait_log(r"another instance took over: going back to the positions "
                    r"stored in PostgreSQL")
    wait_applied(db, GROUP, {0: 10}, daemons=[daemon])
    ids = [r[0] for r in text_query(db, "SELECT id FROM dbo.fenced ORDER BY id")]
    assert ids == [0, 1, 2, 3, 4, 8, 9]
    assert daemon.terminate() == 0


class CommitCutter:
    """A TCP proxy in front of PostgreSQL that, once armed, lets the next COMMIT through and
    PostgreSQL's answer to it not: it cuts the connection as soon as that answer arrives, so the
    transaction is committed and the client cannot know it."""

    COMMIT = b"COMMIT\x00"
    COMMITTED = b"C\x00\x00\x00\x0bCOMMIT\x00"  # CommandComplete "COMMIT"

    def __init__(self, server):
        self.target = (server.host, server.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = False
        self.cuts = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            state = {"commit_sent": False}
            threading.Thread(target=self._pump, args=(client, upstream, state, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, state, False),
                             daemon=True).start()

    def _pump(self, src, dst, state, to_server):
        tail = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                seen = tail + data
                tail = seen[-16:]
                with self.lock:
                    if to_server and self.armed and self.COMMIT in seen:
                        state["commit_sent"] = True
                    if not to_server and state["commit_sent"] and self.COMMITTED in seen:
                        self.armed = False
                        state["commit_sent"] = False
                        self.cuts += 1
                        break  # committed; the client never hears of it
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self):
        self.listener.close()


def test_a_commit_whose_answer_is_lost_is_not_applied_twice(tmp_path, db, broker, ces2pg):
    """The connection breaks after PostgreSQL committed a batch and before ces2pg heard so. ces2pg
    must find out from the stored position that it committed, and not apply it again: its dead
    letter stays one."""
    cols = [("Id", "int"), ("V", "int")]
    rows = lambda ids: [ces_record("Cut", cols, "INS", {"Id": str(i), "V": str(i)}, pk=["Id"])
                        for i in ids]
    cutter = CommitCutter(db.server)
    try:
        b = broker(partitions=1)
        conninfo = re.sub(r"port=\d+", f"port={cutter.port}",
                          re.sub(r"host=\S+", "host=127.0.0.1", db.conninfo)) + " sslmode=disable"
        daemon = ces2pg(db, b, group=GROUP, conninfo=conninfo)
        b.produce("ces", rows(range(0, 3)), partition=0)
        wait_applied(db, GROUP, {0: 3}, daemons=[daemon])
        cutter.armed = True
        b.produce("ces", rows(range(3, 6)) + [b"not a CloudEvent"], partition=0)
        daemon.wait_log(r"the batch had been committed before the connection was lost")
        wait_applied(db, GROUP, {0: 7}, daemons=[daemon])
        assert cutter.cuts == 1
        assert [r[0] for r in text_query(db, "SELECT id FROM dbo.cut ORDER BY id")] == \
            list(range(6))
        assert len(dead_letters(db)) == 1
        assert daemon.terminate() == 0
    finally:
        cutter.close()


def sum_offsets(db):
    try:
        return db.scalar("SELECT coalesce(sum(next_offset), 0) FROM ces2pg.offsets")
    except psycopg2.Error:
        return 0


def test_lock_timeout_is_retried(tmp_path, db):
    cols = [("Id", "int"), ("V", "int")]
    (_, applied, _), _, _ = replay_records(
        db, tmp_path, [ces_record("Locked", cols, "INS", {"Id": "1", "V": "1"}, pk=["Id"])])
    assert applied == 1
    blocker = db.connect()
    blocker.autocommit = False
    blocker.cursor().execute("SELECT * FROM dbo.locked WHERE id = 1 FOR UPDATE")
    path = tmp_path / "update.jsonl"
    write_records(path, [ces_record("Locked", cols, "UPD", {"Id": "1", "V": "2"},
                                    old={"Id": "1", "V": "1"}, pk=["Id"])])
    server_log = db.server.log_path
    start = server_log.stat().st_size
    timeouts = lambda: server_log.read_bytes()[start:].count(b"due to lock timeout")
    result = {}
    conninfo = db.conninfo + " options='-c lock_timeout=100'"
    thread = threading.Thread(target=lambda: result.update(
        zip(("rc", "out", "err"), run_replay(db, [path], conninfo=conninfo))))
    thread.start()
    try:
        # Held for several lock timeouts: ces2pg must retry, neither give up nor skip the change.
        wait_until(lambda: timeouts() >= 3 or not thread.is_alive(), 60,
                   message="three lock timeouts")
        assert thread.is_alive(), result
    finally:
        blocker.rollback()
        blocker.close()
    thread.join(60)
    assert result["rc"] == 0, result
    assert "55P03" in result["err"] and "retrying" in result["err"], result["err"]
    assert text_query(db, "SELECT v FROM dbo.locked") == [(2,)]


def test_wrong_password(tmp_path, db):
    secret = "s3cr3t-but-wrong"
    admin = db.server.sql
    admin("CREATE ROLE ces2pg_pw LOGIN PASSWORD 'right'")
    # The test server trusts every local login: require a password for this role only.
    hba = db.server.pgdata / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text("host all ces2pg_pw 127.0.0.1/32 scram-sha-256\n" + original)
    admin("SELECT pg_reload_conf()")
    try:
        conninfo = re.sub(r"user=\S+", f"user=ces2pg_pw password={secret}", db.conninfo)
        assert "user=ces2pg_pw" in conninfo
        path = tmp_path / "one.jsonl"
        write_records(path, [ces_record("T", [("Id", "int")], "INS", {"Id": "1"}, pk=["Id"])])
        rc, out, err = run_replay(db, [path], conninfo=conninfo, timeout=30)
        assert rc == 1, err
        assert "password authentication failed" in err
        assert secret not in err + out
    finally:
        hba.write_text(original)
        admin("SELECT pg_reload_conf()")
        admin("DROP ROLE IF EXISTS ces2pg_pw")


def test_metadata_schema_and_no_auto_create(tmp_path, db):
    cols = [("Id", "int")]
    db.query("CREATE SCHEMA dbo")
    db.query("CREATE TABLE dbo.existing (id integer PRIMARY KEY, note text)")
    records = [ces_record("Existing", cols, "INS", {"Id": "1"}, pk=["Id"]),
               ces_record("Missing", cols, "INS", {"Id": "1"}, pk=["Id"])]
    (total, applied, dead), _, err = replay_records(
        db, tmp_path, records,
        extra_config='schema = { metadata_schema = "ces_meta"; auto_create = false; };')
    assert (total, applied, dead) == (2, 1, 1), err
    assert not db.table_exists("dbo.missing") and not db.table_exists("ces2pg.dead_letters")
    assert db.scalar("SELECT reason FROM ces_meta.dead_letters") == (
        "target table does not exist and schema.auto_create is off")
    # Columns ces2pg does not know are left alone; the version column was added (adoption).
    assert text_query(db, "SELECT id, note, _ces_lsn IS NOT NULL FROM dbo.existing") == [
        (1, None, True)]


def test_a_missing_table_is_looked_for_once_per_batch(tmp_path, db, broker, ces2pg):
    """With schema.auto_create off, the events of a table that does not exist are dead-lettered
    after one look in pg_catalog per batch, not one per event (a round trip each: a stream of a
    table left out of the replica was dead-lettered at that rate); a table created while ces2pg
    runs is found by a later batch, and its events are applied."""
    cols = [("Id", "int")]
    db.query("CREATE SCHEMA dbo")

    def ins(i):
        return ces_record("Later", cols, "INS", {"Id": str(i)}, pk=["Id"])

    b = broker(partitions=1)
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, batch_max_events=1000, batch_max_ms=200,
                    http_listen=f"127.0.0.1:{port}",
                    extra_config="schema = { auto_create = false; };")
    lookups = "%FROM pg_catalog.pg_attribute a%"
    b.produce("ces", [ins(i) for i in range(600)], partition=0)
    wait_applied(db, GROUP, {0: 600}, daemons=[daemon])
    letters = dead_letters(db)
    assert len(letters) == 600
    assert {d["reason"] for d in letters} == {
        "target table does not exist and schema.auto_create is off"}
    calls, _ = statement_calls(db, lookups)
    # At most one look per batch (nothing here makes a batch take a second attempt). The batch
    # count is read until it is complete: it is counted as a batch's answer is taken in, which
    # may come after its offsets are visible.
    batches = lambda: metric(scrape(port), "ces2pg_batch_duration_seconds_count")
    assert calls >= 1
    wait_until(lambda: batches() >= calls, 10,
               message=lambda: f"{calls} lookups in pg_catalog for {batches():.0f} batches")
    db.query("CREATE TABLE dbo.later (id integer PRIMARY KEY)")
    b.produce("ces", [ins(i) for i in range(1000, 1010)], partition=0)
    wait_applied(db, GROUP, {0: 610}, daemons=[daemon])
    assert text_query(db, "SELECT count(*), min(id), max(id) FROM dbo.later") == [(10, 1000, 1009)]
    assert len(dead_letters(db)) == 600
    assert daemon.terminate() == 0
