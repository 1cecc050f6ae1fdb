"""Integration test harness for ces2pg.

Run with Debian's interpreter (it has psycopg2 and confluent_kafka):

    /usr/bin/python3 -m pytest tests/integration

Pieces (modelled on pgbouncer's test/conftest.py):

- ``pg`` (session): a real PostgreSQL 15 server in a temporary directory on a
  free 127.0.0.1 port, run as an unprivileged user when we are root.
- ``db`` (per test): a fresh database, dropped afterwards.
- ``broker`` (factory): a ``ces-mock-broker`` process (librdkafka mock cluster).
- ``ces2pg`` (factory): the daemon under test, with a generated config file;
  every daemon still running at teardown gets SIGTERM and must exit 0.
- helpers: ``run_replay``, ``run_ces2pg``, ``generate``, ``wait_until``,
  ``wait_applied``, ``OffsetMonitor``, ``assert_tables_match``.

Environment:
    CES2PG_BUILD   build directory (default <repo>/build)
    PG_BINDIR      PostgreSQL binaries (default /usr/lib/postgresql/15/bin)

When a test fails, the logs of the daemons, brokers and the PostgreSQL server
written during that test are attached to the failure report.
"""

import contextlib
import itertools
import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import psycopg2
import pytest

# --------------------------------------------------------------------------
# Locations
# --------------------------------------------------------------------------

