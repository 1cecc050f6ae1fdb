"""Text meant for a terminal or a log carries no control character from an event: names, logical
ids and reasons with ESC sequences, newlines and C1 characters are escaped (`\\x1b`, `\\n`,
`\\xc2\\x9b`, ...) in the text-mode log and in the operator commands' text output, one line per
message, while JSON output keeps the exact original text."""

import base64
import json
import re
import subprocess

from harness.common import CES2PG, child_env
from harness.daemon import make_config, write_config
from harness.events import write_records
from test_apply import ces_record

# Clears the screen, sets the window title, forges a log line, moves back over it, and a C1 CSI
# (U+009B) and NEL (U+0085): all a terminal would act on.
NASTY = "\x1b[2J\x1b]0;owned\x07\nINFO forged line\r\t\u009b31m\u0085\x7f\\x"
LEVEL = re.compile(rb"^(ERROR|WARNING|INFO|DEBUG) ")


def escaped(text):
    """The escape README documents, written again here: backslash, \\n, \\r, \\t; other C0, DEL
    and each byte of a C1 character as \\xHH."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F:
            out.append("".join("\\x%02x" % b for b in ch.encode()))
        else:
            out.append(ch)
    return "".join(out)


def raw_controls(data):
    """The control bytes in data other than the newline that ends each line: C0, DEL, and the
    UTF-8 form of C1 characters."""
    found = [b for b in data if (b < 0x20 and b != 0x0A) or b == 0x7F]
    return found + re.findall(rb"\xc2[\x80-\x9f]", data)


def run(tmp_path, *args):
    """ces2pg ARGS...: (exit status, stdout bytes, stderr bytes), nothing decoded or replaced."""
    r = subprocess.run([str(CES2PG)] + [str(a) for a in args], capture_output=True, timeout=120,
                       env=child_env(), cwd=tmp_path, stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout, r.stderr


def nasty_records():
    """(records, the one not even JSON): a change PostgreSQL rejects in a table and columns named
    with NASTY, with a logicalid carrying it (and a sql_variant column, whose warning names the
    column); a good change of the same table; an event type carrying it (a decode dead letter
    whose reason quotes it); and a record with NASTY raw in it (but its line breaks), which is
    not JSON."""
    cols = [("Id", "int"), ("Co" + NASTY, "varchar(3)"), ("V" + NASTY, "sql_variant")]
    rejected = json.loads(ces_record("T" + NASTY, cols, "INS",
                                     {"Id": "1", "Co" + NASTY: "toolong", "V" + NASTY: "v"},
                                     pk=["Id"]))
    rejected["logicalid"] = rejected["logicalid"] + NASTY
    good = ces_record("T" + NASTY, cols, "INS", {"Id": "2", "Co" + NASTY: "ok", "V" + NASTY: "v"},
                      pk=["Id"])
    odd_type = json.loads(good)
    odd_type["type"] = "com.microsoft." + NASTY
    raw = b"not json " + NASTY.replace("\n", "").replace("\r", "").encode()  # still one line
    return [json.dumps(rejected).encode(), good, json.dumps(odd_type).encode(), raw], raw


def assert_safe_text(data, what):
    assert not raw_controls(data), f"{what}: raw control bytes {raw_controls(data)!r}:\n{data!r}"
    data.decode("utf-8")  # printable UTF-8: no invalid byte left either


def test_event_text_is_escaped_in_logs_and_operator_output(tmp_path, db):
    records, raw = nasty_records()
    path = write_records(tmp_path / "nasty.jsonl", records)
    cfg = write_config(tmp_path, make_config(db))  # log.format "text", the default

    rc, out, err = run(tmp_path, "replay", "-c", cfg, path)
    assert rc == 0, err
    assert out.decode().strip() == "replay: records=4 applied=1 dead_letters=3", out
    # The log: every line a message of its own, with its level first; nothing raw from events.
    assert_safe_text(err, "replay's log")
    lines = err.decode().split("\n")
    assert lines[-1] == "" and all(LEVEL.match(line.encode()) for line in lines[:-1]), err
    assert not any(line.startswith("INFO forged") for line in lines), err
    log = err.decode()
    assert escaped("com.microsoft." + NASTY) in log, log   # a reason quoting an event's text
    assert escaped("Db.dbo.T" + NASTY) in log, log          # a table name, as the event has it
    assert escaped("V" + NASTY) in log, log                  # a column name (sql_variant warns)
    assert "\\n" in log and "\\x1b[2J" in log and "\\xc2\\x9b31m" in log, log

    # JSON: the exact original text.
    rc, out, err = run(tmp_path, "dead-letters", "-c", cfg, "list", "--json")
    assert rc == 0, err
    listed = {d["class"] + ("-raw" if d["payload_bytes"] == len(raw) else ""): d
              for d in json.loads(out)}
    assert set(listed) == {"rejected_by_postgres", "decode", "decode-raw"}, listed
    rejected, decode = listed["rejected_by_postgres"], listed["decode"]
    assert rejected["source_table"] == "dbo.T" + NASTY
    assert rejected["logicalid"].endswith(NASTY)
    assert "com.microsoft." + NASTY in decode["reason"]

    # Text: one line per dead letter, escaped.
    rc, out, err = run(tmp_path, "dead-letters", "-c", cfg, "list")
    assert rc == 0, err
    assert_safe_text(out, "dead-letters list")
    text = out.decode()
    assert len(text.splitlines()) == 1 + 3 + 1, text  # heading, a line each, the count
    assert escaped("dbo.T" + NASTY) + ": PostgreSQL rejected the change" in text, text
    assert escaped("com.microsoft." + NASTY) in text, text

    for dl in listed.values():
        rc, out, err = run(tmp_path, "dead-letters", "-c", cfg, "show", dl["id"])
        assert rc == 0, err
        assert_safe_text(out, f"dead-letters show {dl['id']}")
        text = out.decode()
        assert f"reason:       {escaped(dl['reason'])}\n" in text, text
        assert f"logicalid:    {escaped(dl['logicalid'] or '-')}\n" in text, text
        assert f"source table: {escaped(dl['source_table'] or '-')}\n" in text, text
        # The record on the last line, as replay reads it: as it is when it has nothing to
        # escape, else in base64.
        payload = records[dl["offset"] - 1]
        last = out.splitlines()[-1]
        assert last == payload or base64.b64decode(last, validate=True) == payload, text
        if b"\\u001b" in payload:  # JSON's own escape of ESC: nothing raw
            assert last == payload

        rc, out, err = run(tmp_path, "dead-letters", "-c", cfg, "show", dl["id"], "--json")
        assert rc == 0, err
        shown = json.loads(out)
        assert {k: shown[k] for k in dl} == dl
        body = shown["payload"].encode()
        assert (body if shown["payload_encoding"] == "text" else base64.b64decode(body)) == payload

    shown_raw = listed["decode-raw"]
    rc, out, err = run(tmp_path, "dead-letters", "-c", cfg, "show", shown_raw["id"])
    assert b"base64 (one line" in out and base64.b64decode(out.splitlines()[-1]) == raw, out

    # adopt prints the target tables' names, which came from events.
    rc, out, err = run(tmp_path, "adopt", "-c", cfg, "--all", "--lsn", "0x00000001000000010001")
    assert rc == 0, err
    assert_safe_text(out, "adopt")
    assert_safe_text(err, "adopt's log")
    assert re.search(r"^adopt: dbo\.t\\x1b\[2j.*\\xc2\\x9b31m.*: \d+ rows marked", out.decode(),
                     re.M), out
