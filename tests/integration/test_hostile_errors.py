"""What an event asks cannot stop the stream or wedge ces2pg. An error
PostgreSQL raises because of one event (a generated column it writes, a trigger
that raises, a CHECK, a table ces2pg may not alter or write, a name a view
already has) dead-letters that event with its SQLSTATE; the rest of its batch
commits, the ordinary event after it is applied and replay ends by itself.
Errors about ces2pg itself (its metadata schema) still stop it. A retry (a lock
held on the table, with lock_timeout) backs off, counts itself in
ces2pg_postgres_retries_total{reason}, makes /readyz 503 while it lasts and ends with SIGTERM."""

import contextlib
import time

import psycopg2

from harness.common import free_port, wait_until
from harness.daemon import parse_replay_summary, run_replay
from harness.events import event_record as record, transaction_records, write_records
from harness.metrics import http_get, metric, scrape
from harness.progress import wait_applied
from harness.tables import fetch_table

GROUP = "ces2pg-test"
ROLE = "ces2pg_hostile"


def ordinary(n):
    return record("Orders", [("OrderId", "int"), ("Customer", "nvarchar(50)")],
                  {"OrderId": str(n), "Customer": f"c{n}"}, ["OrderId"])


def two_ints(table, v, extra=None):
    cols = [("id", "int"), ("v", "int")] + ([(extra, "int")] if extra else [])
    current = {"id": "1", "v": str(v)}
    if extra:
        current[extra] = "7"
    return record(table, cols, current, ["id"])


def lost_table(db):
    """dbo.lost, whose trigger inserts into a table that does not exist (42P01 each time)."""
    db.query("CREATE TABLE dbo.lost (id int PRIMARY KEY, v int)")
    db.query("""CREATE FUNCTION dbo.lose() RETURNS trigger LANGUAGE plpgsql AS
                $$ BEGIN INSERT INTO dbo.nowhere VALUES (1); RETURN NEW; END $$""")
    db.query("CREATE TRIGGER lose BEFORE INSERT ON dbo.lost"
             " FOR EACH ROW EXECUTE FUNCTION dbo.lose()")


def replay(db, tmp_path, name, records, **kw):
    path = write_records(tmp_path / name, records)
    started = time.monotonic()
    rc, out, err = run_replay(db, [path], timeout=60, **kw)
    assert rc == 0, f"replay exited {rc}:\n{err}"
    # Ends by itself, and soon: no loop of retries.
    assert time.monotonic() - started < 30, err
    return parse_replay_summary(out), err


def dead_letters(db):
    return db.query("SELECT class, reason FROM ces2pg.dead_letters ORDER BY id")


def assert_ordinary_applied(db, *ns):
    assert fetch_table(db, "dbo.orders", ["orderid", "customer"], ["orderid"]) == [
        {"orderid": str(n), "customer": f"c{n}"} for n in ns]


