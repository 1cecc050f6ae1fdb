"""The harness's pytest fixtures and hooks, shared by every suite: a suite's
conftest.py names this module in pytest_plugins.

- ``pg`` (session): a PostgreSQL 15 server (harness.postgres.Postgres).
- ``db`` (per test): a fresh database in it, dropped afterwards.
- ``broker`` (factory): a ces-mock-broker process (harness.mockbroker.Broker).
- ``ces2pg`` (factory): the daemon under test, with a generated config file;
  every daemon still running at teardown gets SIGTERM and must exit 0.
- ``kafka`` (session): Apache Kafka like Event Hubs (harness.realkafka);
  skips the test when java, mvn or openssl is missing (fails under CI,
  CI=true).
- ``kafka_logs``: kafka, with its log attached to the test's failure report.
- ``topic`` (factory): a new topic of the kafka broker, named after the test.

When a test fails, the logs of the daemons, brokers and the PostgreSQL server
written during that test are attached to the failure report
(harness.reports).

Environment: CES2PG_KAFKA_DIR keeps the kafka broker's directory there
(default: a temporary directory, removed at the end).
"""

import contextlib
import itertools
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psycopg2
import pytest

from harness import reports
from harness.daemon import Daemon, make_config, write_config
from harness.mockbroker import Broker
from harness.postgres import Database, Postgres
from harness.realkafka import fetch_or_skip, running

# --------------------------------------------------------------------------
# Failure reports
# --------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    reports.note_test_start(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
    reports.add_log_sections(item, rep)


@pytest.fixture(autouse=True)
def _track_item(request):
    reports.set_current_item(request.node)
    yield
    reports.set_current_item(None)


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg():
    """A PostgreSQL 15 server shared by the whole session."""
    server = Postgres()
    try:
        server.initdb()
        server.start()
        reports.set_server(server)
        yield server
    finally:
        reports.set_server(None)
        server.cleanup()


_db_counter = itertools.count(1)


# CES2PG_TEST_PG_ROLE=least runs ces2pg, and the test's own sessions, as the
# least-privilege role README describes ("The PostgreSQL role ces2pg needs"):
# a login with CREATE on the test's database, nothing more. The test's sessions
# take that role too (SET ROLE), so that the tables a test makes belong to it,
# as targets ces2pg made itself would.
LEAST_ROLE = "ces2pg_suite"


class LeastPrivilegeDatabase(Database):
    """A Database whose ces2pg and whose test sessions act as LEAST_ROLE."""

    def __init__(self, server, name, tmp_path):
        super().__init__(server, name, tmp_path)
        self.superuser_conninfo = self.conninfo
        self.conninfo = self.conninfo.replace(f"user={server.user}", f"user={LEAST_ROLE}")

    def connect(self):
        conn = super().connect()
        with conn.cursor() as cur:
            cur.execute(f"SET ROLE {LEAST_ROLE}")
        return conn

    def query(self, sql, args=None):
        with contextlib.closing(self.connect()) as conn:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else None


def least_privilege_database(pg, name, tmp_path):
    pg.sql(f"""DO $$ BEGIN
        CREATE ROLE {LEAST_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
    EXCEPTION WHEN duplicate_object THEN NULL; END $$""")
    pg.sql(f'GRANT CREATE ON DATABASE "{name}" TO {LEAST_ROLE}')
    pg.sql(f"GRANT CREATE ON SCHEMA public TO {LEAST_ROLE}", dbname=name)
    database = LeastPrivilegeDatabase(pg, name, tmp_path)
    assert database.scalar("SELECT current_user") == LEAST_ROLE
    return database


@pytest.fixture
def db(pg, tmp_path):
    """A fresh database for one test (dropped afterwards)."""
    name = f"test_{os.getpid()}_{next(_db_counter)}"
    pg.sql(f'CREATE DATABASE "{name}"')
    if os.environ.get("CES2PG_TEST_PG_ROLE") == "least":
        yield least_privilege_database(pg, name, tmp_path)
    else:
        yield Database(pg, name, tmp_path)
    try:
        pg.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg2.Error as e:  # a lingering connection must not fail a test
        print(f"warning: cannot drop database {name}: {e}", file=sys.stderr)


