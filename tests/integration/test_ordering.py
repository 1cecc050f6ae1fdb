"""Source transactions across partitions (apply.ordering), against a real
PostgreSQL and the mock broker.

- The bank invariant (ces-gen --workload bank): every source transaction
  moves money between an account of dbo.AccountsA and one of dbo.AccountsB,
  which sit on different partitions, one of them lagging; with
  apply.ordering = "transaction" a concurrent reader must never see money in
  flight and no PostgreSQL commit may hold part of a source transaction
  (checked by a trigger), also when PostgreSQL holds ces2pg's writes back
  for a while. apply.ordering = "partition" is run too, for the end state
  and for the record of how much of the time a reader sees money in flight.
- kill -9 in the middle of one large source transaction: none of it is
  visible, and a restart applies it whole.
- Two instances in one consumer group, one stopped mid-stream: the end
  state is the generator's and no stored offset ever moves backwards.
"""

import contextlib
import decimal
import re
import threading
import time

import psycopg2
import pytest
from confluent_kafka import Producer

from harness.common import Background, wait_until
from harness.events import generate, read_records, stream_partitions
from harness.mockbroker import PacedProducer, produce_placed
from harness.progress import BackgroundOffsetMonitor, OffsetMonitor, dead_letters, read_offsets, wait_applied
from harness.tables import assert_tables_match, fetch_table

GROUP = "ces2pg-test"
TOPIC = "ces"

# A daemon has its partitions once it logs where each one starts.
ASSIGNED_RE = r"ces\[{p}\]: (resuming at offset|no position stored)"


def no_dead_letters(db):
    found = [(d["partition"], d["offset"], d["logicalid"], d["reason"])
             for d in dead_letters(db)]
    assert found == [], f"dead letters: {found}"


def wait_assigned(daemon, partition, timeout=60):
    daemon.wait_log(ASSIGNED_RE.format(p=partition), timeout=timeout)


# --------------------------------------------------------------------------
# The bank invariant
# --------------------------------------------------------------------------

ACCOUNTS = 100
TRANSFERS = 2000
BANK_EVENTS = 2 * ACCOUNTS + 2 * TRANSFERS
BANK_PARTITIONS = 4  # crc32 placement: dbo.AccountsA -> 3, dbo.AccountsB -> 1
FAST_P, SLOW_P = 3, 1

# The stream, partition scheme Table: AccountsA's records on partition 3,
# all produced at once before ces2pg starts; AccountsB's on partition 1,
# produced steadily from before ces2pg starts to the end (SLOW_CHUNK records
# every LAG_INTERVAL seconds while ces2pg joins the group, then LAG_CHUNK):
# partition 1 lags behind partition 3 all the time, but is never silent.
#
# By design, a partition that is caught up (partition EOF) and has been
# silent for apply.reorder_window_ms (default 200 ms) counts as complete:
# ces2pg cannot tell a slow partition from one that has nothing more to
# say. So a lagging partition that pauses longer than the window lets the
# other partition's halves of later transactions through alone, and that is
# not a bug; nor is it one when a partition that has been idle receives the
# first records of a transaction spanning another idle partition a moment
# before that one does. Hence this layout: partition 3 has everything from
# the start, partition 1 never pauses (the longest pause of its producer is
# reported), and ces2pg never sees an idle partition become active.
SLOW_CHUNK = 1
LAG_CHUNK = 10
LAG_INTERVAL = 0.01

BANK_QUERY = """
SELECT (SELECT count(*) FROM dbo.accountsa),
       (SELECT count(*) FROM dbo.accountsb),
       (SELECT coalesce(sum(balance), 0) FROM dbo.accountsa)
       + (SELECT coalesce(sum(balance), 0) FROM dbo.accountsb),
       (SELECT coalesce(sum(transfers), 0) FROM dbo.accountsa),
       (SELECT coalesce(sum(transfers), 0) FROM dbo.accountsb)
"""

