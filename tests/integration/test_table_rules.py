"""Per-table rules (schema.tables): the first rule whose match fits a source
table decides its target and what a delete does; tables no rule matches get
the defaults. --check-config prints the effective rule of every table it can
name, and a rule it cannot follow is a configuration error (exit 78)."""

from harness.daemon import EX_CONFIG, make_config, run_ces2pg, write_config
from harness.events import event_record
from harness.progress import dead_letters, wait_applied

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
