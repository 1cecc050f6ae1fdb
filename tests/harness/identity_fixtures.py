"""The pytest fixtures of the identity service (harness.identity), imported by
harness.fixtures, so every suite has them:

- ``identity_server`` (session): the one IdentityService of the session, on one
  port throughout: the Kafka brokers with an OAUTH listener trust its JWKS.
- ``identity_service`` (per test): identity_server, reset to its defaults
  before and after the test (lifetime 3600 s, no delay, outage, forced errors
  or hooks; counters and logs emptied; listening), its request log attached
  to the test's failure report.
- ``kafka_oauth`` (module): Apache Kafka with the OAUTH listener
  (harness.realkafka.RealKafka(..., oauth_jwks_url=identity_server.jwks_url))
  for the tests of one module; a module sets KAFKA_OAUTH_REAUTH_MS (default
  20000) to choose connections.max.reauth.ms. Skips like ``kafka``.
- ``kafka_oauth_logs``: kafka_oauth, with its log attached to the test's
  failure report.
- ``entra_pg_role`` (factory): entra_pg_role(name=None) -> a PostgreSQL role
  whose password is each token identity_service issues for PostgreSQL's
  audience (harness.identity.PostgresRotation); rotation undone afterwards.

Environment: CES2PG_KAFKA_DIR keeps the OAUTH broker's directories under
<it>-oauth-<module> (default: temporary directories, removed at the end).
"""

import itertools
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from harness import reports
from harness.identity import IdentityService
from harness.realkafka import fetch_or_skip, running


@pytest.fixture(scope="session")
def identity_server():
    """The session's identity service (started once)."""
    directory = Path(tempfile.mkdtemp(prefix="ces2pg-identity-"))
    service = IdentityService(log_path=directory / "identity-service.log").start()
    try:
        yield service
    finally:
        service.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def identity_service(identity_server, request, tmp_path):
    """The session's identity service with its defaults, for one test."""
    log = tmp_path / "identity-service.log"
    log.touch()
    identity_server.reset(log_path=log)
    identity_server.start()  # a test before may have left it stopped
    reports.attach_log(request, f"identity service requests ({log})", log)
    yield identity_server
    identity_server.reset()
    identity_server.start()


@pytest.fixture(scope="module")
def kafka_oauth(identity_server, request):
    """Apache Kafka with an OAUTH listener trusting identity_server, for one
    module (its KAFKA_OAUTH_REAUTH_MS sets connections.max.reauth.ms)."""
    fetch_or_skip()
    reauth_ms = getattr(request.module, "KAFKA_OAUTH_REAUTH_MS", 20000)
    keep = os.environ.get("CES2PG_KAFKA_DIR")
    if keep:
        name = re.sub(r"[^A-Za-z0-9]+", "-", request.module.__name__)
        directory = Path(f"{keep}-oauth-{name}")
        shutil.rmtree(directory, ignore_errors=True)
    else:
        directory = Path(tempfile.mkdtemp(prefix="ces2pg-kafka-oauth-"))
    with running(directory, not keep, f"kafka (OAUTH, reauth {reauth_ms} ms)",
                 oauth_jwks_url=identity_server.jwks_url, oauth_reauth_ms=reauth_ms) as server:
        yield server


@pytest.fixture
def kafka_oauth_logs(kafka_oauth, request):
    """kafka_oauth, its log attached to the test's failure report."""
    reports.attach_log(request, f"kafka (OAUTH) broker log "
                       f"({kafka_oauth.broker_log})", kafka_oauth.broker_log)
    return kafka_oauth


_role_counter = itertools.count(1)


@pytest.fixture
def entra_pg_role(pg, identity_service):
    """Factory: entra_pg_role(name=None) -> PostgresRotation (.role, .count,
    .password, .conninfo_for(dbname)). The role is made with LOGIN only: grant
    it what the test needs. Afterwards its password no longer rotates and
    trust applies to it again; the role stays (a unique name, in the session's
    throw-away cluster), since a daemon of the test may still be connected."""
    made = []

    def make(name=None):
        role = name or f"entra_{os.getpid()}_{next(_role_counter)}"
        rotation = identity_service.rotate_postgres_role(pg, role)
        made.append(rotation)
        return rotation

    yield make
    for rotation in made:
        rotation.close()
