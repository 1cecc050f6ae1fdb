"""ces2pg itself: its configuration files, its commands run to completion
(run_ces2pg, run_replay) and the daemon as a process (Daemon).
"""

import itertools
import re
import signal
import subprocess
from pathlib import Path

from harness import reports
from harness.common import CES2PG, child_env, require_binary, wait_until
from harness.reports import tail_text


# Kafka client settings for the daemon against the mock cluster. The
# librdkafka 2.0.2 mock answers the first JoinGroup of an empty group after a
# fixed 3 s and waits session.timeout.ms - 1000 ms for members to rejoin after
# a leave; a member blocked in that first join is not refreshed, so the session
# timeout must stay comfortably above 3 s. 4000 ms keeps joins at ~3 s.
DEFAULT_KAFKA_PROPERTIES = (
    "fetch.wait.max.ms=50",
    "session.timeout.ms=4000",
    "heartbeat.interval.ms=500",
)

EX_USAGE = 64
EX_CONFIG = 78


def cfg_str(value):
    """value as a libconfig string literal."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def make_config(db=None, broker=None, group="ces2pg-test", topics=("ces",),
                properties=None, batch_max_events=None, batch_max_ms=50,
                log_level="info", extra_config="", conninfo=None,
                kafka_extra=(), apply_extra=(), http_listen="", decode_threads=2,
                postgres_extra=()):
    """Returns the text of a ces2pg config file.

    apply_extra: more lines of the apply section, e.g.
    'ordering = "partition";'.

    Sections are written only when they have content: no kafka section
    without a broker or kafka_extra (replay mode). kafka_extra: more lines
    of the kafka section, e.g. 'ssl_ca_file = "/path";' (with broker=None,
    no brokers line: Event Hubs mode derives it). http_listen: the
    http.listen value (default "": no HTTP server, so that daemons do not
    compete for the default port; None leaves the key out). decode_threads: the
    decode.threads value (default 2, so that the daemon's decoding thread and the records
    it decodes ahead are exercised on every machine, where the default would give one
    thread on two CPUs; None leaves the key out). extra_config is appended verbatim; it
    must not repeat a section written here (libconfig rejects duplicates): use the keyword
    arguments for those, or put decode.threads in your own decode section.
    postgres_extra: more lines of the postgres section, e.g. 'auth = "entra";'.
    """
    if isinstance(topics, str):
        topics = (topics,)
    if properties is None:
        properties = DEFAULT_KAFKA_PROPERTIES
    lines = []
    if broker is not None or kafka_extra:
        lines.append("kafka = {")
        if broker is not None:
            bootstrap = broker if isinstance(broker, str) else broker.bootstrap
            lines.append(f"  brokers = {cfg_str(bootstrap)};")
        lines += [f"  {line}" for line in kafka_extra]
        lines += [
            "  topics = [ " + ", ".join(cfg_str(t) for t in topics) + " ];",
            f"  group_id = {cfg_str(group)};",
            "  properties = [ " + ", ".join(cfg_str(p) for p in properties)
            + " ];",
            "};",
        ]
    if conninfo is None and db is not None:
        conninfo = db.conninfo
    if conninfo is not None:
        lines += ["postgres = {", f"  conninfo = {cfg_str(conninfo)};"]
        lines += [f"  {line}" for line in postgres_extra] + ["};"]
    apply = []
    if batch_max_events is not None:
        apply.append(f"  batch_max_events = {int(batch_max_events)};")
    if batch_max_ms is not None:
        apply.append(f"  batch_max_ms = {int(batch_max_ms)};")
    apply += [f"  {line}" for line in apply_extra]
    if apply:
        lines += ["apply = {"] + apply + ["};"]
    if log_level is not None:
        lines += [f"log = {{ level = {cfg_str(log_level)}; }};"]
    if http_listen is not None:
        lines += [f"http = {{ listen = {cfg_str(http_listen)}; }};"]
    if decode_threads is not None and "decode = {" not in extra_config:
        lines += [f"decode = {{ threads = {int(decode_threads)}; }};"]
    text = "\n".join(lines) + "\n"
    if extra_config:
        text += extra_config.rstrip("\n") + "\n"
    return text


_cfg_counter = itertools.count(1)


def write_config(directory, text, name=None):
    """Writes a config file into directory (a new name unless given), private
    as a file that may hold a secret must be (ces2pg refuses it otherwise);
    returns its path."""
    path = Path(directory) / (name or f"ces2pg-{next(_cfg_counter)}.conf")
    write_secret(path, text)
    return path


def write_secret(path, text):
    """Writes a file only its owner may read (mode 0600), as ces2pg wants a
    file that holds a secret; returns its path."""
    path = Path(path)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)
    return path


def run_ces2pg(args, timeout=60, cwd=None):
    """Runs ces2pg to completion; returns (exit code, stdout, stderr)."""
    require_binary(CES2PG, "ces2pg")
    r = subprocess.run(
        [str(CES2PG)] + [str(a) for a in args], capture_output=True,
        timeout=timeout, env=child_env(), cwd=cwd, stdin=subprocess.DEVNULL,
    )
    return (r.returncode, r.stdout.decode("utf-8", "replace"),
            r.stderr.decode("utf-8", "replace"))


def run_replay(db, paths, extra_config="", timeout=120, options=(), **config_kw):
    """Runs `ces2pg replay -c FILE [OPTIONS...] PATH...` against db.

    Returns (exit code, stdout, stderr). The config has no kafka section.
    options: replay's own, e.g. ("--capture",).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    cfg = write_config(db.tmp_path,
                       make_config(db, extra_config=extra_config, **config_kw))
    args = ["replay", "-c", cfg] + list(options) + list(paths)
    rc, out, err = run_ces2pg(args, timeout=timeout, cwd=db.tmp_path)
    log = Path(db.tmp_path) / f"replay-{next(_cfg_counter)}.log"
    log.write_text(f"$ ces2pg {' '.join(map(str, args))}\n"
                   f"exit {rc}\n--- stdout\n{out}--- stderr\n{err}")
    reports.attach_to_current(f"ces2pg replay ({log})", log)
    return rc, out, err


