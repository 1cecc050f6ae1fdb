"""Operations: /metrics, /healthz, /readyz, SIGHUP reload, SIGTERM during a
batch and a second signal, sd_notify, secrets, PostgreSQL over TLS, the
systemd unit's hardening and the compose file."""

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psycopg2
import pytest

from harness.common import CES2PG, ROOT, child_env, free_port, wait_until
from harness.daemon import make_config, write_config, write_secret
from harness.events import example_record, generate, read_records, stream_partitions
from harness.metrics import http_get, metric, metric_sum, parse_metrics, scrape
from harness.mockbroker import PacedProducer, produce_placed
from harness.postgres import Postgres
from harness.progress import dead_letters, read_offsets, wait_applied
from harness.tables import assert_tables_match

GROUP = "ces2pg-test"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def record_facts(record):
    """(op, "schema.table") of a current-format JSON record."""
    env = json.loads(record)
    src = json.loads(env["data"])["eventsource"]
    return env["operation"], f'{src["schema"]}.{src["tbl"]}'


OPS = {"INS": "insert", "UPD": "update", "DEL": "delete"}


# --------------------------------------------------------------------------
# /metrics, /healthz, /readyz
# --------------------------------------------------------------------------


def test_metrics_count_a_known_stream(tmp_path, db, broker, ces2pg):
    b = broker(partitions=1)
    expect = generate(tmp_path, seed=8080, events=400, tables=3, fmt="current")
    records = read_records(expect["_out"])
    assert len(records) == expect["events"], "no segmented events expected"
    garbage = [b"not json at all", b'{"specversion": "1.0"}', b"\x00\x01binary"]
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}")
    b.produce("ces", records[:200] + garbage + records[200:], partition=0)
    wait_applied(db, GROUP, {0: len(records) + len(garbage)}, daemons=[daemon])
    assert_tables_match(db, expect)

    want = {}
    for r in records:
        op, table = record_facts(r)
        want[(OPS[op], table)] = want.get((OPS[op], table), 0) + 1

    def settled():  # gauges are published every 100 ms, lag from the broker's cached watermark
        s = scrape(port)
        done = metric(s, "ces2pg_records_consumed_total") == len(records) + len(garbage)
        caught_up = metric(s, "ces2pg_consumer_lag", topic="ces", partition="0") == 0
        return s if done and caught_up else None

    s = wait_until(settled, 10, message="records_consumed_total and the lag settle")
    for (op, table), n in want.items():
        assert metric(s, "ces2pg_events_applied_total", op=op, table=table) == n, (
            op, table)
    assert metric_sum(s, "ces2pg_events_applied_total") == len(records)
    for op in ("insert", "update", "delete"):
        assert metric(s, "ces2pg_events_consumed_total", op=op) == sum(
            n for (o, _), n in want.items() if o == op)
    assert metric(s, "ces2pg_dead_letters_total", reason="decode") == 3
    assert metric_sum(s, "ces2pg_dead_letters_total") == 3
    assert len(dead_letters(db)) == 3
    batches = metric(s, "ces2pg_batch_duration_seconds_count")
    assert batches >= 1
    assert metric(s, "ces2pg_batch_duration_seconds_bucket", le="+Inf") == batches
    assert metric(s, "ces2pg_consumer_lag", topic="ces", partition="0") == 0
    assert metric(s, "ces2pg_postgres_connected") == 1
    assert metric(s, "ces2pg_partitions_assigned") == 1
    assert metric(s, "ces2pg_process_resident_memory_bytes") > 1e6
    assert metric(s, "ces2pg_pending_events") == 0
    assert metric(s, "ces2pg_pending_bytes") == 0
    # The commit time of the last event applied is that of the last record.
    last = json.loads(records[-1])["time"]
    when = datetime.datetime.fromisoformat(last.replace("Z", "+00:00"))
    assert metric(s, "ces2pg_last_applied_commit_timestamp_seconds") == pytest.approx(
        when.timestamp(), abs=0.001)
    delay = metric(s, "ces2pg_replication_delay_seconds")
    assert delay == pytest.approx(time.time() - when.timestamp(), abs=60)
    assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
    assert http_get(f"http://127.0.0.1:{port}/nothing")[0] == 404
    assert daemon.terminate() == 0


