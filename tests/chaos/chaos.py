"""The chaos tier's machinery: a transactional multi-table stream applied by
ces2pg while faults hit it one at a time, and the checks that ces2pg kept its
guarantees. tests/chaos/test_chaos.py runs it against librdkafka's mock
cluster and against Apache Kafka; scripts/chaos is the front end.

The stream (tools/ces-gen): dbo.Customers, dbo.Orders (composite key) and
dbo.Products with inserts, updates, deletes, primary-key changes, keys deleted
and inserted again, and CES's at-least-once resends (duplicates at once, older
events sent again hundreds of events later, a key's first insert sent again
after the key changed or was deleted); with them, in the same source
transactions, the bank of --bank-accounts (dbo.AccountsA/AccountsB). The
partition scheme is Column (a key's changes stay in one partition, a
transaction spreads over several), JSON of both CES generations. ces-gen
writes the records and, from its own model, the final rows.

ces2pg runs in transaction order with a reorder window (WINDOW_MS) longer
than any silence a fault causes a partition, so that no transaction may be
torn by lag alone. A producer thread paces the stream (and, on the mock, keeps
each partition's unapplied bytes under its 5 MiB retention). The stream
starts before ces2pg does, so ces2pg never sees an idle partition wake up.

Checks, all of which must hold after every run:
- every row equals the generator's model (assert_tables_match), no dead
  letters;
- a reader, in REPEATABLE READ snapshots as fast as it can, never sees a
  source transaction in part: as many accounts and transfers in AccountsA as
  in AccountsB, and once every account is open the constant total;
- PostgreSQL's own record (chaos.audit, filled by row triggers that an event
  trigger puts on every table ces2pg creates, ces2pg.tombstones included):
  every row write of one source transaction (its commit LSN: the version
  column without its 20-digit sequence) was committed by one PostgreSQL
  transaction, and no change (table, key, version) was written twice;
- no stored offset ever moved backwards (polled throughout), and at the end
  every partition's offset is the end of its log in the broker, which holds
  every record delivered to it (the mock can hold a record twice after an
  outage, a produce retried and appended again: the stream then carries one
  more resend, as CES streams do);
- every SIGTERM ends ces2pg with exit status 0, no ces2pg exits by itself, no
  daemon log holds a sanitizer report or "events may have been lost";
- under soak, ces2pg's resident memory, sampled every 10 s, does not keep
  growing (see RssSampler.verdict).

The rules profile runs ces2pg with one per-table rule for every table, soft
deletes and a history table beside the mirror (RULES_CONFIG), and checks
instead of the plain model comparison (check_rules):
- the live rows (_ces_deleted_at NULL) equal the model, and every soft-deleted
  row is a key the model does not have (so the version guard kept its
  ordering for soft deletes too);
- each table's history (dbo.<table>_history) holds every distinct change of
  that table in the stream (commit LSN and sequence, from the records'
  logicalid) exactly once, with the stream's operation and a version that is
  its commit LSN and sequence; and every mirror row's version is the newest
  change of its key in the history (older for none: a soft-deleted row may be
  newer, marked by a key change);
- the audit covers the history tables too (version _ces_version), so a history
  row committed apart from the rest of its source transaction is torn.
"""

import contextlib
import decimal
import json
import random
import re
import signal
import threading
import time
import zlib
from pathlib import Path

import psycopg2

from harness import common
from harness.common import wait_until
from harness.daemon import DEFAULT_KAFKA_PROPERTIES
from harness.events import PKKEY_RE, generate, read_records
from harness.mockbroker import watermarks
from harness.progress import dead_letters, read_offsets_conn
from harness.realkafka import DAEMON_PROPERTIES, eventhubs_kafka_lines
from harness.reports import tail_text
from harness.rules import record_changes
from harness.tables import (assert_tables_match, column_types, diff_rows,
                            quote_ident, split_table)

GROUP = "ces2pg-chaos"
APP_NAME = "ces2pg-chaos"  # ces2pg's application_name, to find its session
PARTITIONS = 6
MOCK_BROKERS = 3
ACCOUNTS = 50  # bank accounts per table
RESEND = 0.02  # ces-gen --resend
# The reorder window: longer than any silence of a partition a fault causes
# (a mock broker down for up to 5 s, Apache Kafka stopped and started again in
# about 5 to 10 s, the producer held back by the mock's retention), so that
# no transaction may be torn by lag alone. Its maximum is above it, so that
# a late event caused by lag would show as the window growing in the log.
WINDOW_MS = 20000
WINDOW_MAX_MS = 40000
RATE = 300  # records per second, nominal
SOAK_RATE = 200
MOCK_BACKLOG = 3 * 1024 * 1024  # unapplied bytes per partition (retention: 5 MiB)
RSS_INTERVAL = 10.0

KINDS = ("kill9", "pg_crash", "broker_down", "request_errors", "pg_lock",
         "sighup", "sigterm")
RESTARTS = ("kill9", "sigterm")  # faults that start a new ces2pg process
# Request errors the mock pushes (librdkafka's names): the retriable and
# group-membership errors a broker answers with during leader moves,
# coordinator changes and rebalances. A JoinGroup error waits for a join:
# with it one Heartbeat answers REBALANCE_IN_PROGRESS, which makes one.
REQUEST_ERRORS = {
    "Fetch": ("NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE",
              "REQUEST_TIMED_OUT", "_TRANSPORT"),
    "OffsetCommit": ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE",
                     "REQUEST_TIMED_OUT", "REBALANCE_IN_PROGRESS",
                     "UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION"),
    "JoinGroup": ("COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
                  "COORDINATOR_LOAD_IN_PROGRESS", "_TRANSPORT"),
    "Heartbeat": ("REBALANCE_IN_PROGRESS", "UNKNOWN_MEMBER_ID",
                  "ILLEGAL_GENERATION", "NOT_COORDINATOR",
                  "COORDINATOR_NOT_AVAILABLE"),
}
TABLES = ("dbo.customers", "dbo.orders", "dbo.products", "dbo.accountsa",
          "dbo.accountsb")
# Two shapes of source transactions: many small ones, or some larger than a
# batch (ces2pg streams those into one PostgreSQL transaction in parts).
# Unless --profile names one, the seed chooses, so that runs cover both.
PROFILES = {
    "small": {"txn_size": "1-8", "batch_max_events": 500},
    "streamed": {"txn_size": "1-60", "batch_max_events": 40},
    # The small profile, every table with soft deletes and a history (RULES_CONFIG).
    "rules": {"txn_size": "1-8", "batch_max_events": 500, "rules": True},
}
# What --profile random chooses from: the profiles it had before rules came, so
# that an existing seed still means the same run (the same profile and stream).
RANDOM_PROFILES = ("small", "streamed")
DELETED_COLUMN = "_ces_deleted_at"  # the rule's default deleted_column
HISTORY_TEMPLATE = "{schema}.{table}_history"  # the rule's default history_table
RULES_CONFIG = ('schema = { tables = ( { match = "*"; deletes = "soft"; '
                'history = "also"; } ); };')


def log(text):
    print(text, flush=True)


# --------------------------------------------------------------------------
# The plan: faults in a seeded random order, with their parameters
# --------------------------------------------------------------------------


class Deck:
    """Draws items in random order, every item once before any repeats."""

    def __init__(self, rng, items):
        self.rng, self.items, self.left = rng, list(items), []

    def draw(self):
        if not self.left:
            self.left = list(self.items)
            self.rng.shuffle(self.left)
        return self.left.pop()


class Fault:
    def __init__(self, number, kind, gap, params):
        self.number, self.kind, self.gap, self.params = number, kind, gap, params
        self.notes = []      # what happened, for the report
        self.started = None  # seconds since the run's start
        self.took = None     # the fault itself, seconds
        self.recovered = None  # from its end to ces2pg's next commit, seconds

    def describe(self):
        params = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"#{self.number} {self.kind}" + (f" ({params})" if params else "")


