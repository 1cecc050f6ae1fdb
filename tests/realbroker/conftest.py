"""Real-broker test tier: ces2pg against Apache Kafka configured like the
Azure Event Hubs Kafka endpoint (SASL_SSL, PLAIN, user "$ConnectionString",
an Event Hubs connection string as the password, a private CA).

Run with Debian's interpreter, after building:

    CES2PG_BUILD=build-asan /usr/bin/python3 -m pytest tests/realbroker

The harness of tests/integration (PostgreSQL, the ces2pg daemon fixture, the
generator and comparison helpers) is loaded from there and re-exported here,
so test modules import everything from ``conftest``. This file adds:

- ``kafka`` (session): one broker started by tests/kafka/kafka-broker (it
  fetches Apache Kafka through Maven on first use). Skips the tier when Java
  or Maven is missing (scripts/test turns that into a failure under CI).
- ``topic`` (factory): a new topic with N partitions, named after the test.
- ``eventhubs_daemon`` (factory): a ces2pg daemon in Event Hubs mode.
- ``other_ca``: a CA certificate that did not sign the broker's.

RealKafka.stop_process() and start_again() stop the broker and run it again
on the same ports and data (the chaos tier's broker outage).

Environment: CES2PG_KAFKA_DIR keeps the broker's directory there (default: a
temporary directory, removed at the end).
"""

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

_HERE = Path(__file__).resolve().parent
_HARNESS_PATH = _HERE.parent / "integration" / "conftest.py"


def _load_harness():
    # Loaded under its own name: both files are "conftest" to pytest.
    name = "ces2pg_harness"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HARNESS_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


harness = _load_harness()

# Fixtures and hooks (pytest finds them in this module's namespace).
pg = harness.pg
db = harness.db
broker = harness.broker  # the mock broker factory, needed by the ces2pg fixture
ces2pg = harness.ces2pg
_track_item = harness._track_item
pytest_runtest_setup = harness.pytest_runtest_setup
pytest_runtest_makereport = harness.pytest_runtest_makereport

# Helpers for the test modules.
ROOT = harness.ROOT
CES2PG = harness.CES2PG
CES_GEN = harness.CES_GEN
PYTHON = harness.PYTHON
OffsetMonitor = harness.OffsetMonitor
assert_tables_match = harness.assert_tables_match
dead_letters = harness.dead_letters
generate = harness.generate
make_config = harness.make_config
read_offsets = harness.read_offsets
read_records = harness.read_records
run_ces2pg = harness.run_ces2pg
wait_applied = harness.wait_applied
wait_until = harness.wait_until
write_config = harness.write_config
_attach_log = harness._attach_log
metric = harness.metric
metric_sum = harness.metric_sum
run_lagging_bank = harness.run_lagging_bank
_tail_text = harness._tail_text

KAFKA_SCRIPT = ROOT / "tests" / "kafka" / "kafka-broker"

# Client settings of the daemons under test (on top of Event Hubs mode's own
# defaults, which these override): quick polls, and a short session so that
# a killed member leaves the group within seconds (the broker allows 1 s).
DAEMON_PROPERTIES = (
    "fetch.wait.max.ms=50",
    "session.timeout.ms=3000",
    "heartbeat.interval.ms=500",
)


# --------------------------------------------------------------------------
# The broker
# --------------------------------------------------------------------------


def _missing_tools():
    missing = [t for t in ("java", "openssl") if shutil.which(t) is None]
    lib = KAFKA_SCRIPT.parent / "target" / "lib"
    if shutil.which("mvn") is None and not any(lib.glob("kafka_2.13-*.jar")):
        missing.append("mvn")
    return missing


