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


def record_changes(records):
    """{table (lower case): {(VLF, block, slot, sequence): operation}}: the distinct changes of
    CES JSON records. The change is read from the logicalid (stream:LSN:sequence), which every
    CES generation has (legacy events carry no transaction object); the table from the data,
    joined first for an event split into segments (their copies count once)."""
    changes, slices = {}, {}

    def add(env, data):
        _, lsn, seq = env["logicalid"].rsplit(":", 2)
        change = (int(lsn[0:8], 16), int(lsn[8:16], 16), int(lsn[16:20], 16), int(seq))
        src = data["eventsource"]
        changes.setdefault(f'{src["schema"]}.{src["tbl"]}'.lower(), {})[change] = \
            env["operation"]

    for record in records:
        env = json.loads(record)
        try:
            data = json.loads(env["data"])
        except ValueError:
            data = None
        if isinstance(data, dict) and "eventsource" in data:
            add(env, data)
        else:  # a slice of the data (segmentindex, or splitindex in legacy events)
            index = env.get("segmentindex", env.get("splitindex", 0))
            slices.setdefault(env["logicalid"], ({}, env))[0][index] = env["data"]
    for parts, env in slices.values():
        add(env, json.loads("".join(parts[i] for i in sorted(parts))))
    return changes


def record_versions(records):
    """{table (lower case): {(VLF, block, slot, sequence)}}: the distinct changes of records."""
    return {table: set(changes) for table, changes in record_changes(records).items()}


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