def plan_faults(seed, kinds, brokers):
    """An endless, seeded sequence of faults: kinds in random order, every
    kind once per round; a random pause (gap, seconds) before each."""
    rng = random.Random(f"ces2pg-chaos:{seed}:faults")
    kind_deck = Deck(rng, kinds)
    api_deck = Deck(rng, sorted(REQUEST_ERRORS))
    number = 0
    while True:
        number += 1
        kind = kind_deck.draw()
        params = {}
        if kind == "pg_crash":
            params = {"down_s": round(rng.uniform(0.5, 3.0), 1)}
        elif kind == "broker_down":
            broker = -1 if brokers == 1 or rng.random() < 0.25 else \
                rng.randint(1, brokers)
            params = {"broker": broker, "down_s": round(rng.uniform(2.0, 5.0), 1)}
        elif kind == "request_errors":
            api = api_deck.draw()
            params = {"api": api, "count": rng.randint(1, 5),
                      "error": rng.choice(REQUEST_ERRORS[api])}
        elif kind == "pg_lock":
            params = {"table": rng.choice(TABLES),
                      "mode": rng.choice(("SHARE", "EXCLUSIVE")),
                      "hold_s": round(rng.uniform(2.0, 5.0), 1)}
        yield Fault(number, kind, round(rng.uniform(0.5, 3.0), 1), params)


DEFAULT_PROFILE = "random"


def choose_profile(seed, name=None):
    """The profile called name; "random": one chosen by the seed."""
    name = name or DEFAULT_PROFILE
    if name == "random":
        name = random.Random(f"ces2pg-chaos:{seed}:profile").choice(
            sorted(RANDOM_PROFILES))
    return name, PROFILES[name]


# --------------------------------------------------------------------------
# PostgreSQL's record of every row write (the audit)
# --------------------------------------------------------------------------

AUDIT_DDL = r"""
CREATE SCHEMA chaos;
CREATE TABLE chaos.audit (xid bigint NOT NULL, rel text NOT NULL,
                          key text NOT NULL, version numeric NOT NULL);
-- A row of a target table was inserted or updated: TG_ARGV holds its key's
-- column names. A history table's version is _ces_version (also its key).
CREATE FUNCTION chaos.audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r jsonb := to_jsonb(NEW);
    k text[] := '{}';
    i int;
BEGIN
    FOR i IN 0 .. TG_NARGS - 1 LOOP
        k := k || (r ->> TG_ARGV[i]);
    END LOOP;
    INSERT INTO chaos.audit VALUES (txid_current(),
        TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, k::text,
        coalesce(r ->> '_ces_lsn', r ->> '_ces_version')::numeric);
    RETURN NULL;
END $$;
-- A tombstone was written or raised (a delete, or the old key of a key change).
CREATE FUNCTION chaos.audit_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos.audit VALUES (txid_current(),
        'tombstone of ' || NEW.relid::regclass::text, NEW.key::text, NEW.version);
    RETURN NULL;
END $$;
-- Puts the triggers on the tables ces2pg creates, in the same transaction.
CREATE FUNCTION chaos.attach_audit() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
    cols text;
BEGIN
    FOR c IN SELECT * FROM pg_event_trigger_ddl_commands()
             WHERE object_type = 'table' LOOP
        IF c.schema_name = 'dbo' THEN
            SELECT string_agg(quote_literal(a.attname), ', ' ORDER BY k.n) INTO cols
            FROM pg_index i
            JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
            WHERE i.indrelid = c.objid AND i.indisprimary;
            EXECUTE format('CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON %s '
                           'FOR EACH ROW EXECUTE FUNCTION chaos.audit_row(%s)',
                           c.object_identity, cols);
        ELSIF c.object_identity = 'ces2pg.tombstones' THEN
            CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON ces2pg.tombstones
                FOR EACH ROW EXECUTE FUNCTION chaos.audit_tombstone();
        END IF;
    END LOOP;
END $$;
"""
# Event triggers are database-wide; made last, so that the DDL above is not
# seen by it.
AUDIT_EVENT_TRIGGER = """
CREATE EVENT TRIGGER chaos_attach_audit ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION chaos.attach_audit();
"""

AUDIT_SUMMARY = """
SELECT count(*), count(DISTINCT xid), count(DISTINCT div(version, 1e20)),
       count(DISTINCT rel) FROM chaos.audit
"""
# Source transactions whose row writes PostgreSQL committed in more than one
# transaction: a reader could see them in part.
AUDIT_TORN = """
SELECT count(*), (array_agg(format('commit LSN %s: %s PostgreSQL transactions',
                                   lsn, xids) ORDER BY lsn))[1:5]
FROM (SELECT div(version, 1e20) AS lsn, count(DISTINCT xid) AS xids
      FROM chaos.audit GROUP BY 1 HAVING count(DISTINCT xid) > 1) AS torn
"""
# A change written more than once: the same version of the same row.
AUDIT_TWICE = """
SELECT count(*), (array_agg(format('%s key %s version %s: %s writes',
                                   rel, key, version, n)))[1:5]
FROM (SELECT rel, key, version, count(*) AS n FROM chaos.audit
      GROUP BY 1, 2, 3 HAVING count(*) > 1) AS twice
"""
AUDITED_TABLES = """
SELECT count(*) FROM pg_trigger WHERE tgname = 'chaos_audit'
"""


# For a torn source transaction: which of its changes (sequence numbers) each
# PostgreSQL transaction wrote, in the order they were written.
AUDIT_TORN_DETAIL = """
SELECT lsn, xid, array_agg(seq ORDER BY seq), array_agg(DISTINCT rel)
FROM (SELECT div(version, 1e20) AS lsn, mod(version, 1e20)::bigint AS seq, xid, rel
      FROM chaos.audit) AS a
WHERE lsn IN (SELECT div(version, 1e20) FROM chaos.audit GROUP BY 1
              HAVING count(DISTINCT xid) > 1 ORDER BY 1 LIMIT 5)
GROUP BY lsn, xid ORDER BY lsn, min(seq)
"""


def lsn_text(lsn):
    """A commit LSN as a number (the version without its sequence) in CES's
    form, VLF:block:slot."""
    lsn = int(lsn)
    return "%08X:%08X:%04X" % (lsn >> 48, (lsn >> 16) & 0xFFFFFFFF, lsn & 0xFFFF)


def torn_details(db):
    """Lines describing the torn source transactions (at most 5)."""
    return [f"  {lsn_text(lsn)}: PostgreSQL transaction {xid} wrote changes "
            f"{list(seqs)} of {sorted(rels)}"
            for lsn, xid, seqs, rels in db.query(AUDIT_TORN_DETAIL)]


def install_audit(db):
    db.query(AUDIT_DDL)
    db.query(AUDIT_EVENT_TRIGGER)


def check_audit(db, tables=TABLES):
    """(summary line, problems). tables: the target tables the stream has
    (history tables included)."""
    rows, xids, lsns, rels = db.query(AUDIT_SUMMARY)[0]
    triggers = db.scalar(AUDITED_TABLES)
    problems = []
    if triggers != len(tables) + 1:
        problems.append(f"audit: {triggers} tables audited, expected "
                        f"{len(tables) + 1} (the target tables and "
                        "ces2pg.tombstones)")
    if rows == 0:
        problems.append("audit: no row write recorded")
    torn, _ = db.query(AUDIT_TORN)[0]
    if torn:
        problems.append(f"audit: {torn} source transaction(s) committed by "
                        "more than one PostgreSQL transaction:\n"
                        + "\n".join(torn_details(db)))
    twice, twice_examples = db.query(AUDIT_TWICE)[0]
    if twice:
        problems.append(f"audit: {twice} change(s) written more than once: "
                        f"{twice_examples}")
    summary = (f"audit: {rows} row writes of {lsns} source transactions in "
               f"{xids} PostgreSQL transactions, {rels} tables written; "
               f"{torn} torn, {twice} written twice")
    return summary, problems


# --------------------------------------------------------------------------
# The rules profile: soft deletes and history tables
# --------------------------------------------------------------------------


