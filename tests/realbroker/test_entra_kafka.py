"""Kafka with Microsoft Entra ID (kafka.auth = "entra"): SASL OAUTHBEARER on
Apache Kafka's OAUTH listener, which validates the test identity service's
tokens through its JWKS (signature, audience, expiry) and ends every session
after connections.max.reauth.ms, so that live connections need a current token.

A stream is applied exactly across more than five token lifetimes with
workload identity (the federated token file rotating meanwhile), with both
sides on Entra (PostgreSQL's password rotating to every token); each other
source (IMDS, App Service, a service principal's secret, a command) goes
through at least one refresh; a token for the wrong audience is the broker's
refusal, named as such; a refused client secret stops ces2pg with exit 78; an
outage of the token endpoint is waited out. No token, secret or assertion
appears in ces2pg's log."""

import json
import os
import sys
import threading
import time

from harness.common import free_port, wait_until
from harness.daemon import cfg_str, run_ces2pg, write_secret
from harness.events import event_record
from harness.identity import (EVENTHUBS_AUDIENCE, EVENTHUBS_SCOPE, POSTGRES_AUDIENCE,
                              identity_config)
from harness.metrics import http_get, metric, parse_metrics
from harness.progress import wait_applied
from harness.realkafka import DAEMON_PROPERTIES

GROUP = "ces2pg-test"
EX_CONFIG = 78
# The broker's session length: a connection lives at most this long on one token.
KAFKA_OAUTH_REAUTH_MS = 20000
_topics = iter(range(1, 1000))


def rows(start, n):
    return [event_record("Orders", [("OrderId", "int"), ("Customer", "nvarchar(50)")],
                         {"OrderId": str(i), "Customer": f"c{i}"}, ["OrderId"])
            for i in range(start, start + n)]


def new_topic(kafka, partitions=2):
    return kafka.create_topic(f"ces-entra-{os.getpid()}-{next(_topics)}", partitions)


def entra_daemon(ces2pg, db, kafka, topic, svc, port=None, scope=EVENTHUBS_SCOPE,
                 conninfo=None, postgres_extra=(), **identity):
    kafka_lines = ['auth = "entra";', f"entra_scope = {cfg_str(scope)};",
                   f"ssl_ca_file = {cfg_str(kafka.ca_file)};"]
    return ces2pg(db, kafka.oauth, group=GROUP, topics=(topic,),
                  properties=DAEMON_PROPERTIES, kafka_extra=kafka_lines,
                  conninfo=conninfo, postgres_extra=postgres_extra,
                  extra_config=identity_config(svc, **identity),
                  http_listen=f"127.0.0.1:{port}" if port else "")


def assert_applied_exactly(db, n):
    got = db.query("SELECT orderid, customer FROM dbo.orders ORDER BY orderid")
    assert got == [(i, f"c{i}") for i in range(n)], got[:5]


def assert_no_secret(svc, text):
    for s in svc.secrets():
        if s:
            assert s not in text, "a token or secret appears in ces2pg's log"


