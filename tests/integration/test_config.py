"""Command line and configuration file errors (no server needed)."""

import re

import pytest

from harness.daemon import EX_CONFIG, EX_USAGE, make_config, run_ces2pg, write_config

CONNINFO = "host=127.0.0.1 port=1 dbname=nowhere user=postgres"
BROKERS = "127.0.0.1:1"


def valid_text(**kw):
    return make_config(conninfo=CONNINFO, broker=BROKERS, **kw)


def line_of(text, needle):
    """1-based number of the line containing needle."""
    for n, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return n
    raise AssertionError(f"{needle!r} not in config:\n{text}")


def check_config(tmp_path, text):
    path = write_config(tmp_path, text, name="ces2pg.conf")
    rc, out, err = run_ces2pg(["--check-config", "-c", path])
    return path, rc, out, err


def test_valid_config_passes(tmp_path):
    _, rc, out, err = check_config(tmp_path, valid_text(batch_max_events=100))
    assert rc == 0, f"valid config rejected ({rc}):\n{err}"


def test_valid_config_long_option(tmp_path):
    path = write_config(tmp_path, valid_text(), name="ces2pg.conf")
    rc, _, err = run_ces2pg(["--check-config", "--config", path])
    assert rc == 0, err


def test_unknown_key_names_key_file_and_line(tmp_path):
    text = valid_text().replace("brokers =", "brokerz =")
    path, rc, _, err = check_config(tmp_path, text)
    assert rc == EX_CONFIG, f"exit {rc}, stderr:\n{err}"
    assert "kafka.brokerz" in err, err
    assert f"{path}:{line_of(text, 'brokerz')}" in err, err


def test_unknown_key_in_apply_section(tmp_path):
    text = valid_text(batch_max_events=5).replace("batch_max_events",
                                                  "batch_max_evnts")
    path, rc, _, err = check_config(tmp_path, text)
    assert rc == EX_CONFIG, err
    assert "apply.batch_max_evnts" in err, err
    assert f"{path}:{line_of(text, 'batch_max_evnts')}" in err, err


@pytest.mark.parametrize("key, needle", [
    ("kafka.brokers", "  brokers ="),
    ("kafka.topics", "  topics ="),
    ("postgres.conninfo", "  conninfo ="),
])
def test_missing_required_key(tmp_path, key, needle):
    text = "\n".join(line for line in valid_text().splitlines()
                     if needle not in line) + "\n"
    path, rc, _, err = check_config(tmp_path, text)
    assert rc == EX_CONFIG, f"exit {rc}, stderr:\n{err}"
    assert key in err, err
    assert str(path) in err, err


def test_daemon_needs_kafka_section(tmp_path):
    text = make_config(conninfo=CONNINFO)  # fine for replay only
    path, rc, _, err = check_config(tmp_path, text)
    assert rc == EX_CONFIG, err
    assert "kafka" in err and str(path) in err, err


def test_wrong_type_topics_string(tmp_path):
    text = valid_text().replace('topics = [ "ces" ];', 'topics = "ces";')
    assert 'topics = "ces";' in text
    path, rc, _, err = check_config(tmp_path, text)
    assert rc == EX_CONFIG, f"exit {rc}, stderr:\n{err}"
    assert "kafka.topics" in err, err
    assert f"{path}:{line_of(text, 'topics =')}" in err, err


def test_wrong_type_batch_size_string(tmp_path):
    text = valid_text(batch_max_events=5).replace("batch_max_events = 5;",
                                                  'batch_max_events = "5";')
    path, rc, _, err = check_config(tmp_path, text)
    assert rc == EX_CONFIG, err
    assert "apply.batch_max_events" in err, err


def test_invalid_log_level(tmp_path):
    text = valid_text(log_level="loud")
    path, rc, _, err = check_config(tmp_path, text)
    assert rc == EX_CONFIG, err
    assert "log.level" in err, err


def test_syntax_error_names_file_and_line(tmp_path):
    text = valid_text() + "metrics = { port = ; };\n"
    path, rc, _, err = check_config(tmp_path, text)
    assert rc == EX_CONFIG, err
    assert f"{path}:{line_of(text, 'port = ;')}" in err, err


def test_missing_config_file_fails(tmp_path):
    path = tmp_path / "does-not-exist.conf"
    rc, _, err = run_ces2pg(["--check-config", "-c", path])
    assert rc != 0
    assert str(path) in err, err


def test_daemon_exits_78_on_bad_config(tmp_path):
    text = valid_text().replace("brokers =", "brokerz =")
    path = write_config(tmp_path, text, name="ces2pg.conf")
    rc, _, err = run_ces2pg(["-c", path], timeout=30)
    assert rc == EX_CONFIG, err
    assert "kafka.brokerz" in err, err


def test_replay_exits_78_on_bad_config(tmp_path):
    text = make_config(conninfo=CONNINFO, extra_config="bogus = 1;")
    path = write_config(tmp_path, text, name="ces2pg.conf")
    records = tmp_path / "empty.jsonl"
    records.write_text("")
    rc, _, err = run_ces2pg(["replay", "-c", path, records], timeout=30)
    assert rc == EX_CONFIG, err
    assert "bogus" in err and str(path) in err, err


def test_help_mentions_replay():
    rc, out, err = run_ces2pg(["--help"])
    assert rc == 0, err
    assert "replay" in out, out
    assert "--check-config" in out, out


def test_version():
    rc, out, err = run_ces2pg(["--version"])
    assert rc == 0, err
    assert re.search(r"ces2pg\s+\S*\d", out), out


@pytest.mark.parametrize("args", [
    ["--bogus"],
    ["-c"],
    ["--check-config", "-c", "x.conf", "--no-such-option"],
])
def test_usage_errors_exit_64(args):
    rc, out, err = run_ces2pg(args)
    assert rc == EX_USAGE, f"{args}: exit {rc}\n{err}"
    assert err.strip(), "a usage error must say something on stderr"


def test_reference_config_documents_every_key(tmp_path):
    """conf/ces2pg.conf is valid and names every key ces2pg knows (its own
    --check-config listing), so the reference cannot fall behind the code."""
    from harness.common import ROOT
    reference = ROOT / "conf" / "ces2pg.conf"
    rc, out, err = run_ces2pg(["--check-config", "-c", str(reference)])
    assert rc == 0, err
    keys = [line.split(" = ", 1)[0] for line in out.splitlines()[1:] if " = " in line]
    assert len(keys) >= 15, out
    text = reference.read_text()
    for key in keys:
        group, name = key.split(".", 1)
        assert re.search(r"^%s = \{" % re.escape(group), text, re.M), f"group {group} missing"
        assert re.search(r"^\s*#?\s*%s = " % re.escape(name), text, re.M), (
            f"{key} is not documented in conf/ces2pg.conf")
