"""Comparing PostgreSQL's tables with the generator's expectation, and reading
their columns, types and keys.
"""

import contextlib
import re

from harness.events import load_expect


def quote_ident(name):
    """name as a PostgreSQL quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def split_table(qualified):
    """(schema, table) of "schema.table" (schema public when none is given)."""
    schema, _, table = qualified.partition(".")
    if not table:
        schema, table = "public", schema
    return schema, table


def _sort_key(value):
    if value is None:
        return (2, 0, "")
    if re.fullmatch(r"-?\d+", value):
        return (0, int(value), "")
    return (1, 0, value)


def fetch_table(db, qualified, columns, key):
    """Rows of a table as dicts of text values, ordered by key."""
    schema, table = split_table(qualified)
    # Qualified names: a bare ORDER BY name would pick the text output column.
    select_list = ", ".join(f"t.{quote_ident(c)}::text" for c in columns)
    order = ", ".join(f"t.{quote_ident(c)}" for c in key)
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; "
                    "SET extra_float_digits = 1")
        cur.execute(
            f"SELECT {select_list} FROM {quote_ident(schema)}."
            f"{quote_ident(table)} AS t ORDER BY {order}")
        return [dict(zip(columns, r)) for r in cur.fetchall()]


def _fmt_row(row, columns):
    return "{" + ", ".join(f"{c}={row.get(c)!r}" for c in columns) + "}"


def diff_rows(expected, actual, columns, key, limit=5):
    """A readable description of how two row lists differ ('' if equal)."""
    def k(row):
        return tuple(_sort_key(row.get(c)) for c in key)

    exp = {k(r): r for r in expected}
    act = {k(r): r for r in actual}
    missing = [exp[x] for x in sorted(exp.keys() - act.keys())]
    extra = [act[x] for x in sorted(act.keys() - exp.keys())]
    changed = [(exp[x], act[x]) for x in sorted(exp.keys() & act.keys())
               if exp[x] != act[x]]
    out = []
    if missing:
        out.append(f"  {len(missing)} row(s) missing, e.g.:")
        out += ["    - " + _fmt_row(r, columns) for r in missing[:limit]]
    if extra:
        out.append(f"  {len(extra)} unexpected row(s), e.g.:")
        out += ["    + " + _fmt_row(r, columns) for r in extra[:limit]]
    if changed:
        out.append(f"  {len(changed)} row(s) differ, e.g.:")
        for e, a in changed[:limit]:
            cols = [c for c in columns if e.get(c) != a.get(c)]
            keytxt = ", ".join(f"{c}={e.get(c)!r}" for c in key)
            out.append(f"    key {keytxt}: " + "; ".join(
                f"{c}: expected {e.get(c)!r}, got {a.get(c)!r}" for c in cols))
    if not out and len(expected) != len(actual):
        out.append(f"  {len(expected)} expected rows, {len(actual)} found "
                   f"(duplicate keys?)")
    return "\n".join(out)


def assert_tables_match(db, expect, check_types=True):
    """Asserts every table of the expectation equals PostgreSQL's content.

    With check_types, each expected column must also have the expected type
    (format_type spelling, e.g. "character varying(50)"); columns that are
    not in the expectation (such as a version column) are ignored.
    """
    expect = load_expect(expect)
    problems = []
    for qualified, spec in sorted(expect["tables"].items()):
        columns = list(spec["columns"])
        key = list(spec["key"])
        rows = [{c: r.get(c) for c in columns} for r in spec["rows"]]
        rows.sort(key=lambda r: tuple(_sort_key(r[c]) for c in key))
        if not db.table_exists(qualified):
            if rows:
                problems.append(f"{qualified}: table does not exist "
                                f"({len(rows)} rows expected)")
            continue
        if check_types:
            types = column_types(db, qualified)
            wrong = [f"{c}: expected {t}, found {types.get(c, 'no column')}"
                     for c, t in spec["columns"].items() if types.get(c) != t]
            if wrong:
                problems.append(f"{qualified}: column types differ: "
                                + "; ".join(wrong))
                continue
        actual = fetch_table(db, qualified, columns, key)
        if actual != rows:
            problems.append(
                f"{qualified}: {len(actual)} rows, {len(rows)} expected\n"
                + diff_rows(rows, actual, columns, key))
    assert not problems, "tables differ from the expectation:\n" + "\n".join(
        problems)


def column_types(db, qualified):
    """{column: format_type} of a table, in column order."""
    rows = db.query(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) "
        "FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) "
        "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (qualified,))
    return dict(rows)


def primary_key(db, qualified):
    """Primary key column names of a table, in key order."""
    rows = db.query(
        "SELECT a.attname FROM pg_index i "
        "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = k.attnum "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY k.n",
        (qualified,))
    return [r[0] for r in rows]


def record_applied_changes(db, table="dbo.orders", key="orderid"):
    """Every change that reaches table from now on (INSERT or UPDATE), recorded with its key and
    the PostgreSQL transaction it went in, in public.applied (xid, <key>): a change applied twice
    shows as two rows."""
    db.query(f"CREATE TABLE public.applied (xid bigint, {key} int)")
    db.query(f"""CREATE FUNCTION public.applied() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO public.applied VALUES (txid_current(), NEW.{key});
                 RETURN NULL; END $$""")
    db.query(f"CREATE TRIGGER applied AFTER INSERT OR UPDATE ON {table}"
             " FOR EACH ROW EXECUTE FUNCTION public.applied()")


def statement_sums(db, pattern, columns):
    """Sums of pg_stat_statements columns (expressions) over the statements of this database whose
    text matches pattern (SQL LIKE); it counts each execution as it ends."""
    sums = ", ".join(f"coalesce(sum({c}), 0)" for c in columns)
    db.server.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", dbname=db.name)
    with db.connect() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {sums} FROM pg_stat_statements s JOIN pg_database d "
                    "ON d.oid = s.dbid WHERE d.datname = current_database() AND s.query LIKE %s",
                    (pattern,))
        return tuple(int(v) for v in cur.fetchone())


def statement_calls(db, pattern):
    """(calls, rows) of the statements of this database whose text matches pattern (SQL LIKE)."""
    return statement_sums(db, pattern, ("calls", "rows"))