def test_refusals_of_the_events_own_are_dead_letters(tmp_path, db):
    db.query("CREATE SCHEMA dbo")
    # Tables the operator made, each refusing what the event asks.
    db.query("CREATE TABLE dbo.gen (id int PRIMARY KEY, v int,"
             " g int GENERATED ALWAYS AS (v * 2) STORED)")
    db.query("CREATE TABLE dbo.trig (id int PRIMARY KEY, v int)")
    db.query("""CREATE FUNCTION dbo.refuse() RETURNS trigger LANGUAGE plpgsql AS
                $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$""")
    db.query("CREATE TRIGGER refuse BEFORE INSERT ON dbo.trig"
             " FOR EACH ROW EXECUTE FUNCTION dbo.refuse()")
    db.query("CREATE TABLE dbo.checked (id int PRIMARY KEY, v int CHECK (v < 10))")
    db.query("CREATE TABLE dbo.base (id int PRIMARY KEY, v int)")
    db.query("CREATE VIEW dbo.viewed AS SELECT * FROM dbo.base")
    # A trigger naming a table that does not exist: 42P01 each time, which looks like a table
    # that changed underneath; the same change meeting it three times running is the change's.
    lost_table(db)
    records = [
        ordinary(1),
        record("gen", [("id", "int"), ("v", "int"), ("g", "int")],
               {"id": "1", "v": "2", "g": "4"}, ["id"]),
        two_ints("trig", 1),
        two_ints("checked", 99),
        two_ints("viewed", 1),  # its name is a view's: CREATE TABLE cannot make it
        two_ints("lost", 1),
        ordinary(2),
    ]
    (n, applied, dls), err = replay(db, tmp_path, "refusals.jsonl", records)
    assert (n, applied, dls) == (7, 2, 5), err
    got = dead_letters(db)
    assert [c for c, _ in got] == ["rejected_by_postgres", "rejected_by_postgres",
                                   "rejected_by_postgres", "schema", "rejected_by_postgres"], got
    assert "428C9" in got[0][1], got
    assert "P0001" in got[1][1] and "refused by a trigger" in got[1][1], got
    assert "23514" in got[2][1], got
    assert "could not be created" in got[3][1], got
    assert "42P01" in got[4][1] and "changing underneath" in got[4][1], got
    assert_ordinary_applied(db, 1, 2)
    assert db.scalar("SELECT count(*) FROM dbo.base") == 0


def least_privilege(db):
    """A role that owns nothing the operator made; its connection string."""
    db.query(f"""DO $$ BEGIN
        CREATE ROLE {ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT;
    EXCEPTION WHEN duplicate_object THEN NULL; END $$""")
    db.query(f'GRANT CREATE ON DATABASE "{db.name}" TO {ROLE}')
    return db.conninfo.replace(f"user={db.server.user}", f"user={ROLE}")


def test_a_table_ces2pg_may_not_alter_or_write(tmp_path, db):
    conninfo = least_privilege(db)
    db.query("CREATE SCHEMA dbo")
    db.query(f"GRANT USAGE, CREATE ON SCHEMA dbo TO {ROLE}")
    # Someone else's table, already with the version column: ces2pg may read and write
    # it, but not alter it (42501 on ALTER TABLE ADD COLUMN).
    db.query("CREATE TABLE dbo.owned (id int PRIMARY KEY, v int, _ces_lsn numeric)")
    db.query(f"GRANT SELECT, INSERT, UPDATE, DELETE ON dbo.owned TO {ROLE}")
    # And one it may only read (42501 on INSERT).
    db.query("CREATE TABLE dbo.readonly (id int PRIMARY KEY, v int, _ces_lsn numeric)")
    db.query(f"GRANT SELECT ON dbo.readonly TO {ROLE}")
    records = [ordinary(1), two_ints("owned", 1, extra="w"), two_ints("readonly", 1),
               two_ints("owned", 3), ordinary(2)]
    (n, applied, dls), err = replay(db, tmp_path, "owned.jsonl", records, conninfo=conninfo)
    assert (n, applied, dls) == (5, 3, 2), err
    got = dead_letters(db)
    assert [c for c, _ in got] == ["schema", "rejected_by_postgres"], got
    assert "42501" in got[0][1] and "creating or extending" in got[0][1], got
    assert "42501" in got[1][1], got
    assert db.query("SELECT id, v FROM dbo.owned") == [(1, 3)]
    assert_ordinary_applied(db, 1, 2)


def test_privileges_on_its_own_metadata_stop_it(tmp_path, db):
    """A 42501 that is about ces2pg's metadata schema (the version guard reads its
    tombstones) is not the event's: ces2pg stops, nothing is dead-lettered."""
    conninfo = least_privilege(db)
    replay(db, tmp_path, "first.jsonl", [ordinary(1)], conninfo=conninfo)
    # The operator (a superuser) takes ces2pg's privileges on its tombstones away; it still
    # owns them, so that setting the schema up on connecting works.
    db.query(f"REVOKE SELECT ON ces2pg.tombstones FROM {ROLE}")
    path = write_records(tmp_path / "second.jsonl", [ordinary(2)])
    rc, out, err = run_replay(db, [path], timeout=60, conninfo=conninfo)
    assert rc == 1, err
    assert "metadata schema" in err and "permission denied" in err, err
    assert dead_letters(db) == []


