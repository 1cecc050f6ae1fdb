"""ces2pg under random faults (chaos.py), on librdkafka's mock cluster and on
Apache Kafka, with per-table rules (soft deletes and history tables) on the
mock, and a check that the checks themselves catch what they are there to
catch."""

import pytest

from chaos import (
    ACCOUNTS,
    DELETED_COLUMN,
    GROUP,
    MOCK_BROKERS,
    PARTITIONS,
    RULES_CONFIG,
    TABLES,
    BankReader,
    Chaos,
    MockTarget,
    OffsetWatcher,
    RealTarget,
    RssSampler,
    check_audit,
    check_rules,
    history_table,
    install_audit,
)
from harness.common import wait_until
from harness.daemon import parse_replay_summary, run_replay
from harness.events import generate
from harness.progress import dead_letters
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


# One fault of each kind (they come in rounds of every kind): a few minutes
# beside the main run.
RULES_FAULTS = 7


def test_chaos_rules_mock_broker(tmp_path, pg, db, broker, ces2pg, chaos_options):
    """The rules profile (soft deletes and a history table for every table)
    under a round of faults, the main run's seed: the live rows equal the
    model, soft-deleted rows are keys the model has not, and every change of
    the stream is in its table's history once. Runs beside the main run when
    --profile names none (--profile rules runs it as the main run, with its
    --faults); at most RULES_FAULTS faults."""
    if chaos_options.soak:
        pytest.skip("a soak is the main run alone")
    if chaos_options.profile not in (None, "random"):
        pytest.skip(f"--profile {chaos_options.profile}: test_chaos_mock_broker runs it")
    b = broker(partitions=PARTITIONS, brokers=MOCK_BROKERS, control=True)
    run = Chaos(target=MockTarget(b, "ces"), pg=pg, db=db, tmp_path=tmp_path,
                start_daemon=lambda **kw: ces2pg(db, **kw),
                seed=chaos_options.seed,
                faults=min(chaos_options.faults_for(RULES_FAULTS), RULES_FAULTS),
                profile="rules")
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