TEST_DIR = Path(__file__).resolve().parent
ROOT = TEST_DIR.parent.parent
BUILD = Path(os.environ.get("CES2PG_BUILD", ROOT / "build")).resolve()
CES2PG = BUILD / "ces2pg"
MOCK_BROKER = BUILD / "ces-mock-broker"
CES_GEN = ROOT / "tools" / "ces-gen"
EXAMPLES = ROOT / "tests" / "fixtures" / "examples"  # the example records (README.md there)
PG_BINDIR = Path(os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin"))
PYTHON = "/usr/bin/python3"

PG_USER = "ces2pg-test"  # unprivileged OS user that runs the server as root
PG_SUPERUSER = "postgres"  # database superuser role

# Kafka client settings for the daemon against the mock cluster. The
# librdkafka 2.0.2 mock answers the first JoinGroup of an empty group after a
# fixed 3 s and waits session.timeout.ms - 1000 ms for members to rejoin after
# a leave; a member blocked in that first join is not refreshed, so the session
# timeout must stay comfortably above 3 s. 4000 ms keeps joins at ~3 s.
DEFAULT_KAFKA_PROPERTIES = (
    "fetch.wait.max.ms=50",
    "session.timeout.ms=4000",
    "heartbeat.interval.ms=500",
)

EX_USAGE = 64
EX_CONFIG = 78


# --------------------------------------------------------------------------
# Failure reports: attach logs written during the test
# --------------------------------------------------------------------------

_PG_INSTANCE = None  # the session's Postgres, once started


def _attach_log(request_or_item, title, path):
    """Registers a log file to be shown if the current test fails."""
    item = getattr(request_or_item, "node", request_or_item)
    logs = item.__dict__.setdefault("_ces2pg_logs", [])
    logs.append((title, Path(path)))


def _tail_text(path, start=0, limit=30000):
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    text = data.decode("utf-8", "replace")
    if len(text) > limit:
        text = f"<... {len(text) - limit} characters cut ...>\n" + text[-limit:]
    return text


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _PG_INSTANCE is not None:
        item._pg_log_start = _PG_INSTANCE.log_size()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
    if not rep.failed:
        return
    if getattr(item, "_ces2pg_logs_shown", False):
        return
    item._ces2pg_logs_shown = True
    for title, path in item.__dict__.get("_ces2pg_logs", []):
        rep.sections.append((title, _tail_text(path)))
    if _PG_INSTANCE is not None:
        start = getattr(item, "_pg_log_start", 0)
        rep.sections.append(
            (f"postgresql log ({_PG_INSTANCE.log_path})",
             _tail_text(_PG_INSTANCE.log_path, start))
        )


# --------------------------------------------------------------------------
# Polling helpers
# --------------------------------------------------------------------------


def wait_until(predicate, timeout, interval=0.1, message=None):
    """Polls predicate() until it returns a true value, which is returned.

    On timeout raises AssertionError with message (a string or a callable
    returning one, evaluated then).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            if callable(message):
                message = message()
            raise AssertionError(
                f"timed out after {timeout}s waiting: "
                f"{message or getattr(predicate, '__name__', predicate)}"
            )
        time.sleep(interval)


def free_port():
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_binary(path, what):
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"{what} not found at {path}: build first "
            f"(cmake -S {ROOT} -B {BUILD} && cmake --build {BUILD}) "
            f"or set CES2PG_BUILD"
        )


def child_env():
    """Environment for spawned programs: ours, sanitizer options included."""
    env = dict(os.environ)
    for name in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------


def _ensure_os_user(name):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell",
         "/usr/sbin/nologin", name],
        check=True, capture_output=True,
    )
    return pwd.getpwnam(name)


class Postgres:
    """A throw-away PostgreSQL cluster (initdb + pg_ctl)."""

    def __init__(self):
        self.host = "127.0.0.1"
        self.port = None
        self.dbname = "postgres"
        self.user = PG_SUPERUSER
        self.run_as = None
        if os.geteuid() == 0:
            self.run_as = _ensure_os_user(PG_USER)
        # Not under pytest's basetemp: that is mode 0700 and owned by root,
        # so the server user could not reach it.
        self.dir = Path(tempfile.mkdtemp(prefix="ces2pg-pg-"))
        self.pgdata = self.dir / "data"
        self.log_path = self.dir / "postgresql.log"
        if self.run_as:
            os.chown(self.dir, self.run_as.pw_uid, self.run_as.pw_gid)
        os.chmod(self.dir, 0o755)  # the log must stay readable to root tools
        self.started = False

    def _cmd(self, args):
        if self.run_as:
            return ["runuser", "-u", self.run_as.pw_name, "--"] + args
        return args

    def _run(self, args, **kw):
        return subprocess.run(
            self._cmd(args), capture_output=True, text=True, cwd=self.dir, **kw
        )

    def initdb(self):
        r = self._run(
            [str(PG_BINDIR / "initdb"), "-D", str(self.pgdata), "-U",
             PG_SUPERUSER, "--auth=trust", "--no-sync", "-E", "UTF8",
             "--locale=C"],
            timeout=120,
        )
        if r.returncode:
            raise RuntimeError(f"initdb failed:\n{r.stdout}\n{r.stderr}")
        with open(self.pgdata / "postgresql.conf", "a") as f:
            f.write(
                "\n# ces2pg integration tests\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\n"
                "fsync = off\n"
                "synchronous_commit = off\n"
                "full_page_writes = off\n"
                "shared_buffers = 32MB\n"
                "max_connections = 50\n"
                # lets tests count the statements ces2pg executed (its bulk path)
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "log_line_prefix = '%m [%p] %q%u@%d %a: '\n"
                "log_min_messages = warning\n"
                "log_connections = off\n"
                "TimeZone = 'UTC'\n"
            )

    def start(self, attempts=5):
        last = ""
        for _ in range(attempts):
            port = free_port()
            r = self._run(
                [str(PG_BINDIR / "pg_ctl"), "start", "-w", "-t", "60", "-D",
                 str(self.pgdata), "-l", str(self.log_path), "-o",
                 f"-p {port}"],
                timeout=90,
            )
            if r.returncode == 0:
                self.port = port
                self.started = True
                return
            last = r.stdout + r.stderr + _tail_text(self.log_path)[-2000:]
            if "Address already in use" not in last:
                break
        raise RuntimeError(f"pg_ctl start failed:\n{last}")

    def stop(self, mode="fast"):
        """pg_ctl stop: "fast" cuts the sessions; "immediate" is a crash (no checkpoint, what
        was not written to the WAL is lost)."""
        if self.started:
            r = self._run(
                [str(PG_BINDIR / "pg_ctl"), "stop", "-w", "-m", mode, "-D",
                 str(self.pgdata)],
                timeout=60,
            )
            assert r.returncode == 0, f"pg_ctl stop -m {mode}: {r.stdout}{r.stderr}"
            self.started = False

    def restart(self, down_seconds=0.0, mode="fast"):
        """Stops the server (mode as for stop), optionally stays down for a while, and starts
        it again on the same port."""
        self.stop(mode)
        if down_seconds:
            time.sleep(down_seconds)  # the outage itself is what is tested, not a wait
        self.start_again()

    def start_again(self):
        """Starts the stopped server on its old port."""
        r = self._run(
            [str(PG_BINDIR / "pg_ctl"), "start", "-w", "-t", "60", "-D",
             str(self.pgdata), "-l", str(self.log_path), "-o", f"-p {self.port}"],
            timeout=90,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        self.started = True

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_size(self):
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def conninfo_for(self, dbname):
        return (f"host={self.host} port={self.port} dbname={dbname} "
                f"user={self.user}")

    @property
    def conninfo(self):
        return self.conninfo_for(self.dbname)

    def connect(self, dbname=None):
        conn = psycopg2.connect(self.conninfo_for(dbname or self.dbname))
        conn.autocommit = True
        return conn

    def sql(self, query, args=None, dbname=None):
        """Runs one statement; returns all rows (or None)."""
        with contextlib.closing(self.connect(dbname)) as conn:
            with conn.cursor() as cur:
                cur.execute(query, args)
                return cur.fetchall() if cur.description else None


@pytest.fixture(scope="session")
def pg():
    """A PostgreSQL 15 server shared by the whole session."""
    global _PG_INSTANCE
    server = Postgres()
    try:
        server.initdb()
        server.start()
        _PG_INSTANCE = server
        yield server
    finally:
        _PG_INSTANCE = None
        server.cleanup()


class Database:
    """One test's database in the session server."""

    def __init__(self, server, name, tmp_path):
        self.server = server
        self.name = name
        self.tmp_path = tmp_path
        self.conninfo = server.conninfo_for(name)

    def connect(self):
        """A psycopg2 connection with autocommit on."""
        return self.server.connect(self.name)

    def query(self, sql, args=None):
        """Runs one statement in a new session; returns all rows (or None)."""
        return self.server.sql(sql, args, dbname=self.name)

    def scalar(self, sql, args=None):
        rows = self.query(sql, args)
        assert rows and len(rows) == 1 and len(rows[0]) == 1, rows
        return rows[0][0]

    def table_exists(self, qualified):
        return self.scalar("SELECT to_regclass(%s) IS NOT NULL", (qualified,))


_db_counter = itertools.count(1)


@pytest.fixture
def db(pg, tmp_path):
    """A fresh database for one test (dropped afterwards)."""
    name = f"test_{os.getpid()}_{next(_db_counter)}"
    pg.sql(f'CREATE DATABASE "{name}"')
    yield Database(pg, name, tmp_path)
    try:
        pg.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg2.Error as e:  # a lingering connection must not fail a test
        print(f"warning: cannot drop database {name}: {e}", file=sys.stderr)


# --------------------------------------------------------------------------
# Mock Kafka broker
# --------------------------------------------------------------------------


def _readline_with_timeout(stream, timeout):
    """Reads one line from a pipe, or returns None after timeout seconds."""
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode()


class Broker:
    """A running ces-mock-broker process. With control, its control channel
    is open: command() sends it a command (down, up, errors, clear)."""

    def __init__(self, tmp_path, partitions, topics, brokers, request=None,
                 control=False):
        require_binary(MOCK_BROKER, "ces-mock-broker")
        self.topics = {t: partitions for t in topics}
        self.brokers = brokers
        self.log_path = Path(tmp_path) / f"mock-broker-{id(self):x}.log"
        args = [str(MOCK_BROKER), "--brokers", str(brokers)]
        for t in topics:
            args += ["--topic", f"{t}:{partitions}"]
        if control:
            args.append("--control")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self._log, env=child_env(),
            stdin=subprocess.PIPE if control else None,
        )
        if request is not None:
            _attach_log(request, f"ces-mock-broker log ({self.log_path})",
                        self.log_path)
        line = _readline_with_timeout(self.proc.stdout, 20)
        if not line or not line.strip():
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"ces-mock-broker printed no bootstrap line "
                f"(exit {self.proc.returncode}):\n{_tail_text(self.log_path)}"
            )
        self.bootstrap = line.strip()
        self._producer = None
        self.stopped = False

    def producer(self):
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,  # keeps per-partition order
                "linger.ms": 5,
                "message.timeout.ms": 30000,
            })
        return self._producer

    def produce(self, topic, values, partition=None, key=None):
        """Produces values (bytes or str) in order; waits for delivery.

        Returns a list of (partition, offset) per value, in input order.
        """
        producer = self.producer()
        results = [None] * len(values)
        errors = []

        def on_delivery(index):
            def cb(err, msg):
                if err is not None:
                    errors.append((index, err))
                else:
                    results[index] = (msg.partition(), msg.offset())
            return cb

        for i, value in enumerate(values):
            if isinstance(value, str):
                value = value.encode()
            kw = {"value": value, "on_delivery": on_delivery(i)}
            if partition is not None:
                kw["partition"] = partition
            if key is not None:
                kw["key"] = key
            while True:
                try:
                    producer.produce(topic, **kw)
                    break
                except BufferError:  # local queue full: let it drain
                    producer.poll(0.1)
            producer.poll(0)
        left = producer.flush(60)
        assert left == 0, f"{left} message(s) not delivered within 60s"
        assert not errors, f"delivery errors: {errors[:5]}"
        assert all(r is not None for r in results), "missing delivery reports"
        return results

    def consume(self, topic, count, group="harness-selftest", timeout=30):
        """Consumes count values from topic with a group consumer."""
        from confluent_kafka import Consumer

        consumer = Consumer({
            "bootstrap.servers": self.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 4000,
            "heartbeat.interval.ms": 500,
        })
        try:
            consumer.subscribe([topic])
            got = []
            deadline = time.monotonic() + timeout
            while len(got) < count and time.monotonic() < deadline:
                msg = consumer.poll(0.1)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                got.append((msg.partition(), msg.offset(), msg.value()))
            return got
        finally:
            consumer.close()

    def command(self, line, timeout=10):
        """Sends one command on the control channel (control=True) and waits
        for its reply; fails unless the reply is "ok"."""
        assert self.proc.stdin is not None, "broker started without control"
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        # One command at a time: the reply is the only line on the way.
        reply = _readline_with_timeout(self.proc.stdout, timeout)
        if reply is None or not reply.strip():
            raise AssertionError(
                f"ces-mock-broker: no reply to {line!r} within {timeout}s "
                f"(exit {self.proc.poll()}):\n{_tail_text(self.log_path)[-2000:]}")
        assert reply.strip() == "ok", f"ces-mock-broker: {line!r}: {reply.strip()}"

    def stop(self):
        """SIGTERM; returns the exit code."""
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._log.close()
        return self.proc.returncode


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