# --------------------------------------------------------------------------
# The mock broker and ces2pg
# --------------------------------------------------------------------------


@pytest.fixture
def broker(tmp_path, request):
    """Factory: broker(partitions=4, topics=("ces",), brokers=1,
    control=False) -> Broker."""
    started = []

    def start(partitions=4, topics=("ces",), brokers=1, control=False):
        if isinstance(topics, str):
            topics = (topics,)
        b = Broker(tmp_path, partitions, topics, brokers, request, control)
        started.append(b)
        return b

    yield start

    failures = []
    for b in started:
        if b.stopped:
            continue
        alive = b.proc.poll() is None
        rc = b.stop()
        if not alive:
            failures.append(f"ces-mock-broker died during the test (exit {rc})")
        elif rc != 0:
            failures.append(f"ces-mock-broker exited {rc} on SIGTERM")
    assert not failures, "; ".join(failures)


@pytest.fixture
def ces2pg(tmp_path, request, db, broker):
    """Factory: ces2pg(db, broker=None, extra_config="", group=..., topics=...,
    **make_config kwargs) -> Daemon.

    At teardown every daemon the test did not stop itself gets SIGTERM and must
    exit 0; a daemon that died on its own fails the test. (Depending on db and
    broker makes pytest stop the daemons before their database is dropped and
    their broker stopped.)
    """
    daemons = []

    def start(db, broker=None, extra_config="", group="ces2pg-test",
              topics=("ces",), **config_kw):
        n = len(daemons) + 1
        cfg = write_config(
            tmp_path,
            make_config(db, broker, group=group, topics=topics,
                        extra_config=extra_config, **config_kw),
            name=f"ces2pg-daemon-{n}.conf")
        log_path = Path(tmp_path) / f"ces2pg-daemon-{n}.log"
        d = Daemon(cfg, log_path, tmp_path)
        reports.attach_log(request, f"ces2pg daemon #{n} log ({log_path})", log_path)
        daemons.append(d)
        return d

    yield start

    failures = []
    for n, d in enumerate(daemons, 1):
        if d.handled:
            d._close()
            continue
        died = d.proc.poll()
        if died is not None:
            d._close()
            failures.append(f"daemon #{n} exited by itself with {died}")
            continue
        try:
            rc = d.terminate()
        except AssertionError as e:
            failures.append(f"daemon #{n}: {e}")
            continue
        if rc != 0:
            failures.append(f"daemon #{n} exited {rc} after SIGTERM")
    assert not failures, "; ".join(failures) + " (see the daemon logs)"


# --------------------------------------------------------------------------
# Apache Kafka
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kafka():
    """The session's Apache Kafka broker (started once)."""
    started = time.monotonic()
    fetch_or_skip()
    keep = os.environ.get("CES2PG_KAFKA_DIR")
    directory = Path(keep) if keep else Path(
        tempfile.mkdtemp(prefix="ces2pg-kafka-"))
    if keep:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"\nkafka: fetched in {time.monotonic() - started:.1f}s", file=sys.stderr)
    with running(directory, not keep, "kafka") as server:
        yield server


@pytest.fixture
def kafka_logs(kafka, request):
    """Attaches the broker's log to the test's failure report."""
    reports.attach_log(request, f"kafka broker log ({kafka.broker_log})",
                       kafka.broker_log)
    return kafka


_topic_counter = iter(range(1, 1 << 30))


@pytest.fixture
def topic(kafka_logs, request):
    """Factory: topic(partitions) -> a new topic's name."""

    def create(partitions=1):
        base = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")
        name = f"ces-{base[:150]}-{next(_topic_counter)}"
        return kafka_logs.create_topic(name, partitions)

    return create


# The identity service's fixtures (Microsoft Entra ID): harness.identity_fixtures.
from harness.identity_fixtures import (  # noqa: E402,F401
    entra_pg_role, identity_server, identity_service, kafka_oauth,
    kafka_oauth_logs)