# The account tables are made before ces2pg starts (it finds them and
# leaves them alone), with a trigger that leaves, for every row ces2pg
# inserts or updates, (PostgreSQL transaction, table, operation, balance
# change, transfers change) in public.bank_audit. A PostgreSQL transaction
# that applies whole source transactions opens as many accounts in A as in
# B, moves no money in total and counts as many transfers in A as in B: this
# checks the atomicity of every commit, whatever the concurrent reader
# happened to see.
BANK_DDL = """
CREATE SCHEMA dbo;
CREATE TABLE dbo.accountsa (accountid integer PRIMARY KEY,
    owner character varying(50), balance numeric(18,2), transfers integer);
CREATE TABLE dbo.accountsb (LIKE dbo.accountsa INCLUDING ALL);
CREATE TABLE public.bank_audit (xid bigint, tbl text, op text,
                                dbalance numeric, dtransfers integer);
CREATE FUNCTION public.bank_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.bank_audit VALUES (txid_current(), TG_TABLE_NAME,
            TG_OP, NEW.balance, NEW.transfers);
    ELSE
        INSERT INTO public.bank_audit VALUES (txid_current(), TG_TABLE_NAME,
            TG_OP, NEW.balance - OLD.balance, NEW.transfers - OLD.transfers);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER bank_audit AFTER INSERT OR UPDATE ON dbo.accountsa
    FOR EACH ROW EXECUTE FUNCTION public.bank_audit();
CREATE TRIGGER bank_audit AFTER INSERT OR UPDATE ON dbo.accountsb
    FOR EACH ROW EXECUTE FUNCTION public.bank_audit();
"""

AUDIT_CHECK = """
SELECT count(*),
       count(*) FILTER (WHERE NOT whole),
       (array_agg(format('xid %s: opened %s/%s, moved %s, transfers %s/%s',
                         xid, oa, ob, moved, ta, tb) ORDER BY xid)
        FILTER (WHERE NOT whole))[1:3]
FROM (SELECT xid, oa, ob, moved, ta, tb,
             oa = ob AND moved = 0 AND ta = tb AS whole
      FROM (SELECT xid,
                   count(*) FILTER (WHERE op = 'INSERT' AND tbl = 'accountsa') AS oa,
                   count(*) FILTER (WHERE op = 'INSERT' AND tbl = 'accountsb') AS ob,
                   coalesce(sum(dbalance) FILTER (WHERE op = 'UPDATE'), 0) AS moved,
                   coalesce(sum(dtransfers) FILTER (WHERE op = 'UPDATE' AND tbl = 'accountsa'), 0) AS ta,
                   coalesce(sum(dtransfers) FILTER (WHERE op = 'UPDATE' AND tbl = 'accountsb'), 0) AS tb
            FROM public.bank_audit GROUP BY xid) AS x) AS commits
"""


def audit(db):
    """(PostgreSQL transactions that wrote accounts, how many of them hold
    part of a source transaction, a few of those)."""
    commits, partial, examples = db.query(AUDIT_CHECK)[0]
    return commits, partial, examples or []


class BankChecker(Background):
    """Reads both account tables in one REPEATABLE READ snapshot, over and
    over, in a background thread, and classifies what it saw.

    A consistent snapshot has as many accounts in A as in B (they are
    opened in pairs, one transaction each), as many transfers counted in A
    as in B (each transfer bumps one account of each), and, once every
    account exists, the constant total.
    """

    def __init__(self, db, accounts, total):
        super().__init__("bank-checker")
        self.db, self.accounts, self.total = db, accounts, total
        self.reads = 0          # snapshots
        self.full_reads = 0     # ... with every account open
        self.bad_total = 0      # full reads whose total is not the constant
        self.bad_pairs = 0      # reads with a transaction visible in part
        self.timeline = []      # (time, transfers A, transfers B) of full reads
        self.examples = []

    def run(self):
        conn = psycopg2.connect(self.db.conninfo)
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        with contextlib.closing(conn):
            while not self.stopping():
                self._read(conn)
                time.sleep(0.005)

    def _read(self, conn):
        with conn.cursor() as cur:
            cur.execute(BANK_QUERY)
            na, nb, total, ta, tb = cur.fetchone()
        conn.commit()
        self.reads += 1
        bad = []
        if na != nb or ta != tb:
            self.bad_pairs += 1
            bad.append("pair")
        if na == nb == self.accounts:
            self.full_reads += 1
            self.timeline.append((time.monotonic(), ta, tb))
            if total != self.total:
                self.bad_total += 1
                bad.append("total")
        if bad and len(self.examples) < 5:
            self.examples.append(
                f"{'+'.join(bad)}: accounts {na}/{nb}, total {total} "
                f"(constant {self.total}), transfers {ta}/{tb}")

    def states(self, start=0.0, end=float("inf")):
        """Distinct (transfers A, transfers B) seen between start and end."""
        return {(ta, tb) for t, ta, tb in self.timeline if start <= t <= end}

    def summary(self):
        return (f"{self.reads} reads, {self.full_reads} with every account; "
                f"{self.bad_total} with a wrong total, {self.bad_pairs} with "
                f"a transaction in part; e.g. {self.examples}")


