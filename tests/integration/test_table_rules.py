"""Per-table rules (schema.tables): the first rule whose match fits a source
table decides its target, what a delete does (soft deletes) and whether its
changes are kept in a history table; tables no rule matches get the defaults.
--check-config prints the effective rule of every table it can name, and a
rule it cannot follow is a configuration error (exit 78)."""

import hashlib
import hmac
import json
import os
import re

import pytest

from harness.common import wait_until
from harness.daemon import (EX_CONFIG, make_config, parse_replay_summary, run_ces2pg, run_replay,
                            write_config)
from harness.events import disorder, event_record, generate, read_records, write_records
from harness.mockbroker import PacedProducer
from harness.progress import dead_letters, read_offsets, wait_applied
from harness.rules import assert_history_complete, forget_soft_deleted
from harness.tables import assert_tables_match, statement_calls

GROUP = "ces2pg-rules"

ORDER_COLS = [("OrderId", "int"), ("Customer", "nvarchar(50)")]


def order(i, op="INS", customer=None, table="Orders", schema="dbo", txn=None):
    values = {"OrderId": str(i), "Customer": customer or f"c{i}"}
    if op == "DEL":
        return event_record(table, ORDER_COLS, {}, ["OrderId"], op="DEL", old=values,
                            schema=schema, txn=txn)
    return event_record(table, ORDER_COLS, values, ["OrderId"], op=op, schema=schema, txn=txn)


def rules_config(*rules, mask_key_file=None):
    key = f'mask_key_file = "{mask_key_file}"; ' if mask_key_file else ""
    return "schema = { " + key + "tables = (\n" + ",\n".join(rules) + "\n); };\n"


def replay_with_rules(tmp_path, db, records, *rules, name="r.jsonl"):
    """Replays records with the rules; asserts the exit status 0; returns (dead letters,
    stderr)."""
    path = tmp_path / name
    write_records(path, records)
    rc, out, err = run_replay(db, [path], extra_config=rules_config(*rules))
    assert rc == 0, err
    return parse_replay_summary(out)[2], err


def test_check_config_prints_the_rule_of_each_table(tmp_path):
    text = make_config(conninfo="host=127.0.0.1 port=1 dbname=x", broker="127.0.0.1:1",
                       extra_config=rules_config(
                           '{ match = "dbo.Orders"; target = "sales.orders"; }',
                           '{ match = "audit.*"; deletes = "soft"; }'))
    path = write_config(tmp_path, text)
    rc, out, err = run_ces2pg(["--check-config", "-c", path])
    assert rc == 0, err
    assert "tables: table dbo.Orders (line " in out and \
        "): target sales.orders, deletes hard" in out, out
    assert "tables: pattern audit.* (line " in out and \
        "): target {schema}.{table}, deletes soft (a delete keeps the row and sets " \
        "_ces_deleted_at to the commit time)" in out, out
    assert "tables: any other table: target {schema}.{table}, deletes hard" in out, out


def test_a_rule_it_cannot_follow_stops_with_exit_78(tmp_path):
    text = make_config(conninfo="host=127.0.0.1 port=1 dbname=x", broker="127.0.0.1:1",
                       extra_config=rules_config('{ match = "dbo.Orders"; mask = ["Card"]; }'))
    path = write_config(tmp_path, text)
    rc, out, err = run_ces2pg(["--check-config", "-c", path])
    assert rc == EX_CONFIG, (rc, out, err)
    assert "schema.tables: unknown key 'mask' in a rule" in err, err


def test_a_rule_names_the_target_table(tmp_path, db, broker, ces2pg):
    b = broker(partitions=1)
    d = ces2pg(db, b, group=GROUP, extra_config=rules_config(
        '{ match = "dbo.orders"; target = "sales.{db}_orders"; }'))
    b.produce("ces", [order(1), order(2), order(3, table="Customers")], partition=0)
    wait_applied(db, GROUP, {0: 3}, daemons=[d])
    assert db.query("SELECT orderid, customer FROM sales.shop_orders ORDER BY 1") == \
        [(1, "c1"), (2, "c2")]
    # No rule matches dbo.Customers: schema.target's default.
    assert db.query("SELECT orderid FROM dbo.customers") == [(3,)]
    assert db.scalar("SELECT to_regclass('dbo.orders')") is None
    assert dead_letters(db) == []
    assert d.terminate() == 0


