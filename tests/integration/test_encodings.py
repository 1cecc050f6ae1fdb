"""JSON (current and legacy generations) and Avro records (bare datums and
object container files) of the same tables, mixed in one topic, end exactly
as the generator predicts; malformed records among them become dead letters
with their exact bytes, and every good record is applied."""

import base64

import pytest

from harness.daemon import parse_replay_summary, run_replay
from harness.events import generate, read_records, write_records
from harness.mockbroker import PacedProducer
from harness.progress import dead_letters, wait_applied
from harness.tables import assert_tables_match

GROUP = "ces2pg-test"


def zigzag(n):
    u = ((n << 1) ^ (n >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while u & ~0x7F:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def raw_record(line):
    """A replay-file line as the Kafka record value it stands for."""
    return line if line.startswith(b"{") else base64.b64decode(line)


def kinds(records):
    """Counts of JSON current, JSON legacy, bare Avro and Avro containers."""
    out = {"json": 0, "legacy": 0, "avro": 0, "container": 0}
    for r in records:
        if r.startswith(b"{"):
            out["legacy" if b'"splitindex"' in r else "json"] += 1
        else:
            out["container" if r.startswith(b"Obj\x01") else "avro"] += 1
    return out


def bad_records(records):
    """Broken copies of stream records: each must be rejected whole."""
    avro = [r for r in records if not r.startswith(b"{")]
    js = [r for r in records if r.startswith(b"{")]
    assert avro and js
    bad = [
        avro[0][:len(avro[0]) // 2],                        # truncated Avro record
        avro[1] + b"\x00\x00",                              # trailing bytes
        b"\x061.0" + zigzag(1 << 60) + b"xyz",              # a length of 2^60
        b"\x061.0" + zigzag(-7) + b"xyz",                   # a negative length
        js[0][:len(js[0]) // 2],                            # truncated JSON
        js[1].replace(b'"1.0"', b'"\xc0\xaf"', 1),          # invalid UTF-8
        b"not a record at all",
    ]
    return bad


def mixed_stream(tmp_path, seed, events, container=False):
    """Generator records in all three encodings (about a third each, some of
    them segmented; Avro as bare datums or object container files), with
    broken records inserted at known positions.
    Returns (expect, records, indexes of the broken ones)."""
    args = ["--encoding", "mixed", "--max-message-size-kb", "4"]
    if container:
        args.append("--avro-container")
    expect = generate(tmp_path, seed=seed, events=events, tables=3, extra_args=args)
    lines = read_records(expect["_out"])
    assert len(lines) == expect["records"]
    records = [raw_record(l) for l in lines]
    k = kinds(records)
    assert min(k["json"], k["legacy"], k["container" if container else "avro"]) > events // 5, k
    bad = bad_records(records)
    out, bad_at = list(records), []
    step = len(records) // (len(bad) + 1)
    for n, b in enumerate(bad):
        at = (n + 1) * step + n
        out.insert(at, b)
        bad_at.append(at)
    assert [out[i] for i in bad_at] == bad
    return expect, out, bad_at


def test_mixed_encodings_through_broker(tmp_path, db, broker, ces2pg):
    expect, records, bad_at = mixed_stream(tmp_path, seed=3131, events=1500)
    b = broker(partitions=1)
    daemon = ces2pg(db, b, group=GROUP)
    producer = PacedProducer(b, db, GROUP, "ces", records, [0] * len(records)).start()
    producer.finish(timeout=120, daemons=[daemon])
    wait_applied(db, GROUP, {0: len(records)}, timeout=90, daemons=[daemon])

    assert_tables_match(db, expect)
    dls = dead_letters(db)
    got = sorted((d["offset"], d["payload"]) for d in dls)
    want = sorted((producer.placed[i][1], records[i]) for i in bad_at)
    assert got == want
    for d in dls:
        assert (d["topic"], d["partition"]) == ("ces", 0)
        assert d["reason"] and d["reason"].strip(), d
    assert daemon.terminate() == 0


def test_mixed_encodings_replay(tmp_path, db):
    expect, records, bad_at = mixed_stream(tmp_path, seed=4242, events=1500, container=True)
    # Replay format: JSON as it is, binary records as base64. Broken JSON stays
    # a line of its own; a line that is not base64 is taken as it is.
    lines = [r if r.startswith(b"{") or r == b"not a record at all"
             else base64.b64encode(r) for r in records]
    path = write_records(tmp_path / "mixed.txt", lines)
    rc, out, err = run_replay(db, [path])
    assert rc == 0, f"replay exited {rc}:\n{err}"
    # applied counts events (a segmented event is applied once).
    assert parse_replay_summary(out) == (len(records), expect["events"], len(bad_at))

    assert_tables_match(db, expect)
    dls = dead_letters(db)
    got = sorted((d["offset"], d["payload"]) for d in dls)
    want = sorted((i + 1, records[i]) for i in bad_at)
    assert got == want
    assert all(d["topic"] == str(path) for d in dls)


@pytest.mark.parametrize("container", [False, True], ids=["bare", "container"])
def test_avro_only_replay_with_forced_format(tmp_path, db, container):
    """kafka.format = "avro" takes every record as Avro; JSON ones are dead
    letters then."""
    args = ["--encoding", "avro", "--max-message-size-kb", "2" if container else "1"]
    if container:
        args.append("--avro-container")
    expect = generate(tmp_path, seed=77, events=300, tables=2, extra_args=args)
    lines = read_records(expect["_out"])
    json_line = (b'{"specversion":"1.0","type":"com.microsoft.SQL.CES.DML.V1",'
                 b'"id":"x","logicalid":"y","operation":"INS","segmentindex":1,'
                 b'"finalsegment":true,"data":"{}"}')
    path = write_records(tmp_path / "avro.txt", lines + [json_line])
    rc, out, err = run_replay(db, [path], extra_config='kafka = { format = "avro"; };')
    assert rc == 0, f"replay exited {rc}:\n{err}"
    assert parse_replay_summary(out) == (len(lines) + 1, expect["events"], 1)
    assert_tables_match(db, expect)
    [dl] = dead_letters(db)
    assert dl["payload"] == json_line
    assert dl["offset"] == len(lines) + 1


def test_unknown_format_is_a_configuration_error(tmp_path, db):
    rc, out, err = run_replay(db, [tmp_path / "none.txt"],
                              extra_config='kafka = { format = "xml"; };')
    assert rc == 78, err
    assert 'kafka.format must be "auto", "json" or "avro"' in err, err