def history_table(qualified):
    """The history table of a target table (HISTORY_TEMPLATE, lower case as
    ces2pg folds it)."""
    schema, table = split_table(qualified)
    return HISTORY_TEMPLATE.format(schema=schema, table=table).lower()


def sql_name(qualified):
    """schema.table quoted for SQL."""
    return ".".join(quote_ident(part) for part in split_table(qualified))


def change_text(change):
    return "%08X:%08X:%04X seq %d" % change


def stream_changes(path):
    """{table (lower case): {(VLF, block, slot, sequence): operation}}: the
    distinct changes of a replay file's JSON records (harness.rules)."""
    return record_changes(read_records(path))


def fetch_rows(db, qualified, columns, where):
    """Rows of a table as tuples of text values (as harness.tables.fetch_table
    reads them, so that they compare with the model's texts)."""
    schema, table = split_table(qualified)
    select_list = ", ".join(f"t.{quote_ident(c)}::text" for c in columns)
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; "
                    "SET extra_float_digits = 1")
        cur.execute(f"SELECT {select_list} FROM {quote_ident(schema)}."
                    f"{quote_ident(table)} AS t {where}")
        return cur.fetchall()


def check_live_rows(db, expect, deleted_column=DELETED_COLUMN):
    """Soft deletes: the live rows (deleted column NULL) of every table equal
    the model (what hard deletes leave), and every soft-deleted row is a key
    the model has not. Returns (live rows, soft-deleted rows, problems)."""
    problems, live_total, deleted_total = [], 0, 0
    marked = quote_ident(deleted_column)
    for qualified, spec in sorted(expect["tables"].items()):
        columns, key = list(spec["columns"]), list(spec["key"])
        model = {tuple(r.get(c) for c in key): {c: r.get(c) for c in columns}
                 for r in spec["rows"]}
        if not db.table_exists(qualified):
            if model:
                problems.append(f"{qualified}: table does not exist ({len(model)} rows "
                                "expected)")
            continue
        types = column_types(db, qualified)
        wrong = [f"{c}: expected {t}, found {types.get(c, 'no column')}"
                 for c, t in spec["columns"].items() if types.get(c) != t]
        if types.get(deleted_column) != "timestamp with time zone":
            wrong.append(f"{deleted_column}: expected timestamp with time zone, found "
                         f"{types.get(deleted_column, 'no column')} (soft deletes not in "
                         "effect?)")
        if wrong:
            problems.append(f"{qualified}: column types differ: " + "; ".join(wrong))
            continue
        live = {tuple(r[columns.index(c)] for c in key): dict(zip(columns, r))
                for r in fetch_rows(db, qualified, columns, f"WHERE t.{marked} IS NULL")}
        if live != model:
            problems.append(f"{qualified}: {len(live)} live rows, {len(model)} expected\n"
                            + diff_rows(list(model.values()), list(live.values()),
                                        columns, key))
        deleted = fetch_rows(db, qualified, key, f"WHERE t.{marked} IS NOT NULL")
        kept = [k for k in deleted if tuple(k) in model]
        if kept:
            problems.append(f"{qualified}: {len(kept)} soft-deleted row(s) of keys the "
                            f"model has, e.g. {kept[:5]}")
        live_total += len(live)
        deleted_total += len(deleted)
    return live_total, deleted_total, problems


# A mirror row's version against its key's changes in the history: a live row
# holds the newest of them; a soft-deleted row at least the newest (a key
# change marks the old key with a version that the history files under the
# new key).
MIRROR_VS_HISTORY = """
SELECT count(*), (array_agg(format('key (%s): version %s, deleted %s, newest in the history %s',
                                   {keytext}, t.{version}, t.{marked}, m.newest)))[1:3]
FROM {mirror} AS t LEFT JOIN (SELECT {keys}, max(_ces_version) AS newest
                              FROM {history} GROUP BY {keys}) AS m USING ({keys})
WHERE NOT coalesce(CASE WHEN t.{marked} IS NULL THEN t.{version} = m.newest
                        ELSE t.{version} >= m.newest END, false)
"""


def check_history(db, expect, changes, deleted_column=DELETED_COLUMN,
                  version_column="_ces_lsn"):
    """History tables: each table's history holds every distinct change of
    the stream's (changes: stream_changes) exactly once, with its operation
    and a version made of its commit LSN and sequence; and every mirror row's
    version is its key's newest change there. Returns (history rows,
    problems)."""
    problems, total = [], 0
    for table, want in sorted(changes.items()):
        hist = history_table(table)
        if not db.table_exists(hist):
            problems.append(f"{hist}: no history table ({len(want)} changes of {table})")
            continue
        got, twice, bad_version = {}, [], []
        for version, op, lsn, seq in db.query(
                "SELECT _ces_version, _ces_operation, _ces_commit_lsn, _ces_sequence "
                f"FROM {sql_name(hist)}"):
            parts = tuple(int(x, 16) for x in lsn.split(":"))
            change = parts + (seq,)
            if change in got:
                twice.append(change)
            got[change] = op
            if version != ((parts[0] << 48) | (parts[1] << 16) | parts[2]) * 10**20 + seq:
                bad_version.append(f"{change_text(change)}: version {version}")
            total += 1
        missing = sorted(want.keys() - got.keys())
        extra = sorted(got.keys() - want.keys())
        wrong_op = sorted(f"{change_text(c)}: {got[c]}, {want[c]} in the stream"
                          for c in want.keys() & got.keys() if got[c] != want[c])
        for what, items in (("change(s) of the stream missing", missing),
                            ("change(s) the stream does not have", extra),
                            ("change(s) recorded more than once", twice)):
            if items:
                problems.append(f"{hist}: {len(items)} {what}, e.g. "
                                + ", ".join(change_text(c) for c in items[:5]))
        for what, items in (("with another operation than the stream's", wrong_op),
                            ("whose version is not its commit LSN and sequence",
                             bad_version)):
            if items:
                problems.append(f"{hist}: {len(items)} change(s) {what}, e.g. {items[:5]}")
    for qualified, spec in sorted(expect["tables"].items()):
        hist = history_table(qualified)
        if not (db.table_exists(qualified) and db.table_exists(hist)) or \
                deleted_column not in column_types(db, qualified):
            continue  # (check_live_rows says so)
        keys = ", ".join(quote_ident(c) for c in spec["key"])
        count, examples = db.query(MIRROR_VS_HISTORY.format(
            keytext="concat_ws(', ', " + ", ".join(f"t.{quote_ident(c)}"
                                                     for c in spec["key"]) + ")",
            keys=keys, version=quote_ident(version_column),
            marked=quote_ident(deleted_column),
            mirror=sql_name(qualified), history=sql_name(hist)))[0]
        if count:
            problems.append(f"{qualified}: {count} row(s) whose version is not the newest "
                            f"change of their key in {hist}: {examples}")
    return total, problems


# Soft deletes done in the run: a row write that the audit saw at the version
# of a DEL (a hard delete writes a tombstone instead, or nothing). Most
# deleted keys are inserted again later, so few rows end deleted: the writes
# show that the deletes were soft all along.
AUDIT_SOFT_DELETES = """
SELECT count(*) FROM chaos.audit AS a JOIN {history} AS h
    ON h._ces_version = a.version AND h._ces_operation = 'DEL'
WHERE a.rel = %s
"""


def check_rules(db, expect, stream_path):
    """The rules profile's model checks (check_live_rows, check_history), and
    that the run did soft deletes (AUDIT_SOFT_DELETES). Returns (summary
    line, problems)."""
    live, deleted, problems = check_live_rows(db, expect)
    changes = stream_changes(stream_path)
    history_rows, history_problems = check_history(db, expect, changes)
    problems += history_problems
    marks = sum(db.scalar(AUDIT_SOFT_DELETES.format(history=sql_name(history_table(t))),
                          (t,))
                for t in expect["tables"]
                if db.table_exists(t) and db.table_exists(history_table(t)))
    if marks == 0:
        problems.append("no soft delete was done: no row write at a DEL's version in the "
                        "audit")
    distinct = sum(len(c) for c in changes.values())
    summary = (f"rules: {live} live rows (the model), {deleted} soft-deleted (keys the model "
               f"has not), {marks} soft deletes done; histories: {history_rows} rows for "
               f"{distinct} distinct changes of {len(changes)} tables in the stream")
    return summary, problems