class RealKafka:
    """A broker run by tests/kafka/kafka-broker, with two listeners."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.log_path = self.dir / "kafka-broker.out"
        self._out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(KAFKA_SCRIPT), "run", str(self.dir)], stdout=self._out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.env = {}
        self._admin = None

    def wait_ready(self, timeout):
        env_file = self.dir / "broker.env"

        def env_written():
            self._check_running()
            return env_file.is_file()

        wait_until(env_written, timeout, interval=0.1,
                   message=lambda: "broker.env from kafka-broker; output:\n"
                   + _tail_text(self.log_path)[-3000:])
        for line in env_file.read_text().splitlines():
            key, _, value = line.partition("=")
            self.env[key] = value
        self.plaintext = self.env["PLAINTEXT_BOOTSTRAP"]
        self.sasl_ssl = self.env["SASL_SSL_BOOTSTRAP"]
        self.ca_file = self.env["CA_FILE"]
        self.connection_string_file = self.env["CONNECTION_STRING_FILE"]
        self.connection_string = Path(
            self.connection_string_file).read_text()
        self.broker_log = self.env["LOG_FILE"]

        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # Listening first (a client would log every refused connection),
        # then ready when both listeners answer a metadata request.
        for address in (self.plaintext, self.sasl_ssl):
            host, _, port = address.rpartition(":")

            def listening():
                self._check_running()
                try:
                    socket.create_connection((host, int(port)), 1).close()
                    return True
                except OSError:
                    return False

            wait_until(listening, timeout, interval=0.1,
                       message=lambda: f"the broker to listen on {address}; "
                       "broker log:\n"
                       + _tail_text(self.dir / "broker.log")[-3000:])
        for conf in (self.plaintext_config(), self.sasl_config()):
            client = AdminClient(conf)

            def answers():
                self._check_running()
                try:
                    return client.list_topics(timeout=2).brokers
                except KafkaException:
                    return None

            wait_until(answers, timeout, interval=0.2,
                       message=lambda: "the broker to answer on "
                       f"{conf['bootstrap.servers']}; broker log:\n"
                       + _tail_text(self.broker_log)[-3000:])
        self._admin = AdminClient(self.plaintext_config())

    def _check_running(self):
        rc = self.proc.poll()
        if rc is not None:
            raise RuntimeError(
                f"kafka-broker exited with {rc}:\n"
                + _tail_text(self.log_path)[-3000:] + "\nbroker log:\n"
                + _tail_text(self.dir / "broker.log")[-3000:])

    def plaintext_config(self):
        return {"bootstrap.servers": self.plaintext}

    def sasl_config(self, password=None, ca_file=None):
        """librdkafka settings of an Event Hubs client of this broker."""
        return {
            "bootstrap.servers": self.sasl_ssl,
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "$ConnectionString",
            "sasl.password": password or self.connection_string,
            "ssl.ca.location": ca_file or self.ca_file,
        }

    def create_topic(self, name, partitions):
        from confluent_kafka.admin import NewTopic

        futures = self._admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=30)
        futures[name].result(60)

        def visible():
            md = self._admin.list_topics(name, timeout=5).topics.get(name)
            return (md is not None and md.error is None
                    and len(md.partitions) == partitions)

        wait_until(visible, 30, interval=0.1,
                   message=f"topic {name} in the metadata")
        return name

    def producer(self, **extra):
        from confluent_kafka import Producer

        conf = dict(self.plaintext_config())
        conf.update({"enable.idempotence": True, "linger.ms": 5,
                     "acks": "all"})
        conf.update(extra)
        return Producer(conf)

    def produce(self, topic, values, partitions):
        """Produces values (bytes) to the given partitions in order; waits
        for delivery. Returns (partition, offset) per value."""
        producer = self.producer()
        placed = [None] * len(values)
        errors = []

        def on_delivery(index):
            def cb(err, msg):
                if err is not None:
                    errors.append((index, err))
                else:
                    placed[index] = (msg.partition(), msg.offset())
            return cb

        for i, (value, p) in enumerate(zip(values, partitions)):
            while True:
                try:
                    producer.produce(topic, value=value, partition=p,
                                     on_delivery=on_delivery(i))
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        left = producer.flush(60)
        assert left == 0, f"{left} record(s) not delivered"
        assert not errors, errors[:5]
        return placed

    def as_generator_target(self, topic, partitions):
        """What harness.generate() expects as its broker argument."""
        return SimpleNamespace(bootstrap=self.plaintext,
                               topics={topic: partitions})

    def stop_process(self, timeout=60):
        """Stops the broker with SIGTERM (a controlled shutdown), keeping its
        directory for start_again(); returns how long it took."""
        self._admin = None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"Kafka did not stop within {timeout}s of SIGTERM")
        finally:
            self._out.close()
        return time.monotonic() - started

    def start_again(self, timeout=120):
        """Runs the stopped broker again (kafka-broker rerun: the same ports,
        certificates and data); returns how long it took until both listeners
        answered."""
        started = time.monotonic()
        self._out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(KAFKA_SCRIPT), "rerun", str(self.dir)], stdout=self._out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.wait_ready(timeout)
        return time.monotonic() - started

    def stop(self):
        self._admin = None  # a client left would log refused reconnections
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._out.closed:
            self._out.close()


@pytest.fixture(scope="session")
def kafka():
    """The session's Apache Kafka broker (started once)."""
    missing = _missing_tools()
    if missing:
        why = ("real-broker tier needs " + ", ".join(missing)
               + " (Debian: openjdk-17-jdk-headless maven openssl)")
        if os.environ.get("CI") == "true":
            pytest.fail(why + ": under CI a skipped tier is a failure")
        pytest.skip(why)
    keep = os.environ.get("CES2PG_KAFKA_DIR")
    directory = Path(keep) if keep else Path(
        tempfile.mkdtemp(prefix="ces2pg-kafka-"))
    if keep:
        shutil.rmtree(directory, ignore_errors=True)
    # Fetching (Maven) is separate from starting, so each has its own time
    # limit; the first run on a fresh machine downloads about 60 MB.
    started = time.monotonic()
    r = subprocess.run([str(KAFKA_SCRIPT), "fetch"], capture_output=True,
                       text=True, timeout=900, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        pytest.fail(f"kafka-broker fetch failed:\n{r.stdout}\n{r.stderr}")
    fetched = time.monotonic()
    server = RealKafka(directory)
    try:
        server.wait_ready(120)
        print(f"\nkafka: fetched in {fetched - started:.1f}s, ready in "
              f"{time.monotonic() - fetched:.1f}s (PLAINTEXT {server.plaintext}"
              f", SASL_SSL {server.sasl_ssl})", file=sys.stderr)
        yield server
    finally:
        server.stop()
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def kafka_logs(kafka, request):
    """Attaches the broker's log to the test's failure report."""
    _attach_log(request, f"kafka broker log ({kafka.broker_log})",
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


@pytest.fixture
def other_ca(tmp_path):
    """A CA certificate (PEM) that did not sign the broker's certificate."""
    pem = tmp_path / "other-ca.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
         "-sha256", "-days", "1", "-subj", "/CN=not the broker's CA",
         "-keyout", str(tmp_path / "other-ca.key"), "-out", str(pem)],
        check=True, capture_output=True)
    return pem


