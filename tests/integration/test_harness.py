"""Self-tests of the harness: PostgreSQL, the mock broker and the helpers.

These need neither ces2pg nor the generator, so a broken harness shows up
as its own failure instead of as a puzzling daemon test failure.
"""

import os
import re
import subprocess
import time

import pytest

from harness.common import wait_until
from harness.daemon import make_config
from harness.mockbroker import MOCK_PARTITION_BYTES, PacedProducer, watermarks
from harness.progress import OffsetMonitor, wait_applied
from harness.tables import assert_tables_match, column_types, primary_key


def test_pg_server_settings(pg):
    rows = pg.sql("SELECT name, setting FROM pg_settings WHERE name IN "
                  "('fsync', 'listen_addresses', 'max_connections', 'port')")
    settings = dict(rows)
    assert settings == {"fsync": "off", "listen_addresses": "127.0.0.1",
                        "max_connections": "50", "port": str(pg.port)}
    assert pg.sql("SELECT current_user")[0][0] == "postgres"
    assert pg.sql("SHOW server_version_num")[0][0].startswith("15")


def test_db_is_fresh_per_test_1(db):
    assert db.scalar("SELECT count(*) FROM pg_tables "
                     "WHERE schemaname NOT IN ('pg_catalog', "
                     "'information_schema')") == 0
    db.query("CREATE TABLE leftover (id int)")
    assert db.table_exists("public.leftover")


def test_db_is_fresh_per_test_2(db):
    assert not db.table_exists("public.leftover")
    with db.connect() as conn:
        assert conn.autocommit
        assert conn.info.dbname == db.name


def test_broker_produce_and_group_consume(broker):
    b = broker(partitions=3, topics=("ces", "other"))
    assert b.bootstrap.startswith("127.0.0.1:")
    values = [f"value-{i}".encode() for i in range(30)]
    placed = b.produce("ces", values[:15], partition=1)
    assert [p for p, _ in placed] == [1] * 15
    assert [o for _, o in placed] == list(range(15))
    placed = b.produce("ces", values[15:])
    assert all(0 <= p < 3 for p, _ in placed)
    got = b.consume("ces", 30, group="selftest")
    assert sorted(v for _, _, v in got) == sorted(values)
    on_p1 = [v for p, _, v in sorted(got) if p == 1][:15]
    assert on_p1 == values[:15]  # per-partition order kept
    assert b.stop() == 0


def test_broker_with_three_brokers(broker):
    b = broker(partitions=2, topics=("ces",), brokers=3)
    assert len(b.bootstrap.split(",")) == 3
    b.produce("ces", [b"x", b"y"], partition=0)
    assert b.stop() == 0


def test_broker_control_channel(broker):
    """ces-mock-broker --control: a broker set down refuses clients until it
    is up again, pushed errors fail the next requests of their type, clear
    forgets them, and a bad command is answered with its reason."""
    from confluent_kafka import Producer

    b = broker(partitions=1, brokers=1, control=True)

    def produce_once(value, timeout_ms=3000):
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0,
                      "message.send.max.retries": 0,
                      "message.timeout.ms": timeout_ms,
                      "reconnect.backoff.max.ms": 100})
        result = []
        p.produce("ces", value=value, partition=0,
                  on_delivery=lambda err, msg: result.append(err))
        p.flush(timeout_ms / 1000 + 5)
        assert len(result) == 1
        return result[0]

    assert produce_once(b"before") is None
    b.command("down 1")
    assert produce_once(b"while down", 2000) is not None
    b.command("up 1")
    assert produce_once(b"after") is None
    b.command("errors Produce 1 MSG_SIZE_TOO_LARGE")
    err = produce_once(b"refused")
    assert err is not None and err.name() == "MSG_SIZE_TOO_LARGE", err
    assert produce_once(b"next") is None  # one error, one request
    b.command("errors produce 2 10")  # by number: MSG_SIZE_TOO_LARGE
    b.command("clear Produce")
    assert produce_once(b"cleared") is None
    for bad, reason in (("down 2", "no broker '2'"),
                        ("errors Nope 1 NOT_COORDINATOR", "unknown request type"),
                        ("errors Fetch 1 NOPE", "unknown error code"),
                        ("errors Fetch 0 NOT_COORDINATOR", "invalid count"),
                        ("explode", "unknown command")):
        with pytest.raises(AssertionError, match=reason):
            b.command(bad)
    assert b.stop() == 0


