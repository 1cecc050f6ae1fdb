"""Apache Kafka configured like the Azure Event Hubs Kafka endpoint (SASL_SSL,
PLAIN, user "$ConnectionString", an Event Hubs connection string as the
password, a private CA), run by kafka/kafka-broker next to this file (it
fetches the pinned release through Maven on first use), and the kafka section
of a ces2pg in Event Hubs mode against it.

RealKafka.stop_process() and start_again() stop the broker and run it again
on the same ports and data (the chaos tier's broker outage).

RealKafka(directory, oauth_jwks_url=...) adds the OAUTH listener (Event Hubs
with Microsoft Entra ID: SASL_SSL, OAUTHBEARER, tokens checked against that
JWKS document, as harness.identity's service signs them): its address is
.oauth, and oauth_config() the settings of a client of it.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from harness.common import produce_all, wait_until
from harness.daemon import cfg_str
from harness.reports import tail_text

KAFKA_SCRIPT = Path(__file__).resolve().parent / "kafka" / "kafka-broker"

# Client settings of the daemons under test (on top of Event Hubs mode's own
# defaults, which these override): quick polls, and a short session so that
# a killed member leaves the group within seconds (the broker allows 1 s).
DAEMON_PROPERTIES = (
    "fetch.wait.max.ms=50",
    "session.timeout.ms=3000",
    "heartbeat.interval.ms=500",
)


def missing_tools():
    """The programs the broker needs that are not installed (Maven only
    until the release is fetched)."""
    missing = [t for t in ("java", "openssl") if shutil.which(t) is None]
    lib = KAFKA_SCRIPT.parent / "target" / "lib"
    if shutil.which("mvn") is None and not any(lib.glob("kafka_2.13-*.jar")):
        missing.append("mvn")
    return missing


def fetch_or_skip():
    """Fetches the pinned release (kafka-broker fetch) unless it is there; a
    missing tool skips the test, and fails it under CI (CI=true)."""
    import pytest

    missing = missing_tools()
    if missing:
        why = ("real-broker tier needs " + ", ".join(missing)
               + " (Debian: openjdk-17-jdk-headless maven openssl)")
        if os.environ.get("CI") == "true":
            pytest.fail(why + ": under CI a skipped tier is a failure")
        pytest.skip(why)
    # Fetching (Maven) has its own time limit; the first run on a fresh
    # machine downloads about 60 MB.
    r = subprocess.run([str(KAFKA_SCRIPT), "fetch"], capture_output=True,
                       text=True, timeout=900, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        pytest.fail(f"kafka-broker fetch failed:\n{r.stdout}\n{r.stderr}")


@contextlib.contextmanager
def running(directory, remove, label, **kwargs):
    """A RealKafka(directory, **kwargs) ready for clients while the block
    runs, stopped after it (and its directory removed when remove)."""
    started = time.monotonic()
    server = RealKafka(directory, **kwargs)
    try:
        server.wait_ready(120)
        listeners = f"PLAINTEXT {server.plaintext}, SASL_SSL {server.sasl_ssl}"
        if server.oauth:
            listeners += f", OAUTH {server.oauth}"
        print(f"\n{label}: ready in {time.monotonic() - started:.1f}s ({listeners})",
              file=sys.stderr)
        yield server
    finally:
        server.stop()
        if remove:
            shutil.rmtree(directory, ignore_errors=True)


class RealKafka:
    """A broker run by kafka/kafka-broker, with two listeners, or three with
    OAUTH: oauth_jwks_url enables it (oauth_audience, default the Event Hubs
    namespace https://ces2pg-test.servicebus.windows.net; oauth_reauth_ms,
    default 20000: how long a session lasts before the broker wants a new
    token; oauth_issuer: the iss required, default any)."""

    def __init__(self, directory, oauth_jwks_url=None, oauth_audience=None,
                 oauth_reauth_ms=None, oauth_issuer=None):
        self.dir = Path(directory)
        self.log_path = self.dir / "kafka-broker.out"
        self._out = open(self.log_path, "ab")
        env = dict(os.environ)
        for name, value in (("KAFKA_OAUTH_JWKS_URL", oauth_jwks_url),
                            ("KAFKA_OAUTH_AUDIENCE", oauth_audience),
                            ("KAFKA_OAUTH_REAUTH_MS", oauth_reauth_ms),
                            ("KAFKA_OAUTH_ISSUER", oauth_issuer)):
            env.pop(name, None)
            if value is not None:
                env[name] = str(value)
        self.proc = subprocess.Popen(
            [str(KAFKA_SCRIPT), "run", str(self.dir)], stdout=self._out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.env = {}
        self.oauth = None
        self._admin = None

    def wait_ready(self, timeout):
        env_file = self.dir / "broker.env"

        def env_written():
            self._check_running()
            return env_file.is_file()

        wait_until(env_written, timeout, interval=0.1,
                   message=lambda: "broker.env from kafka-broker; output:\n"
                   + tail_text(self.log_path)[-3000:])
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
        self.oauth = self.env.get("OAUTH_BOOTSTRAP")
        self.oauth_audience = self.env.get("OAUTH_AUDIENCE")
        self.oauth_reauth_ms = int(self.env.get("OAUTH_REAUTH_MS") or 0)

        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # Listening first (a client would log every refused connection),
        # then ready when both listeners answer a metadata request (OAUTH,
        # which needs a token, is up with them).
        for address in filter(None, (self.plaintext, self.sasl_ssl, self.oauth)):
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
                       + tail_text(self.dir / "broker.log")[-3000:])
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
                       + tail_text(self.broker_log)[-3000:])
        self._admin = AdminClient(self.plaintext_config())

    def _check_running(self):
        rc = self.proc.poll()
        if rc is not None:
            raise RuntimeError(
                f"kafka-broker exited with {rc}:\n"
                + tail_text(self.log_path)[-3000:] + "\nbroker log:\n"
                + tail_text(self.dir / "broker.log")[-3000:])

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

    def oauth_config(self, ca_file=None, **extra):
        """librdkafka settings of an Event Hubs client of the OAUTH listener
        (with Microsoft Entra ID): the token comes from the client's refresh
        callback (confluent_kafka: extra oauth_cb=...)."""
        assert self.oauth, "the broker was started without oauth_jwks_url"
        conf = {
            "bootstrap.servers": self.oauth,
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "OAUTHBEARER",
            "ssl.ca.location": ca_file or self.ca_file,
        }
        conf.update(extra)
        return conf

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
        return produce_all(self.producer(), topic, values, partitions)

    def as_generator_target(self, topic, partitions):
        """What harness.events.generate() expects as its broker argument."""
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


def eventhubs_kafka_lines(kafka, connection_string=None, inline=False,
                          ca_file=None, tmp_path=None):
    """kafka section lines of Event Hubs mode against kafka's SASL_SSL
    listener: the connection string from its file (or inline, or the given
    one written to a file in tmp_path), and the test CA."""
    if connection_string is None and not inline:
        source = f"eventhubs_connection_string_file = " \
                 f"{cfg_str(kafka.connection_string_file)};"
    else:
        conn = connection_string or kafka.connection_string
        if inline:
            source = f"eventhubs_connection_string = {cfg_str(conn)};"
        else:
            path = Path(tmp_path) / f"conn-{abs(hash(conn)):x}.txt"
            path.write_text(conn + "\n")
            path.chmod(0o600)  # ces2pg refuses a secret others may read
            source = f"eventhubs_connection_string_file = " \
                     f"{cfg_str(path)};"
    return [source, f"ssl_ca_file = {cfg_str(ca_file or kafka.ca_file)};"]