class Trickle:
    """Produces records to one partition, `chunk` (changeable) at a time,
    each chunk delivered before the next, one chunk per LAG_INTERVAL.
    delivered: records delivered so far; max_gap: the longest time between
    two deliveries (seconds); end: when the last one was delivered."""

    def __init__(self, broker, topic, partition, records, chunk):
        self.topic, self.partition, self.records = topic, partition, records
        self.chunk = chunk
        self.max_gap = 0.0
        self.delivered = 0
        self.end = None
        self.started = False
        self.done = False
        self.error = None
        self.producer = Producer({"bootstrap.servers": broker.bootstrap,
                                  "enable.idempotence": True,
                                  "linger.ms": 0})
        self.producer.list_topics(topic, timeout=10)  # connected now
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"trickle-{partition}")

    def start(self):
        self.started = True
        self._thread.start()
        return self

    def finish(self, timeout=120):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "producer still running"
        if self.error is not None:
            raise self.error

    def _run(self):
        try:
            last = None
            i = 0
            while i < len(self.records):
                started = time.monotonic()
                n = self.chunk
                for rec in self.records[i:i + n]:
                    self.producer.produce(self.topic, value=rec,
                                          partition=self.partition)
                assert self.producer.flush(30) == 0, "chunk not delivered"
                i = min(i + n, len(self.records))
                self.delivered = i
                now = time.monotonic()
                if last is not None:
                    self.max_gap = max(self.max_gap, now - last)
                last = now
                time.sleep(max(0.0, LAG_INTERVAL - (now - started)))
            self.end = time.monotonic()
        except BaseException as e:  # reported by finish()
            self.error = e
        finally:
            self.done = True


def bank_total(expect):
    """sum(A) + sum(B) of the final state: the constant."""
    return sum(decimal.Decimal(r["balance"])
               for name in ("dbo.accountsa", "dbo.accountsb")
               for r in expect["tables"][name]["rows"])


def ces2pg_waits_for_lock(conn):
    with conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND wait_event_type = 'Lock'")
        return cur.fetchone()[0] > 0


def stall_apply(db, trickle, window_s, lock_conn):
    """Holds ces2pg's next write back with a SHARE lock on both account
    tables (readers go on) until it has waited on the lock for twice the
    reorder window and the lagging partition has received 3 more chunks.
    Returns how many records that partition received meanwhile."""
    def lock_both():
        # Between two of ces2pg's transactions: a LOCK that waited would take the tables one by
        # one, and deadlock with a batch holding one of them and wanting the other.
        try:
            with lock_conn.cursor() as cur:
                cur.execute("LOCK TABLE dbo.accountsa, dbo.accountsb IN SHARE MODE NOWAIT")
            return True
        except psycopg2.errors.LockNotAvailable:
            lock_conn.rollback()
            return False

    wait_until(lock_both, 30, interval=0.005, message="both account tables locked")
    try:
        with contextlib.closing(db.connect()) as conn:
            wait_until(lambda: ces2pg_waits_for_lock(conn) or trickle.done,
                       30, interval=0.005,
                       message="ces2pg blocked by the lock")
        blocked = time.monotonic()
        before = trickle.delivered
        wait_until(lambda: trickle.done or (
            time.monotonic() - blocked >= 2 * window_s
            and trickle.delivered >= before + 3 * LAG_CHUNK), 30,
            interval=0.005, message="the lagging partition to go on")
        return trickle.delivered - before
    finally:
        lock_conn.rollback()