def test_wait_until_times_out_with_message():
    with pytest.raises(AssertionError, match="the sky to fall"):
        wait_until(lambda: False, 0.3, interval=0.05,
                   message="the sky to fall")
    assert wait_until(lambda: 42, 1) == 42


def _make_offsets(db):
    db.query("CREATE SCHEMA ces2pg")
    db.query("CREATE TABLE ces2pg.offsets (group_id text, topic text, "
             "partition int, next_offset bigint, updated_at timestamptz, "
             "PRIMARY KEY (group_id, topic, partition))")


def test_offset_helpers(db):
    mon = OffsetMonitor(db, "g")
    assert mon.poll() == {}  # no schema yet
    _make_offsets(db)
    db.query("INSERT INTO ces2pg.offsets VALUES ('g', 'ces', 0, 5, now()), "
             "('g', 'ces', 1, 3, now()), ('h', 'ces', 2, 99, now())")
    assert wait_applied(db, "g", {"0": 5, "1": 3, "2": 0}, timeout=1,
                        monitor=mon) == {0: 5, 1: 3}
    with pytest.raises(AssertionError, match="timed out"):
        wait_applied(db, "g", {0: 6, 1: 3}, timeout=0.3)
    with pytest.raises(AssertionError, match="past the 4"):
        wait_applied(db, "g", {0: 4, 1: 3}, timeout=1)
    db.query("UPDATE ces2pg.offsets SET next_offset = 2 WHERE partition = 0")
    with pytest.raises(AssertionError, match="moved backwards: 5 -> 2"):
        mon.poll()


def test_assert_tables_match_detects_differences(db):
    db.query("CREATE SCHEMA dbo")
    db.query("CREATE TABLE dbo.t (id int PRIMARY KEY, name varchar(10), "
             "ts timestamp(6))")
    db.query("INSERT INTO dbo.t VALUES (2, 'b', '2026-01-01 10:00:00.5'), "
             "(10, NULL, NULL), (1, 'a', NULL)")
    expect = {"tables": {"dbo.t": {
        "key": ["id"],
        "columns": {"id": "integer", "name": "character varying(10)",
                    "ts": "timestamp(6) without time zone"},
        "rows": [{"id": "10", "name": None, "ts": None},
                 {"id": "1", "name": "a", "ts": None},
                 {"id": "2", "name": "b", "ts": "2026-01-01 10:00:00.5"}]}}}
    assert_tables_match(db, expect)  # numeric key order, NULLs, timestamps
    expect["tables"]["dbo.t"]["columns"]["name"] = "text"
    with pytest.raises(AssertionError, match="name: expected text, found "
                       "character varying"):
        assert_tables_match(db, expect)
    assert_tables_match(db, expect, check_types=False)
    expect["tables"]["dbo.t"]["columns"]["name"] = "character varying(10)"
    assert primary_key(db, "dbo.t") == ["id"]
    assert column_types(db, "dbo.t")["name"] == "character varying(10)"

    expect["tables"]["dbo.t"]["rows"][1]["name"] = "A"
    with pytest.raises(AssertionError, match=r"name: expected 'A', got 'a'"):
        assert_tables_match(db, expect)
    expect["tables"]["dbo.t"]["rows"][1]["name"] = "a"
    expect["tables"]["dbo.t"]["rows"].append({"id": "3", "name": "c",
                                              "ts": None})
    with pytest.raises(AssertionError, match="1 row.s. missing"):
        assert_tables_match(db, expect)
    expect["tables"]["dbo.t"]["rows"].pop()
    expect["tables"]["dbo.other"] = {"key": ["id"], "columns": {"id": "int"},
                                     "rows": [{"id": "1"}]}
    with pytest.raises(AssertionError, match="dbo.other: table does not"):
        assert_tables_match(db, expect)


def test_make_config_shape():
    class B:
        bootstrap = "127.0.0.1:1,127.0.0.1:2"

    text = make_config(conninfo="host=h port=1 dbname=d user=postgres",
                       broker=B(), topics=("a", "b"), batch_max_events=7,
                       extra_config='metrics = { port = 0; };')
    assert 'brokers = "127.0.0.1:1,127.0.0.1:2";' in text
    assert 'topics = [ "a", "b" ];' in text
    assert "batch_max_events = 7;" in text
    assert text.rstrip().endswith("metrics = { port = 0; };")
    replay = make_config(conninfo="dbname=x", batch_max_ms=None,
                         log_level=None)
    assert "kafka" not in replay and "apply" not in replay


