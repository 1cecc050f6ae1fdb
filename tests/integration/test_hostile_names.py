"""Names from events are untrusted. An event aimed at ces2pg's metadata, a
system catalog or a pg_* schema is a dead letter of class reserved_target; a
source column PostgreSQL reserves (xmin, ctid, ...) or named like the version
column is applied as _src_<name>; names longer than 63 bytes are clipped with
a hash of the whole name; two source names that map to one target are never
merged (class name_collision). Each case replays a few records and then one
ordinary event, which must be applied, and replay must end by itself."""

import contextlib
from pathlib import Path

from harness.daemon import make_config, parse_replay_summary, run_ces2pg, run_replay, write_config
from harness.events import event_record as record, write_records
from harness.tables import fetch_table


def ordinary(n):
    """The ordinary event every case ends with: dbo.Orders row n."""
    return record("Orders", [("OrderId", "int"), ("Customer", "nvarchar(50)")],
                  {"OrderId": str(n), "Customer": f"c{n}"}, ["OrderId"])


def replay(db, tmp_path, name, records, **kw):
    path = write_records(tmp_path / name, records)
    rc, out, err = run_replay(db, [path], timeout=60, **kw)
    assert rc == 0, f"replay exited {rc}:\n{err}"
    return parse_replay_summary(out), err


def query(db, sql, params=()):
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def dead_letter_classes(db):
    return [(c, r) for c, r in query(
        db, "SELECT class, reason FROM ces2pg.dead_letters ORDER BY id")]


def columns_of(db, schema, table):
    return [r[0] for r in query(
        db, "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0"
            " AND NOT a.attisdropped ORDER BY a.attnum", (schema, table))]


def assert_ordinary_applied(db, *ns):
    assert fetch_table(db, "dbo.orders", ["orderid", "customer"], ["orderid"]) == [
        {"orderid": str(n), "customer": f"c{n}"} for n in ns]


def test_metadata_schema_is_never_a_target(tmp_path, db):
    meta_cols = None
    # A first replay makes the metadata schema, so that its shape can be compared.
    replay(db, tmp_path, "first.jsonl", [ordinary(1)])
    meta_cols = {t: columns_of(db, "ces2pg", t) for t in ("dead_letters", "offsets")}
    forged = [
        # CES2PG folds onto ces2pg.
        record("dead_letters", [("id", "bigint"), ("reason", "nvarchar(50)")],
               {"id": "999", "reason": "forged"}, ["id"], schema="CES2PG"),
        record("offsets", [("group_id", "nvarchar(50)"), ("topic", "nvarchar(50)"),
                           ("partition", "int"), ("offset", "bigint")],
               {"group_id": "g", "topic": "t", "partition": "0", "offset": "42"},
               ["group_id", "topic", "partition"], schema="ces2pg"),
        record("Tombstones", [("relid", "int")], {"relid": "1"}, ["relid"],
               schema="Ces2Pg", op="DEL", old={"relid": "1"}),
        ordinary(2),
    ]
    (records, applied, dls), err = replay(db, tmp_path, "meta.jsonl", forged)
    assert (records, applied, dls) == (4, 1, 3)
    classes = dead_letter_classes(db)
    assert [c for c, _ in classes] == ["reserved_target"] * 3, classes
    assert all("metadata schema" in r for _, r in classes), classes
    assert {t: columns_of(db, "ces2pg", t) for t in meta_cols} == meta_cols
    assert query(db, "SELECT count(*) FROM ces2pg.dead_letters WHERE reason = 'forged'") == [(0,)]
    assert query(db, "SELECT count(*) FROM ces2pg.offsets WHERE topic = 't'") == [(0,)]
    assert_ordinary_applied(db, 1, 2)
    assert "metadata schema" in err


def test_a_configured_metadata_schema_is_never_a_target(tmp_path, db):
    """schema.metadata_schema moves ces2pg's own tables; the events aimed at
    them are refused there, and the default name is an ordinary schema."""
    conf = 'schema = { metadata_schema = "replica_meta"; };'
    replay(db, tmp_path, "first.jsonl", [ordinary(1)], extra_config=conf)
    forged = [
        record("offsets", [("group_id", "nvarchar(50)"), ("next_offset", "bigint")],
               {"group_id": "g", "next_offset": "42"}, ["group_id"], schema="Replica_Meta"),
        ordinary(2),
    ]
    (records, applied, dls), err = replay(db, tmp_path, "meta.jsonl", forged,
                                          extra_config=conf)
    assert (records, applied, dls) == (2, 1, 1)
    assert [c for c, _ in query(db, "SELECT class, reason FROM replica_meta.dead_letters")] == [
        "reserved_target"]
    assert query(db, "SELECT count(*) FROM replica_meta.offsets WHERE group_id = 'g'") == [(0,)]
    assert_ordinary_applied(db, 1, 2)


