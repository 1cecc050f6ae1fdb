"""What every other module of the harness uses: where the programs under test
are, how to run them, and waiting for something to happen.

Environment:
    CES2PG_BUILD   build directory (default <repo>/build)
"""

import os
import socket
import threading
import time
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent.parent
BUILD = Path(os.environ.get("CES2PG_BUILD", ROOT / "build")).resolve()
CES2PG = BUILD / "ces2pg"
MOCK_BROKER = BUILD / "ces-mock-broker"
CES_GEN = ROOT / "tools" / "ces-gen"
EXAMPLES = ROOT / "tests" / "fixtures" / "examples"  # the example records (README.md there)
PYTHON = "/usr/bin/python3"


def wait_until(predicate, timeout, interval=0.1, message=None):
    """Polls predicate() until it returns a true value, which is returned.

    On timeout raises AssertionError with message (a string or a callable
    returning one, evaluated then).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            if callable(message):
                message = message()
            raise AssertionError(
                f"timed out after {timeout}s waiting: "
                f"{message or getattr(predicate, '__name__', predicate)}"
            )
        time.sleep(interval)


def free_port():
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_binary(path, what):
    """Fails the test unless path is an executable (built, or CES2PG_BUILD wrong)."""
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"{what} not found at {path}: build first "
            f"(cmake -S {ROOT} -B {BUILD} && cmake --build {BUILD}) "
            f"or set CES2PG_BUILD"
        )


def child_env():
    """Environment for spawned programs: ours, sanitizer options included."""
    env = dict(os.environ)
    for name in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


class Background:
    """Runs self.run() in a daemon thread from start() until stop(); run() loops while
    not self.stopping(). An exception it raises is re-raised by stop()."""

    def __init__(self, name):
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name=name)

    def start(self):
        self._thread.start()
        return self

    def started(self):
        return self._thread.ident is not None

    def stopping(self):
        return self._stop.is_set()

    def stop(self):
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error

    def _main(self):
        try:
            self.run()
        except BaseException as e:  # reported by stop()
            self.error = e


def produce_all(producer, topic, values, partitions=None, key=None):
    """Produces values (bytes or str) in order with a confluent_kafka
    Producer, values[i] to partitions[i] when partitions is given (else where
    the partitioner puts it), and waits for every delivery. Returns
    (partition, offset) per value, in input order."""
    placed = [None] * len(values)
    errors = []

    def on_delivery(index):
        def cb(err, msg):
            if err is not None:
                errors.append((index, err))
            else:
                placed[index] = (msg.partition(), msg.offset())
        return cb

    for i, value in enumerate(values):
        kw = {"value": value.encode() if isinstance(value, str) else value,
              "on_delivery": on_delivery(i)}
        if partitions is not None:
            kw["partition"] = partitions[i]
        if key is not None:
            kw["key"] = key
        while True:
            try:
                producer.produce(topic, **kw)
                break
            except BufferError:  # local queue full: let it drain
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0, f"{left} message(s) not delivered within 60s"
    assert not errors, f"delivery errors: {errors[:5]}"
    assert all(r is not None for r in placed), "missing delivery reports"
    return placed