def test_mock_partition_keeps_only_5_mib(broker):
    """The finding PacedProducer exists for: the mock drops old data."""
    b = broker(partitions=1)
    record = b"x" * 10000
    b.produce("ces", [record] * 700, partition=0)  # 7 MB
    low, high = watermarks(b, "ces", [0])[0]
    assert high == 700
    assert low > 0, "the mock kept more than 5 MiB: drop PacedProducer?"
    assert (high - low) * len(record) <= MOCK_PARTITION_BYTES + 1024 * 1024


def test_paced_producer_loses_nothing(db, broker):
    """12 MB through one partition to a slow consumer that stores its
    progress like ces2pg does: every record arrives, in order."""
    from confluent_kafka import Consumer

    _make_offsets(db)
    b = broker(partitions=2)
    records = [f"{i:08d}".encode() * 250 for i in range(6000)]  # 2 kB each
    parts = [0 if i % 10 else 1 for i in range(len(records))]
    prod = PacedProducer(b, db, "paced", "ces", records, parts).start()
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "paced",
                         "auto.offset.reset": "earliest",
                         "session.timeout.ms": 4000,
                         "heartbeat.interval.ms": 500})
    consumer.subscribe(["ces"])
    expected = {0: [r for r, p in zip(records, parts) if p == 0],
                1: [r for r, p in zip(records, parts) if p == 1]}
    got = {0: 0, 1: 0}
    conn = db.connect()
    try:
        deadline = time.monotonic() + 60
        while got != {0: len(expected[0]), 1: len(expected[1])}:
            assert time.monotonic() < deadline, f"stuck at {got}"
            msg = consumer.poll(0.05)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            p = msg.partition()
            assert msg.offset() == got[p], "gap or jump: data was lost"
            assert msg.value() == expected[p][got[p]]
            got[p] += 1
            if got[p] % 100 == 0 or got[p] == len(expected[p]):
                with conn.cursor() as cur:
                    cur.execute(
                        "INSERT INTO ces2pg.offsets VALUES ('paced', 'ces', "
                        "%s, %s, now()) ON CONFLICT (group_id, topic, "
                        "partition) DO UPDATE SET next_offset = "
                        "excluded.next_offset", (p, got[p]))
        prod.finish(timeout=30)
        assert prod.waits > 0, "the producer never had to wait"
        assert prod.counts == {0: 5400, 1: 600}
        assert prod.placed[-1] == (0, 5399)
    finally:
        prod.stop()
        conn.close()
        consumer.close()


def test_stream_partitions_match_generator(tmp_path, broker):
    from harness.events import generate, read_records, stream_partitions

    b = broker(partitions=4)
    produced = generate(tmp_path, seed=99, events=300, broker=b)
    written = generate(tmp_path / "f", seed=99, events=300)
    parts = stream_partitions(read_records(written["_out"]), 4)
    counts = {str(p): parts.count(p) for p in range(4)}
    assert counts == produced["partition_records"]
    assert written["tables"] == produced["tables"]


def test_kafka_broker_cluster_ids_are_never_read_as_options():
    """The real-broker tier's broker formats its storage with a random cluster id. One id in 64
    that starts with "-" was taken by kafka-storage for an option, and the broker did not start
    (CI, 2026-12-06: "--cluster-id/-t: expected one argument"). 1,000 ids from the script's own
    function: with the old one, all 1,000 free of a leading "-" had a chance of 1 in 7 million."""
    script = os.path.join(os.path.dirname(__file__), "..", "harness", "kafka", "kafka-broker")
    r = subprocess.run(
        ["bash", "-c", 'source <(sed -n "/^random_uuid() {/,/^}/p" "$1") && '
         'for i in $(seq 1000); do random_uuid; echo; done', "bash", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ids = r.stdout.split("\n")[:-1]
    assert len(ids) == 1000
    for cluster_id in ids:
        # KRaft's form: 16 random bytes in URL-safe base64 without padding.
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id), cluster_id
        assert not cluster_id.startswith("-"), cluster_id
    assert len(set(ids)) == 1000
