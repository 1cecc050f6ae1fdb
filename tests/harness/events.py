"""CES records: the generator (tools/ces-gen) and its expectation, record files
(one record a line), the example records of tests/fixtures/examples, and the
partition ces-gen sends each record to.
"""

import json
import random
import re
import subprocess
import zlib
from pathlib import Path

from harness.common import CES_GEN, EXAMPLES, PYTHON


def load_expect(expect):
    """A generator's expectation: the dict itself, or read from its file."""
    if isinstance(expect, (str, Path)):
        with open(expect) as f:
            return json.load(f)
    return expect


def generate(tmp_path, seed, events, broker=None, topic="ces",
             partitions=None, out=None, tables=None, fmt=None,
             partition_scheme=None, extra_args=(), timeout=120):
    """Runs tools/ces-gen; returns the parsed expectation.

    With broker, the generator produces to it (partitions defaults to the
    broker's partition count for topic); otherwise it writes records to out
    (default <tmp_path>/gen-<seed>.jsonl), one per line. The expectation
    dict gets the records file's path under "_out" when one was written.
    """
    assert CES_GEN.is_file(), f"generator not found at {CES_GEN}"
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    expect_path = tmp_path / f"gen-{seed}-{events}.expect.json"
    args = [PYTHON, str(CES_GEN), "--seed", str(seed), "--events",
            str(events), "--expect", str(expect_path)]
    if tables is not None:
        args += ["--tables", str(tables)]
    if fmt is not None:
        args += ["--format", fmt]
    if partition_scheme is not None:
        args += ["--partition-scheme", partition_scheme]
    if broker is not None:
        if partitions is None:
            partitions = broker.topics.get(topic)
        args += ["--brokers", broker.bootstrap, "--topic", topic]
        if partitions is not None:
            args += ["--partitions", str(partitions)]
    else:
        out = Path(out) if out else tmp_path / f"gen-{seed}-{events}.jsonl"
        args += ["--out", str(out)]
    args += list(extra_args)
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (
        f"ces-gen failed ({r.returncode}): {' '.join(args)}\n"
        f"{r.stdout}\n{r.stderr}")
    expect = load_expect(expect_path)
    expect["_expect_path"] = str(expect_path)
    if broker is None:
        expect["_out"] = str(out)
    return expect


def read_records(path):
    """The records of a replay file (one per line) as a list of bytes."""
    return Path(path).read_bytes().splitlines()


_TBL_RE = re.compile(r'"tbl"\s*:\s*"([^"]+)"')
PKKEY_RE = re.compile(r'"pkkey"\s*:\s*\[\s*\{\s*"columnname"\s*:\s*"[^"]*"\s*,'
                       r'\s*"value"\s*:\s*"([^"]*)"')


def stream_partitions(records, nparts, scheme="table"):
    """The partition ces-gen would produce each record to.

    scheme "table": crc32("dbo.<Table>") mod nparts; "column": crc32(first
    primary key value) mod nparts (segments follow the first segment of
    their logicalid); "streamgroup": 0; "none": round-robin per record.
    """
    if scheme == "streamgroup":
        return [0] * len(records)
    if scheme == "none":
        return [i % nparts for i in range(len(records))]
    assert scheme in ("table", "column"), f"unsupported partition scheme {scheme}"
    by_logicalid = {}
    parts = []
    for rec in records:
        event = json.loads(rec)
        m = (_TBL_RE if scheme == "table" else PKKEY_RE).search(event["data"])
        if m:
            text = m.group(1) if scheme == "column" else f"dbo.{m.group(1)}"
            p = zlib.crc32(text.encode()) % nparts
            by_logicalid[event["logicalid"]] = p
        else:  # a later segment: the data slice has no table name
            p = by_logicalid[event["logicalid"]]
        parts.append(p)
    return parts


EXAMPLE_ORDER = ("legacy-insert", "legacy-update", "legacy-delete",
                 "current-insert", "current-update", "current-delete")


def example_record(name):
    """One example record re-serialized as one compact JSON line (bytes)."""
    path = EXAMPLES / f"{name}.json"
    assert path.is_file(), f"example record not found: {path}"
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def write_records(path, records):
    """Writes records (bytes or str), one per line."""
    with open(path, "wb") as f:
        for r in records:
            if isinstance(r, str):
                r = r.encode()
            assert b"\n" not in r, "a record must be one line"
            f.write(r + b"\n")
    return Path(path)


# One sequence of commit LSNs for every record made here, so that records of
# different tests (and modules) never share a transaction.
_lsn = iter(range(0x100, 0x100000))


def event_record(table, cols, current, pk, op="INS", old=None, schema="dbo",
                 db="Shop", txn=None):
    """One CES record: a transaction of its own. cols: [(name, type)];
    current and old: {name: value}; pk: the key's column names. txn: (its
    transaction's number, sequence number, final event?) for an event of a
    transaction of several (transaction_records)."""
    n, seq, final = txn if txn is not None else (next(_lsn), 1, True)
    lsn = f"00000001:{n:08X}:0001"
    image = current if op != "DEL" else old
    data = {
        "eventsource": {
            "db": db, "schema": schema, "tbl": table,
            "cols": [{"name": c, "type": t, "index": i}
                     for i, (c, t) in enumerate(cols)],
            "pkkey": [{"columnname": k, "value": image[k]} for k in pk],
            "transaction": {"commitlsn": lsn,
                            "beginlsn": f"00000001:{n:08X}:0000",
                            "sequencenumber": seq, "finalevent": final,
                            "committime": "2026-02-11T10:42:18.377Z"},
        },
        "eventrow": {
            "old": json.dumps(old or {}),
            "current": json.dumps(current if op != "DEL" else {}),
        },
    }
    ev = {
        "specversion": "1.0", "type": "com.microsoft.SQL.CES.DML.V1",
        "source": "/", "id": f"00000000-0000-{seq:04x}-0000-{n:012x}",
        "logicalid": f"c5f33283-8041-4d35-b4e8-9ff51b849d2a:00000001{n:08X}0001:"
                     f"{seq:020d}",
        "time": "2026-02-11T10:42:18.377Z",
        "datacontenttype": "application/json", "operation": op,
        "segmentindex": 0, "finalsegment": True, "data": json.dumps(data),
    }
    return json.dumps(ev, separators=(",", ":")).encode()


def transaction_records(events):
    """The records of one source transaction: events is a list of
    event_record's positional arguments (table, cols, current, pk)."""
    n = next(_lsn)
    return [event_record(*args, txn=(n, i + 1, i + 1 == len(events)))
            for i, args in enumerate(events)]


def disorder(records, how, seed=7):
    """records reversed, shuffled, or "resent": in order with duplicates right away and a tail
    of old ones resent long after newer ones (seeded)."""
    rng = random.Random(seed)
    if how == "reversed":
        return list(reversed(records))
    if how == "shuffled":
        out = list(records)
        rng.shuffle(out)
        return out
    if how == "resent":
        # The stream in order, with duplicates right away, immediate repeats, and a tail of old
        # events resent long after newer ones.
        out = []
        for r in records:
            out.append(r)
            if rng.random() < 0.1:
                out.append(r)
        out += rng.sample(records, len(records) // 3)
        return out
    raise ValueError(how)
