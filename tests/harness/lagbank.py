"""A bank whose second partition lags: the stream of `ces-gen --workload bank`
with AccountsA's events sent to one partition at a steady pace and AccountsB's
to another in bursts that lag behind, a reader checking the invariant in
snapshots, and PostgreSQL's own record of which transactions were committed in
parts (torn transactions, the reorder window).
"""

import contextlib
import threading
import time

import psycopg2

from harness.common import Background, free_port, wait_until
from harness.events import generate, read_records
from harness.metrics import http_get, parse_metrics
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match


# Every source transaction of `ces-gen --workload bank` touches one account
# of dbo.AccountsA and one of dbo.AccountsB (opening both, or moving money
# from one to the other), with one commit LSN. The harness sends AccountsA's
# events to one partition at a steady pace and AccountsB's to another in
# bursts that lag behind: a reader of PostgreSQL sees money appear or vanish
# whenever a transaction is committed in parts.

LAG_DDL = """
CREATE SCHEMA dbo;
CREATE TABLE dbo.accountsa (accountid integer PRIMARY KEY,
    owner character varying(50), balance numeric(18,2), transfers integer);
CREATE TABLE dbo.accountsb (LIKE dbo.accountsa INCLUDING ALL);
CREATE TABLE public.lag_audit (xid bigint, tbl text, version numeric);
CREATE FUNCTION public.lag_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.lag_audit VALUES (txid_current(), TG_TABLE_NAME, NEW._ces_lsn);
    RETURN NULL;
END $$;
CREATE TRIGGER lag_audit AFTER INSERT OR UPDATE ON dbo.accountsa
    FOR EACH ROW EXECUTE FUNCTION public.lag_audit();
CREATE TRIGGER lag_audit AFTER INSERT OR UPDATE ON dbo.accountsb
    FOR EACH ROW EXECUTE FUNCTION public.lag_audit();
"""

# Source transactions PostgreSQL committed in parts: the commit LSN (the
# version without its 20-digit sequence) of every change, and the
# PostgreSQL transactions its changes to A and to B went in.
LAG_TORN_QUERY = """
SELECT count(*) FROM (
    SELECT trunc(version / 1e20) AS lsn
    FROM public.lag_audit GROUP BY 1
    HAVING count(DISTINCT xid) > 1) AS torn
"""

# Changes applied more than once (a late event must be applied exactly once).
LAG_TWICE_QUERY = """
SELECT count(*) FROM (
    SELECT tbl, version FROM public.lag_audit GROUP BY 1, 2 HAVING count(*) > 1) AS twice
"""

LAG_INVARIANT_QUERY = """
SELECT (SELECT count(*) FROM dbo.accountsa) + (SELECT count(*) FROM dbo.accountsb),
       (SELECT coalesce(sum(balance), 0) FROM dbo.accountsa)
       + (SELECT coalesce(sum(balance), 0) FROM dbo.accountsb)
"""


def lag_bank_stream(tmp_path, accounts, transfers, seed=1806):
    """The bank stream: (AccountsA's records, AccountsB's records, the total
    money once every account is open, the expectation). The i-th records of
    both lists belong to the same source transaction."""
    expect = generate(tmp_path, seed=seed, events=2 * (accounts + transfers),
                      extra_args=["--workload", "bank", "--accounts",
                                  str(accounts)])
    a, b = [], []
    for rec in read_records(expect["_out"]):
        (a if b'\\"tbl\\":\\"AccountsA\\"' in rec else b).append(rec)
    assert len(a) == len(b) == accounts + transfers
    total = sum(float(r["balance"])
                for name in ("dbo.accountsa", "dbo.accountsb")
                for r in expect["tables"][name]["rows"])
    return a, b, total, expect


