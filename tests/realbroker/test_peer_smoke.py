"""bench/peer's harness does not rot: the peer it compares ces2pg with (Kafka Connect with Debezium's
JDBC sink, fetched with Maven like the broker) starts, and a handful of generated changes, written
once as CES records and once as Debezium change events (tools/ces-gen --debezium-topic), end as the
generator predicts in PostgreSQL through both, each into its own database."""

import importlib.machinery
import importlib.util
import sys
import time

import pytest

from harness.common import ROOT, wait_until
from harness.events import generate
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match

PARTITIONS = 2


def _load_peer():
    name = "ces2pg_bench_peer"
    if name in sys.modules:
        return sys.modules[name]
    path = str(ROOT / "bench" / "peer")
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


@pytest.fixture(scope="module")
def peer(kafka):
    """bench/peer as a module, its jars fetched (Maven; cached outside the repository, in
    $CES2PG_PEER_CACHE or ~/.cache/ces2pg/peer: about 90 MB on first use)."""
    module = _load_peer()
    started = time.monotonic()
    try:
        jars = module.fetch()
    except RuntimeError as e:
        pytest.fail(f"fetching the peer's jars failed: {e}")
    print(f"\npeer jars: {jars['base']} ({time.monotonic() - started:.1f}s)", file=sys.stderr)
    module.smoke_jars = jars
    return module


def test_peer_and_ces2pg_apply_the_same_changes(tmp_path, pg, db, kafka, topic, ces2pg, peer):
    ces_topic, dbz_topic = topic(PARTITIONS), topic(PARTITIONS)
    expect = generate(tmp_path, seed=2121, events=300, tables=3,
                      broker=kafka.as_generator_target(ces_topic, PARTITIONS), topic=ces_topic,
                      extra_args=["--mix", "50,35,15", "--debezium-topic", dbz_topic,
                                  "--partition-scheme", "column"])
    dbz_counts = expect["debezium_partition_records"]
    assert sum(dbz_counts.values()) == 300
    counts = {int(p): n for p, n in expect["partition_records"].items()}
    assert len([n for n in counts.values() if n]) == PARTITIONS, counts
    # The end of each partition of the peer's topic.
    producer = kafka.producer()
    for part, key, value in peer.marker_records(PARTITIONS, dbz_counts):
        producer.produce(dbz_topic, key=key, value=value, partition=part)
    assert producer.flush(30) == 0

    # ces2pg, over plain Kafka.
    daemon = ces2pg(db, kafka.plaintext, group="peer-smoke", topics=(ces_topic,))
    wait_applied(db, "peer-smoke", counts, timeout=60, topic=ces_topic, daemons=[daemon])
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert daemon.terminate() == 0

    # The peer, as bench/peer runs it (a smaller heap), into a database of its own.
    peer_db = f"{db.name}_peer"
    pg.sql(f'CREATE DATABASE "{peer_db}"')
    connect = None
    try:
        pg.sql("CREATE SCHEMA dbo", dbname=peer_db)
        url = f"jdbc:postgresql://127.0.0.1:{pg.port}/{peer_db}?reWriteBatchedInserts=true"
        connect = peer.Connect(peer.smoke_jars, str(tmp_path / "connect"), kafka.plaintext,
                               "peer-smoke", dbz_topic, PARTITIONS, url,
                               heap="-Xms64M -Xmx512M")

        def done():
            connect.check()
            rows = pg.sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'dbo' "
                          "AND tablename = 'peerend'", dbname=peer_db)
            if not rows[0][0]:
                return False
            return pg.sql("SELECT count(*) FROM dbo.peerend", dbname=peer_db)[0][0] \
                >= PARTITIONS

        try:
            wait_until(done, 120, interval=0.2,
                       message=lambda: "the peer's markers; its log:\n" + connect.tail())
        except RuntimeError as e:      # the worker died or a task failed
            pytest.fail(f"{e}\n{connect.tail()}")
        rows = peer.compare_rows(pg.conninfo_for(peer_db), expect)
        assert rows["expected_rows"] > 0
        assert rows["wrong"] == 0, rows["examples"]
        assert rows["rows"] == rows["expected_rows"], rows
    finally:
        if connect is not None:
            connect.stop()
        pg.sql(f'DROP DATABASE IF EXISTS "{peer_db}" WITH (FORCE)')