def test_a_small_prefetch_keeps_fetching(tmp_path, db, broker, ces2pg):
    """librdkafka 2.0 stops fetching when its queue holds queued.min.messages and looks again only
    when its broker thread wakes up, up to a second later (librdkafka issue #2879). Here every
    fetch fills the queue: without a wake-up each would idle, and 12,000 records would take minutes.
    ces2pg wakes the fetcher up whenever the queue has drained to half."""
    b = broker(partitions=4)
    expect = generate(tmp_path, seed=7007, events=12000, tables=3, extra_args=("--narrow",))
    records = read_records(expect["_out"])
    # Round robin keeps each partition in stream order (all transaction mode needs), message sets
    # of 16 records make a fetch of 16 KB per partition bring about 16 of each.
    counts = produce_placed(b, "ces", records, [i % 4 for i in range(len(records))],
                            producer_config={"batch.num.messages": 16})
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}",
                    properties=("fetch.wait.max.ms=50", "session.timeout.ms=4000",
                                "heartbeat.interval.ms=500", "queued.min.messages=50",
                                "max.partition.fetch.bytes=16384"))
    wait_applied(db, GROUP, counts, timeout=40, daemons=[daemon])
    assert_tables_match(db, expect)

    def published():
        s = scrape(port)
        return s if metric(s, "ces2pg_kafka_fetch_wakeups_total") else None

    s = wait_until(published, 5, message="the wake-up counter is published")
    # Each fetch brings up to about 64 records, more than the queue's 50: one wake-up per fetch
    # or two.
    assert metric(s, "ces2pg_kafka_fetch_wakeups_total") >= 12000 / 64 / 2, s
    assert daemon.terminate() == 0


def test_readyz_follows_postgres(tmp_path, pg, db, broker, ces2pg):
    b = broker(partitions=1)
    port = free_port()
    daemon = ces2pg(db, b, group=GROUP, http_listen=f"127.0.0.1:{port}")
    ready = f"http://127.0.0.1:{port}/readyz"
    wait_until(lambda: http_get(ready)[0] == 200, 30, message="/readyz 200")
    pg.stop()
    try:
        wait_until(lambda: http_get(ready)[0] == 503, 30,
                   message="/readyz 503 while PostgreSQL is down")
        # Still alive: the loop turns while PostgreSQL is away.
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    finally:
        pg.start_again()
    wait_until(lambda: http_get(ready)[0] == 200, 30,
               message="/readyz 200 once PostgreSQL is back")
    # And it applies again.
    b.produce("ces", [example_record("current-insert")], partition=0)
    wait_applied(db, GROUP, {0: 1}, daemons=[daemon])
    assert daemon.terminate() == 0


def test_a_postgresql_that_never_answers_is_given_up_on(tmp_path, db, broker, ces2pg):
    """A server that accepts the connection and never says a word (a hung host, a proxy whose
    far side is gone) must not hold ces2pg forever: the connect gives up after libpq's
    connect_timeout, which ces2pg sets to 10 s unless the conninfo says otherwise, and retries."""
    b = broker(partitions=1)
    mute = socket.create_server(("127.0.0.1", 0))  # never accepts: the kernel does the handshake
    try:
        conninfo = re.sub(r"port=\d+", f"port={mute.getsockname()[1]}",
                          re.sub(r"host=\S+", "host=127.0.0.1", db.conninfo))
        began = time.monotonic()
        daemon = ces2pg(db, b, group=GROUP, conninfo=conninfo)
        daemon.wait_log(r"cannot connect to PostgreSQL: .*timeout expired.* \(retrying in",
                        timeout=40)
        took = time.monotonic() - began
        print(f"the connect gave up after {took:.1f} s")
        assert took >= 9, took
        assert daemon.alive()
        assert daemon.terminate() == 0
    finally:
        mute.close()


# --------------------------------------------------------------------------
# signals
# --------------------------------------------------------------------------


