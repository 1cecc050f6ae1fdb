"""`ces2pg status` against a real broker in Event Hubs mode: the group's members come from the
brokers (librdkafka's mock cluster cannot list groups), so a stopped ces2pg is CRITICAL at once,
and the connection string's key never reaches the output."""

import json

from harness.common import wait_until
from harness.daemon import make_config, run_ces2pg, write_config
from harness.events import generate, read_records
from harness.progress import read_offsets
from harness.realkafka import eventhubs_kafka_lines

GROUP = "ces2pg-status"


def status(config, tmp_path):
    rc, out, err = run_ces2pg(["status", "-c", config, "--json"], cwd=tmp_path)
    assert rc in (0, 1, 2), (rc, out, err)
    return rc, json.loads(out), out + err


def test_status_sees_the_group(tmp_path, db, kafka, topic, eventhubs_daemon):
    t = topic(2)
    records = read_records(generate(tmp_path, seed=2202, events=40, tables=1)["_out"])
    kafka.produce(t, records[:30], [i % 2 for i in range(30)])
    config = write_config(tmp_path, make_config(
        db, kafka.sasl_ssl, group=GROUP, topics=(t,),
        kafka_extra=eventhubs_kafka_lines(kafka, tmp_path=tmp_path)), name="status.conf")
    secret = kafka.connection_string.split("SharedAccessKey=")[1].split(";")[0]

    daemon = eventhubs_daemon(db, t, group=GROUP)
    wait_until(lambda: sum(read_offsets(db, GROUP, t).values()) == 30, 60)
    rc, st, text = status(config, tmp_path)
    assert (rc, st["health"], st["members"], st["group_state"]) == (0, "OK", 1, "Stable"), text
    assert sum(p["high_watermark"] for p in st["partitions"]) == 30
    assert all(p["lag"] == 0 for p in st["partitions"]), st
    assert secret not in text

    assert daemon.terminate() == 0
    kafka.produce(t, records[30:], [0] * 10)
    rc, st, text = status(config, tmp_path)
    assert (rc, st["health"], st["members"]) == (2, "CRITICAL", 0), text
    assert "no ces2pg of group ces2pg-status is running (10 records waiting)" in st["reason"]
    assert secret not in text