# --------------------------------------------------------------------------
# ces2pg configuration and processes
# --------------------------------------------------------------------------


def _cfg_str(value):
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def make_config(db=None, broker=None, group="ces2pg-test", topics=("ces",),
                properties=None, batch_max_events=None, batch_max_ms=50,
                log_level="info", extra_config="", conninfo=None,
                kafka_extra=(), apply_extra=(), http_listen="", decode_threads=2):
    """Returns the text of a ces2pg config file.

    apply_extra: more lines of the apply section, e.g.
    'ordering = "partition";'.

    Sections are written only when they have content: no kafka section
    without a broker or kafka_extra (replay mode). kafka_extra: more lines
    of the kafka section, e.g. 'ssl_ca_file = "/path";' (with broker=None,
    no brokers line: Event Hubs mode derives it). http_listen: the
    http.listen value (default "": no HTTP server, so that daemons do not
    compete for the default port; None leaves the key out). decode_threads: the
    decode.threads value (default 2, so that the daemon's decoding thread and the records
    it decodes ahead are exercised on every machine, where the default would give one
    thread on two CPUs; None leaves the key out). extra_config is appended verbatim; it
    must not repeat a section written here (libconfig rejects duplicates): use the keyword
    arguments for those, or put decode.threads in your own decode section.
    """
    if isinstance(topics, str):
        topics = (topics,)
    if properties is None:
        properties = DEFAULT_KAFKA_PROPERTIES
    lines = []
    if broker is not None or kafka_extra:
        lines.append("kafka = {")
        if broker is not None:
            bootstrap = broker if isinstance(broker, str) else broker.bootstrap
            lines.append(f"  brokers = {_cfg_str(bootstrap)};")
        lines += [f"  {line}" for line in kafka_extra]
        lines += [
            "  topics = [ " + ", ".join(_cfg_str(t) for t in topics) + " ];",
            f"  group_id = {_cfg_str(group)};",
            "  properties = [ " + ", ".join(_cfg_str(p) for p in properties)
            + " ];",
            "};",
        ]
    if conninfo is None and db is not None:
        conninfo = db.conninfo
    if conninfo is not None:
        lines += ["postgres = {", f"  conninfo = {_cfg_str(conninfo)};", "};"]
    apply = []
    if batch_max_events is not None:
        apply.append(f"  batch_max_events = {int(batch_max_events)};")
    if batch_max_ms is not None:
        apply.append(f"  batch_max_ms = {int(batch_max_ms)};")
    apply += [f"  {line}" for line in apply_extra]
    if apply:
        lines += ["apply = {"] + apply + ["};"]
    if log_level is not None:
        lines += [f"log = {{ level = {_cfg_str(log_level)}; }};"]
    if http_listen is not None:
        lines += [f"http = {{ listen = {_cfg_str(http_listen)}; }};"]
    if decode_threads is not None and "decode = {" not in extra_config:
        lines += [f"decode = {{ threads = {int(decode_threads)}; }};"]
    text = "\n".join(lines) + "\n"
    if extra_config:
        text += extra_config.rstrip("\n") + "\n"
    return text