# --------------------------------------------------------------------------
# Background threads
# --------------------------------------------------------------------------


class Background(common.Background):
    """harness.common.Background with failed(): the thread's error without stopping
    it, so that the run can fail as soon as one thread has."""

    def failed(self):
        return self.error


def _connect(db, application_name):
    conn = psycopg2.connect(db.conninfo, application_name=application_name,
                            connect_timeout=5)
    conn.autocommit = True
    return conn


PG_GONE = (psycopg2.OperationalError, psycopg2.InterfaceError)

BANK_QUERY = """
SELECT (SELECT count(*) FROM dbo.accountsa {a}), (SELECT count(*) FROM dbo.accountsb {b}),
       (SELECT coalesce(sum(balance), 0) FROM dbo.accountsa {a})
       + (SELECT coalesce(sum(balance), 0) FROM dbo.accountsb {b}),
       (SELECT coalesce(sum(transfers), 0) FROM dbo.accountsa {a}),
       (SELECT coalesce(sum(transfers), 0) FROM dbo.accountsb {b})
"""
# Which bank tables have the soft-delete column yet (ces2pg adds it when it
# first loads the table, in a transaction of its own).
BANK_DELETED_COLUMNS = """
SELECT attrelid = to_regclass('dbo.accountsa') FROM pg_attribute
WHERE attrelid IN (to_regclass('dbo.accountsa'), to_regclass('dbo.accountsb'))
  AND attname = %s AND NOT attisdropped
"""


class BankReader(Background):
    """Reads the bank in one REPEATABLE READ snapshot, over and over. A
    snapshot holding whole source transactions only has as many accounts and
    as many transfers counted in AccountsA as in AccountsB, and once every
    account is open the constant total. Reconnects while PostgreSQL is
    down.

    With deleted_column (soft deletes), the bank is the live rows: those whose
    deleted column is NULL, as for any reader of soft-deleted tables. The bank
    has no deletes, so this changes nothing as long as ces2pg marks no row by
    mistake; a marked account would then count as closed. Before ces2pg added
    the column to a table none of its rows can be marked."""

    def __init__(self, db, accounts, total, deleted_column=None):
        super().__init__("bank-reader")
        self.db, self.accounts, self.total = db, accounts, total
        self.deleted_column = deleted_column
        self.reads = 0
        self.full_reads = 0  # with every account open (the total checked)
        self.bad = 0
        self.examples = []
        self.reconnects = 0
        self.states = set()  # distinct (transfers A, transfers B) seen

    def run(self):
        conn = None
        try:
            while not self.stopping():
                try:
                    if conn is None:
                        conn = psycopg2.connect(
                            self.db.conninfo, application_name="chaos-reader",
                            connect_timeout=5)
                        conn.set_session(isolation_level="REPEATABLE READ",
                                         readonly=True)
                    self._read(conn)
                except PG_GONE:
                    if conn is not None:
                        conn.close()
                    conn = None
                    self.reconnects += 1
                    time.sleep(0.2)
                    continue
                time.sleep(0.01)
        finally:
            if conn is not None:
                conn.close()

    def _read(self, conn):
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass('dbo.accountsa') IS NOT NULL, "
                        "to_regclass('dbo.accountsb') IS NOT NULL")
            has_a, has_b = cur.fetchone()
            live = {True: "", False: ""}  # (is AccountsA): the live rows' filter
            if self.deleted_column is not None and (has_a or has_b):
                cur.execute(BANK_DELETED_COLUMNS, (self.deleted_column,))
                for (is_a,) in cur.fetchall():
                    live[is_a] = "WHERE " + quote_ident(self.deleted_column) + " IS NULL"
            if has_a and has_b:
                cur.execute(BANK_QUERY.format(a=live[True], b=live[False]))
                na, nb, total, ta, tb = cur.fetchone()
            elif has_a or has_b:
                cur.execute("SELECT count(*) FROM dbo.accounts"
                            + ("a " if has_a else "b ") + live[has_a])
                na = nb = cur.fetchone()[0]
                if has_a:
                    nb = 0
                else:
                    na = 0
                total, ta, tb = None, 0, 0
            else:
                na = nb = ta = tb = 0
                total = None
        conn.commit()
        self.reads += 1
        bad = []
        if na != nb or ta != tb:
            bad.append("pair")
        if na == nb == self.accounts:
            self.full_reads += 1
            self.states.add((ta, tb))
            if total != self.total:
                bad.append("total")
        if bad:
            self.bad += 1
            if len(self.examples) < 5:
                self.examples.append(
                    f"{'+'.join(bad)}: accounts {na}/{nb}, transfers {ta}/{tb}, "
                    f"total {total} (constant {self.total})")

    def summary(self):
        return (f"reader: {self.reads} snapshots, {self.full_reads} with every "
                f"account open, {len(self.states)} distinct states of the "
                f"transfers, {self.bad} with a source transaction in part"
                + (f" (e.g. {self.examples})" if self.examples else "")
                + f"; {self.reconnects} reconnections")


class OffsetWatcher(Background):
    """Polls ces2pg.offsets over one connection (again after PostgreSQL came
    back); an offset that moves backwards or a row that vanishes fails."""

    def __init__(self, db, group, topic, interval=0.05):
        super().__init__("offset-watcher")
        self.db, self.group, self.topic = db, group, topic
        self.interval = interval
        self.last = {}
        self.polls = 0
        self.lock = threading.Lock()

    def total(self):
        with self.lock:
            return sum(self.last.values())

    def snapshot(self):
        with self.lock:
            return dict(self.last)

    def run(self):
        conn = None
        try:
            while not self.stopping():
                try:
                    if conn is None:
                        conn = _connect(self.db, "chaos-offsets")
                    now = read_offsets_conn(conn, self.group, self.topic)
                except PG_GONE:
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.2)
                    continue
                with self.lock:
                    for p, prev in self.last.items():
                        cur = now.get(p)
                        assert cur is not None, (
                            f"offsets row of partition {p} vanished (was {prev})")
                        assert cur >= prev, (
                            f"offset of partition {p} moved backwards: "
                            f"{prev} -> {cur}")
                    self.last = now
                    self.polls += 1
                time.sleep(self.interval)
        finally:
            if conn is not None:
                conn.close()


def column_partition(record, nparts, by_logicalid):
    """The partition ces-gen's Column scheme gives a JSON record: crc32 of its
    first key value; a later segment follows its first (harness.events.stream_partitions
    for one record at a time)."""
    event = json.loads(record)
    m = PKKEY_RE.search(event["data"])
    if m:
        p = zlib.crc32(m.group(1).encode()) % nparts
        by_logicalid[event["logicalid"]] = p
        return p
    return by_logicalid[event["logicalid"]]