def run_bank(tmp_path, db, broker, ces2pg, ordering, stalls=0,
             lag_chunk=LAG_CHUNK):
    """Runs the bank stream (see SLOW_CHUNK) under a concurrent reader;
    checks the end state; returns (checker, audit result, stalls done,
    summary)."""
    b = broker(partitions=BANK_PARTITIONS)
    expect = generate(tmp_path, seed=777, events=BANK_EVENTS,
                      extra_args=["--workload", "bank", "--accounts",
                                  str(ACCOUNTS)])
    records = read_records(expect["_out"])
    parts = stream_partitions(records, BANK_PARTITIONS, "table")
    assert set(parts) == {FAST_P, SLOW_P}, "the tables must share no partition"
    fast = [r for r, p in zip(records, parts) if p == FAST_P]
    slow = [r for r, p in zip(records, parts) if p == SLOW_P]
    assert len(fast) == len(slow) == ACCOUNTS + TRANSFERS
    total = bank_total(expect)
    db.query(BANK_DDL)

    checker = BankChecker(db, ACCOUNTS, total).start()
    trickle = Trickle(b, TOPIC, SLOW_P, slow, SLOW_CHUNK)
    done = 0
    try:
        produce_placed(b, TOPIC, fast, [FAST_P] * len(fast))
        trickle.start()
        daemon = ces2pg(db, b, group=GROUP,
                        apply_extra=[f'ordering = "{ordering}";'])
        for p in range(BANK_PARTITIONS):
            wait_assigned(daemon, p)
        lag_start = time.monotonic()
        trickle.chunk = lag_chunk
        if stalls:
            with contextlib.closing(psycopg2.connect(db.conninfo)) as lock:
                for _ in range(stalls):
                    if trickle.done:
                        break
                    if stall_apply(db, trickle, 0.2, lock) > 0:
                        done += 1
                    at = trickle.delivered
                    wait_until(lambda: trickle.done
                               or trickle.delivered >= at + 5 * lag_chunk,
                               30, interval=0.005)
        trickle.finish()
        wait_applied(db, GROUP, {FAST_P: len(fast), SLOW_P: len(slow)},
                     timeout=90, daemons=[daemon])
    finally:
        checker.stop()
        if trickle.started:
            trickle.finish()
    result = audit(db)
    lag_states = checker.states(lag_start, trickle.end)
    summary = (f"ordering={ordering}: reader: {checker.summary()}; commits: "
               f"{result[0]} writing accounts, {result[1]} with part of a "
               f"source transaction, e.g. {result[2]}; lagging partition: "
               f"{len(slow)} records, "
               f"longest pause {trickle.max_gap * 1000:.0f} ms, "
               f"{len(lag_states)} states seen while it lagged"
               + (f"; {done} stall(s) of the apply" if stalls else ""))
    print(summary)
    assert_tables_match(db, expect)
    no_dead_letters(db)
    assert daemon.terminate() == 0
    # The reader did look while the lagging partition was being applied.
    assert len(lag_states) >= 3, summary
    return checker, result, done, summary


@pytest.mark.parametrize("ordering", ["transaction", "partition"])
def test_bank_invariant_lagging_partition(tmp_path, db, broker, ces2pg,
                                          ordering):
    """Transaction mode: no reader ever sees money in flight, and no commit
    holds part of a source transaction. Partition mode: no assertion on
    that (the counts are printed), only the end state."""
    checker, (commits, partial, _), _, summary = run_bank(
        tmp_path, db, broker, ces2pg, ordering)
    if ordering == "transaction":
        assert partial == 0, summary
        assert checker.bad_total == 0 and checker.bad_pairs == 0, summary


def test_bank_invariant_stalled_apply(tmp_path, db, broker, ces2pg):
    """Transaction mode, and three times while the lagging partition flows a
    lock holds ces2pg's writes back for twice the reorder window. That
    partition goes on receiving records meanwhile: it is never silent, so
    when the apply resumes ces2pg must not take it for complete."""
    checker, (commits, partial, _), done, summary = run_bank(
        tmp_path, db, broker, ces2pg, "transaction", stalls=3, lag_chunk=4)
    assert done >= 1, summary
    assert partial == 0, summary
    assert checker.bad_total == 0 and checker.bad_pairs == 0, summary


