"""PostgreSQL with Microsoft Entra ID (postgres.auth = "entra"): the access
token is the password, as on Azure Database for PostgreSQL. A role whose
password the test identity service (harness.identity) rotates to every token it
issues for PostgreSQL's audience stands in for Azure's token check at login.

ces2pg applies across rotations and expiries, fetches a fresh token once when a
login with its cached one is refused, waits out an outage of the token endpoint
(not ready, retrying, counted, `status` saying why), stops with exit 78 and one
ERROR line when Entra refuses the identity, and no token or secret appears in a
log, `status` output or /metrics. The Kafka side (SASL OAUTHBEARER) runs
against Apache Kafka in tests/realbroker/test_entra_kafka.py."""

import re
import time

from harness.common import free_port, wait_until
from harness.daemon import cfg_str, make_config, run_ces2pg, write_config, write_secret
from harness.events import event_record
from harness.identity import (POSTGRES_AUDIENCE, POSTGRES_SCOPE, identity_config,
                              invalid_secret_error)
from harness.metrics import http_get, metric, parse_metrics
from harness.progress import wait_applied

GROUP = "ces2pg-test"
EX_CONFIG = 78


def orders(n, start=0):
    """n new rows of dbo.orders, one source transaction each."""
    return [event_record("Orders", [("OrderId", "int"), ("Customer", "nvarchar(50)")],
                         {"OrderId": str(i), "Customer": f"c{i}"}, ["OrderId"])
            for i in range(start, start + n)]


def entra_role(db, entra_pg_role):
    """A rotated role that may create in db (what ces2pg needs), and its
    password-less conninfo over TCP."""
    rotation = entra_pg_role()
    db.server.sql(f'GRANT CREATE ON DATABASE "{db.name}" TO {rotation.role}')
    return rotation, rotation.conninfo_for(db.name)


def entra_daemon(ces2pg, db, broker, svc, conninfo, port=None, **identity):
    return ces2pg(db, broker, group=GROUP, conninfo=conninfo,
                  postgres_extra=('auth = "entra";', "retry_max_ms = 1000;"),
                  extra_config=identity_config(svc, **identity),
                  http_listen=f"127.0.0.1:{port}" if port else "")


def assert_no_secret(svc, *texts):
    secrets = [s for s in svc.secrets() if s]
    for text in texts:
        for s in secrets:
            assert s not in text, "a token or secret appears in ces2pg's output"


def test_applies_across_rotations_and_expiries(tmp_path, db, broker, ces2pg,
                                               identity_service, entra_pg_role):
    svc = identity_service
    svc.set(lifetime=8)
    rotation, conninfo = entra_role(db, entra_pg_role)
    b = broker(partitions=1)
    port = free_port()
    daemon = entra_daemon(ces2pg, db, b, svc, conninfo, port=port)
    b.produce("ces", orders(3), partition=0)
    wait_applied(db, GROUP, {0: 3}, daemons=[daemon])
    assert db.scalar("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'dbo'"
                     ) == rotation.role
    first = len(svc.issued_for(POSTGRES_AUDIENCE))
    assert first >= 1
    log = daemon.log()
    assert re.search(r"identity: new postgres token from Microsoft Entra ID, managed identity "
                     r".*audience https://ossrdbms-aad\.database\.windows\.net, expires "
                     r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(in \d+ s\)", log), log

    # The token expires; the session stays (PostgreSQL checks tokens at login only). Cut it:
    # the next login needs a new token, fetched because the cached one is too old.
    time.sleep(8.5)
    killed = db.server.sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE usename = %s", (rotation.role,))[0][0]
    assert killed >= 1
    b.produce("ces", orders(3, start=3), partition=0)
    wait_applied(db, GROUP, {0: 6}, daemons=[daemon])
    assert len(svc.issued_for(POSTGRES_AUDIENCE)) > first

    # Someone else's login rotates the password while ces2pg's cached token is still young:
    # its next login is refused, it fetches a fresh token once, and gets in.
    svc.set(lifetime=3600)
    db.server.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                  (rotation.role,))
    b.produce("ces", orders(1, start=6), partition=0)
    wait_applied(db, GROUP, {0: 7}, daemons=[daemon])
    svc.issue(POSTGRES_AUDIENCE)  # the rotation: ces2pg's cached token no longer logs in
    db.server.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                  (rotation.role,))
    b.produce("ces", orders(1, start=7), partition=0)
    wait_applied(db, GROUP, {0: 8}, daemons=[daemon])
    assert "PostgreSQL refused the login with a cached token" in daemon.log()
    assert db.scalar("SELECT count(*) FROM dbo.orders") == 8

    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    samples = parse_metrics(body)
    assert 0 < metric(samples, "ces2pg_identity_token_expiry_seconds", side="postgres") <= 3600
    assert metric(samples, "ces2pg_identity_token_fetch_failures_total", side="postgres") == 0
    assert metric(samples, "ces2pg_identity_token_expiry_seconds", side="kafka") is None
    assert daemon.terminate() == 0
    assert_no_secret(svc, daemon.log(), body)