# --------------------------------------------------------------------------
# soft deletes
# --------------------------------------------------------------------------

SOFT_ALL = rules_config('{ match = "*"; deletes = "soft"; }')


@pytest.mark.parametrize("how", ["in_order", "reversed", "shuffled", "resent"])
def test_soft_deletes_converge_in_any_order(tmp_path, db, how):
    """A generated stream with deletes, key changes and keys inserted again after their delete,
    in any order, through replay: the rows a soft delete did not mark are exactly the rows hard
    deletes leave, so the version guard holds for soft deletes as for hard ones."""
    expect = generate(tmp_path, seed=45, events=3000,
                      extra_args=["--pk-changes", "--reuse-deleted-keys"])
    records = read_records(expect["_out"])
    if how != "in_order":
        records = disorder(records, how)
    path = tmp_path / f"{how}.jsonl"
    write_records(path, records)
    rc, out, err = run_replay(db, [path], extra_config=SOFT_ALL)
    assert rc == 0, err
    assert parse_replay_summary(out)[2] == 0, out
    kept = forget_soft_deleted(db, expect)
    print(f"{how}: {kept} rows soft-deleted")
    if how == "in_order":  # (most deleted keys are inserted again later)
        assert kept > 0, "the stream must end with rows deleted"
    assert_tables_match(db, expect)


def orders(db):
    return db.query("SELECT orderid, customer, _ces_deleted_at IS NOT NULL FROM dbo.orders "
                    "ORDER BY 1")


def test_soft_delete_through_the_daemon(tmp_path, db, broker, ces2pg):
    """A delete keeps the row with the commit time; an older change resent after it changes
    nothing; a newer insert of the key clears the mark; a delete older than the row does
    nothing; a delete of a key with no row keeps an older insert out; a key change marks the old
    key. Other tables keep hard deletes."""
    b = broker(partitions=1)
    d = ces2pg(db, b, group=GROUP, apply_extra=('ordering = "partition";',), log_level="debug",
               extra_config=rules_config('{ match = "dbo.Orders"; deletes = "soft"; }'))
    n = 0x7000000

    def txn():
        nonlocal n
        n += 1
        return (n, 1, True)

    ins1, ins2, ins3 = txn(), txn(), txn()
    b.produce("ces", [order(1, txn=ins1), order(2, txn=ins2), order(3, txn=ins3),
                      order(9, table="Customers", txn=txn())], partition=0)
    wait_applied(db, GROUP, {0: 4}, daemons=[d])
    del1 = txn()
    b.produce("ces", [order(1, "DEL", txn=del1),
                      order(9, "DEL", table="Customers", txn=txn())], partition=0)
    wait_applied(db, GROUP, {0: 6}, daemons=[d])
    assert orders(db) == [(1, "c1", True), (2, "c2", False), (3, "c3", False)]
    assert db.scalar("SELECT _ces_deleted_at FROM dbo.orders WHERE orderid = 1").isoformat() \
        == "2026-02-11T10:42:18.377000+00:00", "the mark is the event's commit time"
    assert db.query("SELECT * FROM dbo.customers") == [], "hard deletes elsewhere"
    # Made with the table, so that no reader sees the table without it.
    assert "adding the soft-delete column" not in d.log()

    # An older update of 1, resent after its delete: no change, still deleted.
    b.produce("ces", [order(1, "UPD", customer="old", txn=ins1)], partition=0)
    # A delete of 2 older than its row (resent late): no change.
    b.produce("ces", [order(2, "DEL", txn=(ins2[0] - 0x100, 1, True))], partition=0)
    # A delete of 5, a key with no row, then an older insert of 5: kept out by its tombstone.
    del5 = txn()
    b.produce("ces", [order(5, "DEL", txn=del5), order(5, txn=(del5[0] - 1, 1, True))],
              partition=0)
    wait_applied(db, GROUP, {0: 10}, daemons=[d])
    assert orders(db) == [(1, "c1", True), (2, "c2", False), (3, "c3", False)]

    # A newer insert of 1 clears the mark; a move of 3 to 4 marks 3.
    move = order(4, "UPD", customer="moved", txn=txn())
    env = json.loads(move)
    data = json.loads(env["data"])
    data["eventrow"]["old"] = json.dumps({"OrderId": "3", "Customer": "c3"})
    env["data"] = json.dumps(data)
    b.produce("ces", [order(1, customer="again", txn=txn()),
                      json.dumps(env).encode()], partition=0)
    wait_applied(db, GROUP, {0: 12}, daemons=[d])
    assert orders(db) == [(1, "again", False), (2, "c2", False), (3, "c3", True),
                          (4, "moved", False)]
    assert db.scalar("SELECT count(*) FROM ces2pg.tombstones") == 2, \
        "tombstones only for the hard-deleted row and the key with no row"
    # Soft deletes go in bulk statements like other changes, and PostgreSQL takes them; only the
    # key change goes row by row, as every key change does.
    assert statement_calls(db, "WITH s AS (SELECT * FROM unnest(%_ces_deleted_at%")[0] >= 2
    assert statement_calls(db, "WITH marked AS (UPDATE %")[0] == 1
    assert dead_letters(db) == []
    assert d.terminate() == 0


