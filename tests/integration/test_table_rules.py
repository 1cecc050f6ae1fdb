"""Per-table rules (schema.tables): the first rule whose match fits a source
table decides its target and what a delete does; tables no rule matches get
the defaults. --check-config prints the effective rule of every table it can
name, and a rule it cannot follow is a configuration error (exit 78)."""

import json

import pytest

from harness.daemon import (EX_CONFIG, make_config, parse_replay_summary, run_ces2pg, run_replay,
                            write_config)
from harness.events import disorder, event_record, generate, read_records, write_records
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match, quote_ident, split_table

GROUP = "ces2pg-rules"

ORDER_COLS = [("OrderId", "int"), ("Customer", "nvarchar(50)")]


def order(i, op="INS", customer=None, table="Orders", schema="dbo", txn=None):
    values = {"OrderId": str(i), "Customer": customer or f"c{i}"}
    if op == "DEL":
        return event_record(table, ORDER_COLS, {}, ["OrderId"], op="DEL", old=values,
                            schema=schema, txn=txn)
    return event_record(table, ORDER_COLS, values, ["OrderId"], op=op, schema=schema, txn=txn)


def rules_config(*rules):
    return "schema = { tables = (\n" + ",\n".join(rules) + "\n); };\n"


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


def forget_soft_deleted(db, expect, column="_ces_deleted_at"):
    """Removes the rows a soft delete kept; returns how many there were."""
    removed = 0
    for qualified in expect["tables"]:
        if db.table_exists(qualified):
            schema, table = split_table(qualified)
            removed += db.scalar(
                f"WITH d AS (DELETE FROM {quote_ident(schema)}.{quote_ident(table)} "
                f"WHERE {quote_ident(column)} IS NOT NULL RETURNING 1) SELECT count(*) FROM d")
    return removed


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
    d = ces2pg(db, b, group=GROUP, apply_extra=('ordering = "partition";',),
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
    assert dead_letters(db) == []
    assert d.terminate() == 0


def test_a_source_column_named_like_the_deleted_column_is_refused(tmp_path, db):
    cols = [("OrderId", "int"), ("Gone", "datetime2")]
    rec = event_record("Orders", cols, {"OrderId": "1", "Gone": "2026-01-01 00:00:00"},
                       ["OrderId"])
    path = tmp_path / "r.jsonl"
    write_records(path, [rec])
    rc, out, err = run_replay(db, [path], extra_config=rules_config(
        '{ match = "dbo.orders"; deletes = "soft"; deleted_column = "gone"; }'))
    assert rc == 0, err
    assert parse_replay_summary(out)[2] == 1, out
    assert [r["reason"] for r in dead_letters(db)] == [
        "name collision: source column 'Gone' maps to the soft-delete column 'gone' (choose "
        "another deleted_column in the table's rule)"]