def test_sighup_reloads_log_level_and_format(tmp_path, db, broker, ces2pg):
    b = broker(partitions=1)
    daemon = ces2pg(db, b, group=GROUP, log_level="info")
    daemon.wait_log(r"assigned 1 partition")
    rec = example_record("current-insert")
    b.produce("ces", [rec, rec], partition=0)  # the second is a duplicate
    wait_applied(db, GROUP, {0: 2}, daemons=[daemon])
    assert "DEBUG" not in daemon.log()

    # An invalid file changes nothing.
    good = daemon.config_path.read_text()
    daemon.config_path.write_text(good + "\nlog = { level = \"loud\"; };\n")
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_log(r"reload failed, the running configuration stays")
    daemon.check_alive()

    daemon.config_path.write_text(good.replace(
        'log = { level = "info"; };',
        'log = { level = "debug"; format = "json"; };'))
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_log(r"configuration reloaded \(log level debug\)")
    b.produce("ces", [rec], partition=0)  # another duplicate: a debug line
    wait_applied(db, GROUP, {0: 3}, daemons=[daemon])
    daemon.wait_log(r'"level":"debug","message":"duplicate of an applied')
    tail = daemon.log().split("configuration reloaded", 1)[1].splitlines()[1:]
    for line in tail:  # everything after the reload is one JSON object
        if line.strip() and not line.startswith(("==", "kafka")):
            obj = json.loads(line)
            assert set(obj) == {"time", "level", "message"}, obj
    assert daemon.terminate() == 0


def test_sigterm_during_large_batch_loses_and_doubles_nothing(
        tmp_path, db, broker, ces2pg):
    b = broker(partitions=2)
    expect = generate(tmp_path, seed=31337, events=12000, tables=3)
    records = read_records(expect["_out"])
    parts = stream_partitions(records, 2, "table")
    daemon = ces2pg(db, b, group=GROUP, batch_max_events=5000,
                    batch_max_ms=2000)
    producer = PacedProducer(b, db, GROUP, "ces", records, parts).start()
    try:
        wait_until(lambda: sum(read_offsets(db, GROUP).values()) > 0, 60,
                   message="a first batch committed")
        t0 = time.monotonic()
        assert daemon.terminate(timeout=60) == 0
        assert time.monotonic() - t0 < 30, "the stop took too long"
        assert "stopping: applying what is complete" in daemon.log()
        again = ces2pg(db, b, group=GROUP, batch_max_events=5000,
                       batch_max_ms=200)
        producer.finish(timeout=180, daemons=[again])
    finally:
        producer.stop()
    wait_applied(db, GROUP, producer.counts, timeout=120, daemons=[again])
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert again.terminate() == 0


@contextlib.contextmanager
def table_locked(db, table):
    """Holds an ACCESS EXCLUSIVE lock on table in an open transaction."""
    conn = db.connect()
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        conn.rollback()
        conn.close()


def waiting_on_lock(db):
    return db.scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'") > 0