def test_a_source_column_named_like_the_deleted_column_is_refused(tmp_path, db):
    cols = [("OrderId", "int"), ("Gone", "datetime2")]
    rec = event_record("Orders", cols, {"OrderId": "1", "Gone": "2026-01-01 00:00:00"},
                       ["OrderId"])
    dead, _ = replay_with_rules(tmp_path, db, [rec], '{ match = "dbo.orders"; deletes = "soft"; '
                                'deleted_column = "gone"; }')
    assert dead == 1
    assert [r["reason"] for r in dead_letters(db)] == [
        "name collision: source column 'Gone' maps to the soft-delete column 'gone' (choose "
        "another deleted_column in the table's rule)"]


# --------------------------------------------------------------------------
# history
# --------------------------------------------------------------------------

def test_history_beside_the_mirror(tmp_path, db, broker, ces2pg):
    """Every change of the table appended with its operation, commit LSN, sequence, commit time,
    the row after it (before it, for a delete) and when it was applied; the mirror as always."""
    b = broker(partitions=1)
    d = ces2pg(db, b, group=GROUP, extra_config=rules_config(
        '{ match = "dbo.Orders"; history = "also"; }'))
    n = 0x7100000
    b.produce("ces", [order(1, txn=(n, 1, True)), order(2, txn=(n + 1, 1, True)),
                      order(1, "UPD", customer="new", txn=(n + 2, 1, True)),
                      order(2, "DEL", txn=(n + 3, 1, True)),
                      order(7, table="Customers", txn=(n + 4, 1, True))], partition=0)
    wait_applied(db, GROUP, {0: 5}, daemons=[d])
    assert db.query("SELECT orderid, customer FROM dbo.orders") == [(1, "new")]
    rows = db.query("SELECT _ces_operation, _ces_commit_lsn, _ces_sequence, "
                    "_ces_commit_time::text, orderid, customer, _ces_applied_at IS NOT NULL "
                    "FROM dbo.orders_history ORDER BY _ces_version")
    lsn = [f"00000001:{k:08X}:0001" for k in range(n, n + 4)]
    when = "2026-02-11 10:42:18.377+00"
    assert rows == [("INS", lsn[0], 1, when, 1, "c1", True),
                    ("INS", lsn[1], 1, when, 2, "c2", True),
                    ("UPD", lsn[2], 1, when, 1, "new", True),
                    ("DEL", lsn[3], 1, when, 2, "c2", True)], rows
    assert db.scalar("SELECT to_regclass('dbo.customers_history')") is None
    # History rows go in bulk statements like every other change.
    calls, rows = statement_calls(db, 'INSERT INTO "dbo"."orders_history" % FROM unnest(%')
    assert calls >= 1 and rows == 4, (calls, rows)
    assert statement_calls(db, 'INSERT INTO "dbo"."orders_history" % VALUES (%')[0] == 0
    assert d.terminate() == 0