_cfg_counter = itertools.count(1)


def write_config(directory, text, name=None):
    path = Path(directory) / (name or f"ces2pg-{next(_cfg_counter)}.conf")
    path.write_text(text)
    return path


def run_ces2pg(args, timeout=60, cwd=None):
    """Runs ces2pg to completion; returns (exit code, stdout, stderr)."""
    require_binary(CES2PG, "ces2pg")
    r = subprocess.run(
        [str(CES2PG)] + [str(a) for a in args], capture_output=True,
        timeout=timeout, env=child_env(), cwd=cwd, stdin=subprocess.DEVNULL,
    )
    return (r.returncode, r.stdout.decode("utf-8", "replace"),
            r.stderr.decode("utf-8", "replace"))


def run_replay(db, paths, extra_config="", timeout=120, options=(), **config_kw):
    """Runs `ces2pg replay -c FILE [OPTIONS...] PATH...` against db.

    Returns (exit code, stdout, stderr). The config has no kafka section.
    options: replay's own, e.g. ("--capture",).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    cfg = write_config(db.tmp_path,
                       make_config(db, extra_config=extra_config, **config_kw))
    args = ["replay", "-c", cfg] + list(options) + list(paths)
    rc, out, err = run_ces2pg(args, timeout=timeout, cwd=db.tmp_path)
    log = Path(db.tmp_path) / f"replay-{next(_cfg_counter)}.log"
    log.write_text(f"$ ces2pg {' '.join(map(str, args))}\n"
                   f"exit {rc}\n--- stdout\n{out}--- stderr\n{err}")
    if _current_item is not None:
        _attach_log(_current_item, f"ces2pg replay ({log})", log)
    return rc, out, err


REPLAY_SUMMARY = re.compile(
    r"^replay: records=(\d+) applied=(\d+) dead_letters=(\d+)$", re.M)


def parse_replay_summary(stdout):
    """Returns (records, applied, dead_letters) from replay's summary line."""
    m = REPLAY_SUMMARY.search(stdout)
    assert m, f"no replay summary line in stdout: {stdout!r}"
    return tuple(int(x) for x in m.groups())


_current_item = None


@pytest.fixture(autouse=True)
def _track_item(request):
    global _current_item
    _current_item = request.node
    yield
    _current_item = None


