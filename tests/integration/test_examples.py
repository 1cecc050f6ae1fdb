"""The six example records (tests/fixtures/examples) end to end.

Order: legacy insert, update, delete (HrDb hr.Staff, early preview format),
then current insert, update, delete (ShopDb sales.Orders). Each step is
checked against the rows the record describes, the version the row carries
(its commit LSN and sequence number, from logicalid for the legacy ones) and,
after a delete, the tombstone it leaves.
"""

from harness.common import EXAMPLES
from harness.daemon import parse_replay_summary, run_replay
from harness.events import EXAMPLE_ORDER, example_record, write_records
from harness.progress import dead_letters, wait_applied
from harness.tables import column_types, fetch_table, primary_key

STAFF = "hr.staff"
STAFF_TYPES = {
    "staffid": "integer",
    "fullname": "character varying(80)",
    "salary": "numeric(10,2)",
    "hiredat": "timestamp(6) without time zone",
    "remote": "boolean",
    "managerid": "integer",
    "reviewedat": "timestamp(3) without time zone",
    "_ces_lsn": "numeric",
}
STAFF_COLS = [c for c in STAFF_TYPES if c != "_ces_lsn"]
ORDERS = "sales.orders"
ORDER_TYPES = {
    "orderid": "integer",
    "customer": "character varying(100)",
    "total": "numeric(10,2)",
    "placedat": "timestamp(6) without time zone",
    "paid": "boolean",
    "note": "character varying(200)",
    "_ces_lsn": "numeric",
}
ORDER_COLS = [c for c in ORDER_TYPES if c != "_ces_lsn"]

STAFF_AFTER_INSERT = {
    "staffid": "314", "fullname": "Marta Kovačević", "salary": "4200.00",
    # datetime2(7) '2025-05-19 08:30:52.6618403' in a timestamp(6)
    "hiredat": "2025-05-19 08:30:52.66184",
    "remote": "false", "managerid": None, "reviewedat": None,
}
STAFF_AFTER_UPDATE = dict(STAFF_AFTER_INSERT, salary="4450.00", remote="true",
                          managerid="12",
                          reviewedat="2025-06-02 13:47:35.357")
ORDER_AFTER_INSERT = {
    "orderid": "2048", "customer": "Jonas Berg", "total": "189.50",
    # datetime2(7) '2026-02-11 10:42:18.3712846' rounds up to the microsecond
    "placedat": "2026-02-11 10:42:18.371285",
    "paid": "false", "note": None,
}
ORDER_AFTER_UPDATE = dict(ORDER_AFTER_INSERT, total="170.55", paid="true",
                          note='ring twice, "back door"')


def version(lsn, sequence):
    """The version ces2pg stores for a position (docs/ces-format.md): the
    LSN as an integer, then the sequence number in 20 digits."""
    return str(int(lsn.replace(":", ""), 16)) + "%020d" % sequence


# (example, table, columns, rows expected in that table after the step,
#  the step's position as (commit LSN, sequence number))
STEPS = [
    ("legacy-insert", STAFF, STAFF_COLS, [STAFF_AFTER_INSERT],
     ("00000019:000004B0:0002", 1)),
    ("legacy-update", STAFF, STAFF_COLS, [STAFF_AFTER_UPDATE],
     ("00000019:00000588:0005", 2)),
    ("legacy-delete", STAFF, STAFF_COLS, [],
     ("00000019:000006D8:0003", 1)),
    ("current-insert", ORDERS, ORDER_COLS, [ORDER_AFTER_INSERT],
     ("0000003E:00000A10:0004", 1)),
    ("current-update", ORDERS, ORDER_COLS, [ORDER_AFTER_UPDATE],
     ("0000003E:00000B70:000A", 2)),
    ("current-delete", ORDERS, ORDER_COLS, [],
     ("0000003E:00000C28:0006", 1)),
]
assert tuple(s[0] for s in STEPS) == EXAMPLE_ORDER
# The positions increase in the order the records apply in.
assert [int(version(*s[4])) for s in STEPS] == sorted(
    int(version(*s[4])) for s in STEPS)