# --------------------------------------------------------------------------
# kill -9 in the middle of one large source transaction
# --------------------------------------------------------------------------

BIG_ACCOUNTS = 500
BIG_TRANSFERS = 10000  # one source transaction of 20,000 events
BIG_PARTITIONS = 8  # 25 MB of records, round-robin: ~3 MB per partition


def open_write_transactions(conn):
    """Other sessions in this database with an open transaction that has
    written (it has an xid) and holds a row lock on an account table:
    ces2pg's, while it applies transfers. [(pid, xid, xact_start)]"""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT a.pid, a.backend_xid::text, a.xact_start "
            "FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
            "WHERE a.datname = current_database() "
            "AND a.pid <> pg_backend_pid() AND a.backend_xid IS NOT NULL "
            "AND l.relation IN ('dbo.accountsa'::regclass, "
            "'dbo.accountsb'::regclass) AND l.mode = 'RowExclusiveLock'")
        return cur.fetchall()


def other_backends(conn):
    with conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return cur.fetchone()[0]


def bank_rows(db):
    return {name: fetch_table(db, name, ["accountid", "owner", "balance",
                                         "transfers"], ["accountid"])
            for name in ("dbo.accountsa", "dbo.accountsb")}


@pytest.mark.parametrize("apply_mode", ["streamed", "one_batch"])
def test_kill9_inside_large_transaction(tmp_path, db, broker, ces2pg,
                                        apply_mode):
    """The stream: 500 transactions opening accounts, one transaction of
    10,000 transfers (20,000 UPD events over 8 partitions), one more
    transfer. ces2pg is killed while the big one is open in PostgreSQL;
    nothing of it may be visible, nor its positions stored. The restarted
    ces2pg applies it whole.

    streamed: batch_max_events 5000 (the default), so ces2pg may stream the
    transaction into one PostgreSQL transaction in chunks; one_batch:
    batch_max_events 50000, so it is applied as one batch. Either way the
    test watches PostgreSQL, not the log: it kills as soon as ces2pg's
    session has written in an open transaction.
    """
    b = broker(partitions=BIG_PARTITIONS)
    expect = generate(
        tmp_path, seed=9090,
        events=2 * BIG_ACCOUNTS + 2 * (BIG_TRANSFERS + 1),
        extra_args=["--workload", "bank", "--accounts", str(BIG_ACCOUNTS),
                    "--transfers-per-txn", str(BIG_TRANSFERS)])
    records = read_records(expect["_out"])
    parts = stream_partitions(records, BIG_PARTITIONS, "none")
    n_open = 2 * BIG_ACCOUNTS
    batch_max_events = 50000 if apply_mode == "one_batch" else None
    monitor = OffsetMonitor(db, GROUP)

    # 1. The accounts, applied and committed.
    before_counts = produce_placed(b, TOPIC, records[:n_open], parts[:n_open])
    first = ces2pg(db, b, group=GROUP, batch_max_events=batch_max_events)
    wait_applied(db, GROUP, before_counts, timeout=90, daemons=[first],
                 monitor=monitor)
    before = bank_rows(db)
    before_offsets = dict(monitor.last)
    assert sum(r["transfers"] != "0" for rows in before.values()
               for r in rows) == 0

    # 2. The big transaction and the one after it; kill -9 once ces2pg has
    # written part of it in an open PostgreSQL transaction.
    with contextlib.closing(db.connect()) as conn:
        assert open_write_transactions(conn) == []
        produce_placed(b, TOPIC, records[n_open:], parts[n_open:])

        def writing():
            first.check_alive()
            monitor.poll()
            return open_write_transactions(conn)

        seen = wait_until(writing, 90, interval=0.002,
                          message=lambda: f"ces2pg writing the big "
                          f"transaction (offsets {monitor.last})")
        assert first.kill9() == -9
        killed_at = time.monotonic()
        # PostgreSQL ends the session when it finds the client gone.
        wait_until(lambda: other_backends(conn) == 0, 60,
                   message="ces2pg's PostgreSQL session to end")
        print(f"{apply_mode}: killed while writing ({seen}); session gone "
              f"{time.monotonic() - killed_at:.2f}s later; streaming logged: "
              f"{'streaming it into one' in first.log()}")
    monitor.poll()
    after = bank_rows(db)
    assert monitor.last == before_offsets, (
        f"positions moved although the transaction was open when ces2pg "
        f"was killed: {before_offsets} -> {monitor.last} ("
        + ("its rows did not change" if after == before else
           "its rows changed too: PostgreSQL must have received the COMMIT "
           "before the kill, so the kill came too late for this test")
        + ")")
    changed = {name: sum(a != b for a, b in zip(before[name], after[name]))
               for name in before}
    assert after == before, (
        f"part of the killed transaction is visible: rows changed {changed}")
    no_dead_letters(db)

    # 3. Restart: everything, the big transaction whole.
    second = ces2pg(db, b, group=GROUP, batch_max_events=batch_max_events)
    counts = {p: parts.count(p) for p in set(parts)}
    wait_applied(db, GROUP, counts, timeout=120, daemons=[second],
                 monitor=monitor)
    assert_tables_match(db, expect)
    no_dead_letters(db)
    assert second.terminate() == 0