class Daemon:
    """A ces2pg daemon started by the ces2pg fixture."""

    def __init__(self, config_path, log_path, cwd):
        require_binary(CES2PG, "ces2pg")
        self.config_path = Path(config_path)
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(CES2PG), "-c", str(self.config_path)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env(), cwd=cwd,
        )
        self.handled = False  # set once the test stopped or waited for it

    def log(self):
        return _tail_text(self.log_path, limit=10**9)

    def alive(self):
        return self.proc.poll() is None

    def check_alive(self):
        """Fails at once if the daemon has exited."""
        rc = self.proc.poll()
        if rc is not None:
            raise AssertionError(
                f"ces2pg exited unexpectedly with {rc}; log tail:\n"
                f"{_tail_text(self.log_path)[-4000:]}")

    def wait_log(self, regex, timeout=30):
        """Waits for a log line matching regex; returns the match."""
        pattern = re.compile(regex, re.M)

        def found():
            m = pattern.search(self.log())
            if m:
                return m
            if not self.alive():  # one last look happened above
                raise AssertionError(
                    f"ces2pg exited ({self.proc.returncode}) before logging "
                    f"{regex!r}; log tail:\n{self.log()[-4000:]}")
            return None

        return wait_until(found, timeout, interval=0.05,
                          message=lambda: f"log line {regex!r}; log tail:\n"
                          + self.log()[-4000:])

    def wait(self, timeout=30):
        """Waits for the daemon to exit by itself; returns the exit code."""
        self.handled = True
        try:
            return self.proc.wait(timeout)
        finally:
            self._close()

    def terminate(self, timeout=30):
        """SIGTERM, waits up to timeout seconds; returns the exit code."""
        self.handled = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"ces2pg did not exit within {timeout}s of SIGTERM")
        finally:
            self._close()

    def kill9(self):
        """SIGKILL (simulated crash); returns the exit code (-9)."""
        self.handled = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        rc = self.proc.wait()
        self._close()
        return rc

    def _close(self):
        if not self._log.closed:
            self._log.close()


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
        _attach_log(request, f"ces2pg daemon #{n} log ({log_path})", log_path)
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
# Progress: ces2pg.offsets
# --------------------------------------------------------------------------


def read_offsets(db, group, topic="ces"):
    """{partition: next_offset} from ces2pg.offsets ({} before it exists)."""
    with contextlib.closing(db.connect()) as conn:
        return _read_offsets_conn(conn, group, topic)


class OffsetMonitor:
    """Polls ces2pg.offsets and asserts that no offset ever moves backwards."""

    def __init__(self, db, group, topic="ces"):
        self.db, self.group, self.topic = db, group, topic
        self.last = {}
        self.polls = 0

    def poll(self):
        now = read_offsets(self.db, self.group, self.topic)
        for p, prev in self.last.items():
            cur = now.get(p)
            assert cur is not None, (
                f"offsets row for partition {p} vanished (was {prev})")
            assert cur >= prev, (
                f"offset of partition {p} moved backwards: {prev} -> {cur}")
        self.last = now
        self.polls += 1
        return now

    def total(self):
        return sum(self.last.values())


def _norm_counts(expected):
    return {int(p): int(n) for p, n in expected.items()}


def wait_applied(db, group, expected_records_per_partition, timeout=60,
                 topic="ces", daemons=(), monitor=None, interval=0.05):
    """Waits until next_offset == records produced, for every partition.

    Partitions that received no record may have no row. Fails at once if an
    offset passes the number of records (nothing can be there) or moves
    backwards, or if one of daemons exits. Returns the final offsets.
    """
    expected = _norm_counts(expected_records_per_partition)
    monitor = monitor or OffsetMonitor(db, group, topic)

    def done():
        for d in daemons:
            d.check_alive()
        got = monitor.poll()
        for p, n in got.items():
            assert n <= expected.get(p, 0), (
                f"partition {p}: next_offset {n} is past the "
                f"{expected.get(p, 0)} record(s) produced")
        return all(got.get(p, 0) == n for p, n in expected.items())

    wait_until(done, timeout, interval=interval,
               message=lambda: f"offsets {monitor.last} to reach {expected}")
    return monitor.last


def dead_letters(db):
    """All rows of ces2pg.dead_letters as dicts, by id."""
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute("SELECT to_regclass('ces2pg.dead_letters') IS NOT NULL")
        if not cur.fetchone()[0]:
            return []
        cur.execute(
            'SELECT id, topic, partition, "offset", reason, logicalid, payload '
            "FROM ces2pg.dead_letters ORDER BY id")
        cols = [c.name for c in cur.description]
        rows = []
        for r in cur.fetchall():
            row = dict(zip(cols, r))
            if row["payload"] is not None:
                row["payload"] = bytes(row["payload"])
            rows.append(row)
        return rows


# --------------------------------------------------------------------------
# Comparing tables with the generator's expectation
# --------------------------------------------------------------------------


def _quote_ident(name):
    return '"' + name.replace('"', '""') + '"'


def _split_table(qualified):
    schema, _, table = qualified.partition(".")
    if not table:
        schema, table = "public", schema
    return schema, table


def _sort_key(value):
    if value is None:
        return (2, 0, "")
    if re.fullmatch(r"-?\d+", value):
        return (0, int(value), "")
    return (1, 0, value)


