"""The six documented example records (shared/ces/examples) end to end.

Order: legacy insert, update, delete (db1 dbo.Purchases, early preview
format), then current insert, update, delete (EmployeesDb dbo.Employees).
Each step is checked against the state the documentation describes.
"""

from conftest import (
    EXAMPLE_ORDER,
    EXAMPLES,
    column_types,
    dead_letters,
    example_record,
    fetch_table,
    parse_replay_summary,
    primary_key,
    run_replay,
    wait_applied,
    write_records,
)

PURCHASES = "dbo.purchases"
PURCHASE_COLS = ["purchase_id", "customer_name", "product_id", "product_name",
                 "price_per_item", "quantity", "purchase_date",
                 "payment_method"]
PURCHASE_TYPES = {
    "purchase_id": "integer",
    "customer_name": "character varying(100)",
    "product_id": "integer",
    "product_name": "character varying(100)",
    "price_per_item": "integer",
    "quantity": "integer",
    "purchase_date": "timestamp(3) without time zone",
    "payment_method": "character varying(50)",
}
EMPLOYEES = "dbo.employees"
EMPLOYEE_COLS = ["id", "firstname", "lastname", "signupdate"]
EMPLOYEE_TYPES = {
    "id": "integer",
    "firstname": "character varying(50)",
    "lastname": "character varying(50)",
    "signupdate": "timestamp(6) without time zone",
}

PURCHASE_AFTER_INSERT = {
    "purchase_id": "105", "customer_name": "Anna Doe", "product_id": "101",
    "product_name": "Game 2077", "price_per_item": "60", "quantity": "1",
    "purchase_date": "2025-03-14 16:45:01", "payment_method": "Credit Card",
}
PURCHASE_AFTER_UPDATE = dict(PURCHASE_AFTER_INSERT, product_id="100",
                             product_name="Game 2066", price_per_item="50",
                             quantity="2")
EMPLOYEE_AFTER_INSERT = {
    "id": "8", "firstname": "Nikola", "lastname": "Nikolic",
    # datetime2(7) '2026-08-07 16:25:00.8833333' in a timestamp(6)
    "signupdate": "2026-08-07 16:25:00.883333",
}
EMPLOYEE_AFTER_UPDATE = dict(EMPLOYEE_AFTER_INSERT, lastname="Nikolic-Smith")

# (example, table, columns, rows expected in that table after the step)
STEPS = [
    ("legacy-insert", PURCHASES, PURCHASE_COLS, [PURCHASE_AFTER_INSERT]),
    ("legacy-update", PURCHASES, PURCHASE_COLS, [PURCHASE_AFTER_UPDATE]),
    ("legacy-delete", PURCHASES, PURCHASE_COLS, []),
    ("current-insert", EMPLOYEES, EMPLOYEE_COLS, [EMPLOYEE_AFTER_INSERT]),
    ("current-update", EMPLOYEES, EMPLOYEE_COLS, [EMPLOYEE_AFTER_UPDATE]),
    ("current-delete", EMPLOYEES, EMPLOYEE_COLS, []),
]
assert tuple(s[0] for s in STEPS) == EXAMPLE_ORDER


def check_schema(db):
    assert column_types(db, PURCHASES).items() >= PURCHASE_TYPES.items(), (
        column_types(db, PURCHASES))
    assert primary_key(db, PURCHASES) == ["purchase_id"]
    if db.table_exists(EMPLOYEES):
        assert column_types(db, EMPLOYEES).items() >= EMPLOYEE_TYPES.items(), (
            column_types(db, EMPLOYEES))
        assert primary_key(db, EMPLOYEES) == ["id"]


def check_step(db, step):
    _, table, cols, rows = STEPS[step]
    assert db.table_exists(table), f"{table} was not created"
    check_schema(db)
    key = cols[:1]
    assert fetch_table(db, table, cols, key) == rows, (
        f"after {STEPS[step][0]}")
    if step >= 3:  # the purchases row stays deleted
        assert fetch_table(db, PURCHASES, PURCHASE_COLS, ["purchase_id"]) == []


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
    assert fetch_table(db, EMPLOYEES, EMPLOYEE_COLS, ["id"]) == []
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
