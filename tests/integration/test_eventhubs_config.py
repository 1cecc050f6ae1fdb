"""Event Hubs mode in the configuration: kafka.eventhubs_connection_string
(or _file) sets SASL_SSL/PLAIN and the bootstrap servers, and the string is
a secret that no message shows. (The real-broker tier, tests/realbroker,
runs Event Hubs mode against Apache Kafka.)"""

import time

from harness.daemon import (EX_CONFIG, cfg_str, make_config, run_ces2pg, write_config,
                            write_secret)

CONNINFO = "host=127.0.0.1 port=1 dbname=nowhere user=postgres"
KEY = "c2VjcmV0LWtleS1vZi10aGUtdGVzdHM9PT09PT09PT0="
CONN = ("Endpoint=sb://contoso-ces.servicebus.windows.net/;"
        "SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=" + KEY)


def check(tmp_path, kafka_extra, broker=None, **kw):
    text = make_config(conninfo=kw.pop("conninfo", CONNINFO), broker=broker,
                       kafka_extra=kafka_extra, **kw)
    path = write_config(tmp_path, text, name="ces2pg.conf")
    rc, out, err = run_ces2pg(["--check-config", "-c", path])
    assert KEY not in out + err, "the connection string was shown"
    return path, rc, out, err


def test_brokers_derived_from_endpoint(tmp_path):
    _, rc, out, err = check(tmp_path, [
        f"eventhubs_connection_string = {cfg_str(CONN)};"])
    assert rc == 0, err
    assert 'kafka.brokers = "contoso-ces.servicebus.windows.net:9093"' in out
    assert "kafka.eventhubs_connection_string = (set)" in out, out


def test_brokers_given_win(tmp_path):
    _, rc, out, err = check(tmp_path, [
        f"eventhubs_connection_string = {cfg_str(CONN)};"],
        broker="127.0.0.1:19093")
    assert rc == 0, err
    assert 'kafka.brokers = "127.0.0.1:19093"' in out, out


def test_connection_string_file_is_trimmed(tmp_path):
    secret = tmp_path / "eventhubs.secret"
    write_secret(secret, f"\n  {CONN}  \r\n")
    _, rc, out, err = check(tmp_path, [
        f"eventhubs_connection_string_file = {cfg_str(secret)};"])
    assert rc == 0, err
    assert 'kafka.brokers = "contoso-ces.servicebus.windows.net:9093"' in out
    assert "kafka.eventhubs_connection_string = (set)" in out, out
    assert str(secret) in out, out


def test_connection_string_file_missing(tmp_path):
    missing = tmp_path / "nope.secret"
    path, rc, _, err = check(tmp_path, [
        f"eventhubs_connection_string_file = {cfg_str(missing)};"])
    assert rc == EX_CONFIG, err
    assert "kafka.eventhubs_connection_string_file" in err, err
    assert str(missing) in err and str(path) in err, err


def test_connection_string_file_empty(tmp_path):
    empty = tmp_path / "empty.secret"
    write_secret(empty, " \n")
    _, rc, _, err = check(tmp_path, [
        f"eventhubs_connection_string_file = {cfg_str(empty)};"])
    assert rc == EX_CONFIG, err
    assert "empty" in err, err


def test_both_sources_refused(tmp_path):
    secret = tmp_path / "eventhubs.secret"
    write_secret(secret, CONN)
    _, rc, _, err = check(tmp_path, [
        f"eventhubs_connection_string = {cfg_str(CONN)};",
        f"eventhubs_connection_string_file = {cfg_str(secret)};"])
    assert rc == EX_CONFIG, err
    assert "not both" in err, err


def test_no_endpoint_refused_without_echo(tmp_path):
    bad = "SharedAccessKeyName=x;SharedAccessKey=" + KEY
    _, rc, _, err = check(tmp_path, [
        f"eventhubs_connection_string = {cfg_str(bad)};"])
    assert rc == EX_CONFIG, err
    assert "Endpoint=sb://" in err and "not shown" in err, err


def test_brokers_required_without_connection_string(tmp_path):
    path, rc, _, err = check(tmp_path, ["poll_ms = 100;"])  # no brokers
    assert rc == EX_CONFIG, err
    assert "kafka.brokers" in err and str(path) in err, err


def test_sasl_password_property_conflicts(tmp_path):
    _, rc, _, err = check(
        tmp_path, [f"eventhubs_connection_string = {cfg_str(CONN)};"],
        properties=("sasl.password=" + KEY,))
    assert rc == EX_CONFIG, err
    assert "sasl.password" in err, err