def fetch_table(db, qualified, columns, key):
    """Rows of a table as dicts of text values, ordered by key."""
    schema, table = _split_table(qualified)
    # Qualified names: a bare ORDER BY name would pick the text output column.
    select_list = ", ".join(f"t.{_quote_ident(c)}::text" for c in columns)
    order = ", ".join(f"t.{_quote_ident(c)}" for c in key)
    with contextlib.closing(db.connect()) as conn, conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO'; "
                    "SET extra_float_digits = 1")
        cur.execute(
            f"SELECT {select_list} FROM {_quote_ident(schema)}."
            f"{_quote_ident(table)} AS t ORDER BY {order}")
        return [dict(zip(columns, r)) for r in cur.fetchall()]


def _fmt_row(row, columns):
    return "{" + ", ".join(f"{c}={row.get(c)!r}" for c in columns) + "}"


def diff_rows(expected, actual, columns, key, limit=5):
    """A readable description of how two row lists differ ('' if equal)."""
    def k(row):
        return tuple(_sort_key(row.get(c)) for c in key)

    exp = {k(r): r for r in expected}
    act = {k(r): r for r in actual}
    missing = [exp[x] for x in sorted(exp.keys() - act.keys())]
    extra = [act[x] for x in sorted(act.keys() - exp.keys())]
    changed = [(exp[x], act[x]) for x in sorted(exp.keys() & act.keys())
               if exp[x] != act[x]]
    out = []
    if missing:
        out.append(f"  {len(missing)} row(s) missing, e.g.:")
        out += ["    - " + _fmt_row(r, columns) for r in missing[:limit]]
    if extra:
        out.append(f"  {len(extra)} unexpected row(s), e.g.:")
        out += ["    + " + _fmt_row(r, columns) for r in extra[:limit]]
    if changed:
        out.append(f"  {len(changed)} row(s) differ, e.g.:")
        for e, a in changed[:limit]:
            cols = [c for c in columns if e.get(c) != a.get(c)]
            keytxt = ", ".join(f"{c}={e.get(c)!r}" for c in key)
            out.append(f"    key {keytxt}: " + "; ".join(
                f"{c}: expected {e.get(c)!r}, got {a.get(c)!r}" for c in cols))
    if not out and len(expected) != len(actual):
        out.append(f"  {len(expected)} expected rows, {len(actual)} found "
                   f"(duplicate keys?)")
    return "\n".join(out)


def load_expect(expect):
    if isinstance(expect, (str, Path)):
        with open(expect) as f:
            return json.load(f)
    return expect


def assert_tables_match(db, expect, check_types=True):
    """Asserts every table of the expectation equals PostgreSQL's content.

    With check_types, each expected column must also have the expected type
    (format_type spelling, e.g. "character varying(50)"); columns that are
    not in the expectation (such as a version column) are ignored.
    """
    expect = load_expect(expect)
    problems = []
    for qualified, spec in sorted(expect["tables"].items()):
        columns = list(spec["columns"])
        key = list(spec["key"])
        rows = [{c: r.get(c) for c in columns} for r in spec["rows"]]
        rows.sort(key=lambda r: tuple(_sort_key(r[c]) for c in key))
        if not db.table_exists(qualified):
            if rows:
                problems.append(f"{qualified}: table does not exist "
                                f"({len(rows)} rows expected)")
            continue
        if check_types:
            types = column_types(db, qualified)
            wrong = [f"{c}: expected {t}, found {types.get(c, 'no column')}"
                     for c, t in spec["columns"].items() if types.get(c) != t]
            if wrong:
                problems.append(f"{qualified}: column types differ: "
                                + "; ".join(wrong))
                continue
        actual = fetch_table(db, qualified, columns, key)
        if actual != rows:
            problems.append(
                f"{qualified}: {len(actual)} rows, {len(rows)} expected\n"
                + diff_rows(rows, actual, columns, key))
    assert not problems, "tables differ from the expectation:\n" + "\n".join(
        problems)


def column_types(db, qualified):
    """{column: format_type} of a table, in column order."""
    rows = db.query(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) "
        "FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) "
        "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (qualified,))
    return dict(rows)


def primary_key(db, qualified):
    """Primary key column names of a table, in key order."""
    rows = db.query(
        "SELECT a.attname FROM pg_index i "
        "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = k.attnum "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY k.n",
        (qualified,))
    return [r[0] for r in rows]


# --------------------------------------------------------------------------
# Event generator
# --------------------------------------------------------------------------


def generate(tmp_path, seed, events, broker=None, topic="ces",
             partitions=None, out=None, tables=None, fmt=None,
             partition_scheme=None, extra_args=(), timeout=120):
    """Runs tools/ces-gen; returns the parsed expectation.

    With broker, the generator produces to it (partitions defaults to the
    broker's partition count for topic); otherwise it writes records to out
    (default <tmp_path>/gen-<seed>.jsonl), one per line. The expectation
    dict gets the records file's path under "_out" when one was written.
    """
    assert CES_GEN.is_file(), f"generator not found at {CES_GEN}"
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    expect_path = tmp_path / f"gen-{seed}-{events}.expect.json"
    args = [PYTHON, str(CES_GEN), "--seed", str(seed), "--events",
            str(events), "--expect", str(expect_path)]
    if tables is not None:
        args += ["--tables", str(tables)]
    if fmt is not None:
        args += ["--format", fmt]
    if partition_scheme is not None:
        args += ["--partition-scheme", partition_scheme]
    if broker is not None:
        if partitions is None:
            partitions = broker.topics.get(topic)
        args += ["--brokers", broker.bootstrap, "--topic", topic]
        if partitions is not None:
            args += ["--partitions", str(partitions)]
    else:
        out = Path(out) if out else tmp_path / f"gen-{seed}-{events}.jsonl"
        args += ["--out", str(out)]
    args += list(extra_args)
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (
        f"ces-gen failed ({r.returncode}): {' '.join(args)}\n"
        f"{r.stdout}\n{r.stderr}")
    expect = load_expect(expect_path)
    expect["_expect_path"] = str(expect_path)
    if broker is None:
        expect["_out"] = str(out)
    return expect