def catches(pid, sig):
    """True while process pid has a handler installed for sig (/proc/PID/status SigCgt)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (int(sig) - 1)))
    raise AssertionError(f"no SigCgt line for process {pid}")


@pytest.mark.parametrize("second_signal", [False, True])
def test_stop_while_a_batch_waits(tmp_path, db, broker, ces2pg, second_signal):
    """First SIGTERM: the batch in PostgreSQL is finished, then exit 0. A
    second SIGTERM ends the process at once."""
    b = broker(partitions=1)
    daemon = ces2pg(db, b, group=GROUP)
    b.produce("ces", [example_record("current-insert")], partition=0)
    wait_applied(db, GROUP, {0: 1}, daemons=[daemon])
    with table_locked(db, "sales.orders"):
        b.produce("ces", [example_record("current-update")], partition=0)
        wait_until(lambda: waiting_on_lock(db), 30,
                   message="the batch waits for the lock")
        daemon.proc.send_signal(signal.SIGTERM)
        # The handler only sets a flag, and SA_RESETHAND gives SIGTERM its default action back
        # as it is delivered: once ces2pg no longer catches SIGTERM, the first signal is in.
        wait_until(lambda: not catches(daemon.proc.pid, signal.SIGTERM), 30,
                   message="the first SIGTERM delivered")
        if second_signal:
            # The first signal waits for the batch; the second does not.
            daemon.proc.send_signal(signal.SIGTERM)
            assert daemon.wait(10) == -signal.SIGTERM
            return
        assert daemon.alive(), "exited before its batch was done"
    # The lock is gone: the batch commits, then the daemon stops.
    assert daemon.wait(30) == 0
    assert "stopping: applying what is complete" in daemon.log()
    assert read_offsets(db, GROUP) == {0: 2}
    assert db.query("SELECT total::text, paid, note FROM sales.orders") == [
        ("170.55", True, 'ring twice, "back door"')]


# --------------------------------------------------------------------------
# sd_notify
# --------------------------------------------------------------------------


class NotifySocket:
    """A Unix datagram socket collecting sd_notify messages."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            self.messages.extend(data.decode().split("\n"))

    def wait_for(self, line, after=0, timeout=30):
        """Waits for a message equal to line (or matching it, a compiled
        regex) after index after; returns the index after it."""
        def found():
            for i, m in enumerate(self.messages[after:], after):
                if (m == line if isinstance(line, str) else line.search(m)):
                    return i + 1
            return None
        return wait_until(found, timeout, message=lambda: f"{line!r} in "
                          f"{self.messages[-20:]}")

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_sd_notify_messages(tmp_path, db, broker, ces2pg, monkeypatch):
    b = broker(partitions=1)
    ns = NotifySocket(tmp_path / "notify.sock")
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", ns.path)
        monkeypatch.setenv("WATCHDOG_USEC", "1000000")
        daemon = ces2pg(db, b, group=GROUP)
        monkeypatch.delenv("NOTIFY_SOCKET")
        monkeypatch.delenv("WATCHDOG_USEC")
        i = ns.wait_for("READY=1")
        assert "ready: PostgreSQL connected, consumer group joined" in daemon.log()
        # Watchdog pings every half period.
        j = ns.wait_for("WATCHDOG=1", after=i, timeout=5)
        ns.wait_for("WATCHDOG=1", after=j, timeout=5)
        daemon.proc.send_signal(signal.SIGHUP)
        k = ns.wait_for("RELOADING=1", after=i)
        k = ns.wait_for("READY=1", after=k)
        b.produce("ces", [example_record("current-insert")], partition=0)
        wait_applied(db, GROUP, {0: 1}, daemons=[daemon])
        assert daemon.terminate() == 0
        ns.wait_for("STOPPING=1", after=k, timeout=5)
        assert any(m.startswith("STATUS=") for m in ns.messages), ns.messages
    finally:
        ns.close()


def test_status_line_carries_progress(tmp_path, db, broker, ces2pg,
                                      monkeypatch):
    b = broker(partitions=1)
    ns = NotifySocket(tmp_path / "notify.sock")
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", ns.path)
        daemon = ces2pg(db, b, group=GROUP)
        monkeypatch.delenv("NOTIFY_SOCKET")
        daemon.wait_log(r"ready: PostgreSQL connected")  # signals handled by now
        cfg = daemon.config_path.read_text().replace(
            'log = { level = "info"; };',
            'log = { level = "info"; progress_interval = 1; };')
        daemon.config_path.write_text(cfg)
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_log(r"reload: log.progress_interval changed")
        b.produce("ces", [example_record("current-insert")], partition=0)
        wait_applied(db, GROUP, {0: 1}, daemons=[daemon])
        m = daemon.wait_log(r"progress: .*events/s.*lag (\d+) records, delay .*"
                            r"1 events applied, 0 dead letters")
        assert m.group(1) == "0"
        ns.wait_for(re.compile(r"^STATUS=.*events/s.*1 events applied"))
        assert daemon.terminate() == 0
    finally:
        ns.close()


# --------------------------------------------------------------------------
# secrets and PostgreSQL over TLS
# --------------------------------------------------------------------------

PG_PASSWORD = "pw-Zq8sX3-never-in-a-log"
KAFKA_SECRET = "kafka-Yw2-never-in-a-log"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   capture_output=True)


def make_ca(directory, name):
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out",
             f"{name}.crt", cwd=directory)