def test_rules_checks_catch_what_they_check(tmp_path, db):
    """The rules profile's checks on a stream replayed with soft deletes and
    histories (both CES generations, resends): they pass, and each fails on
    what it is there to catch: a live row marked deleted, a deleted row
    brought back, a row's version that is not its key's newest change, a
    history with a change missing, one twice, one with another operation; the
    audit covers the history tables; the reader counts live accounts only."""
    install_audit(db)
    expect = generate(
        tmp_path, seed=31337, events=3000,
        extra_args=["--bank-accounts", str(ACCOUNTS), "--pk-changes",
                    "--reuse-deleted-keys", "--resend", "0.02", "--format", "mixed"])
    rc, out, err = run_replay(db, expect["_out"], extra_config=RULES_CONFIG)
    assert rc == 0, err
    assert parse_replay_summary(out)[2] == 0 and dead_letters(db) == [], out

    def problems():
        return check_rules(db, expect, expect["_out"])[1]

    summary, found = check_rules(db, expect, expect["_out"])
    assert found == [], found
    print(summary)
    audited = TABLES + tuple(history_table(t) for t in TABLES)
    summary, found = check_audit(db, audited)
    assert found == [], found
    assert db.scalar(r"SELECT count(DISTINCT rel) FROM chaos.audit WHERE rel LIKE "
                     r"'%\_history'") == len(TABLES), "history writes audited"
    print(summary)

    live = f"{DELETED_COLUMN} IS NULL"
    # A table of the stream with a soft-deleted row (few are left: most deleted
    # keys are inserted again), a live key and a deleted key of it.
    for table, cols in (("dbo.customers", "customerid"), ("dbo.products", "productid"),
                        ("dbo.orders", "orderid, lineno")):
        gone = db.query(f"SELECT {cols} FROM {table} WHERE NOT {live} ORDER BY 1 LIMIT 1")
        if gone:
            break
    assert gone, "the stream ends with keys soft-deleted"
    key = db.query(f"SELECT {cols} FROM {table} WHERE {live} ORDER BY 1 LIMIT 1")
    key, gone = (f"({cols}) = ({', '.join(map(str, row[0]))})" for row in (key, gone))

    def tampered(sql, undo, *expected):
        db.query(sql)
        try:
            found = problems()
        finally:
            db.query(undo)
        for text in expected:
            assert any(text in p for p in found), (text, found)

    # The mirror: a live row marked, a deleted row brought back, a version.
    tampered(f"UPDATE {table} SET {DELETED_COLUMN} = now() WHERE {key}",
             f"UPDATE {table} SET {DELETED_COLUMN} = NULL WHERE {key}",
             f"{table}: ", "1 row(s) missing", "1 soft-deleted row(s) of keys the model has")
    tampered(f"UPDATE {table} SET {DELETED_COLUMN} = NULL WHERE {gone}",
             f"UPDATE {table} SET {DELETED_COLUMN} = now() WHERE {gone}",
             f"{table}: ", "1 unexpected row(s)")
    tampered(f"UPDATE {table} SET _ces_lsn = _ces_lsn - 1 WHERE {key}",
             f"UPDATE {table} SET _ces_lsn = _ces_lsn + 1 WHERE {key}",
             f"{table}: 1 row(s) whose version is not the newest change of their key")
    # A composite key (the problem names it).
    order, no = db.query(f"SELECT orderid, lineno FROM dbo.orders WHERE {live} "
                         "ORDER BY 1, 2 LIMIT 1")[0]
    line = f"(orderid, lineno) = ({order}, {no})"
    tampered(f"UPDATE dbo.orders SET _ces_lsn = _ces_lsn + 1 WHERE {line}",
             f"UPDATE dbo.orders SET _ces_lsn = _ces_lsn - 1 WHERE {line}",
             "dbo.orders: 1 row(s) whose version is not the newest change of their key "
             f"in dbo.orders_history: ['key ({order}, {no}): version ")
    assert problems() == []

    # The histories (not undone: each check looks for its own problem).
    db.query("UPDATE dbo.products_history SET _ces_operation = 'INS' WHERE _ces_version = "
             "(SELECT min(_ces_version) FROM dbo.products_history "
             "WHERE _ces_operation = 'UPD')")
    assert any("dbo.products_history: 1 change(s) with another operation" in p
               for p in problems()), problems()
    # A copy of one change under another version (the key is the version).
    db.query("INSERT INTO dbo.orders_history SELECT (jsonb_populate_record("
             "NULL::dbo.orders_history, to_jsonb(h) || jsonb_build_object("
             "'_ces_version', h._ces_version + 1e19))).* FROM dbo.orders_history AS h "
             "ORDER BY _ces_version LIMIT 1")
    found = problems()
    for text in ("dbo.orders_history: 1 change(s) recorded more than once",
                 "dbo.orders_history: 1 change(s) whose version is not its commit LSN"):
        assert any(text in p for p in found), (text, found)
    db.query("DELETE FROM dbo.accountsb_history WHERE _ces_version = "
             "(SELECT max(_ces_version) FROM dbo.accountsb_history)")
    assert any("dbo.accountsb_history: 1 change(s) of the stream missing" in p
               for p in problems()), problems()

    # The reader: an account soft-deleted in one table only.
    total = db.scalar(f"SELECT (SELECT sum(balance) FROM dbo.accountsa WHERE {live}) + "
                      f"(SELECT sum(balance) FROM dbo.accountsb WHERE {live})")
    reader = BankReader(db, ACCOUNTS, total, deleted_column=DELETED_COLUMN).start()
    try:
        wait_until(lambda: reader.failed() or reader.full_reads >= 5, 30)
        assert reader.bad == 0, reader.summary()
        db.query(f"UPDATE dbo.accountsa SET {DELETED_COLUMN} = now() "
                 "WHERE accountid = (SELECT min(accountid) FROM dbo.accountsa)")
        wait_until(lambda: reader.failed() or reader.bad > 0, 30,
                   message=reader.summary)
    finally:
        reader.stop()
    assert "pair" in reader.examples[0], reader.examples


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
