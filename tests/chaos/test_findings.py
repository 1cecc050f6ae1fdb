"""ces2pg bugs the chaos runs found, each reduced to a deterministic case.

Each test asserts what ces2pg promises; each was marked xfail(strict=True)
while its bug was there, and fails again should the bug come back. A new
finding goes here the same way: its case first, marked xfail(strict=True)
with the run that found it, the mark removed by the fix.
"""

import contextlib
import re

import psycopg2

from chaos import APP_NAME, check_audit, install_audit
from harness.common import wait_until
from harness.events import generate, read_records
from harness.progress import dead_letters, read_offsets, wait_applied
from harness.tables import assert_tables_match

GROUP = "ces2pg-findings"
TOPIC = "ces"


def bank_records(tmp_path, seed, accounts, transfers_per_txn, transactions):
    """The bank stream split by table: (AccountsA's records, AccountsB's,
    expectation); the i-th records of both lists belong to one source
    transaction (every event of it on one table is in one list)."""
    expect = generate(
        tmp_path, seed=seed,
        events=2 * accounts + 2 * transfers_per_txn * transactions,
        extra_args=["--workload", "bank", "--accounts", str(accounts),
                    "--transfers-per-txn", str(transfers_per_txn)])
    a, b = [], []
    for rec in read_records(expect["_out"]):
        (a if b'\\"tbl\\":\\"AccountsA\\"' in rec else b).append(rec)
    return a, b, expect


def test_rebalance_while_streaming_commits_a_part(tmp_path, db, broker, ces2pg):
    """A source transaction of 40 events (20 transfers between AccountsA on
    partition 0 and AccountsB on partition 1) with batches of 10 events:
    ces2pg streams it. While its first half is sent, a Heartbeat answered
    ILLEGAL_GENERATION makes the consumer lose its assignment (with the eager
    and the cooperative protocol alike) and join again; then the second half
    arrives. The whole transaction must be committed by one PostgreSQL
    transaction (chaos.audit), whatever happened in between."""
    accounts, per_txn = 10, 20
    a, b, expect = bank_records(tmp_path, 4711, accounts, per_txn, 3)
    assert len(a) == len(b) == accounts + 3 * per_txn
    mb = broker(partitions=2, control=True)
    install_audit(db)
    # The first big transaction: records accounts .. accounts + per_txn of
    # each list. Its first half, and everything before it, first.
    half = accounts + per_txn // 2
    mb.produce(TOPIC, a[:half], partition=0)
    mb.produce(TOPIC, b[:half], partition=1)
    daemon = ces2pg(db, mb, group=GROUP, batch_max_events=10,
                    conninfo=f"{db.conninfo} application_name={APP_NAME}",
                    apply_extra=['ordering = "transaction";',
                                 "reorder_window_ms = 20000;",
                                 "reorder_window_max_ms = 40000;"])
    daemon.wait_log(r"is larger than a batch .*: streaming it", timeout=60)
    mb.command("errors Heartbeat 1 ILLEGAL_GENERATION")
    daemon.wait_log(r"revoked \d+ partition", timeout=30)
    assigned = len(re.findall(r"assigned \d+ partition", daemon.log()))
    wait_until(
        lambda: len(re.findall(r"assigned \d+ partition", daemon.log())) > assigned,
        30, message="the partitions assigned again")
    mb.produce(TOPIC, a[half:], partition=0)
    mb.produce(TOPIC, b[half:], partition=1)
    wait_applied(db, GROUP, {0: len(a), 1: len(b)}, timeout=90,
                 daemons=[daemon])
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    summary, problems = check_audit(db, tables=("dbo.accountsa", "dbo.accountsb"))
    print(summary)
    assert problems == [], "\n".join(problems) + "\nces2pg's log:\n" + "\n".join(
        line for line in daemon.log().splitlines()
        if re.search(r"stream|revoked|assigned|committed|window", line))
    assert daemon.terminate() == 0


def _set_wal_writer_delay(pg, value):
    pg.sql(f"ALTER SYSTEM SET wal_writer_delay = '{value}'" if value
           else "ALTER SYSTEM RESET wal_writer_delay")
    pg.sql("SELECT pg_reload_conf()")


def test_commits_lost_by_postgresql_are_applied_again(tmp_path, pg, db, broker,
                                                      ces2pg):
    """ces2pg's sessions commit asynchronously (synchronous_commit = off) and
    the WAL writer waits 10 s between writes of a partial page, so a crash of
    PostgreSQL right after a batch has committed loses that batch, its
    positions with it (everything before is made durable by a synchronous
    commit of the test's own). ces2pg then finds positions older than its own
    (the fence) and must read from there again and apply what PostgreSQL
    lost."""
    expect = generate(tmp_path, seed=8080, events=600,
                      extra_args=["--txn-size", "1-3"])
    records = read_records(expect["_out"])
    mb = broker(partitions=1)
    db.query(f'ALTER DATABASE "{db.name}" SET synchronous_commit = off')
    db.query("CREATE TABLE public.wal_flush (at timestamptz)")
    _set_wal_writer_delay(pg, "10s")

    def durable():
        # A synchronous commit writes the WAL before it: every commit so far.
        with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
            cur.execute("SET synchronous_commit = on")
            cur.execute("INSERT INTO public.wal_flush VALUES (now())")

    try:
        daemon = ces2pg(db, mb, group=GROUP,
                        apply_extra=['ordering = "transaction";'])
        sent = 100
        mb.produce(TOPIC, records[:sent], partition=0)
        wait_applied(db, GROUP, {0: sent}, timeout=60, daemons=[daemon])
        durable()
        lost = None
        for chunk in (50,) * 5:
            mb.produce(TOPIC, records[sent:sent + chunk], partition=0)
            sent += chunk
            wait_applied(db, GROUP, {0: sent}, timeout=60, daemons=[daemon])
            pg.restart(mode="immediate")
            (stored,) = wait_until(lambda: _stored_offset(db), 30,
                                   message="PostgreSQL back after the crash")
            if stored < sent:
                lost = (stored, sent)
                break
            durable()
        # The setup makes the loss all but certain (the WAL written every 10 s, crashes right
        # after a commit): without one the test shows nothing, which is a failure, not a skip.
        assert lost is not None, "PostgreSQL lost no commit in 5 crashes: the case is not made"
        print(f"PostgreSQL's crash lost the changes of the records {lost[0]}..{lost[1] - 1}")
        mb.produce(TOPIC, records[sent:], partition=0)
        wait_applied(db, GROUP, {0: len(records)}, timeout=90,
                     daemons=[daemon])
        try:
            assert_tables_match(db, expect)
        except AssertionError as e:
            raise AssertionError(
                f"after PostgreSQL lost the records {lost[0]}..{lost[1] - 1}: {e}\n"
                "ces2pg's log:\n" + "\n".join(
                    line for line in daemon.log().splitlines()
                    if re.search(r"going back|fence|duplicates|stopped", line)))
        assert daemon.terminate() == 0
    finally:
        _set_wal_writer_delay(pg, None)


def _stored_offset(db):
    """(the stored offset of partition 0,), or None while PostgreSQL is not
    answering yet."""
    try:
        return (read_offsets(db, GROUP, TOPIC).get(0, 0),)
    except psycopg2.OperationalError:
        return None
