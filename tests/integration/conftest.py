"""Integration tests of ces2pg: a real PostgreSQL 15 server, librdkafka's mock
cluster (ces-mock-broker) and the daemon under test, all started by the test
harness (tests/harness, on sys.path through pytest.ini's pythonpath).

Run with Debian's interpreter (it has psycopg2 and confluent_kafka):

    CES2PG_BUILD=build /usr/bin/python3 -m pytest tests/integration

Fixtures (harness.fixtures): ``pg`` (session), ``db`` (per test), ``broker``
and ``ces2pg`` (factories); test modules import the helpers from the
harness's modules (tests/harness/README.md). When a test fails, the logs of
the daemons, brokers and the PostgreSQL server written during that test are
attached to the failure report.

Environment:
    CES2PG_BUILD   build directory (default <repo>/build)
    PG_BINDIR      PostgreSQL binaries (default /usr/lib/postgresql/15/bin)
"""

import pytest

# Before the harness is imported, so that its asserts explain their failures.
pytest.register_assert_rewrite("harness")

pytest_plugins = ("harness.fixtures",)