def test_system_schemas_are_never_targets(tmp_path, db):
    records = [
        record("pg_description", [("objoid", "int"), ("description", "nvarchar(50)")],
               {"objoid": "1", "description": "forged"}, ["objoid"],
               schema="pg_catalog"),
        record("Tables", [("x", "int")], {"x": "1"}, ["x"],
               schema="INFORMATION_SCHEMA"),
        record("t", [("x", "int")], {"x": "1"}, ["x"], schema="pg_toast"),
        record("t", [("x", "int")], {"x": "1"}, ["x"], schema="PG_Evil"),
        record("", [("x", "int")], {"x": "1"}, ["x"]),
        ordinary(1),
    ]
    (n, applied, dls), err = replay(db, tmp_path, "sys.jsonl", records)
    assert (n, applied, dls) == (6, 1, 5)
    # The empty table name is the decoder's to refuse (an empty schema.target part would be
    # reserved_target).
    classes = sorted(c for c, _ in dead_letter_classes(db))
    assert classes == ["decode"] + ["reserved_target"] * 4, classes
    assert query(db, "SELECT count(*) FROM pg_catalog.pg_description"
                     " WHERE description = 'forged'") == [(0,)]
    assert query(db, "SELECT count(*) FROM pg_namespace WHERE nspname ILIKE 'pg_evil'") == [(0,)]
    assert query(db, "SELECT c.relkind FROM pg_class c JOIN pg_namespace n"
                     " ON n.oid = c.relnamespace WHERE nspname = 'information_schema'"
                     " AND relname = 'tables'") == [("v",)]  # the view, untouched
    assert_ordinary_applied(db, 1)


GIS_COLS = [("Id", "int"), ("xmin", "float"), ("XMAX", "float"), ("ctid", "int"),
            ("tableoid", "int"), ("_ces_lsn", "nvarchar(10)"), ("Name", "nvarchar(10)")]


def test_reserved_columns_are_renamed(tmp_path, db):
    row = {"Id": "1", "xmin": "1.5", "XMAX": "2.5", "ctid": "7", "tableoid": "8",
           "_ces_lsn": "src", "Name": "a"}
    row2 = dict(row, xmin="3.5", Name="b")
    records = [
        record("Shapes", GIS_COLS, row, ["Id"]),
        record("Shapes", GIS_COLS, row2, ["Id"], op="UPD", old=row),
        # A key made of a reserved name.
        record("Boxes", [("xmin", "int"), ("v", "int")], {"xmin": "5", "v": "1"}, ["xmin"]),
        record("Boxes", [("xmin", "int"), ("v", "int")], {"xmin": "5", "v": "2"}, ["xmin"],
               op="UPD", old={"xmin": "5", "v": "1"}),
        record("Boxes", [("xmin", "int"), ("v", "int")], {}, ["xmin"], op="DEL",
               old={"xmin": "5", "v": "2"}),
        ordinary(1),
    ]
    (n, applied, dls), err = replay(db, tmp_path, "cols.jsonl", records)
    assert (n, applied, dls) == (6, 6, 0), err
    cols = columns_of(db, "dbo", "shapes")
    assert cols == ["id", "_src_xmin", "_src_xmax", "_src_ctid", "_src_tableoid",
                    "_src__ces_lsn", "name", "_ces_lsn"], cols
    assert fetch_table(db, "dbo.shapes", ["id", "_src_xmin", "_src_xmax", "_src_ctid",
                                          "_src_tableoid", "_src__ces_lsn", "name"],
                       ["id"]) == [
        {"id": "1", "_src_xmin": "3.5", "_src_xmax": "2.5", "_src_ctid": "7",
         "_src_tableoid": "8", "_src__ces_lsn": "src", "name": "b"}]
    assert fetch_table(db, "dbo.boxes", ["_src_xmin"], ["_src_xmin"]) == []
    assert "_src_xmin" in err
    assert_ordinary_applied(db, 1)
    # Again, on tables that exist: the same names, nothing new.
    (n, applied, dls), err = replay(db, tmp_path, "again.jsonl",
                                    [record("Shapes", GIS_COLS, dict(row, Id="2"), ["Id"]),
                                     ordinary(2)])
    assert (n, applied, dls) == (2, 2, 0), err
    assert columns_of(db, "dbo", "shapes") == cols


def test_long_names_stay_apart(tmp_path, db):
    stem = "Table_" + "x" * 60  # 66 bytes: PostgreSQL alone would cut both to one name
    col = "Column_" + "y" * 60
    cols = [("Id", "int"), (col + "_A", "int"), (col + "_B", "int")]
    records = [
        record(stem + "_A", cols, {"Id": "1", col + "_A": "10", col + "_B": "11"}, ["Id"]),
        record(stem + "_B", cols, {"Id": "1", col + "_A": "20", col + "_B": "21"}, ["Id"]),
        ordinary(1),
    ]
    (n, applied, dls), err = replay(db, tmp_path, "long.jsonl", records)
    assert (n, applied, dls) == (3, 3, 0), err
    tables = sorted(r[0] for r in query(
        db, "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE nspname = 'dbo' AND relkind = 'r' AND relname LIKE 'table_%%'"))
    assert len(tables) == 2, tables
    for t in tables:
        assert len(t.encode()) == 63 and t.startswith(stem.lower()[:54] + "_"), t
        cs = columns_of(db, "dbo", t)
        assert len(cs) == 4 and len(set(cs)) == 4, cs  # id, two columns, version
    values = sorted(tuple(r) for t in tables for r in query(
        db, f'SELECT * FROM dbo."{t}"')[:1])
    assert [v[:3] for v in values] == [(1, 10, 11), (1, 20, 21)], values
    assert_ordinary_applied(db, 1)


