"""ces2pg's test harness: the library the integration, chaos and real-broker
suites share (a throw-away PostgreSQL server, the mock and the real Kafka
broker, ces2pg's commands and daemon, the generator, comparisons of tables
with its expectation, /metrics), and their pytest fixtures
(harness.fixtures). README.md in this directory lists what each module offers.

Suites import it normally (pytest's pythonpath option in their pytest.ini puts
tests/ on sys.path): ``from harness.daemon import make_config``.
"""