class LaggingProducer:
    """Produces the A records to partition pa at `rate` source transactions
    a second, and the B records to partition pb in bursts: every burst waits
    a random time in `lag` (seconds) and then sends every B record whose A
    record had been sent when the wait began. So partition pb runs `lag`
    behind pa and is silent for `lag` between bursts. make_producer() returns
    a confluent_kafka Producer."""

    def __init__(self, make_producer, topic, a, b, pa, pb, rate, lag, seed=7):
        import random

        self.topic, self.a, self.b, self.pa, self.pb = topic, a, b, pa, pb
        self.rate, self.lag = rate, lag
        self.random = random.Random(seed)
        self.sent_a = 0
        self.sent_b = 0
        self.longest_lag = 0.0
        self.sent_times = []  # when each A record was delivered
        self.errors = []
        self.producers = (make_producer(), make_producer())
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self._run_a, self._run_b)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def finish(self, timeout=180):
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), "producer still running"
        assert not self.errors, self.errors[:3]

    def _guard(self, fn):
        try:
            fn()
        except BaseException as e:  # reported by finish()
            self.errors.append(e)

    def _run_a(self):
        producer, step = self.producers[0], 0.01
        per_step = max(1, int(self.rate * step))
        while self.sent_a < len(self.a):
            started = time.monotonic()
            chunk = self.a[self.sent_a:self.sent_a + per_step]
            for rec in chunk:
                producer.produce(self.topic, value=rec, partition=self.pa)
            assert producer.flush(30) == 0, "A records not delivered"
            self.sent_times.extend([time.monotonic()] * len(chunk))
            self.sent_a += len(chunk)
            time.sleep(max(0.0, step - (time.monotonic() - started)))

    def _run_b(self):
        producer = self.producers[1]
        while self.sent_b < len(self.b):
            mark = self.sent_a
            time.sleep(self.random.uniform(*self.lag))
            if self.sent_a >= len(self.a):
                mark = len(self.a)  # the end: flush everything
            for rec in self.b[self.sent_b:mark]:
                producer.produce(self.topic, value=rec, partition=self.pb)
            assert producer.flush(30) == 0, "B records not delivered"
            if mark > self.sent_b:
                self.longest_lag = max(self.longest_lag,
                                       time.monotonic() - self.sent_times[self.sent_b])
            self.sent_b = max(self.sent_b, mark)


class InvariantReader(Background):
    """Reads the accounts' count and total money in one snapshot, as fast as
    it can; a read with every account open and another total saw a source
    transaction in part. reads: [(time, complete, consistent)]."""

    def __init__(self, db, accounts, total):
        super().__init__("invariant-reader")
        self.db, self.accounts, self.total = db, accounts, total
        self.reads = []

    def run(self):
        conn = psycopg2.connect(self.db.conninfo)
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        with contextlib.closing(conn):
            while not self.stopping():
                with conn.cursor() as cur:
                    cur.execute(LAG_INVARIANT_QUERY)
                    n, total = cur.fetchone()
                conn.commit()
                complete = n == 2 * self.accounts
                ok = not complete or abs(float(total) - self.total) < 0.005
                self.reads.append((time.monotonic(), complete, ok))

    def bad_since(self, start=0.0):
        return [t for t, complete, ok in self.reads if t >= start and not ok]

    def complete_since(self, start=0.0):
        return [t for t, complete, ok in self.reads if t >= start and complete]


def run_lagging_bank(tmp_path, db, make_producer, start_daemon, topic, group,
                     accounts, transfers, rate, lag, fast=0, slow=1):
    """Streams the bank to topic with partition `slow` lagging `lag` (seconds,
    a range) behind `fast` under a concurrent InvariantReader; start_daemon(port)
    starts ces2pg with its HTTP server on port. Checks the end state; returns
    (reader, producer, torn transactions PostgreSQL committed, the metrics at
    the end, when ces2pg started).

    The stream starts before ces2pg does, so that ces2pg finds both
    partitions busy: a partition idle for longer than the window when its
    transactions' first events arrive elsewhere counts as complete by design,
    which would tear transactions at the start whatever the lag."""
    a_recs, b_recs, total, expect = lag_bank_stream(tmp_path, accounts, transfers)
    db.query(LAG_DDL)
    producer = LaggingProducer(make_producer, topic, a_recs, b_recs, fast, slow,
                               rate=rate, lag=lag).start()
    reader = InvariantReader(db, accounts, total)
    try:
        wait_until(lambda: producer.sent_b > 0 or producer.errors, 30,
                   message=f"the first burst of partition {slow}")
        port = free_port()
        started = time.monotonic()
        daemon = start_daemon(port)
        reader.start()
        producer.finish()
        wait_applied(db, group, {fast: len(a_recs), slow: len(b_recs)},
                     timeout=120, topic=topic, daemons=[daemon])
    finally:
        producer.finish()  # again only after a failure: finishing twice is a no-op
        if reader.started():
            reader.stop()
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert db.scalar(LAG_TWICE_QUERY) == 0, "a change was applied twice"
    assert db.scalar("SELECT count(*) FROM public.lag_audit") == len(a_recs) + len(b_recs)
    torn = db.scalar(LAG_TORN_QUERY)
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, f"/metrics: {status} {body}"
    return reader, producer, torn, parse_metrics(body), started
