"""ces2pg under random faults (chaos.py), on librdkafka's mock cluster and on
Apache Kafka, and a check that the checks themselves catch what they are
there to catch."""

import pytest

from chaos import (
    ACCOUNTS,
    GROUP,
    MOCK_BROKERS,
    PARTITIONS,
    BankReader,
    Chaos,
    MockTarget,
    OffsetWatcher,
    RealTarget,
    RssSampler,
    check_audit,
    install_audit,
)
from harness.common import wait_until
from harness.daemon import run_replay
from harness.events import generate
from harness.tables import assert_tables_match


def test_chaos_mock_broker(tmp_path, pg, db, broker, ces2pg, chaos_options):
    """Kill -9, PostgreSQL crashes, mock brokers down, request errors on
    Fetch, OffsetCommit, JoinGroup and Heartbeat, locks, SIGHUP and SIGTERM
    in the middle of batches."""
    b = broker(partitions=PARTITIONS, brokers=MOCK_BROKERS, control=True)
    run = Chaos(target=MockTarget(b, "ces"), pg=pg, db=db, tmp_path=tmp_path,
                start_daemon=lambda **kw: ces2pg(db, **kw),
                seed=chaos_options.seed, faults=chaos_options.faults_for(30),
                soak_minutes=chaos_options.soak, profile=chaos_options.profile)
    run.run()


def test_chaos_real_broker(tmp_path, pg, db, kafka, topic, ces2pg, chaos_options):
    """The same on Apache Kafka, ces2pg in Event Hubs mode over SASL_SSL; the
    broker outage is the broker stopped and started again on its ports."""
    target = RealTarget(kafka, topic(PARTITIONS), tmp_path)
    run = Chaos(target=target, pg=pg, db=db, tmp_path=tmp_path,
                start_daemon=lambda **kw: ces2pg(db, **kw),
                seed=chaos_options.seed, faults=chaos_options.faults_for(10),
                soak_minutes=chaos_options.soak, profile=chaos_options.profile)
    run.run()


def test_checks_catch_what_they_check(tmp_path, db):
    """Each check of a chaos run fails on what it is there to catch: a row
    changed behind ces2pg's back, a source transaction committed in two
    PostgreSQL transactions, a change written twice, a reader's snapshot
    with money in flight, an offset moving backwards."""
    install_audit(db)
    expect = generate(
        tmp_path, seed=31337, events=3000,
        extra_args=["--bank-accounts", str(ACCOUNTS), "--pk-changes",
                    "--reuse-deleted-keys", "--resend", "0.02"])
    rc, out, err = run_replay(db, expect["_out"])
    assert rc == 0, err
    assert_tables_match(db, expect)
    summary, problems = check_audit(db)
    assert problems == [], problems
    print(summary)

    # The audit: a write of an applied source transaction in another
    # PostgreSQL transaction, and a write done twice.
    db.query("INSERT INTO chaos.audit SELECT xid + 1000000, rel, key || 'x', version "
             "FROM chaos.audit ORDER BY version LIMIT 1")
    _, problems = check_audit(db)
    assert len(problems) == 1 and "more than one PostgreSQL transaction" in problems[0]
    db.query("INSERT INTO chaos.audit SELECT * FROM chaos.audit "
             "ORDER BY version DESC LIMIT 1")
    _, problems = check_audit(db)
    assert any("written more than once" in p for p in problems), problems

    # The model comparison: one value of one row (the audit records this
    # write too, which no longer matters).
    db.query("UPDATE dbo.customers SET fullname = fullname || '!' "
             "WHERE customerid = (SELECT min(customerid) FROM dbo.customers)")
    with pytest.raises(AssertionError, match="dbo.customers"):
        assert_tables_match(db, expect)

    # The reader: money that appears in one table only.
    total = db.scalar("SELECT (SELECT sum(balance) FROM dbo.accountsa) + "
                      "(SELECT sum(balance) FROM dbo.accountsb)")
    reader = BankReader(db, ACCOUNTS, total).start()
    try:
        wait_until(lambda: reader.failed() or reader.full_reads >= 5, 30)
        assert reader.bad == 0, reader.summary()
        db.query("UPDATE dbo.accountsa SET balance = balance + 1 "
                 "WHERE accountid = (SELECT min(accountid) FROM dbo.accountsa)")
        wait_until(lambda: reader.failed() or reader.bad > 0, 30,
                   message=reader.summary)
    finally:
        reader.stop()
    assert "total" in reader.examples[0], reader.examples

    # The offsets: one moving backwards.
    db.query("CREATE SCHEMA IF NOT EXISTS ces2pg")
    db.query("CREATE TABLE IF NOT EXISTS ces2pg.offsets (group_id text, topic text, "
             "partition int, next_offset bigint, "
             "PRIMARY KEY (group_id, topic, partition))")
    db.query("INSERT INTO ces2pg.offsets (group_id, topic, partition, next_offset) "
             "VALUES (%s, 'ces', 0, 10)", (GROUP,))
    watcher = OffsetWatcher(db, GROUP, "ces", interval=0.01).start()
    wait_until(lambda: watcher.failed() or watcher.polls >= 3, 30)
    db.query("UPDATE ces2pg.offsets SET next_offset = 9 WHERE group_id = %s", (GROUP,))
    wait_until(lambda: watcher.failed(), 30)
    with pytest.raises(AssertionError, match="moved backwards: 10 -> 9"):
        watcher.stop()


def test_rss_verdict():
    """The soak's memory criterion: flat or bounded memory passes, memory
    that keeps growing fails, and so do too few samples."""
    def verdict(kib_at, n=30, until=None):
        sampler = RssSampler(lambda: (1, 1))
        sampler.samples = [(10.0 * i, 1, 1, kib_at(i)) for i in range(n)]
        return sampler.verdict(until=until)

    assert verdict(lambda i: 20000 + (i % 5) * 500)[0]  # noisy but flat
    assert verdict(lambda i: 10000 + min(i, 8) * 2000)[0]  # warm-up, then flat
    ok, text = verdict(lambda i: 20000 + i * 400)  # 400 KiB more every 10 s
    assert not ok and "KEEPS GROWING" in text, text
    # A burst at the end (the drain) does not count when until excludes it.
    assert not verdict(lambda i: 20000 if i < 27 else 40000)[0]
    assert verdict(lambda i: 20000 if i < 27 else 40000, until=260)[0]
    assert not verdict(lambda i: 20000, n=5)[0]