def test_retry_backs_off_is_counted_not_ready_and_stops(tmp_path, db, broker, ces2pg):
    """A lock held on a target table, with lock_timeout: every attempt fails with
    55P03; ces2pg retries with backoff (ces2pg_postgres_retries_total{reason="timeout"}),
    /readyz is 503 while it does, and SIGTERM ends it at once. Before that, a
    hostile event through the daemon is a dead letter and the daemon goes on."""
    db.query("CREATE SCHEMA dbo")
    db.query("CREATE TABLE dbo.trig (id int PRIMARY KEY, v int)")
    db.query("""CREATE FUNCTION dbo.refuse() RETURNS trigger LANGUAGE plpgsql AS
                $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$""")
    db.query("CREATE TRIGGER refuse BEFORE INSERT ON dbo.trig"
             " FOR EACH ROW EXECUTE FUNCTION dbo.refuse()")
    b = broker(partitions=1)
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}",
                    conninfo=db.conninfo + " options='-c lock_timeout=200'")
    b.produce("ces", [ordinary(1), two_ints("trig", 1), ordinary(2)], partition=0)
    wait_applied(db, GROUP, {0: 3}, daemons=[daemon])
    assert [c for c, _ in dead_letters(db)] == ["rejected_by_postgres"]
    assert_ordinary_applied(db, 1, 2)
    ready = f"http://127.0.0.1:{port}/readyz"
    wait_until(lambda: http_get(ready)[0] == 200, 30, message="/readyz 200")
    before = metric(scrape(port), "ces2pg_postgres_retries_total", reason="timeout") or 0

    with contextlib.closing(psycopg2.connect(db.conninfo)) as holder:
        cur = holder.cursor()
        cur.execute("LOCK TABLE dbo.orders IN ACCESS EXCLUSIVE MODE")
        b.produce("ces", [ordinary(3)], partition=0)
        wait_until(lambda: (metric(scrape(port), "ces2pg_postgres_retries_total",
                                   reason="timeout") or 0) >= before + 3,
                   30, message="retries counted")
        assert http_get(ready)[0] == 503
        assert daemon.alive()
        # Backing off: a few retries a second at most, not hundreds.
        n1 = metric(scrape(port), "ces2pg_postgres_retries_total", reason="timeout")
        time.sleep(2)
        n2 = metric(scrape(port), "ces2pg_postgres_retries_total", reason="timeout")
        assert n2 - n1 <= 10, (n1, n2)
        started = time.monotonic()
        assert daemon.terminate(timeout=15) == 0
        assert time.monotonic() - started < 10
        holder.rollback()
    assert "stopped while retrying" in daemon.log() or "rolled back" in daemon.log()
    assert db.scalar("SELECT count(*) FROM dbo.orders") == 2


def test_sigterm_cancels_a_statement_that_lasts(tmp_path, db, broker, ces2pg):
    """A trigger that sleeps, and no statement_timeout: the batch waits for
    PostgreSQL. SIGTERM stops ces2pg all the same: after a grace of 5 s the
    statement is cancelled, the batch rolled back, and ces2pg exits 0."""
    db.query("CREATE SCHEMA dbo")
    db.query("CREATE TABLE dbo.slow (id int PRIMARY KEY, v int)")
    db.query("""CREATE FUNCTION dbo.sleep() RETURNS trigger LANGUAGE plpgsql AS
                $$ BEGIN PERFORM pg_sleep(600); RETURN NEW; END $$""")
    db.query("CREATE TRIGGER sleep BEFORE INSERT ON dbo.slow"
             " FOR EACH ROW EXECUTE FUNCTION dbo.sleep()")
    b = broker(partitions=1)
    daemon = ces2pg(db, b, group=GROUP)
    b.produce("ces", [ordinary(1)], partition=0)
    wait_applied(db, GROUP, {0: 1}, daemons=[daemon])
    b.produce("ces", [two_ints("slow", 1)], partition=0)
    wait_until(lambda: db.scalar("SELECT count(*) FROM pg_stat_activity"
                                 " WHERE query LIKE '%%slow%%' AND wait_event = 'PgSleep'") > 0,
               30, message="the trigger sleeps")
    started = time.monotonic()
    assert daemon.terminate(timeout=30) == 0
    assert time.monotonic() - started < 15
    assert "cancelling the statement" in daemon.log()
    assert db.scalar("SELECT count(*) FROM dbo.slow") == 0
    assert db.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'") == 0