def check_schema(db):
    assert column_types(db, STAFF) == STAFF_TYPES, column_types(db, STAFF)
    assert primary_key(db, STAFF) == ["staffid"]
    if db.table_exists(ORDERS):
        assert column_types(db, ORDERS) == ORDER_TYPES, column_types(db, ORDERS)
        assert primary_key(db, ORDERS) == ["orderid"]


def tombstones(db, table):
    return db.query(
        "SELECT key::text, version::text FROM ces2pg.tombstones "
        "WHERE relid = to_regclass(%s)", (table,))


def check_step(db, step):
    name, table, cols, rows, position = STEPS[step]
    assert db.table_exists(table), f"{table} was not created"
    check_schema(db)
    key = cols[:1]
    assert fetch_table(db, table, cols, key) == rows, f"after {name}"
    if rows:  # the row carries the version of the step's event
        assert db.query(f"SELECT _ces_lsn::text FROM {table}") == [
            (version(*position),)], f"after {name}"
    else:  # the delete left a tombstone with its version
        assert tombstones(db, table) == [
            ("{%s}" % STEPS[step - 1][3][0][key[0]], version(*position))
        ], f"after {name}"
    if step >= 3:  # the staff row stays deleted
        assert fetch_table(db, STAFF, STAFF_COLS, ["staffid"]) == []
        assert tombstones(db, STAFF) == [("{314}", version(*STEPS[2][4]))]


def test_example_records_are_one_line_each():
    for name in EXAMPLE_ORDER:
        line = example_record(name)
        assert b"\n" not in line and line.startswith(b"{")


def test_examples_replay_step_by_step(db):
    for step, (name, *_rest) in enumerate(STEPS):
        path = write_records(db.tmp_path / f"{step + 1}-{name}.jsonl",
                             [example_record(name)])
        rc, out, err = run_replay(db, [path])
        assert rc == 0, f"replay of {name} exited {rc}\n{err}"
        assert parse_replay_summary(out) == (1, 1, 0), out
        check_step(db, step)
    assert dead_letters(db) == []


def test_examples_replay_all_in_one_file(db):
    path = write_records(db.tmp_path / "examples.jsonl",
                         [example_record(n) for n in EXAMPLE_ORDER])
    rc, out, err = run_replay(db, [path])
    assert rc == 0, err
    assert parse_replay_summary(out) == (6, 6, 0), out
    check_step(db, 5)
    assert fetch_table(db, ORDERS, ORDER_COLS, ["orderid"]) == []
    assert dead_letters(db) == []


def test_examples_replay_several_paths(db):
    """replay takes several files and applies them in command-line order."""
    paths = [write_records(db.tmp_path / f"{i}.jsonl", [example_record(n)])
             for i, n in enumerate(EXAMPLE_ORDER[:2])]
    rc, out, err = run_replay(db, paths)
    assert rc == 0, err
    assert parse_replay_summary(out) == (2, 2, 0), out
    check_step(db, 1)


def test_examples_through_broker(db, broker, ces2pg):
    """The six records through a 1-partition topic, one step at a time.

    The legacy records go on the wire exactly as the example files are
    (pretty-printed over several lines: a Kafka value need not be one line),
    the current ones as compact JSON.
    """
    b = broker(partitions=1)
    daemon = ces2pg(db, b)
    for step, (name, *_rest) in enumerate(STEPS):
        if name.startswith("legacy-"):
            record = (EXAMPLES / f"{name}.json").read_bytes()
            assert b"\n" in record
        else:
            record = example_record(name)
        [(partition, offset)] = b.produce("ces", [record])
        assert (partition, offset) == (0, step)
        wait_applied(db, "ces2pg-test", {0: step + 1}, timeout=30,
                     daemons=[daemon])
        check_step(db, step)
    assert dead_letters(db) == []
    assert daemon.terminate() == 0
