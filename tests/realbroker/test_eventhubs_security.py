"""Event Hubs authentication against a real broker: a wrong password and a
wrong CA stop ces2pg with a clear error instead of retrying forever, and the
connection string never shows in a log or in --check-config."""

import re
from pathlib import Path

from harness.common import CES2PG
from harness.daemon import make_config, run_ces2pg, write_config
from harness.events import generate
from harness.progress import wait_applied
from harness.realkafka import eventhubs_kafka_lines
from harness.tables import assert_tables_match

GROUP = "ces2pg-test"
# ces2pg's exit status for a fatal error other than configuration.
EXIT_FATAL = 1


def wrong_connection_string(kafka):
    good = kafka.connection_string
    key = good.split("SharedAccessKey=", 1)[1]
    bad = good.replace(key, "A" * len(key))
    assert bad != good
    return bad


def test_wrong_password_stops_with_a_clear_error(db, kafka, topic,
                                                 eventhubs_daemon):
    t = topic(1)
    daemon = eventhubs_daemon(db, t, connection_string=wrong_connection_string(
        kafka))
    rc = daemon.wait(timeout=60)
    log = daemon.log()
    assert rc == EXIT_FATAL, f"exit {rc}:\n{log[-3000:]}"
    assert re.search(r"^ERROR .*authentication failed.*Invalid username or "
                     r"password", log, re.M), log[-3000:]


def test_wrong_ca_stops_with_a_clear_error(db, kafka, topic, other_ca,
                                           eventhubs_daemon):
    t = topic(1)
    daemon = eventhubs_daemon(db, t, ca_file=other_ca)
    rc = daemon.wait(timeout=60)
    log = daemon.log()
    assert rc == EXIT_FATAL, f"exit {rc}:\n{log[-3000:]}"
    assert re.search(r"^ERROR .*TLS failure.*certificate verify failed", log,
                     re.M), log[-3000:]


def test_connection_string_never_shown(tmp_path, db, kafka, topic,
                                       eventhubs_daemon):
    secret = kafka.connection_string
    key = secret.split("SharedAccessKey=", 1)[1]
    wrong = wrong_connection_string(kafka)
    wrong_key = wrong.split("SharedAccessKey=", 1)[1]

    # --check-config: inline and from a file, brokers derived from Endpoint.
    for inline in (True, False):
        text = make_config(
            db, None, topics=("ces",), kafka_extra=eventhubs_kafka_lines(
                kafka, inline=inline, tmp_path=tmp_path))
        cfg = write_config(tmp_path, text)
        rc, out, err = run_ces2pg(["--check-config", "-c", cfg])
        assert rc == 0, err
        assert "kafka.eventhubs_connection_string = (set)" in out, out
        assert ('kafka.brokers = "ces2pg-test.servicebus.windows.net:9093"'
                in out), out
        assert key not in out + err

    # A daemon at debug level with all of librdkafka's debug contexts (which
    # print its configuration), through a stream, and one with a wrong key.
    t = topic(2)
    expect = generate(tmp_path, seed=77, events=300,
                      broker=kafka.as_generator_target(t, 2), topic=t)
    counts = {int(p): n for p, n in expect["partition_records"].items()}
    noisy = eventhubs_daemon(
        db, t, group=GROUP, inline=True, log_level="debug",
        properties=("debug=all", "session.timeout.ms=3000",
                    "heartbeat.interval.ms=500"))
    wait_applied(db, GROUP, counts, timeout=90, topic=t, daemons=[noisy])
    assert_tables_match(db, expect)
    assert noisy.terminate() == 0
    refused = eventhubs_daemon(db, t, group="other", connection_string=wrong,
                               inline=True, log_level="debug",
                               properties=("debug=conf,security,broker",))
    assert refused.wait(timeout=60) == EXIT_FATAL

    noisy_log = noisy.log()
    assert "sasl.password" in noisy_log, "librdkafka printed no configuration"
    assert "SharedAccessKey" not in noisy_log
    logs = list(Path(tmp_path).glob("*.log"))
    assert len(logs) >= 2, logs
    for path in logs:
        text = path.read_text(errors="replace")
        for needle in (secret, key, wrong, wrong_key):
            assert needle not in text, f"{path} shows the connection string"
    assert CES2PG.is_file()
