"""Failure reports: the logs a test's programs wrote (daemons, brokers, replay
runs, and the part of the PostgreSQL server's log written during the test) are
attached to the report of a test that fails.

harness.fixtures calls the hooks' halves here; a module that starts a program
registers its log with attach_log() (given the test's request or item) or
attach_to_current() (the test running now, when it has no request at hand).
"""

from pathlib import Path

_server = None  # the session's Postgres, once started
_current_item = None  # the test running now


def attach_log(request_or_item, title, path):
    """Registers a log file to be shown if the current test fails."""
    item = getattr(request_or_item, "node", request_or_item)
    logs = item.__dict__.setdefault("_ces2pg_logs", [])
    logs.append((title, Path(path)))


def attach_to_current(title, path):
    """attach_log() for the test running now (nothing outside a test)."""
    if _current_item is not None:
        attach_log(_current_item, title, path)


def tail_text(path, start=0, limit=30000):
    """The text of a file from start, at most its last limit characters."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    text = data.decode("utf-8", "replace")
    if len(text) > limit:
        text = f"<... {len(text) - limit} characters cut ...>\n" + text[-limit:]
    return text


def set_server(server):
    """The session's PostgreSQL server (None once stopped): its log is
    attached from where each test began."""
    global _server
    _server = server


def set_current_item(item):
    """The test running now (None between tests)."""
    global _current_item
    _current_item = item


def note_test_start(item):
    """Notes where the server's log stood when the test began."""
    if _server is not None:
        item._pg_log_start = _server.log_size()


def add_log_sections(item, rep):
    """Adds the attached logs to a failed report, once per test."""
    if not rep.failed:
        return
    if getattr(item, "_ces2pg_logs_shown", False):
        return
    item._ces2pg_logs_shown = True
    for title, path in item.__dict__.get("_ces2pg_logs", []):
        rep.sections.append((title, tail_text(path)))
    if _server is not None:
        start = getattr(item, "_pg_log_start", 0)
        rep.sections.append(
            (f"postgresql log ({_server.log_path})",
             tail_text(_server.log_path, start))
        )