def test_recommended_settings_overridable(tmp_path):
    _, rc, _, err = check(
        tmp_path, [f"eventhubs_connection_string = {cfg_str(CONN)};"],
        properties=("session.timeout.ms=10000", "metadata.max.age.ms=60000"))
    assert rc == 0, err


def test_ssl_ca_file_must_be_readable(tmp_path):
    missing = tmp_path / "ca.pem"
    _, rc, _, err = check(tmp_path, [f"ssl_ca_file = {cfg_str(missing)};"],
                          broker="127.0.0.1:9093")
    assert rc == EX_CONFIG, err
    assert "kafka.ssl_ca_file" in err and str(missing) in err, err


def test_unreachable_broker_is_retried(db, broker, ces2pg, tmp_path):
    """A broker that does not answer is transient: ces2pg keeps trying
    (and stops cleanly on SIGTERM), and logs no secret meanwhile."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    daemon = ces2pg(db, f"127.0.0.1:{port}", kafka_extra=[
        f"eventhubs_connection_string = {cfg_str(CONN)};"],
        log_level="debug", properties=("debug=conf,security,broker",))
    daemon.wait_log(r"kafka: .*Connection refused", timeout=30)
    time.sleep(3)
    daemon.check_alive()
    assert daemon.terminate() == 0
    log = daemon.log()
    assert "sasl.password" in log, "librdkafka printed no configuration"
    assert KEY not in log and "SharedAccessKey" not in log, log[-2000:]


def test_loose_secret_file_refused(tmp_path):
    """A connection string file its group or others may read is refused (as
    libpq refuses a loose ~/.pgpass), with the fix, never the secret."""
    secret = write_secret(tmp_path / "eventhubs.secret", CONN)
    secret.chmod(0o644)
    path, rc, _, err = check(tmp_path, [
        f"eventhubs_connection_string_file = {cfg_str(secret)};"])
    assert rc == EX_CONFIG, err
    assert f"{path}:" in err and "kafka.eventhubs_connection_string_file" in err, err
    assert "readable by its group or others (mode 0644)" in err, err
    assert f"chmod 600 '{secret}'" in err, err
    secret.chmod(0o640)  # group-readable is loose unless root owns the file
    _, rc, _, err = check(tmp_path, [
        f"eventhubs_connection_string_file = {cfg_str(secret)};"])
    assert rc == (0 if secret.stat().st_uid == 0 else EX_CONFIG), err


def test_loose_configuration_with_a_secret_refused(tmp_path, monkeypatch):
    """A configuration file that holds a secret in its own text must be as
    private as a secret file; one that refers to the environment need not."""
    for line, key in ((f"eventhubs_connection_string = {cfg_str(CONN)};",
                       "kafka.eventhubs_connection_string"),):
        path, rc, _, _ = check(tmp_path, [line])
        assert rc == 0
        path.chmod(0o644)
        rc, out, err = run_ces2pg(["--check-config", "-c", path])
        assert rc == EX_CONFIG, err
        assert f"{key}: '{path}' holds a secret" in err, err
        assert KEY not in out + err
    monkeypatch.setenv("CES_TEST_EH_KEY", KEY)
    by_reference = CONN.replace(KEY, "${CES_TEST_EH_KEY}")
    path, _, _, _ = check(tmp_path, [
        f"eventhubs_connection_string = {cfg_str(by_reference)};"])
    path.chmod(0o644)
    rc, out, err = run_ces2pg(["--check-config", "-c", path])
    assert rc == 0, err
    for conninfo, loose in ((CONNINFO + " password=hunter2", True),
                            ("postgresql://u:hunter2@127.0.0.1:1/db", True),
                            (CONNINFO + " password=${CES_TEST_EH_KEY}", False)):
        path, rc, _, err = check(tmp_path, [], broker="127.0.0.1:1", conninfo=conninfo)
        assert rc == 0, err
        path.chmod(0o644)
        rc, out, err = run_ces2pg(["--check-config", "-c", path])
        assert rc == (EX_CONFIG if loose else 0), (conninfo, err)
        assert "hunter2" not in out + err
        if loose:
            assert "postgres.conninfo: " in err and "chmod 600" in err, err
    path, rc, _, err = check(tmp_path, [], broker="127.0.0.1:1",
                             properties=("sasl.password=hunter2",))
    path.chmod(0o644)
    rc, out, err = run_ces2pg(["--check-config", "-c", path])
    assert rc == EX_CONFIG and "kafka.properties: " in err, err