def read_records(path):
    """The records of a replay file (one per line) as a list of bytes."""
    return Path(path).read_bytes().splitlines()


_TBL_RE = re.compile(r'"tbl"\s*:\s*"([^"]+)"')
_PKKEY_RE = re.compile(r'"pkkey"\s*:\s*\[\s*\{\s*"columnname"\s*:\s*"[^"]*"\s*,'
                       r'\s*"value"\s*:\s*"([^"]*)"')


def watermarks(client, topic, partitions):
    """{partition: (low, high)}: where each partition's log starts and ends, asked of the broker.
    client is a broker fixture (its bootstrap) or a librdkafka client configuration."""
    from confluent_kafka import Consumer, TopicPartition

    config = client if isinstance(client, dict) else {"bootstrap.servers": client.bootstrap}
    c = Consumer(dict(config, **{"group.id": "watermarks", "log_level": 0}))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                for p in partitions}
    finally:
        c.close()


def produce_placed(broker, topic, records, partitions, producer_config=None):
    """Produces records[i] to partitions[i], in list order (so in order
    within each partition); waits for delivery. Returns {partition: count}.

    producer_config: more librdkafka properties for a producer of its own
    (e.g. {"batch.num.messages": 16} for small message sets).
    """
    counts = {}
    for p in partitions:
        counts[p] = counts.get(p, 0) + 1
    if producer_config:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": broker.bootstrap,
                             "enable.idempotence": True, "linger.ms": 5,
                             **producer_config})
    else:
        producer = broker.producer()
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)

    for rec, p in zip(records, partitions):
        while True:
            try:
                producer.produce(topic, value=rec, partition=p, on_delivery=cb)
                break
            except BufferError:  # local queue full: let it drain
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0, f"{left} message(s) not delivered within 60s"
    assert not errors, f"delivery errors: {errors[:5]}"
    return counts


def stream_partitions(records, nparts, scheme="table"):
    """The partition ces-gen would produce each record to.

    scheme "table": crc32("dbo.<Table>") mod nparts; "column": crc32(first
    primary key value) mod nparts (segments follow the first segment of
    their logicalid); "streamgroup": 0; "none": round-robin per record.
    """
    if scheme == "streamgroup":
        return [0] * len(records)
    if scheme == "none":
        return [i % nparts for i in range(len(records))]
    assert scheme in ("table", "column"), f"unsupported partition scheme {scheme}"
    by_logicalid = {}
    parts = []
    for rec in records:
        event = json.loads(rec)
        m = (_TBL_RE if scheme == "table" else _PKKEY_RE).search(event["data"])
        if m:
            text = m.group(1) if scheme == "column" else f"dbo.{m.group(1)}"
            p = zlib.crc32(text.encode()) % nparts
            by_logicalid[event["logicalid"]] = p
        else:  # a later segment: the data slice has no table name
            p = by_logicalid[event["logicalid"]]
        parts.append(p)
    return parts


# librdkafka 2.0.2's mock cluster keeps at most 5 MiB (and 100,000
# messages) per partition: on append it drops the oldest message sets, read
# or not, and a consumer behind them gets OFFSET_OUT_OF_RANGE and jumps
# (auto.offset.reset). Streams bigger than that must be produced at the pace
# the daemon applies them.
MOCK_PARTITION_BYTES = 5 * 1024 * 1024


class Background:
    """Runs self.run() in a daemon thread from start() until stop(); run() loops while
    not self.stopping(). An exception it raises is re-raised by stop()."""

    def __init__(self, name):
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name=name)

    def start(self):
        self._thread.start()
        return self

    def started(self):
        return self._thread.ident is not None

    def stopping(self):
        return self._stop.is_set()

    def stop(self):
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error

    def _main(self):
        try:
            self.run()
        except BaseException as e:  # reported by stop()
            self.error = e