REPLAY_SUMMARY = re.compile(
    r"^replay: records=(\d+) applied=(\d+) dead_letters=(\d+)$", re.M)


def parse_replay_summary(stdout):
    """Returns (records, applied, dead_letters) from replay's summary line."""
    m = REPLAY_SUMMARY.search(stdout)
    assert m, f"no replay summary line in stdout: {stdout!r}"
    return tuple(int(x) for x in m.groups())


class Daemon:
    """A ces2pg daemon started by the ces2pg fixture."""

    def __init__(self, config_path, log_path, cwd):
        require_binary(CES2PG, "ces2pg")
        self.config_path = Path(config_path)
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(CES2PG), "-c", str(self.config_path)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env(), cwd=cwd,
        )
        self.handled = False  # set once the test stopped or waited for it

    def log(self):
        return tail_text(self.log_path, limit=10**9)

    def alive(self):
        return self.proc.poll() is None

    def check_alive(self):
        """Fails at once if the daemon has exited."""
        rc = self.proc.poll()
        if rc is not None:
            raise AssertionError(
                f"ces2pg exited unexpectedly with {rc}; log tail:\n"
                f"{tail_text(self.log_path)[-4000:]}")

    def wait_log(self, regex, timeout=30):
        """Waits for a log line matching regex; returns the match."""
        pattern = re.compile(regex, re.M)

        def found():
            m = pattern.search(self.log())
            if m:
                return m
            if not self.alive():  # one last look happened above
                raise AssertionError(
                    f"ces2pg exited ({self.proc.returncode}) before logging "
                    f"{regex!r}; log tail:\n{self.log()[-4000:]}")
            return None

        return wait_until(found, timeout, interval=0.05,
                          message=lambda: f"log line {regex!r}; log tail:\n"
                          + self.log()[-4000:])

    def wait(self, timeout=30):
        """Waits for the daemon to exit by itself; returns the exit code."""
        self.handled = True
        try:
            return self.proc.wait(timeout)
        finally:
            self._close()

    def terminate(self, timeout=30):
        """SIGTERM, waits up to timeout seconds; returns the exit code."""
        self.handled = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"ces2pg did not exit within {timeout}s of SIGTERM")
        finally:
            self._close()

    def kill9(self):
        """SIGKILL (simulated crash); returns the exit code (-9)."""
        self.handled = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        rc = self.proc.wait()
        self._close()
        return rc

    def _close(self):
        if not self._log.closed:
            self._log.close()