# --------------------------------------------------------------------------
# Two instances in one consumer group
# --------------------------------------------------------------------------


def assigned_counts(daemon):
    """The partition counts of the assignments a daemon logged, in order."""
    return [int(n) for n in
            re.findall(r"assigned (\d+) partition\(s\)", daemon.log())]


def test_two_instances_one_stopped_midstream(tmp_path, db, broker, ces2pg):
    """Two daemons in partition order share a group over 6 partitions (partition scheme Column:
    a row's changes stay in one partition, so each instance keeps its rows
    right without the per-row version guard). One gets SIGTERM after 30%
    of the stream; the other takes over its partitions. The end state is
    the generator's, nothing is dead-lettered, and no offset ever moves
    backwards (polled every 20 ms throughout)."""
    b = broker(partitions=6)
    expect = generate(tmp_path, seed=60606, events=20000,
                      partition_scheme="column")
    records = read_records(expect["_out"])
    total = len(records)
    parts = stream_partitions(records, 6, "column")
    assert set(parts) == set(range(6))

    watcher = BackgroundOffsetMonitor(db, GROUP).start()
    producer = None
    try:
        # Instances share partitions in partition order only: transaction order has one writer
        # (test_writer.py).
        one = ces2pg(db, b, group=GROUP, batch_max_events=200,
                     apply_extra=['ordering = "partition";'])
        two = ces2pg(db, b, group=GROUP, batch_max_events=200,
                     apply_extra=['ordering = "partition";'])
        # Both in the group, with three partitions each.
        wait_until(lambda: assigned_counts(one) and assigned_counts(two)
                   and assigned_counts(one)[-1] == 3
                   and assigned_counts(two)[-1] == 3, 60,
                   interval=0.05, message=lambda: "both daemons assigned: "
                   f"{assigned_counts(one)} / {assigned_counts(two)}")

        producer = PacedProducer(b, db, GROUP, TOPIC, records, parts).start()
        wait_until(lambda: (one.check_alive(), two.check_alive(),
                            sum(read_offsets(db, GROUP).values())
                            >= total * 3 // 10)[-1],
                   90, interval=0.02, message="30% of the stream applied")
        assert two.terminate() == 0
        m = re.search(r"stopped: \d+ records, (\d+) events applied",
                      two.log())
        assert m and int(m.group(1)) > 0, "the second daemon applied nothing"
        stopped_at = sum(read_offsets(db, GROUP).values())
        print(f"second instance stopped at {stopped_at}/{total} records")
        assert stopped_at < total * 9 // 10, "stopped too late to matter"
        # The remaining instance takes over all six partitions.
        wait_until(lambda: (one.check_alive(),
                            assigned_counts(one)[-1] == 6)[-1], 60,
                   interval=0.05, message=lambda: "all partitions on the "
                   f"first daemon: {assigned_counts(one)}")
        producer.finish(timeout=120, daemons=[one])
        wait_applied(db, GROUP, producer.counts, timeout=60, daemons=[one])
    finally:
        if producer is not None:
            producer.stop()
        watcher.stop()
    assert watcher.monitor.polls > 50
    assert_tables_match(db, expect)
    no_dead_letters(db)
    assert one.terminate() == 0