def test_a_history_row_postgres_refuses_is_found_row_by_row(tmp_path, db):
    """A bulk history statement PostgreSQL rejects for one bad value is retried row by row: the
    bad change is a dead letter, every other change of the batch is in the history once."""
    cols = [("Id", "int"), ("Payload", "nvarchar(max)")]
    n = 0x7B00000
    recs = [event_record("Events", cols, {"Id": str(i), "Payload": payload}, ["Id"],
                         txn=(n + i, 1, True))
            for i, payload in enumerate(['{"a": 1}', '"\\u0000"', "[2]", "3"])]
    dead, err = replay_with_rules(
        tmp_path, db, recs, '{ match = "dbo.events"; history = "only"; '
        'columns = { types = ( ["Payload", "jsonb"] ); }; }')
    assert dead == 1
    assert db.query("SELECT id, payload::text FROM dbo.events_history ORDER BY id") == \
        [(0, '{"a": 1}'), (2, "[2]"), (3, "3")]
    assert db.query("SELECT class FROM ces2pg.dead_letters") == [("rejected_by_postgres",)]
    assert "PostgreSQL rejected the change" in err


def test_history_exactly_once_across_kill9_and_redelivery(tmp_path, db, broker, ces2pg):
    """A generated stream, the daemon killed (kill -9) in the middle and started again, and a
    batch of records sent a second time: each change is in its history once, and the mirror
    equals the stream's end."""
    b = broker(partitions=2)
    expect = generate(tmp_path, seed=4545, events=3000, tables=3,
                      extra_args=["--pk-changes"])
    records = read_records(expect["_out"])
    rules = rules_config('{ match = "*"; history = "also"; }')
    # The stream, then records 1000-1199 once more at new offsets (a producer's retry), paced so
    # that the mock broker's retention drops nothing unread.
    sent = records + records[1000:1200]
    producer = PacedProducer(b, db, GROUP, "ces", sent, [0] * len(sent)).start()
    d = ces2pg(db, b, group=GROUP, batch_max_events=20, extra_config=rules)
    wait_until(lambda: sum(read_offsets(db, GROUP).values()) > 600, 60,
               message="part of the stream applied")
    d.kill9()
    d = ces2pg(db, b, group=GROUP, batch_max_events=20, extra_config=rules)
    producer.finish(daemons=[d])
    wait_applied(db, GROUP, {0: len(sent)}, daemons=[d], timeout=120)
    assert_tables_match(db, expect)
    assert_history_complete(db, records)
    assert dead_letters(db) == []
    assert d.terminate() == 0