@pytest.fixture(scope="module")
def tls_pg(tmp_path_factory):
    """A separate PostgreSQL with ssl=on, a server certificate for
    127.0.0.1 from a test CA, and only scram-sha-256 logins over TLS."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    server = Postgres()
    try:
        server.initdb()
        d = server.dir
        make_ca(d, "test-ca")
        make_ca(d, "other-ca")
        (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                 "-keyout", "server.key", "-out", "server.csr", cwd=d)
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "test-ca.crt",
                 "-CAkey", "test-ca.key", "-CAcreateserial", "-days", "2",
                 "-extfile", "san.cnf", "-out", "server.crt", cwd=d)
        for f in ("server.key", "server.crt"):
            if server.run_as:
                os.chown(d / f, server.run_as.pw_uid, server.run_as.pw_gid)
            os.chmod(d / f, 0o600)
        with open(server.pgdata / "postgresql.conf", "a") as f:
            f.write(f"ssl = on\nssl_cert_file = '{d}/server.crt'\n"
                    f"ssl_key_file = '{d}/server.key'\n"
                    "password_encryption = 'scram-sha-256'\n")
        server.start()
        server.sql(f"CREATE ROLE app LOGIN SUPERUSER PASSWORD '{PG_PASSWORD}'")
        server.sql("CREATE DATABASE app OWNER app")
        # From now on only TLS with a password (the harness's own session is
        # made before; a reload applies the new rules).
        (server.pgdata / "pg_hba.conf").write_text(
            "local all postgres trust\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256\n")
        server.sql("SELECT pg_reload_conf()")
        yield server
    finally:
        server.cleanup()


def tls_conninfo(server, ca, **extra):
    parts = [f"host=127.0.0.1 port={server.port} dbname=app user=app "
             f"sslmode=verify-full sslrootcert={server.dir / ca}"]
    parts += [f"{k}={v}" for k, v in extra.items()]
    return " ".join(parts)


def secret_free(text, *secrets):
    for s in secrets:
        assert s not in text, "a secret appears in the log"


def test_tls_verify_full_with_password_file_and_env(
        tmp_path, tls_pg, broker, ces2pg, monkeypatch):
    b = broker(partitions=1)
    creds = tmp_path / "credentials"
    creds.mkdir()
    write_secret(creds / "pg-password", PG_PASSWORD + "\n")
    # The port comes from the environment; the password file from systemd's
    # credentials directory (a relative path is looked up there).
    monkeypatch.setenv("CES_TEST_PG_PORT", str(tls_pg.port))
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    conninfo = tls_conninfo(tls_pg, "test-ca.crt").replace(
        f"port={tls_pg.port}", "port=${CES_TEST_PG_PORT}")

    port = free_port()
    text = make_config(
        None, b, group=GROUP, log_level="debug", conninfo=conninfo,
        properties=("fetch.wait.max.ms=50", "session.timeout.ms=4000",
                    "heartbeat.interval.ms=500", "debug=conf,security,generic",
                    # A credential property (unused on PLAINTEXT): librdkafka's
                    # configuration dump must not show it either.
                    f"sasl.password={KAFKA_SECRET}"),
        http_listen=f"127.0.0.1:{port}")
    text = text.replace('conninfo = ', 'password_file = "pg-password";\n  conninfo = ')
    cfg = write_config(tmp_path, text, name="tls.conf")
    rc, out, err = _run(["--check-config", "-c", cfg])
    assert rc == 0, err
    secret_free(out + err, PG_PASSWORD)
    from harness.daemon import Daemon
    daemon = Daemon(cfg, tmp_path / "tls.log", tmp_path)
    try:
        monkeypatch.delenv("CES_TEST_PG_PORT")
        daemon.wait_log(r"connected to PostgreSQL")
        b.produce("ces", [example_record("current-insert")], partition=0)

        def applied():
            with contextlib.closing(psycopg2.connect(
                    tls_conninfo(tls_pg, "test-ca.crt", password=PG_PASSWORD))) as c:
                with c.cursor() as cur:
                    cur.execute("SELECT to_regclass('sales.orders') IS NOT NULL")
                    if not cur.fetchone()[0]:
                        return False
                    cur.execute("SELECT count(*) FROM sales.orders")
                    return cur.fetchone()[0] == 1
        wait_until(applied, 60, message="the record applied over TLS")
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200,
                   30, message="/readyz 200")
        assert daemon.terminate() == 0
    finally:
        if daemon.alive():
            daemon.kill9()
    secret_free(daemon.log(), PG_PASSWORD, KAFKA_SECRET)
    # librdkafka's configuration dump was there (and redacted its password).
    assert re.search(r"kafka: CONF: .*sasl\.password", daemon.log())


def _run(args, env=None, timeout=60):
    r = subprocess.run([str(CES2PG)] + [str(a) for a in args],
                       capture_output=True, timeout=timeout,
                       env=env or child_env(), stdin=subprocess.DEVNULL)
    return (r.returncode, r.stdout.decode("utf-8", "replace"),
            r.stderr.decode("utf-8", "replace"))


@pytest.mark.parametrize("case", ["wrong_ca", "wrong_password"])
def test_tls_failures_stop_with_a_clear_error(tmp_path, tls_pg, broker, case):
    b = broker(partitions=1)
    pw = tmp_path / "pw"
    write_secret(pw, PG_PASSWORD if case == "wrong_ca" else "not-the-" + PG_PASSWORD)
    ca = "other-ca.crt" if case == "wrong_ca" else "test-ca.crt"
    text = make_config(None, b, group=GROUP, log_level="debug",
                       conninfo=tls_conninfo(tls_pg, ca))
    text = text.replace('conninfo = ', f'password_file = "{pw}";\n  conninfo = ')
    cfg = write_config(tmp_path, text, name=f"{case}.conf")
    rc, out, err = _run(["-c", cfg], timeout=60)
    assert rc == 1, (rc, err)
    expected = ("certificate verify failed" if case == "wrong_ca"
                else "password authentication failed")
    assert expected in err, err
    secret_free(out + err, PG_PASSWORD)


def test_unset_environment_variable_is_a_config_error(tmp_path, db):
    text = make_config(db, None, conninfo="host=127.0.0.1 password=${CES_NO_SUCH_VAR_X}")
    cfg = write_config(tmp_path, text, name="env.conf")
    env = child_env()
    env.pop("CES_NO_SUCH_VAR_X", None)
    rc, _, err = _run(["--check-config", "-c", cfg], env=env)
    assert rc == 78
    m = re.search(r"env\.conf:(\d+): postgres\.conninfo: environment variable "
                  r"CES_NO_SUCH_VAR_X is not set", err)
    assert m, err
    line = cfg.read_text().splitlines()[int(m.group(1)) - 1]
    assert "conninfo" in line


# --------------------------------------------------------------------------
# packaging: the systemd unit and the compose file
# --------------------------------------------------------------------------

UNIT = ROOT / "systemd" / "ces2pg.service"


def test_systemd_unit_exposure_is_at_most_2():
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    r = subprocess.run(["systemd-analyze", "security", "--offline=true",
                        "--no-pager", str(UNIT)], capture_output=True,
                       text=True, timeout=60)
    out = r.stdout + r.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)
    assert m, out
    assert float(m.group(1)) <= 2.0, out


def test_systemd_unit_essentials():
    text = UNIT.read_text()
    for line in ("Type=notify", "RestartPreventExitStatus=78 65",
                 "Environment=CES2PG_GROUP_INSTANCE_ID=%H-%p%i",
                 "NotifyAccess=main", "ExecReload=/bin/kill -HUP $MAINPID"):
        assert re.search(rf"^{re.escape(line)}$", text, re.M), line
    assert re.search(r"^WatchdogSec=\d+", text, re.M)
    assert re.search(r"^LoadCredential=\S+:\S+", text, re.M)
    # The packaged system user (systemd/ces2pg.sysusers), the group that may read the
    # configuration, and a credential whose file may be missing without stopping the start.
    assert re.search(r"^User=ces2pg$", text, re.M)
    assert re.search(r"^Group=ces2pg$", text, re.M)
    assert not re.search(r"^DynamicUser=", text, re.M)
    assert re.search(r"^SetCredential=pg-password:", text, re.M)
    sysusers = (ROOT / "systemd" / "ces2pg.sysusers").read_text()
    assert re.search(r"^u ces2pg - ", sysusers, re.M)


def test_compose_file_is_valid(tmp_path):
    compose = ROOT / "docker" / "compose.yaml"
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load(compose.read_text())
    services = spec["services"]
    assert set(services) == {"postgres", "kafka", "ces2pg", "ces-gen", "credentials",
                             "ces2pg-standby"}
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in services["kafka"]["environment"][
        "KAFKA_PROCESS_ROLES"]
    assert services["ces-gen"]["restart"] == "no"
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, (name, dep)
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            assert src in spec["volumes"] or (compose.parent / src).exists(), vol
    for secret in spec.get("secrets", {}).values():
        assert (compose.parent / secret["file"]).exists(), secret
    # ces2pg logs in as the least-privilege role the postgres service makes,
    # with a password only its user may read (compose mounts secrets with the
    # host file's mode, so the credentials service copies it, 0400).
    assert "ces2pg-role.sh" in " ".join(services["postgres"]["volumes"])
    initdb = (compose.parent / "initdb-ces2pg.sh").read_text()
    assert "CREATE ROLE ces2pg LOGIN PASSWORD" in initdb
    assert "SUPERUSER" not in initdb.replace("no superuser", "")
    credentials = services["credentials"]
    assert credentials["entrypoint"][:5] == ["install", "-m", "0400", "-o", "ces2pg"]
    assert services["ces2pg"]["depends_on"]["credentials"]["condition"] == \
        "service_completed_successfully"
    assert "user=ces2pg" in (compose.parent / "ces2pg.compose.conf").read_text()
    # The configuration it mounts is one ces2pg accepts.
    creds = tmp_path / "secrets"
    creds.mkdir()
    write_secret(creds / "pg-password",
                 (compose.parent / "demo-ces2pg-password.txt").read_text())
    env = child_env()
    env["CREDENTIALS_DIRECTORY"] = str(creds)
    rc, out, err = _run(["--check-config", "-c",
                         compose.parent / "ces2pg.compose.conf"], env=env)
    assert rc == 0, err
    assert "ces2pg-role-demo-only" not in out + err
    # Then Compose itself: it must accept the file, resolve what it refers to,
    # and reject a broken copy (so a linter that accepts anything fails here).
    compose_cmd = _compose_command()
    if compose_cmd is None:
        why = ("neither docker compose nor docker-compose is installed "
               "(Debian: docker-compose); only the structure was checked")
        if os.environ.get("CI") == "true":
            pytest.fail(why + ": under CI a skipped check is a failure")
        pytest.skip(why)
    r = _compose(compose_cmd, compose, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    resolved = yaml.safe_load(r.stdout)
    assert set(resolved["services"]) == set(services), r.stdout
    for name in ("ces2pg", "ces-gen"):
        build = resolved["services"][name]["build"]
        assert Path(build["context"]) == ROOT, build
        assert (ROOT / build["dockerfile"]).is_file(), build
    assert resolved["services"]["ces-gen"]["build"]["target"] == "ces-gen"
    assert Path(resolved["secrets"]["pg-password"]["file"]) == \
        compose.parent / "demo-pg-password.txt", r.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text(compose.read_text().replace(
        "    stop_grace_period: 60s\n",
        "    stop_grace_period: 60s\n    stop_grace_priod: 60s\n"))
    assert "stop_grace_priod" in broken.read_text()
    r = _compose(compose_cmd, broken, tmp_path)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "stop_grace_priod" in r.stdout + r.stderr, r.stdout + r.stderr


def _compose_command():
    """The compose plugin (`docker compose`) when it runs, else Compose 1.x
    (`docker-compose`, Debian's docker-compose package), else None."""
    if shutil.which("docker"):
        r = subprocess.run(["docker", "compose", "version"],
                           capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        if r.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def _compose(compose_cmd, path, cwd):
    """`config` on the file at path: validated and printed with every relative
    path resolved (no Docker engine needed)."""
    return subprocess.run(compose_cmd + ["-f", str(path), "config"],
                          capture_output=True, text=True, timeout=60,
                          cwd=cwd, stdin=subprocess.DEVNULL)