def eventhubs_kafka_lines(kafka, connection_string=None, inline=False,
                          ca_file=None, tmp_path=None):
    """kafka section lines of Event Hubs mode against kafka's SASL_SSL
    listener: the connection string from its file (or inline, or the given
    one written to a file in tmp_path), and the test CA."""
    if connection_string is None and not inline:
        source = f"eventhubs_connection_string_file = " \
                 f"{harness._cfg_str(kafka.connection_string_file)};"
    else:
        conn = connection_string or kafka.connection_string
        if inline:
            source = f"eventhubs_connection_string = {harness._cfg_str(conn)};"
        else:
            path = Path(tmp_path) / f"conn-{abs(hash(conn)):x}.txt"
            path.write_text(conn + "\n")
            source = f"eventhubs_connection_string_file = " \
                     f"{harness._cfg_str(path)};"
    return [source, f"ssl_ca_file = {harness._cfg_str(ca_file or kafka.ca_file)};"]


@pytest.fixture
def eventhubs_daemon(kafka_logs, ces2pg, tmp_path):
    """Factory: eventhubs_daemon(db, topic, group=..., connection_string=None,
    inline=False, ca_file=None, properties=DAEMON_PROPERTIES,
    kafka_extra_lines=(), **make_config kwargs) -> Daemon in Event Hubs mode on
    the SASL_SSL listener (kafka_extra_lines: more lines of its kafka section).

    kafka.brokers is given (the SASL_SSL listener): the connection string's
    Endpoint names a namespace that does not resolve here."""

    def start(db, topic, group="ces2pg-test", connection_string=None,
              inline=False, ca_file=None, properties=DAEMON_PROPERTIES,
              kafka_extra_lines=(), **config_kw):
        lines = eventhubs_kafka_lines(kafka_logs, connection_string, inline,
                                      ca_file, tmp_path) + list(kafka_extra_lines)
        return ces2pg(db, kafka_logs.sasl_ssl, group=group, topics=(topic,),
                      properties=properties, kafka_extra=lines, **config_kw)

    return start
