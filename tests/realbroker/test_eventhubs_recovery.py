"""After a crash, replication resumes at once: with static group membership
(kafka.group_instance_id, which the systemd unit and the compose file set per
instance), a ces2pg restarted right after kill -9 gets its partitions back
without waiting for the group's session timeout."""

import time

from harness.common import wait_until
from harness.events import generate, read_records
from harness.progress import read_offsets

GROUP = "ces2pg-test"
# Microsoft's session.timeout.ms for Event Hubs, which Event Hubs mode sets: without static
# membership a restarted member waits this long for the dead one to leave.
PROPERTIES = ("fetch.wait.max.ms=50",)


def test_restart_after_kill9_resumes_within_seconds(tmp_path, db, kafka, topic,
                                                     eventhubs_daemon):
    t = topic(2)
    records = read_records(generate(tmp_path, seed=71, events=40, tables=1)["_out"])
    kafka.produce(t, records[:20], [i % 2 for i in range(20)])
    extra = ['group_instance_id = "ces2pg-recovery";']
    daemon = eventhubs_daemon(db, t, group=GROUP, properties=PROPERTIES, kafka_extra_lines=extra)
    wait_until(lambda: sum(read_offsets(db, GROUP, t).values()) == 20, 60)
    assert daemon.kill9() == -9
    restarted = time.monotonic()
    again = eventhubs_daemon(db, t, group=GROUP, properties=PROPERTIES, kafka_extra_lines=extra)
    kafka.produce(t, records[20:22], [0, 1])
    wait_until(lambda: sum(read_offsets(db, GROUP, t).values()) == 22, 60)
    took = time.monotonic() - restarted
    print(f"\nthe next events were applied {took:.1f} s after the restart")
    assert took < 5, f"{took:.1f} s after the restart (target: 5 s)"
    assert again.terminate() == 0