def test_case_collision_is_a_dead_letter_on_every_run(tmp_path, db):
    cols = [("Id", "int"), ("V", "int")]
    first = record("Items", cols, {"Id": "1", "V": "1"}, ["Id"])
    second = record("ITEMS", cols, {"Id": "1", "V": "2"}, ["Id"])
    (n, applied, dls), err = replay(db, tmp_path, "case.jsonl", [first, second, ordinary(1)])
    assert (n, applied, dls) == (3, 2, 1), err
    [(cls, reason)] = dead_letter_classes(db)
    assert cls == "name_collision" and "Items" in reason, reason
    assert fetch_table(db, "dbo.items", ["id", "v"], ["id"]) == [{"id": "1", "v": "1"}]
    # After a restart, the other source arrives first: still not merged, and the table's own
    # source still goes in.
    again = record("ITEMS", cols, {"Id": "1", "V": "3"}, ["Id"])
    own = record("Items", cols, {"Id": "2", "V": "4"}, ["Id"])
    (n, applied, dls), err = replay(db, tmp_path, "case2.jsonl", [again, own, ordinary(2)])
    assert (n, applied, dls) == (3, 2, 1), err
    assert [c for c, _ in dead_letter_classes(db)] == ["name_collision"] * 2
    assert "comment" in dead_letter_classes(db)[1][1]
    assert fetch_table(db, "dbo.items", ["id", "v"], ["id"]) == [
        {"id": "1", "v": "1"}, {"id": "2", "v": "4"}]
    assert_ordinary_applied(db, 1, 2)


def test_column_case_collision_is_a_dead_letter(tmp_path, db):
    cols = [("Id", "int"), ("Name", "nvarchar(10)"), ("NAME", "nvarchar(10)")]
    clash = record("People", cols, {"Id": "1", "Name": "a", "NAME": "b"}, ["Id"])
    renamed = record("Boxes", [("Id", "int"), ("xmin", "int"), ("_src_xmin", "int")],
                     {"Id": "1", "xmin": "1", "_src_xmin": "2"}, ["Id"])
    (n, applied, dls), err = replay(db, tmp_path, "colcase.jsonl",
                                    [clash, renamed, ordinary(1)])
    assert (n, applied, dls) == (3, 1, 2), err
    classes = dead_letter_classes(db)
    assert [c for c, _ in classes] == ["name_collision"] * 2, classes
    assert "'Name' and 'NAME'" in classes[0][1], classes
    # Refused before any DDL: neither table was made.
    assert query(db, "SELECT count(*) FROM pg_class WHERE relname IN ('people', 'boxes')") == [(0,)]
    assert_ordinary_applied(db, 1)


def test_fuzz_name_seeds_end_by_themselves(tmp_path, db):
    """The identifier seeds of tests/fuzz/corpus/ (long, case-folded, reserved and control-character
    names) replayed together: each applied or a dead letter, and replay ends by itself."""
    corpus = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"
    seeds = sorted(corpus.glob("names-*"))
    assert len(seeds) >= 7
    records = [p.read_bytes().strip() for p in seeds] + [ordinary(1)]
    (n, applied, dls), err = replay(db, tmp_path, "seeds.jsonl", records)
    assert n == len(records) and applied + dls == n, err
    classes = sorted(c for c, _ in dead_letter_classes(db))
    # case-folded: Name/NAME; reserved-columns: xmin next to _src_xmin; two reserved targets.
    assert classes == ["name_collision", "name_collision", "reserved_target",
                       "reserved_target"], (classes, err)
    assert query(db, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pg\\_%%'"
                     " AND nspname NOT IN ('pg_catalog', 'pg_toast')") == [(0,)]
    assert_ordinary_applied(db, 1)


def test_check_config_says_how_names_are_changed(tmp_path, db):
    """--check-config cannot know the events' names, but says the rules: the
    reserved columns and their new names (the version column included, as
    configured), the cut of long names, the reserved targets."""
    for extra, version in (((), "_ces_lsn"), (('version_column = "_v";',), "_v"),
                           (("lsn_guard = false;",), None)):
        text = make_config(db, "127.0.0.1:9", apply_extra=extra,
                           extra_config='schema = { metadata_schema = "repl_meta"; };')
        rc, out, err = run_ces2pg(["--check-config", "-c", write_config(tmp_path, text)])
        assert rc == 0, err
        names = [line for line in out.splitlines() if line.startswith("names: ")]
        assert len(names) == 3, out
        assert "xmin, xmax, cmin, cmax, ctid, tableoid" in names[0], names
        assert "applied as _src_<name>" in names[0], names
        assert (f"or {version} (the version column)" in names[0]) == (version is not None), names
        assert "longer than 63 bytes becomes its first 54 bytes" in names[1], names
        assert "schema repl_meta (ces2pg's), pg_catalog" in names[2], names