class StreamProducer(Background):
    """Produces the records of a replay file in order, to their Column-scheme
    partitions, at `rate` records a second (changeable; None: as fast as
    allowed). With max_backlog, a record waits while its partition holds more
    than that many bytes past the offset ces2pg stored (read from
    ces2pg.offsets): the mock drops the oldest data of a partition beyond
    5 MiB, read or not. counts: records delivered per partition."""

    def __init__(self, make_producer, topic, path, nparts, total, rate,
                 db=None, group=None, max_backlog=None, stall_timeout=180):
        super().__init__("stream-producer")
        self.make_producer, self.topic, self.path = make_producer, topic, path
        self.nparts, self.total, self.rate = nparts, total, rate
        self.db, self.group, self.max_backlog = db, group, max_backlog
        self.stall_timeout = stall_timeout
        self.counts = {}
        self.produced = 0
        self.delivered = 0
        self.held_back = 0.0  # seconds spent waiting for ces2pg (mock retention)
        self.done = threading.Event()
        self._errors = []

    def left(self):
        return self.total - self.produced

    def _on_delivery(self, err, msg):
        if err is not None:
            self._errors.append(f"{msg.partition()}: {err}")
        else:
            p = msg.partition()
            self.counts[p] = self.counts.get(p, 0) + 1
            self.delivered += 1

    def run(self):
        producer = self.make_producer()
        conn = None
        cum = {p: [0] for p in range(self.nparts)}  # bytes before each offset
        applied = {}
        last_read = 0.0
        last_change = time.monotonic()
        by_logicalid = {}
        due = time.monotonic()
        try:
            with open(self.path, "rb") as f:
                for line in f:
                    if self.stopping():
                        return
                    rec = line.rstrip(b"\n")
                    p = column_partition(rec, self.nparts, by_logicalid)
                    c = cum[p]
                    c.append(c[-1] + len(rec))
                    k = len(c) - 2  # this record's offset
                    # The mock's retention: wait for ces2pg to apply.
                    waited = None
                    while (self.max_backlog is not None
                           and c[k + 1] - c[applied.get(p, 0)] > self.max_backlog):
                        if self.stopping():
                            return
                        waited = waited or time.monotonic()
                        producer.poll(0.05)
                        if time.monotonic() - last_read >= 0.1:
                            last_read = time.monotonic()
                            try:
                                if conn is None:
                                    conn = _connect(self.db, "chaos-producer")
                                now = read_offsets_conn(
                                    conn, self.group, self.topic)
                            except PG_GONE:
                                if conn is not None:
                                    conn.close()
                                conn = None
                                now = applied
                            if now != applied:
                                applied = now
                                last_change = time.monotonic()
                        assert time.monotonic() - last_change < self.stall_timeout, (
                            f"ces2pg stored no progress for {self.stall_timeout}s "
                            f"while the producer waited (partition {p}, offsets "
                            f"{applied}, {self.produced} produced)")
                    if waited is not None:
                        self.held_back += time.monotonic() - waited
                    rate = self.rate
                    if rate:
                        now_t = time.monotonic()
                        due = max(due, now_t - 0.5)  # no burst after a wait
                        if due > now_t:
                            time.sleep(due - now_t)
                        due += 1.0 / rate
                    while True:
                        try:
                            producer.produce(self.topic, value=rec, partition=p,
                                             on_delivery=self._on_delivery)
                            break
                        except BufferError:
                            producer.poll(0.1)
                    producer.poll(0)
                    self.produced += 1
                    if time.monotonic() - last_read >= 1.0 and self.max_backlog:
                        last_read = time.monotonic()
                        try:
                            if conn is None:
                                conn = _connect(self.db, "chaos-producer")
                            applied = read_offsets_conn(
                                conn, self.group, self.topic)
                            last_change = time.monotonic()
                        except PG_GONE:
                            if conn is not None:
                                conn.close()
                            conn = None
                    assert not self._errors, self._errors[:5]
            assert self.produced == self.total, (
                f"{self.produced} records in {self.path}, {self.total} expected")
            left = producer.flush(300)
            assert left == 0, f"{left} records not delivered after 300 s"
            assert not self._errors, self._errors[:5]
            assert self.delivered == self.total, (
                f"{self.delivered} of {self.total} records delivered")
        finally:
            if conn is not None:
                conn.close()
            self.done.set()


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class RssSampler(Background):
    """Samples the resident memory of the current ces2pg every interval
    seconds: samples [(seconds since start, ces2pg instance, pid, KiB)]."""

    def __init__(self, current, interval=RSS_INTERVAL):
        super().__init__("rss-sampler")
        self.current, self.interval = current, interval  # current(): (n, pid)
        self.samples = []
        self.start_time = time.monotonic()

    def run(self):
        while not self._stop.wait(self.interval):
            n, pid = self.current()
            kib = rss_kib(pid) if pid else None
            if kib is not None:
                self.samples.append((time.monotonic() - self.start_time, n, pid, kib))

    def table(self):
        return "\n".join(f"  {t:7.1f}s  ces2pg #{n} (pid {pid})  {kib / 1024:8.1f} MiB"
                         for t, n, pid, kib in self.samples)

    def verdict(self, margin=0.05, floor_kib=3072, until=None):
        """Whether memory kept growing: the samples of the longest-lived
        ces2pg (taken until `until`, seconds), in thirds by time. The first
        third is the warm-up (buffers, caches and librdkafka's queues filling
        up to their bounds); memory keeps growing when the peak of the last
        third is above the peak of the second by more than margin (5%) of
        it, or floor_kib (3 MiB), whichever is more. Returns (ok, text)."""
        by_instance = {}
        for s in self.samples:
            if until is None or s[0] <= until:
                by_instance.setdefault(s[1], []).append(s)
        if not by_instance:
            return False, "no RSS sample"
        samples = max(by_instance.values(), key=len)
        if len(samples) < 9:
            return False, (f"only {len(samples)} samples of one ces2pg "
                           "(at least 9 are needed: soak for 2 minutes or more)")
        t0, t1 = samples[0][0], samples[-1][0]
        third = (t1 - t0) / 3
        second = [kib for t, _, _, kib in samples if t0 + third <= t < t0 + 2 * third]
        last = [kib for t, _, _, kib in samples if t >= t0 + 2 * third]
        peak2, peak3 = max(second), max(last)
        allowed = peak2 + max(peak2 * margin, floor_kib)
        ok = peak3 <= allowed
        return ok, (f"RSS of ces2pg #{samples[0][1]} from {t0:.0f} s to {t1:.0f} s, "
                    f"{len(samples)} samples: peak of the first third "
                    f"{max(kib for t, _, _, kib in samples if t < t0 + third) / 1024:.1f} MiB, "
                    f"of the second "
                    f"{peak2 / 1024:.1f} MiB, of the last {peak3 / 1024:.1f} MiB "
                    f"(allowed {allowed / 1024:.1f} MiB): "
                    + ("stable" if ok else "KEEPS GROWING"))


# --------------------------------------------------------------------------
# The brokers
# --------------------------------------------------------------------------


class MockTarget:
    """librdkafka's mock cluster (3 brokers) with its control channel."""

    name = "mock"
    kinds = KINDS
    brokers = MOCK_BROKERS
    # Offsets committed to Kafka every second (librdkafka's default is 5 s): the 3 s of an
    # OffsetCommit fault then always meet commits.
    properties = DEFAULT_KAFKA_PROPERTIES + ("reconnect.backoff.max.ms=1000",
                                                     "auto.commit.interval.ms=1000")
    max_backlog = MOCK_BACKLOG

    def __init__(self, broker, topic):
        self.broker, self.topic = broker, topic

    def client_config(self):
        return {"bootstrap.servers": self.broker.bootstrap}

    def make_producer(self):
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.broker.bootstrap,
                         "enable.idempotence": True, "linger.ms": 5,
                         "log_level": 0,  # outages are expected: no noise
                         # small message sets: the mock trims whole sets
                         "batch.size": 256 * 1024,
                         "reconnect.backoff.max.ms": 1000})

    def daemon_args(self):
        return {"broker": self.broker, "properties": self.properties}

    def broker_down(self, fault):
        b = fault.params["broker"]
        self.broker.command(f"down {b}")
        try:
            time.sleep(fault.params["down_s"])
        finally:
            self.broker.command(f"up {b}")

    def request_errors(self, fault):
        api, count, error = (fault.params[k] for k in ("api", "count", "error"))
        self.broker.command(f"errors {api} {count} {error}")
        if api == "JoinGroup":
            self.broker.command("errors Heartbeat 1 REBALANCE_IN_PROGRESS")
        try:
            time.sleep(3.0)
        finally:
            # Nothing of this fault lingers into the next one.
            self.broker.command(f"clear {api}")
            if api == "JoinGroup":
                self.broker.command("clear Heartbeat")

    def alive(self):
        assert self.broker.proc.poll() is None, (
            f"ces-mock-broker died (exit {self.broker.proc.returncode})")