def test_history_only_follows_new_columns(tmp_path, db):
    """history = "only": no mirror table, every change appended; a column that appears later is
    added to the history table; through replay, applied twice, each change once."""
    cols = ORDER_COLS + [("Note", "nvarchar(20)")]
    n = 0x7200000
    recs = [order(1, txn=(n, 1, True)), order(1, "UPD", customer="x", txn=(n + 1, 1, True)),
            event_record("Orders", cols, {"OrderId": "1", "Customer": "y", "Note": "hi"},
                         ["OrderId"], op="UPD", txn=(n + 2, 1, True)),
            order(1, "DEL", customer="y", txn=(n + 3, 1, True))]
    # A table without a primary key: no mirror could take it, a history can.
    recs.append(event_record("Logs", [("Line", "nvarchar(50)")], {"Line": "started"}, [],
                             txn=(n + 4, 1, True)))
    path = tmp_path / "h.jsonl"
    write_records(path, recs)
    extra = rules_config('{ match = "dbo.orders"; history = "only"; '
                         'history_table = "audit.{table}_changes"; },\n'
                         '{ match = "dbo.logs"; history = "only"; '
                         'history_table = "audit.{table}_changes"; }')
    for _ in range(2):
        rc, out, err = run_replay(db, [path], extra_config=extra)
        assert rc == 0, err
        assert parse_replay_summary(out)[2] == 0, out
    assert db.scalar("SELECT to_regclass('dbo.orders')") is None, "no mirror"
    assert db.query("SELECT _ces_operation, customer, note FROM audit.orders_changes "
                    "ORDER BY _ces_version") == [("INS", "c1", None), ("UPD", "x", None),
                                                 ("UPD", "y", "hi"), ("DEL", "y", None)]
    assert db.query("SELECT _ces_operation, line FROM audit.logs_changes") == [("INS", "started")]
    assert_history_complete(db, recs, template="audit.{table}_changes")


# --------------------------------------------------------------------------
# columns
# --------------------------------------------------------------------------

WIDE_COLS = [("OrderId", "int"), ("Customer", "nvarchar(50)"), ("Secret", "nvarchar(50)"),
             ("Note", "nvarchar(50)")]


def wide(i, txn, extra=None, op="INS"):
    cols = WIDE_COLS + ([extra[0]] if extra else [])
    values = {"OrderId": str(i), "Customer": f"c{i}", "Secret": f"s{i}", "Note": f"n{i}"}
    if extra:
        values[extra[0][0]] = extra[1]
    if op == "DEL":
        return event_record("Orders", cols, {}, ["OrderId"], op="DEL", old=values, txn=txn)
    return event_record("Orders", cols, values, ["OrderId"], op=op, txn=txn)