def test_an_outage_of_the_token_endpoint_is_waited_out(tmp_path, db, broker, ces2pg,
                                                       identity_service, entra_pg_role):
    svc = identity_service
    _, conninfo = entra_role(db, entra_pg_role)
    svc.set(outage=True)
    b = broker(partitions=1)
    port = free_port()
    daemon = entra_daemon(ces2pg, db, b, svc, conninfo, port=port)
    b.produce("ces", orders(2), partition=0)
    daemon.wait_log(r"no token from Microsoft Entra ID.*HTTP 503")

    def failures():
        return metric(parse_metrics(http_get(f"http://127.0.0.1:{port}/metrics")[1]),
                      "ces2pg_identity_token_fetch_failures_total", side="postgres") or 0
    wait_until(lambda: failures() >= 2, 30, message="failed fetches counted")
    assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 503
    # The operator's view says why.
    cfg = write_config(tmp_path, make_config(
        db, b, group=GROUP, conninfo=conninfo, postgres_extra=('auth = "entra";',),
        extra_config=identity_config(svc)), name="status.conf")
    rc, out, err = run_ces2pg(["status", "-c", cfg])
    assert rc == 3, (rc, out, err)
    assert "no token from Microsoft Entra ID" in out + err and "503" in out + err, out + err
    assert daemon.alive()

    svc.set(outage=False)
    wait_applied(db, GROUP, {0: 2}, daemons=[daemon])
    wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30,
               message="/readyz 200 once a token came")
    assert daemon.terminate() == 0
    assert_no_secret(svc, daemon.log(), out, err)


def test_a_refused_client_secret_stops_with_exit_78(tmp_path, db, broker, ces2pg,
                                                     identity_service, entra_pg_role):
    svc = identity_service
    _, conninfo = entra_role(db, entra_pg_role)
    secret = write_secret(tmp_path / "client-secret", "not-" + svc.client_secret)
    b = broker(partitions=1)
    daemon = entra_daemon(ces2pg, db, b, svc, conninfo, source="client_secret",
                          client_id=svc.client_id, client_secret_file=secret)
    assert daemon.wait(30) == EX_CONFIG
    errors = [line for line in daemon.log().splitlines() if "AADSTS7000215" in line]
    assert errors and all(line.startswith("ERROR") for line in errors), daemon.log()
    assert "Invalid client secret provided." in errors[0]
    assert_no_secret(svc, daemon.log())
    assert "not-" + svc.client_secret not in daemon.log()


def test_check_config_fetches_a_token_when_asked(tmp_path, db, identity_service,
                                                  entra_pg_role):
    svc = identity_service
    _, conninfo = entra_role(db, entra_pg_role)
    text = make_config(db, "127.0.0.1:9", group=GROUP, conninfo=conninfo,
                       postgres_extra=('auth = "entra";',),
                       extra_config=identity_config(svc))
    cfg = write_config(tmp_path, text)
    rc, out, err = run_ces2pg(["--check-config", "-c", cfg])
    assert rc == 0 and svc.requests["imds"] == 0, err
    rc, out, err = run_ces2pg(["--check-config", "--fetch-tokens", "-c", cfg])
    assert rc == 0, err
    assert re.search(r"^postgres: a token from Microsoft Entra ID, managed identity .* for "
                     + re.escape(POSTGRES_SCOPE) + r": .*audience " + re.escape(POSTGRES_AUDIENCE),
                     out, re.M), out
    svc.fail_next(*invalid_secret_error(svc.client_id), endpoint="imds")
    rc, out, err = run_ces2pg(["--check-config", "--fetch-tokens", "-c", cfg])
    assert rc == EX_CONFIG and "AADSTS7000215" in err, (rc, err)
    svc.set(outage=True)
    rc, out, err = run_ces2pg(["--check-config", "--fetch-tokens", "-c", cfg])
    assert rc == 1 and "503" in err, (rc, err)
    assert_no_secret(svc, out, err)


def test_entra_settings_that_cannot_work(tmp_path, db):
    def check(pg=(), identity="", kafka_extra=()):
        text = make_config(db, "127.0.0.1:9", group=GROUP, postgres_extra=pg,
                           kafka_extra=kafka_extra, extra_config=identity)
        return run_ces2pg(["--check-config", "-c", write_config(tmp_path, text)])

    rc, _, err = check(pg=('auth = "token";',))
    assert rc == EX_CONFIG and "postgres.auth must be" in err, err
    pw = write_secret(tmp_path / "pw", "x")
    rc, _, err = check(pg=('auth = "entra";', f"password_file = {cfg_str(str(pw))};"))
    assert rc == EX_CONFIG and "takes no password_file" in err, err
    rc, _, err = check(pg=('auth = "entra";',), identity='identity = { source = "magic"; };')
    assert rc == EX_CONFIG and "identity.source must be one of" in err, err
    rc, _, err = check(pg=('auth = "entra";',),
                       identity='identity = { source = "client_secret"; };')
    assert rc == EX_CONFIG and "identity.client_secret_file" in err, err
    rc, _, err = check(pg=('auth = "entra";',),
                       identity='identity = { source = "workload_identity"; };')
    assert rc == EX_CONFIG and "identity:" in err, err
    rc, out, err = check(kafka_extra=('auth = "entra";',),
                         identity='identity = { source = "command"; command = "true"; };')
    assert rc == 0, err
    assert 'kafka.entra_scope = "https://127.0.0.1/.default"' in out, out
