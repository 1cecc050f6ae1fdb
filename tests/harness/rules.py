"""What per-table rules (schema.tables) leave in PostgreSQL, checked against a
stream: the rows a soft delete kept, and the history tables' changes."""

import json

from harness.tables import quote_ident, split_table


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


def record_versions(records):
    """{source table: {(VLF, block, slot, sequence)}}: the distinct changes of records (an
    event split into segments is joined first; its copies count once)."""
    events = {}
    for r in records:
        env = json.loads(r)
        events.setdefault(env["logicalid"], {})[env.get("segmentindex", 0)] = env["data"]
    out = {}
    for parts in events.values():
        data = json.loads("".join(parts[i] for i in sorted(parts)))
        src, txn = data["eventsource"], data["eventsource"]["transaction"]
        lsn = tuple(int(p, 16) for p in txn["commitlsn"].split(":"))
        out.setdefault(f'{src["schema"]}.{src["tbl"]}', set()).add(lsn + (txn["sequencenumber"],))
    return out


def history_versions(db, qualified):
    """The changes a history table holds, as record_versions has them; and how many rows."""
    schema, table = split_table(qualified)
    rows = db.query(f"SELECT _ces_commit_lsn, _ces_sequence FROM "
                    f"{quote_ident(schema)}.{quote_ident(table)}")
    return {tuple(int(p, 16) for p in lsn.split(":")) + (seq,) for lsn, seq in rows}, len(rows)


def assert_history_complete(db, records, template="{schema}.{table}_history"):
    """Every distinct change of records is in its table's history exactly once."""
    for source, want in sorted(record_versions(records).items()):
        schema, table = source.split(".")
        got, count = history_versions(db, template.format(schema=schema, table=table).lower())
        assert got == want, (source, len(got), len(want), sorted(want - got)[:3],
                             sorted(got - want)[:3])
        assert count == len(want), f"{source}: {count} history rows for {len(want)} changes"