def columns_of(db, qualified):
    schema, table = qualified.split(".")
    return [r[0] for r in db.query(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum", (f"{schema}.{table}",))]


def test_include_list_keeps_only_its_columns_as_new_ones_come(tmp_path, db):
    n = 0x7300000
    recs = [wide(1, (n, 1, True)), wide(2, (n + 1, 1, True), extra=(("Extra", "int"), "5"))]
    dead, _ = replay_with_rules(tmp_path, db, recs, '{ match = "dbo.orders"; history = "also"; '
                                'columns = { include = ["orderid", "Customer"]; }; }')
    assert dead == 0
    assert columns_of(db, "dbo.orders") == ["orderid", "customer", "_ces_lsn"]
    assert db.query("SELECT orderid, customer FROM dbo.orders ORDER BY 1") == \
        [(1, "c1"), (2, "c2")]
    # The history follows the same choice.
    assert columns_of(db, "dbo.orders_history")[6:] == ["orderid", "customer"]


def test_exclude_and_rename_and_a_new_column(tmp_path, db, broker, ces2pg):
    """Through the daemon: excluded columns never reach PostgreSQL, renamed ones land under
    their new names (deletes and updates too), and a column that appears later is added."""
    b = broker(partitions=1)
    d = ces2pg(db, b, group=GROUP, extra_config=rules_config(
        '{ match = "dbo.Orders"; columns = { exclude = ["secret"]; '
        'rename = ( ["Customer", "client"], ["Note", "remark"] ); }; }'))
    n = 0x7400000
    b.produce("ces", [wide(1, (n, 1, True)), wide(2, (n + 1, 1, True)),
                      wide(2, (n + 2, 1, True), op="DEL"),
                      wide(3, (n + 3, 1, True), extra=(("Extra", "int"), "7"))], partition=0)
    wait_applied(db, GROUP, {0: 4}, daemons=[d])
    assert columns_of(db, "dbo.orders") == ["orderid", "client", "remark", "_ces_lsn", "extra"]
    assert db.query("SELECT orderid, client, remark, extra FROM dbo.orders ORDER BY 1") == \
        [(1, "c1", "n1", None), (3, "c3", "n3", 7)]
    assert "s1" not in d.log() and dead_letters(db) == []
    assert d.terminate() == 0


def test_a_rule_that_leaves_out_the_key_is_refused(tmp_path, db):
    n = 0x7500000
    dead, err = replay_with_rules(tmp_path, db, [wide(1, (n, 1, True)), wide(2, (n + 1, 1, True))],
                                  '{ match = "dbo.orders"; columns = { exclude = ["OrderID"]; }; }')
    assert dead == 2
    reason = re.compile(r"the rule of line \d+ of schema.tables leaves out the key column "
                        r"'OrderId' \(changes are applied by key: include it, or keep a history "
                        r"only\)$")
    reasons = [r["reason"] for r in dead_letters(db)]
    assert len(reasons) == 2 and all(reason.match(r) for r in reasons), reasons
    assert err.count("leaves out the key column") == 1, "logged once per table"
    assert db.scalar("SELECT to_regclass('dbo.orders')") is None


def test_types_chosen_for_columns_and_values_that_do_not_convert(tmp_path, db):
    """nvarchar(max) holding JSON becomes jsonb, a datetime2 of Berlin's local time becomes
    timestamptz; a value that is not JSON, or not a date and time, is a dead letter of class
    type_conflict and the rest of the batch is applied. The history takes the same types."""
    cols = [("Id", "int"), ("Payload", "nvarchar(max)"), ("Created", "datetime2(7)")]
    n = 0x7600000

    def rec(i, payload, created, k):
        return event_record("Events", cols, {"Id": str(i), "Payload": payload, "Created": created},
                            ["Id"], txn=(n + k, 1, True))

    recs = [rec(1, '{"a": [1, 2], "b": "x"}', "2026-02-11 10:42:18.3770000", 0),
            rec(2, "not json", "2026-02-11 10:42:18", 1),
            rec(3, "[]", "yesterday", 2),
            rec(4, "null", "2026-07-01T08:00", 3)]
    dead, _ = replay_with_rules(
        tmp_path, db, recs, '{ match = "dbo.events"; history = "also"; columns = { types = ( '
        '["payload", "jsonb"], ["Created", "timestamptz", "Europe/Berlin"] ); }; }')
    assert dead == 2
    for table in ("dbo.events", "dbo.events_history"):
        types = dict(db.query("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                              "WHERE attrelid = %s::regclass AND attnum > 0", (table,)))
        assert (types["payload"], types["created"]) == ("jsonb", "timestamp with time zone"), types
    rows = db.query("SELECT id, payload -> 'a' ->> 1, created AT TIME ZONE 'UTC' "
                    "FROM dbo.events ORDER BY id")
    assert [(r[0], r[1], r[2].isoformat()) for r in rows] == [
        (1, "2", "2026-02-11T09:42:18.377000"),   # CET, UTC+1
        (4, None, "2026-07-01T06:00:00")], rows    # CEST, UTC+2
    reasons = sorted(r["reason"] for r in dead_letters(db))
    assert len(reasons) == 2 and all(r.startswith("type conflict: a value of column '")
                                     for r in reasons), reasons
    assert "'Created'" in reasons[0] and "'Payload'" in reasons[1], reasons
    assert db.scalar("SELECT count(*) FROM ces2pg.dead_letters WHERE class = 'type_conflict'") == 2


def test_an_existing_table_gets_the_deleted_column(tmp_path, db):
    db.query("CREATE SCHEMA dbo; CREATE TABLE dbo.orders (orderid integer PRIMARY KEY, "
             "customer varchar(50)); INSERT INTO dbo.orders VALUES (1, 'loaded')")
    n = 0x7700000
    _, err = replay_with_rules(tmp_path, db, [order(1, "DEL", customer="loaded", txn=(n, 1, True))],
                               '{ match = "dbo.orders"; deletes = "soft"; '
                               'deleted_column = "gone_at"; }')
    assert "adding the soft-delete column" in err
    assert db.query("SELECT orderid, customer, gone_at IS NOT NULL FROM dbo.orders") == \
        [(1, "loaded", True)]


# --------------------------------------------------------------------------
# masks
# --------------------------------------------------------------------------

MASK_KEY = "k3y-0f-the-m4sks-never-logged"
PEOPLE_COLS = [("Id", "int"), ("Email", "nvarchar(200)"), ("Notes", "nvarchar(max)")]


def mask_key_file(tmp_path):
    path = tmp_path / "mask.key"
    path.write_text(MASK_KEY + "\n")
    os.chmod(path, 0o600)
    return str(path)


def masked(value):
    return hmac.new(MASK_KEY.encode(), value.encode(), hashlib.sha256).hexdigest()


def person(i, email, txn, table="People", op="INS", extra=None):
    cols = PEOPLE_COLS + ([extra[0]] if extra else [])
    values = {"Id": str(i), "Email": email, "Notes": f"private {i}"}
    if extra:
        values[extra[0][0]] = extra[1]
    if op == "DEL":
        return event_record(table, cols, {}, ["Id"], op="DEL", old=values, txn=txn)
    return event_record(table, cols, values, ["Id"], op=op, txn=txn)


PEOPLE_MASKS = ('{ match = "dbo.*"; history = "also"; columns = { mask = ( ["Email", "hash"], '
                '["notes", "null"], ["Phone", "hash"] ); }; }')


def test_check_config_shows_masks_and_never_the_key(tmp_path):
    key = mask_key_file(tmp_path)
    text = make_config(conninfo="host=127.0.0.1 port=1 dbname=x", broker="127.0.0.1:1",
                       extra_config=rules_config(PEOPLE_MASKS, mask_key_file=key))
    rc, out, err = run_ces2pg(["--check-config", "-c", write_config(tmp_path, text)])
    assert rc == 0, err
    assert "masking Email by keyed hash, notes as NULL, Phone by keyed hash" in out, out
    assert MASK_KEY not in out + err
    # Without the key a hash mask cannot be made: a configuration error, not NULLs.
    text = make_config(conninfo="host=127.0.0.1 port=1 dbname=x", broker="127.0.0.1:1",
                       extra_config=rules_config(PEOPLE_MASKS))
    rc, out, err = run_ces2pg(["--check-config", "-c", write_config(tmp_path, text)])
    assert rc == EX_CONFIG, (rc, out, err)
    assert "a rule masks a column by \"hash\", which needs schema.mask_key_file" in err, err


def test_masked_columns_are_stable_across_restarts_and_joinable(tmp_path, db, broker, ces2pg):
    """Through the daemon: a hash mask writes HMAC-SHA256 under the key (as text), equal values
    give equal masks in two tables and across a restart, a null mask writes NULL, the history
    keeps the masked image, a masked column that appears later is masked too, and neither the
    key nor a masked value reaches the log or PostgreSQL."""
    key = mask_key_file(tmp_path)
    config = rules_config(PEOPLE_MASKS, mask_key_file=key)
    b = broker(partitions=1)
    n = 0x7800000
    d = ces2pg(db, b, group=GROUP, extra_config=config, log_level="debug")
    b.produce("ces", [person(1, "ann@example.com", (n, 1, True)),
                      person(2, "bob@example.com", (n + 1, 1, True)),
                      person(1, "ann@example.com", (n + 2, 1, True), table="Contacts"),
                      person(2, "bob@example.com", (n + 3, 1, True), op="DEL")], partition=0)
    wait_applied(db, GROUP, {0: 4}, daemons=[d])
    first_log = d.log()
    assert d.terminate() == 0

    d = ces2pg(db, b, group=GROUP, extra_config=config, log_level="debug")
    b.produce("ces", [person(3, "ann@example.com", (n + 4, 1, True)),
                      person(4, "cy@example.com", (n + 5, 1, True),
                             extra=(("Phone", "varchar(20)"), "+49 30 1234"))], partition=0)
    wait_applied(db, GROUP, {0: 6}, daemons=[d])
    assert d.terminate() == 0

    types = dict(db.query("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                          "WHERE attrelid = 'dbo.people'::regclass AND attnum > 0"))
    assert (types["email"], types["notes"], types["phone"]) == ("text", "text", "text"), types
    assert db.query("SELECT id, email, notes, phone FROM dbo.people ORDER BY id") == [
        (1, masked("ann@example.com"), None, None),
        (3, masked("ann@example.com"), None, None),
        (4, masked("cy@example.com"), None, masked("+49 30 1234"))]
    # Joinable: the same value in another table has the same mask.
    assert db.scalar("SELECT count(*) FROM dbo.people p JOIN dbo.contacts c USING (email)") == 2
    # The history holds the masked images, the delete's (its old image) too.
    assert db.query("SELECT id, _ces_operation, email, notes FROM dbo.people_history "
                    "ORDER BY _ces_version") == [
        (1, "INS", masked("ann@example.com"), None), (2, "INS", masked("bob@example.com"), None),
        (2, "DEL", masked("bob@example.com"), None), (3, "INS", masked("ann@example.com"), None),
        (4, "INS", masked("cy@example.com"), None)]
    logs = first_log + d.log()
    assert "creating table \"dbo\".\"people\"" in logs  # (the logs are there to search)
    for secret in (MASK_KEY, "ann@example.com", "private 1", "+49 30 1234"):
        assert secret not in logs, secret
    dump = json.dumps(db.query("SELECT * FROM dbo.people_history"), default=str)
    assert "example.com" not in dump and "private" not in dump
    assert dead_letters(db) == []


def test_a_rule_that_masks_the_key_is_refused(tmp_path, db):
    n = 0x7900000
    recs = [person(1, "a@x", (n, 1, True)), person(2, "b@x", (n + 1, 1, True))]
    path = tmp_path / "r.jsonl"
    write_records(path, recs)
    rc, out, err = run_replay(db, [path], extra_config=rules_config(
        '{ match = "dbo.people"; columns = { mask = ( ["ID", "null"] ); }; }'))
    assert rc == 0, err
    assert parse_replay_summary(out)[2] == 2
    reasons = [r["reason"] for r in dead_letters(db)]
    assert len(reasons) == 2 and all(re.match(
        r"the rule of line \d+ of schema.tables masks the key column 'Id' \(changes are applied "
        r"by key: do not mask it, or keep a history only\)$", r) for r in reasons), reasons
    assert db.scalar("SELECT to_regclass('dbo.people')") is None


def test_a_mask_into_an_existing_column(tmp_path, db):
    """An existing column keeps its type: a mask fits a text-like column, and one it does not
    fit is a type conflict, never a value written another way."""
    db.query("CREATE SCHEMA dbo; CREATE TABLE dbo.people (id integer PRIMARY KEY, "
             "email varchar(100), notes text); CREATE TABLE dbo.contacts (id integer PRIMARY "
             "KEY, email bigint, notes text)")
    n = 0x7A00000
    recs = [person(1, "ann@example.com", (n, 1, True)),
            person(1, "ann@example.com", (n + 1, 1, True), table="Contacts")]
    path = tmp_path / "r.jsonl"
    write_records(path, recs)
    rc, out, err = run_replay(db, [path], extra_config=rules_config(
        PEOPLE_MASKS, mask_key_file=mask_key_file(tmp_path)))
    assert rc == 0, err
    assert db.query("SELECT id, email, notes FROM dbo.people") == \
        [(1, masked("ann@example.com"), None)]
    assert db.query("SELECT class, source_table FROM ces2pg.dead_letters") == \
        [("type_conflict", "dbo.Contacts")]
    assert db.scalar("SELECT count(*) FROM dbo.contacts") == 0