class RealTarget:
    """Apache Kafka 4.1 (tests/harness/kafka/kafka-broker), ces2pg in Event Hubs mode
    on its SASL_SSL listener."""

    name = "real"
    kinds = tuple(k for k in KINDS if k != "request_errors")
    brokers = 1
    properties = DAEMON_PROPERTIES + ("reconnect.backoff.max.ms=1000",)
    max_backlog = None  # a real broker keeps everything

    def __init__(self, kafka, topic, tmp_path):
        self.kafka, self.topic, self.tmp_path = kafka, topic, tmp_path

    def client_config(self):
        return self.kafka.plaintext_config()

    def make_producer(self):
        return self.kafka.producer(**{"reconnect.backoff.max.ms": 1000,
                                      "log_level": 0})

    def daemon_args(self):
        return {"broker": self.kafka.sasl_ssl, "properties": self.properties,
                "kafka_extra": eventhubs_kafka_lines(
                    self.kafka, tmp_path=self.tmp_path)}

    def broker_down(self, fault):
        stopped = self.kafka.stop_process()
        time.sleep(fault.params["down_s"])
        started = self.kafka.start_again()
        fault.notes.append(f"Kafka stopped in {stopped:.1f}s, answering "
                           f"{started:.1f}s after its start")

    def request_errors(self, fault):
        raise AssertionError("request errors are injected on the mock only")

    def alive(self):
        self.kafka._check_running()


# --------------------------------------------------------------------------
# A run
# --------------------------------------------------------------------------


