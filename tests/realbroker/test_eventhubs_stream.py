"""End to end over SASL_SSL against a real Kafka broker, in Event Hubs mode:
generated streams end as the generator predicts, a restart in the middle
(SIGTERM or kill -9) resumes exactly, and a record that is not JSON becomes
a dead letter while the records after it apply."""

import json

import pytest

from harness.common import wait_until
from harness.events import generate, read_records
from harness.progress import OffsetMonitor, dead_letters, wait_applied
from harness.tables import assert_tables_match

GROUP = "ces2pg-test"


def test_stream_over_sasl_ssl(tmp_path, db, kafka, topic, eventhubs_daemon):
    t = topic(4)
    # The generator itself produces over SASL_SSL, as an Event Hubs client.
    sasl = kafka.sasl_config()
    producer_config = []
    for key, value in sasl.items():
        if key != "bootstrap.servers":
            producer_config += ["--producer-config", f"{key}={value}"]
    target = kafka.as_generator_target(t, 4)
    target.bootstrap = kafka.sasl_ssl
    expect = generate(tmp_path, seed=20260807, events=10000, tables=3,
                      broker=target, topic=t, extra_args=producer_config)
    counts = {int(p): n for p, n in expect["partition_records"].items()}
    assert sum(counts.values()) == expect["records"]
    assert len([n for n in counts.values() if n]) >= 2, counts

    daemon = eventhubs_daemon(db, t, group=GROUP)
    daemon.wait_log(r"assigned \d+ partition", timeout=60)
    monitor = OffsetMonitor(db, GROUP, t)
    wait_applied(db, GROUP, counts, timeout=120, topic=t, daemons=[daemon],
                 monitor=monitor)
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert daemon.terminate() == 0
    assert monitor.poll() == {p: n for p, n in counts.items() if n}


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_in_the_middle(tmp_path, db, kafka, topic, eventhubs_daemon,
                               how):
    t = topic(4)
    # A real broker keeps everything: the whole stream is there at once.
    expect = generate(tmp_path, seed=4242 if how == "sigterm" else 4343,
                      events=20000, broker=kafka.as_generator_target(t, 4),
                      topic=t)
    counts = {int(p): n for p, n in expect["partition_records"].items()}
    total = sum(counts.values())
    monitor = OffsetMonitor(db, GROUP, t)

    # Small batches so that progress is gradual.
    first = eventhubs_daemon(db, t, group=GROUP, batch_max_events=10,
                             batch_max_ms=20)

    def some_progress():
        first.check_alive()
        monitor.poll()
        return monitor.total() >= total // 10

    wait_until(some_progress, 90, interval=0.01,
               message=lambda: f"10% of {total} records applied "
               f"(offsets {monitor.last})")
    if how == "sigterm":
        assert first.terminate() == 0
    else:
        assert first.kill9() == -9
    monitor.poll()
    done = monitor.total()
    print(f"{how}: stopped at {done}/{total} records, offsets {monitor.last}")
    assert total // 10 <= done <= total * 9 // 10, (
        f"stopped at {done} of {total} records: not in the middle "
        f"(offsets {monitor.last})")

    second = eventhubs_daemon(db, t, group=GROUP)
    wait_applied(db, GROUP, counts, timeout=120, topic=t, daemons=[second],
                 monitor=monitor)
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert second.terminate() == 0
    assert monitor.polls > 10


BAD = b"not json at all"


def _commitlsn(record):
    data = json.loads(json.loads(record)["data"])
    return data["eventsource"]["transaction"]["commitlsn"]


def test_dead_letter_and_later_records_apply(tmp_path, db, kafka, topic,
                                             eventhubs_daemon):
    expect = generate(tmp_path, seed=515, events=2000)
    lines = read_records(expect["_out"])
    cut = len(lines) // 2
    while _commitlsn(lines[cut - 1]) == _commitlsn(lines[cut]):
        cut += 1  # between two source transactions
    records = lines[:cut] + [BAD] + lines[cut:]
    t = topic(1)
    placed = kafka.produce(t, records, [0] * len(records))
    assert placed[cut] == (0, cut)

    daemon = eventhubs_daemon(db, t, group=GROUP)
    wait_applied(db, GROUP, {0: len(records)}, timeout=90, topic=t,
                 daemons=[daemon])
    [dl] = dead_letters(db)
    assert dl["payload"] == BAD
    assert (dl["topic"], dl["partition"], dl["offset"]) == (t, 0, cut)
    assert dl["reason"] and dl["reason"].strip(), dl
    assert_tables_match(db, expect)  # everything else, before and after
    assert daemon.terminate() == 0