def test_sigterm_cancels_ddl_waiting_on_a_lock(tmp_path, db, broker, ces2pg):
    """A new column arrives while the application holds the table locked: the
    ALTER TABLE ces2pg sends waits on the lock. SIGTERM stops ces2pg all the
    same: DDL goes through the same wait as the batch's statements, cancelled
    after the 5 s grace, and ces2pg exits 0 with the column not added."""
    b = broker(partitions=1)
    daemon = ces2pg(db, b, group=GROUP)
    b.produce("ces", [two_ints("locked", 1)], partition=0)
    wait_applied(db, GROUP, {0: 1}, daemons=[daemon])
    with contextlib.closing(db.connect()) as holder:
        holder.autocommit = False
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE dbo.locked IN ACCESS EXCLUSIVE MODE")
        b.produce("ces", [two_ints("locked", 2, extra="w")], partition=0)
        wait_until(lambda: db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'ALTER TABLE%%'"
            " AND wait_event_type = 'Lock'") > 0, 30, message="the ALTER TABLE waits")
        started = time.monotonic()
        assert daemon.terminate(timeout=30) == 0
        assert time.monotonic() - started < 15
        holder.rollback()
    assert "cancelling the statement" in daemon.log()
    assert db.scalar("SELECT count(*) FROM information_schema.columns"
                     " WHERE table_name = 'locked' AND column_name = 'w'") == 0
    assert db.scalar("SELECT v FROM dbo.locked") == 1


def test_a_change_that_keeps_failing_inside_a_streamed_transaction(tmp_path, db, broker, ces2pg):
    """A source transaction larger than a batch is streamed into one open PostgreSQL transaction.
    One of its changes meets a trigger that names a missing table (42P01, which looks like a
    table changed underneath): the stream is read again after a wait, counted, and the change that
    keeps failing is dead-lettered, so the rest of the transaction commits and the stream goes on."""
    db.query("CREATE SCHEMA dbo")
    lost_table(db)
    cols = [("OrderId", "int"), ("Customer", "nvarchar(50)")]
    events = [("Orders", cols, {"OrderId": str(i), "Customer": f"c{i}"}, ["OrderId"])
              for i in range(1, 251)]
    events.insert(170, ("lost", [("id", "int"), ("v", "int")], {"id": "1", "v": "1"}, ["id"]))
    b = broker(partitions=1)
    port = free_port()
    # More events than may be held: the transaction is streamed, 50 events a part.
    daemon = ces2pg(db, b, group=GROUP, batch_max_events=50, http_listen=f"127.0.0.1:{port}",
                    apply_extra=["max_pending_events = 100;"])
    b.produce("ces", transaction_records(events) + [ordinary(1000)], partition=0)
    wait_applied(db, GROUP, {0: 252}, daemons=[daemon], timeout=90)
    assert "streaming" in daemon.log().lower(), daemon.log()[-3000:]
    got = dead_letters(db)
    assert len(got) == 1 and "42P01" in got[0][1], got
    assert_ordinary_applied(db, *range(1, 251), 1000)
    assert db.scalar("SELECT count(*) FROM dbo.lost") == 0
    retries = metric(scrape(port), "ces2pg_postgres_retries_total", reason="table_changed")
    assert retries >= 2, retries
    assert daemon.terminate() == 0