class Chaos:
    """One run: the stream, ces2pg, the faults, the checks."""

    def __init__(self, *, target, pg, db, tmp_path, start_daemon, seed,
                 faults, soak_minutes=0.0, profile=None):
        self.target, self.pg, self.db, self.tmp_path = target, pg, db, tmp_path
        self.start_daemon_fn = start_daemon  # (**make_config kwargs) -> Daemon
        self.seed, self.fault_count, self.soak = seed, faults, soak_minutes
        self.topic = target.topic
        self.profile_name, self.profile = choose_profile(seed, profile)
        self.rules = self.profile.get("rules", False)
        self.kinds = tuple(k for k in target.kinds
                           if not (soak_minutes and k in RESTARTS))
        self.daemon = None
        self.standby = None  # transaction order has one writer: a warm standby beside it
        self.instances = 0
        self.done = []  # faults done
        self.t0 = None
        self.daemons = []

    # -- reporting ---------------------------------------------------------

    def elapsed(self):
        return time.monotonic() - self.t0

    def note(self, text):
        line = f"[{self.elapsed():7.1f}s] {text}"
        log(line)

    def replay_hint(self):
        extra = f" --soak {self.soak:g}" if self.soak else f" --faults {self.fault_count}"
        if self.profile_name != DEFAULT_PROFILE:
            extra += f" --profile {self.profile_name}"
        return (f"seed {self.seed}: replay with scripts/chaos{extra} --seed "
                f"{self.seed}" + (" --real-broker" if self.target.name == "real" else ""))

    def fail(self, text):
        raise AssertionError(f"{text}\n{self.replay_hint()}\nfaults so far:\n"
                             + "\n".join(self.fault_lines()))

    def fault_lines(self):
        lines = []
        for f in self.done:
            timing = ""
            if f.started is not None:
                timing = f" at {f.started:.1f}s"
            if f.took is not None:
                timing += f", {f.took:.1f}s"
            if f.recovered is not None:
                timing += f", next commit {f.recovered:.1f}s after"
            lines.append(f"  {f.describe()}{timing}"
                         + (f": {'; '.join(f.notes)}" if f.notes else ""))
        return lines

    # -- ces2pg ------------------------------------------------------------

    @staticmethod
    def role(d):
        """What an instance says it is last: "writer", "standby", or None (nothing yet)."""
        log = d.log()
        writer = log.rfind("writer of group '")
        standby = max(log.rfind("standby for group"), log.rfind("stepped down"))
        if writer < 0 and standby < 0:
            return None
        return "writer" if writer > standby else "standby"

    def start_standby(self):
        """A second instance of the same configuration: a standby while the writer lives. Just
        after a start either may have got the role first: the one that says it stands by is
        the standby."""
        other = self.daemon
        self.start_daemon()
        new = self.daemon
        wait_until(lambda: self.check_threads() or self.role(new) is not None, 60,
                   interval=0.05, message="the new instance saying whether it writes")
        self.standby, self.daemon = (new, other) if self.role(new) == "standby" else (other, new)

    def writer_first(self):
        """Other faults (a PostgreSQL crash ends every session) may have moved the role: the
        instance that writes now is the one a kill or stop hits."""
        if self.standby is not None and self.role(self.standby) == "writer" and \
                self.role(self.daemon) != "writer":
            self.daemon, self.standby = self.standby, self.daemon

    def promote(self, fault):
        """The writer is gone: the standby takes over (the writer role is in its log last), and a
        new standby starts beside it."""
        wait_until(lambda: self.check_threads() or self.role(self.standby) == "writer", 60,
                   interval=0.05, message="the standby taking over")
        self.daemon = self.standby
        fault.notes.append(f"the standby (ces2pg #{self.daemon.number}) writes")
        self.start_standby()
        fault.notes.append(f"ces2pg #{self.standby.number} stands by")

    def start_daemon(self):
        self.instances += 1
        kw = dict(self.target.daemon_args())
        self.daemon = self.start_daemon_fn(
            group=GROUP, topics=(self.topic,),
            conninfo=f"{self.db.conninfo} application_name={APP_NAME}",
            batch_max_events=self.profile["batch_max_events"], batch_max_ms=50,
            log_level=None, http_listen="", decode_threads=2,
            apply_extra=['ordering = "transaction";',
                         f"reorder_window_ms = {WINDOW_MS};",
                         f"reorder_window_max_ms = {WINDOW_MAX_MS};"],
            extra_config='log = { level = "info"; progress_interval = 5; };'
            + ("\n" + RULES_CONFIG if self.rules else ""),
            **kw)
        self.daemon.number = self.instances
        self.daemons.append(self.daemon)
        return self.daemon

    def current(self):
        d = self.daemon
        return (self.instances, d.proc.pid if d is not None and d.alive() else None)

    # -- the run -----------------------------------------------------------

    def prepare(self):
        """Generates the stream; returns the expectation."""
        if self.soak:
            rate = SOAK_RATE
            seconds = self.soak * 60
        else:
            rate = RATE
            # about 7 s a fault on the mock (a pause, the fault, ces2pg's next
            # commit), 9 on Apache Kafka; the rate adapts as faults go
            per_fault = 7.0 if self.target.name == "mock" else 9.0
            seconds = 5 + per_fault * self.fault_count
        self.rate = rate
        events = max(int(rate * seconds), 4 * ACCOUNTS)
        stream_seed = random.Random(f"ces2pg-chaos:{self.seed}:stream").randrange(1, 2**31)
        args = ["--bank-accounts", str(ACCOUNTS), "--pk-changes",
                "--reuse-deleted-keys", "--resend", str(RESEND), "--format", "mixed",
                "--txn-size", self.profile["txn_size"]]
        if self.soak:
            args += ["--mix", "40,45,15"]  # fewer keys: the model stays small
        started = time.monotonic()
        expect = generate(self.tmp_path, seed=stream_seed, events=events,
                          extra_args=args, timeout=3600)
        self.expect = expect
        self.records = expect["records"]
        self.bank_total = sum(decimal.Decimal(r["balance"])
                              for name in ("dbo.accountsa", "dbo.accountsb")
                              for r in expect["tables"][name]["rows"])
        log(f"stream: ces-gen --seed {stream_seed} --events {events} "
            f"{' '.join(args)}: {self.records} records "
            f"({Path(expect['_out']).stat().st_size / 2**20:.0f} MiB) in "
            f"{time.monotonic() - started:.1f}s; {PARTITIONS} partitions "
            f"(Column scheme), {rate} records/s")
        return expect

    def run(self):
        """The whole run. Returns the report (text)."""
        log(f"chaos on the {self.target.name} broker: seed {self.seed}, "
            + (f"soak {self.soak:g} min" if self.soak else f"{self.fault_count} faults")
            + f", profile {self.profile_name} ({self.profile}), kinds "
            + ", ".join(self.kinds))
        plan = plan_faults(self.seed, self.kinds, self.target.brokers)
        if not self.soak:
            upcoming = [next(plan) for _ in range(self.fault_count)]
            log("faults: " + ", ".join(f.describe() for f in upcoming))
            plan = iter(upcoming)
        self.prepare()
        # A crash of PostgreSQL must not lose what it acknowledged: the test
        # server runs with synchronous_commit = off, which lets an immediate
        # stop lose the last commits (rows and positions alike), a loss no
        # client can see or undo. WAL written at COMMIT survives a crash of the
        # server's processes even with fsync = off.
        self.db.query(f'ALTER DATABASE "{self.db.name}" SET synchronous_commit = on')
        install_audit(self.db)
        producer = StreamProducer(
            self.target.make_producer, self.topic, self.expect["_out"], PARTITIONS,
            self.records, self.rate, db=self.db, group=GROUP,
            max_backlog=self.target.max_backlog)
        watcher = OffsetWatcher(self.db, GROUP, self.topic)
        reader = BankReader(self.db, ACCOUNTS, self.bank_total,
                            deleted_column=DELETED_COLUMN if self.rules else None)
        sampler = RssSampler(self.current)
        self.faults_end = None
        self.threads = [producer, watcher, reader, sampler]
        self.producer, self.watcher, self.reader, self.sampler = self.threads
        self.t0 = sampler.start_time = time.monotonic()
        try:
            watcher.start()
            producer.start()
            # The stream first: ces2pg must not find idle partitions that wake
            # up later (an idle partition counts as complete by design).
            wait_until(lambda: self.check_threads() or producer.produced >= self.rate,
                       60, message="the first second of the stream")
            self.start_daemon()
            reader.start()
            sampler.start()
            self.note(f"ces2pg #{self.instances} started")
            self.start_standby()
            self.note(f"ces2pg #{self.instances} stands by")
            self.wait_progress(0, "ces2pg's first commit", timeout=120)
            if self.soak:
                deadline = self.t0 + self.soak * 60
                for fault in plan:
                    if producer.done.is_set() or time.monotonic() >= deadline:
                        break
                    self.one_fault(fault)
            else:
                per_fault = []
                for fault in plan:
                    started = time.monotonic()
                    left = self.fault_count - len(self.done)
                    # Pace the rest of the stream to last a little longer than
                    # the faults, so that the last one too hits a flowing stream.
                    if per_fault:
                        mean = sum(per_fault) / len(per_fault)
                        producer.rate = min(3 * self.rate, max(
                            self.rate / 3, producer.left() / (left * mean + 10)))
                    self.one_fault(fault)
                    per_fault.append(time.monotonic() - started)
                    if producer.done.is_set() and len(self.done) < self.fault_count:
                        self.note("the stream is all produced; the remaining faults "
                                  "hit ces2pg while it applies the rest or idles")
            self.faults_end = self.elapsed()
            if not self.soak:
                producer.rate = None  # the rest as fast as the broker allows
            self.note(f"{len(self.done)} faults done; producing the rest of the stream "
                      f"({producer.left()} records)")
            self.finish()
        except Exception as e:
            if "replay with scripts/chaos" in str(e):
                raise
            # Whatever failed, the report says how to replay the run.
            raise AssertionError(
                f"{type(e).__name__}: {e}\n{self.replay_hint()}\nfaults so far:\n"
                + "\n".join(self.fault_lines())) from e
        finally:
            for t in self.threads:
                t._stop.set()
            if producer._thread.is_alive():
                producer._thread.join(30)
        return self.report()

    def check_threads(self):
        for t in self.threads:
            if t.failed() is not None:
                self.fail(f"{t._thread.name} failed: {t.failed()!r}")
        return False

    def check_alive(self):
        self.check_threads()
        self.target.alive()
        for d in (self.daemon, self.standby):
            rc = d.proc.poll() if d is not None else None
            if rc is not None:
                self.fail(f"ces2pg #{d.number} exited by itself with status "
                          f"{rc}; log tail:\n{tail_text(d.log_path)[-4000:]}")

    def sleep(self, seconds):
        end = time.monotonic() + seconds
        while True:
            self.check_alive()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))

    def wait_progress(self, base, what, timeout=120):
        """Until ces2pg commits past the offsets' total base (or has applied
        everything there is)."""
        started = time.monotonic()

        def progressed():
            self.check_alive()
            total = self.watcher.total()
            if total > base:
                return True
            return (self.producer.done.is_set()
                    and total == self.producer.delivered == self.records)

        wait_until(progressed, timeout, interval=0.05,
                   message=lambda: self.fail(
                       f"{what}: ces2pg committed nothing for {timeout}s "
                       f"(offsets {self.watcher.snapshot()}, "
                       f"{self.producer.produced} records produced); "
                       f"log tail:\n"
                       f"{tail_text(self.daemon.log_path)[-3000:]}"))
        return time.monotonic() - started

    def offsets_now(self):
        """The sum of the stored offsets, read now (the watcher's may be 50 ms
        old)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                with contextlib.closing(_connect(self.db, "chaos-faults")) as conn:
                    return sum(read_offsets_conn(conn, GROUP, self.topic).values())
            except PG_GONE:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def one_fault(self, fault):
        self.sleep(fault.gap)
        fault.started = self.elapsed()
        self.note(f"fault {fault.describe()}")
        started = time.monotonic()
        getattr(self, "fault_" + fault.kind)(fault)
        fault.took = time.monotonic() - started
        self.done.append(fault)
        # Survived: ces2pg (the same or a new one) commits again.
        fault.recovered = self.wait_progress(
            self.offsets_now(), f"after fault {fault.describe()}",
            timeout=180 if self.target.name == "real" else 120)
        self.note(f"  survived: {fault.took:.1f}s, next commit {fault.recovered:.1f}s "
                  "later" + (f"; {'; '.join(fault.notes)}" if fault.notes else ""))

    # -- the faults --------------------------------------------------------

    def fault_kill9(self, fault):
        self.writer_first()
        rc = self.daemon.kill9()
        if rc != -signal.SIGKILL:
            self.fail(f"ces2pg #{self.instances} had exited with {rc} before kill -9")
        self.promote(fault)

    def fault_sigterm(self, fault):
        self.writer_first()
        # In the middle of a batch: ces2pg's session has written in an open
        # transaction (a few seconds at most).
        mid = None
        with contextlib.closing(_connect(self.db, "chaos-faults")) as conn, \
                conn.cursor() as cur:
            deadline = time.monotonic() + 5
            while mid is None and time.monotonic() < deadline:
                cur.execute("SELECT backend_xid::text, state FROM pg_stat_activity "
                            "WHERE application_name = %s AND backend_xid IS NOT NULL",
                            (APP_NAME,))
                row = cur.fetchone()
                if row:
                    mid = row
                else:
                    time.sleep(0.002)
        started = time.monotonic()
        n = self.instances
        rc = self.daemon.terminate(timeout=90)
        fault.notes.append(
            (f"mid-batch (xid {mid[0]}, {mid[1]})" if mid else "no batch open")
            + f", exit {rc} after {time.monotonic() - started:.1f}s")
        if rc != 0:
            self.fail(f"ces2pg #{n} exited with {rc} after SIGTERM (0 expected); "
                      f"log tail:\n{tail_text(self.daemon.log_path)[-4000:]}")
        self.promote(fault)

    def fault_pg_crash(self, fault):
        self.pg.restart(fault.params["down_s"], mode="immediate")

    def fault_broker_down(self, fault):
        self.target.broker_down(fault)

    def fault_request_errors(self, fault):
        self.target.request_errors(fault)

    def fault_pg_lock(self, fault):
        table, mode = fault.params["table"], fault.params["mode"]
        if self.rules and fault.number % 2:
            # Every other lock on the table's history, written in the same
            # transactions (one table a lock: locking both could deadlock with
            # ces2pg, which would abort one of us).
            table = history_table(table)
        conn = psycopg2.connect(self.db.conninfo, application_name="chaos-lock")
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
                if not cur.fetchone()[0]:
                    fault.notes.append(f"{table} does not exist yet: nothing locked")
                    return
                cur.execute("SET lock_timeout = '20s'")
                cur.execute(f"LOCK TABLE {table} IN {mode} MODE")
                if table != fault.params["table"]:
                    fault.notes.append(f"{table} locked")
            blocked = False
            with contextlib.closing(_connect(self.db, "chaos-faults")) as watch, \
                    watch.cursor() as wc:
                end = time.monotonic() + fault.params["hold_s"]
                while time.monotonic() < end:
                    self.check_alive()
                    wc.execute("SELECT count(*) FROM pg_stat_activity WHERE "
                               "application_name = %s AND wait_event_type = 'Lock'",
                               (APP_NAME,))
                    blocked = blocked or wc.fetchone()[0] > 0
                    time.sleep(0.05)
            fault.notes.append("ces2pg waited on the lock" if blocked
                               else "ces2pg did not wait on the lock")
        finally:
            conn.close()  # rolls back: the lock goes

    def fault_sighup(self, fault):
        path = self.daemon.config_path
        text = path.read_text()
        m = re.search(r"progress_interval = (\d+);", text)
        interval = 6 if m.group(1) == "5" else 5
        path.write_text(text.replace(m.group(0), f"progress_interval = {interval};"))
        before = self.daemon.log().count("configuration reloaded")
        self.daemon.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: self.check_alive() or
            self.daemon.log().count("configuration reloaded") > before,
            30, interval=0.05,
            message=lambda: self.fail("ces2pg did not log 'configuration reloaded' "
                                      "within 30s of SIGHUP"))
        fault.notes.append(f"reloaded (log.progress_interval = {interval})")

    # -- the end -----------------------------------------------------------

    def finish(self):
        producer = self.producer
        wait_until(lambda: self.check_alive() or producer.done.is_set(),
                   600, interval=0.1, message="the producer to finish")
        self.check_threads()
        counts = dict(producer.counts)
        self.note(f"stream produced: {sum(counts.values())} records, per partition "
                  f"{dict(sorted(counts.items()))}")
        # What ces2pg must reach is the end of each partition's log, not the count of records
        # delivered: after a broker came back the mock can hold a produce the producer retried
        # twice (CI, seed 712086849: a log of 11,894 records for 11,892 delivered, no delivery
        # error), and ces2pg reads such copies like any resent record.
        ends = {p: high for p, (_, high) in watermarks(
            self.target.client_config(), self.target.topic, sorted(counts)).items()}
        short = {p: (ends[p], n) for p, n in counts.items() if ends[p] < n}
        if short:
            self.fail(f"the broker's log holds fewer records than were delivered "
                      f"(partition: (log end, delivered)): {short}")
        twice = {p: ends[p] - n for p, n in counts.items() if ends[p] > n}
        if twice:
            self.note(f"the broker's log holds {sum(twice.values())} record(s) twice (a "
                      f"produce retried after an outage), per partition {twice}")
        # The last transactions wait for the window once every partition is quiet.
        deadline = time.monotonic() + WINDOW_MAX_MS / 1000 + 240
        wait_until(
            lambda: self.check_alive() or self.watcher.snapshot() ==
            {p: n for p, n in ends.items() if n}, deadline - time.monotonic(),
            interval=0.1, message=lambda: self.fail(
                f"ces2pg did not apply the whole stream: offsets "
                f"{self.watcher.snapshot()}, log ends {ends}, delivered {counts}"))
        self.note("every record applied")
        for t in self.threads:
            t.stop()  # raises what a thread raised
        self.final_offsets = self.watcher.snapshot()
        rc = self.daemon.terminate(timeout=90)
        if rc != 0:
            self.fail(f"the last ces2pg exited with {rc} after SIGTERM (0 expected)")
        rc = self.standby.terminate(timeout=90)
        if rc != 0:
            self.fail(f"the last standby exited with {rc} after SIGTERM (0 expected)")

    def report(self):
        """Checks everything; returns the report or fails with it."""
        problems = []
        rules_summary = None
        if self.rules:
            rules_summary, rules_problems = check_rules(self.db, self.expect,
                                                        self.expect["_out"])
            problems += [f"rules: {p}" for p in rules_problems]
        else:
            try:
                assert_tables_match(self.db, self.expect)
            except AssertionError as e:
                problems.append(f"rows differ from the model: {e}")
        letters = dead_letters(self.db)
        if letters:
            problems.append(f"{len(letters)} dead letter(s): "
                            + repr([(d['partition'], d['offset'], d['reason'])
                                    for d in letters[:5]]))
        reader = self.reader
        if reader.bad:
            problems.append(f"a reader saw a source transaction in part: {reader.summary()}")
        if reader.full_reads < 10 or len(reader.states) < 3:
            problems.append(f"the reader hardly saw the bank: {reader.summary()}")
        audit_summary, audit_problems = check_audit(
            self.db, TABLES + tuple(history_table(t) for t in TABLES) if self.rules
            else TABLES)
        problems += audit_problems
        if self.watcher.polls < 100:
            problems.append(f"ces2pg.offsets polled only {self.watcher.polls} times")
        torn_logged = lost_logged = 0
        window_grew = []
        for n, d in enumerate(self.daemons, 1):
            text = d.log()
            for bad in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                        "runtime error:"):
                if bad in text:
                    problems.append(f"ces2pg #{n}'s log holds a sanitizer report "
                                    f"({bad!r}): {d.log_path}")
            lost_logged += text.count("events may have been lost")
            torn_logged += text.count("torn transaction:")
            window_grew += re.findall(r"reorder window: \d+ ms -> \d+ ms, to wait", text)
        if lost_logged:
            problems.append(f"ces2pg logged 'events may have been lost' {lost_logged} "
                            "time(s): a position was gone from the broker")
        by_kind = {}
        for f in self.done:
            by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
        lines = [
            f"chaos on the {self.target.name} broker, {self.replay_hint()}",
            f"profile {self.profile_name}: {self.profile}; window {WINDOW_MS} ms"
            + (f"; {RULES_CONFIG}" if self.rules else ""),
            f"faults survived: {len(self.done)} ("
            + ", ".join(f"{k} {by_kind[k]}" for k in self.kinds if k in by_kind) + ")",
            *self.fault_lines(),
            f"ces2pg instances: {self.instances}; run {self.elapsed():.0f}s"
            + (f"; the producer waited {self.producer.held_back:.1f}s for ces2pg to apply "
               "(the mock's retention)" if self.target.max_backlog else ""),
            f"offsets: {self.watcher.polls} polls, never backwards; final "
            f"{dict(sorted(self.final_offsets.items()))}",
            reader.summary(),
            audit_summary,
            *([rules_summary] if rules_summary else []),
            f"ces2pg logs: {torn_logged} torn-transaction warnings (resent older "
            f"events count as late), {len(window_grew)} window growths",
            "RSS samples:", self.sampler.table() or "  (none)",
        ]
        if window_grew:
            # A late event that a longer window would have held: lag, not a resend.
            lines.append(f"  window growths: {window_grew[:3]}")
        if self.soak:
            # Judged while the paced stream flowed and faults came: not the end,
            # when ces2pg holds the last transactions for the window.
            ok, text = self.sampler.verdict(until=self.faults_end)
            lines.append(text)
            if not ok:
                problems.append(text)
        report = "\n".join(lines)
        log(report)
        if problems:
            raise AssertionError("chaos run failed:\n- " + "\n- ".join(problems)
                                 + "\n" + report)
        return report