def paced(kafka, topic, start, n, seconds):
    """Produces n rows evenly over seconds, on a thread; returns it."""
    def run():
        for i in range(n):
            kafka.produce(topic, rows(start + i, 1), [i % 2])
            time.sleep(seconds / n)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_five_lifetimes_with_workload_identity_both_sides(tmp_path, db, ces2pg, kafka_oauth_logs,
                                                           identity_service, entra_pg_role):
    """AKS workload identity: the assertion file rotates like the kubelet's; Kafka's token
    lives 20 s (as long as a broker session), PostgreSQL's password rotates with every token."""
    kafka, svc = kafka_oauth_logs, identity_service
    svc.set(lifetime=20)
    client = svc.add_federated_client()
    assertion = tmp_path / "azure-identity-token"
    svc.write_federated_token_file(assertion)
    rotation = entra_pg_role()
    db.server.sql(f'GRANT CREATE ON DATABASE "{db.name}" TO {rotation.role}')
    t = new_topic(kafka)
    port = free_port()
    daemon = entra_daemon(ces2pg, db, kafka, t, svc, port=port, source="workload_identity",
                          client_id=client, federated_token_file=assertion,
                          conninfo=rotation.conninfo_for(db.name),
                          postgres_extra=('auth = "entra";',))
    started = time.monotonic()
    producer = paced(kafka, t, 0, 240, 110)
    time.sleep(55)
    svc.write_federated_token_file(assertion)  # the kubelet's rotation
    producer.join(120)
    wait_applied(db, GROUP, {0: 120, 1: 120}, topic=t, daemons=[daemon], timeout=90)
    assert time.monotonic() - started >= 5 * 20
    assert_applied_exactly(db, 240)
    kafka_tokens = svc.issued_for(EVENTHUBS_AUDIENCE)
    assert len(kafka_tokens) >= 6, len(kafka_tokens)
    assert all(i.source == "token" and i.client_id == client for i in kafka_tokens)
    assert svc.issued_for(POSTGRES_AUDIENCE), "PostgreSQL got no token"
    samples = parse_metrics(http_get(f"http://127.0.0.1:{port}/metrics")[1])
    assert 0 < metric(samples, "ces2pg_identity_token_expiry_seconds", side="kafka") <= 20
    assert metric(samples, "ces2pg_identity_token_fetch_failures_total", side="kafka") == 0
    assert daemon.terminate() == 0
    log = daemon.log()
    assert log.count("identity: new kafka token from Microsoft Entra ID, workload identity") >= 6
    assert "refused" not in log, log[-3000:]
    assert_no_secret(svc, log)


def command_script(tmp_path, svc):
    """A token command like `az account get-access-token`: it asks the v2.0 endpoint for the
    scope ces2pg gives it (CES2PG_TOKEN_SCOPE) and prints az's JSON."""
    secret = write_secret(tmp_path / "sp-secret", svc.client_secret)
    script = tmp_path / "get-token"
    script.write_text(f"""#!{sys.executable}
import json, os, urllib.parse, urllib.request
form = urllib.parse.urlencode({{"client_id": {svc.client_id!r},
    "client_secret": open({str(secret)!r}).read(), "grant_type": "client_credentials",
    "scope": os.environ["CES2PG_TOKEN_SCOPE"]}}).encode()
with urllib.request.urlopen({svc.token_url()!r}, form, timeout=5) as r:
    body = json.load(r)
import time
print(json.dumps({{"accessToken": body["access_token"], "tokenType": "Bearer",
                  "expires_on": int(time.time()) + body["expires_in"]}}))
""")
    script.chmod(0o700)
    return script


