"""Real-broker test tier: ces2pg against Apache Kafka configured like the
Azure Event Hubs Kafka endpoint (SASL_SSL, PLAIN, user "$ConnectionString",
an Event Hubs connection string as the password, a private CA).

Run with Debian's interpreter, after building:

    CES2PG_BUILD=build-asan /usr/bin/python3 -m pytest tests/realbroker

The test harness (tests/harness, on sys.path through pytest.ini's pythonpath)
gives the fixtures of every suite (harness.fixtures): PostgreSQL, the ces2pg
daemon factory, and

- ``kafka`` (session): one broker started by tests/harness/kafka/kafka-broker
  (it fetches Apache Kafka through Maven on first use). Skips the tier when
  Java or Maven is missing (scripts/test turns that into a failure under CI).
- ``topic`` (factory): a new topic with N partitions, named after the test.

Test modules import the helpers from the harness's modules (harness.realkafka
for the broker's). This file adds:

- ``eventhubs_daemon`` (factory): a ces2pg daemon in Event Hubs mode.
- ``other_ca``: a CA certificate that did not sign the broker's.

Environment: CES2PG_KAFKA_DIR keeps the broker's directory there (default: a
temporary directory, removed at the end).
"""

import subprocess

import pytest

# Before the harness is imported, so that its asserts explain their failures.
pytest.register_assert_rewrite("harness")

from harness.realkafka import DAEMON_PROPERTIES, eventhubs_kafka_lines  # noqa: E402

pytest_plugins = ("harness.fixtures",)


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