class PacedProducer:
    """Produces records in order in a background thread, never letting the
    bytes a partition holds beyond the group's applied offset (as stored in
    ces2pg.offsets) exceed max_backlog, so the mock never drops unread data.

    start() returns self; finish() waits for the end and raises the thread's
    error. counts: records per partition; placed[i]: (partition, offset).
    """

    def __init__(self, broker, db, group, topic, records, partitions,
                 max_backlog=2 * 1024 * 1024, stall_timeout=90):
        assert len(records) == len(partitions)
        self.broker, self.db, self.group, self.topic = broker, db, group, topic
        self.records = [r.encode() if isinstance(r, str) else r
                        for r in records]
        self.partitions = list(partitions)
        self.max_backlog = max_backlog
        self.stall_timeout = stall_timeout
        self.counts = {}
        for p in self.partitions:
            self.counts[p] = self.counts.get(p, 0) + 1
        self.placed = [None] * len(self.records)
        self.produced = 0
        self.error = None
        self.waits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="paced-producer")

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(30)

    def finish(self, timeout=120, daemons=()):
        """Waits until every record is delivered; fails early if one of
        daemons exits."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive():
            for d in daemons:
                if not d.alive():
                    self.stop()
                    d.check_alive()
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"paced producer not done after {timeout}s: "
                    f"{self.produced}/{len(self.records)} produced")
            self._thread.join(0.1)
        if self.error is not None:
            raise self.error

    def _run(self):
        from confluent_kafka import Producer

        conn = None
        producer = Producer({
            "bootstrap.servers": self.broker.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 256 * 1024,  # small message sets: fine-grained trim
        })
        errors = []
        try:
            cum = {}  # partition -> cumulative bytes by offset
            for rec, p in zip(self.records, self.partitions):
                c = cum.setdefault(p, [0])
                c.append(c[-1] + len(rec))
            applied = {}
            next_offset = {}
            last_progress = time.monotonic()

            def on_delivery(index):
                def cb(err, msg):
                    if err is not None:
                        errors.append(f"record {index}: {err}")
                    else:
                        self.placed[index] = (msg.partition(), msg.offset())
                return cb

            for i, (rec, p) in enumerate(zip(self.records, self.partitions)):
                k = next_offset.get(p, 0)
                c = cum[p]
                while (k > applied.get(p, 0)
                       and c[k + 1] - c[applied.get(p, 0)] > self.max_backlog):
                    if self._stop.is_set():
                        return
                    left = producer.flush(30)
                    assert left == 0, f"{left} records not delivered"
                    before = dict(applied)
                    try:
                        if conn is None:
                            conn = self.db.connect()
                        applied = _read_offsets_conn(conn, self.group, self.topic)
                    except psycopg2.OperationalError:
                        # The server may be restarted by the test: reconnect next round.
                        if conn is not None:
                            conn.close()
                        conn = None
                    if applied != before:
                        last_progress = time.monotonic()
                    elif time.monotonic() - last_progress > self.stall_timeout:
                        raise AssertionError(
                            f"no progress in ces2pg.offsets for "
                            f"{self.stall_timeout}s while producing "
                            f"(partition {p} at {applied.get(p, 0)}, "
                            f"{k} produced)")
                    self.waits += 1
                    time.sleep(0.05)
                while True:
                    try:
                        producer.produce(self.topic, value=rec, partition=p,
                                         on_delivery=on_delivery(i))
                        break
                    except BufferError:
                        producer.poll(0.1)
                producer.poll(0)
                next_offset[p] = k + 1
                self.produced = i + 1
                assert not errors, errors[:5]
            left = producer.flush(60)
            assert left == 0, f"{left} records not delivered"
            assert not errors, errors[:5]
            for i, pl in enumerate(self.placed):
                assert pl is not None, f"no delivery report for record {i}"
        except BaseException as e:  # reported by finish()
            self.error = e
        finally:
            if conn is not None:
                conn.close()


def _read_offsets_conn(conn, group, topic):
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('ces2pg.offsets') IS NOT NULL")
        if not cur.fetchone()[0]:
            return {}
        cur.execute(
            "SELECT partition, next_offset FROM ces2pg.offsets "
            "WHERE group_id = %s AND topic = %s", (group, topic))
        return {int(p): int(o) for p, o in cur.fetchall()}


# --------------------------------------------------------------------------
# Example records
# --------------------------------------------------------------------------

EXAMPLE_ORDER = ("legacy-insert", "legacy-update", "legacy-delete",
                 "current-insert", "current-update", "current-delete")


def example_record(name):
    """One example record re-serialized as one compact JSON line (bytes)."""
    path = EXAMPLES / f"{name}.json"
    assert path.is_file(), f"example record not found: {path}"
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def write_records(path, records):
    """Writes records (bytes or str), one per line."""
    with open(path, "wb") as f:
        for r in records:
            if isinstance(r, str):
                r = r.encode()
            assert b"\n" not in r, "a record must be one line"
            f.write(r + b"\n")
    return Path(path)


# --------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------

def http_get(url, timeout=5):
    """(status, body) of a GET; (None, error) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
        return None, str(e)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """{(name, frozenset(labels)): value}; checks every line is well formed."""
    samples = {}
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m, f"malformed metrics line: {line!r}"
        name, labels, value = m.groups()
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or base in typed, f"{name} has no # TYPE"
        key = (name, frozenset(_LABEL.findall(labels or "")))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
    return samples


def metric(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def metric_sum(samples, name, **labels):
    """Sum over every sample of name whose labels include labels."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def scrape(port):
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, f"/metrics: {status} {body}"
    return parse_metrics(body)


# --------------------------------------------------------------------------
# A bank whose second partition lags (torn transactions, the reorder window)
# --------------------------------------------------------------------------

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