def test_each_source_goes_through_a_refresh(tmp_path, db, ces2pg, kafka_oauth_logs,
                                             identity_service, monkeypatch):
    kafka, svc = kafka_oauth_logs, identity_service
    svc.set(lifetime=8)
    # identity.source: (its keys, the identity service's endpoint it asks, how the log names it)
    sources = {
        "managed_identity": ({}, "imds", "managed identity (IMDS "),
        "app_service": ({"identity_endpoint": svc.app_service_url}, "app_service",
                        "managed identity (App Service endpoint "),
        "client_secret": ({"client_id": svc.client_id,
                           "client_secret_file": write_secret(tmp_path / "secret",
                                                              svc.client_secret)}, "token",
                          "service principal with a client secret (tenant "),
        "command": ({"command": str(command_script(tmp_path, svc))}, "token", "command ("),
    }
    monkeypatch.setenv("IDENTITY_HEADER", svc.identity_header)
    for source, (keys, endpoint, named) in sources.items():
        db.query("DROP SCHEMA IF EXISTS dbo CASCADE")
        db.query("DROP SCHEMA IF EXISTS ces2pg CASCADE")
        t = new_topic(kafka)
        before = len(svc.issued_for(EVENTHUBS_AUDIENCE))
        daemon = entra_daemon(ces2pg, db, kafka, t, svc, source=source, **keys)
        kafka.produce(t, rows(0, 10), [0, 1] * 5)
        wait_applied(db, GROUP, {0: 5, 1: 5}, topic=t, daemons=[daemon], timeout=60)
        if source == "managed_identity":
            # ces2pg status reads the group and the watermarks with the same identity.
            rc, out, err = run_ces2pg(["status", "--json", "-c", daemon.config_path])
            st = json.loads(out)
            assert (rc, st["health"], st["members"]) == (0, "OK", 1), out + err
            assert sum(p["high_watermark"] for p in st["partitions"]) == 10, st
            assert_no_secret(svc, out + err)
        # A refresh at 80% of the token's life, and the stream still applies after it.
        wait_until(lambda: daemon.log().count(
            "identity: new kafka token from Microsoft Entra ID, " + named) >= 2, 30,
            message=f"{source}: the daemon's second Kafka token")
        kafka.produce(t, rows(10, 10), [0, 1] * 5)
        wait_applied(db, GROUP, {0: 10, 1: 10}, topic=t, daemons=[daemon], timeout=60)
        assert_applied_exactly(db, 20)
        issued = svc.issued_for(EVENTHUBS_AUDIENCE)[before:]
        assert {i.source for i in issued} == {endpoint}, (source, issued)
        assert daemon.terminate() == 0, source
        log = daemon.log()
        assert log.count("identity: new kafka token from Microsoft Entra ID, " + named) >= 2, \
            (source, log[-2000:])
        assert_no_secret(svc, log)


def test_a_token_for_another_audience_is_the_brokers_refusal(tmp_path, db, ces2pg,
                                                             kafka_oauth_logs, identity_service):
    kafka, svc = kafka_oauth_logs, identity_service
    t = new_topic(kafka)
    other = "https://someone-else.servicebus.windows.net/.default"
    daemon = entra_daemon(ces2pg, db, kafka, t, svc, scope=other)
    assert daemon.wait(60) == 1
    log = daemon.log()
    assert "the broker refused the Microsoft Entra token (audience " + other in log, log[-3000:]
    assert "invalid_token" in log
    assert_no_secret(svc, log)


def test_a_refused_client_secret_stops_with_exit_78(tmp_path, db, ces2pg, kafka_oauth_logs,
                                                     identity_service):
    kafka, svc = kafka_oauth_logs, identity_service
    t = new_topic(kafka)
    wrong = write_secret(tmp_path / "secret", "wrong-" + svc.client_secret)
    daemon = entra_daemon(ces2pg, db, kafka, t, svc, source="client_secret",
                          client_id=svc.client_id, client_secret_file=wrong)
    assert daemon.wait(60) == EX_CONFIG
    log = daemon.log()
    errors = [line for line in log.splitlines() if line.startswith("ERROR")]
    assert any("AADSTS7000215: Invalid client secret provided." in e for e in errors), log
    assert "wrong-" + svc.client_secret not in log
    assert_no_secret(svc, log)


def test_an_outage_of_the_token_endpoint_is_waited_out(tmp_path, db, ces2pg, kafka_oauth_logs,
                                                       identity_service):
    kafka, svc = kafka_oauth_logs, identity_service
    t = new_topic(kafka)
    svc.set(outage=True)
    port = free_port()
    daemon = entra_daemon(ces2pg, db, kafka, t, svc, port=port)
    kafka.produce(t, rows(0, 4), [0, 1] * 2)
    daemon.wait_log(r"identity: no kafka token from Microsoft Entra ID.*yet.*HTTP 503")
    assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 503
    failures = metric(parse_metrics(http_get(f"http://127.0.0.1:{port}/metrics")[1]),
                      "ces2pg_identity_token_fetch_failures_total", side="kafka")
    assert failures >= 1
    svc.set(outage=False)
    wait_applied(db, GROUP, {0: 2, 1: 2}, topic=t, daemons=[daemon], timeout=60)
    assert_applied_exactly(db, 4)
    assert daemon.terminate() == 0
    assert_no_secret(svc, daemon.log())
