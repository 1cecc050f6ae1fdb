"""A throw-away PostgreSQL 15 server (initdb + pg_ctl in a temporary directory,
on a free 127.0.0.1 port, run as an unprivileged user when we are root), and
one test's database in it.

Environment:
    PG_BINDIR      PostgreSQL binaries (default /usr/lib/postgresql/15/bin)
"""

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg2

from harness.common import free_port
from harness.reports import tail_text


PG_BINDIR = Path(os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin"))

PG_USER = "ces2pg-test"  # unprivileged OS user that runs the server as root
PG_SUPERUSER = "postgres"  # database superuser role


def _ensure_os_user(name):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell",
         "/usr/sbin/nologin", name],
        check=True, capture_output=True,
    )
    return pwd.getpwnam(name)


class Postgres:
    """A throw-away PostgreSQL cluster (initdb + pg_ctl)."""

    def __init__(self):
        self.host = "127.0.0.1"
        self.port = None
        self.dbname = "postgres"
        self.user = PG_SUPERUSER
        self.run_as = None
        if os.geteuid() == 0:
            self.run_as = _ensure_os_user(PG_USER)
        # Not under pytest's basetemp: that is mode 0700 and owned by root,
        # so the server user could not reach it.
        self.dir = Path(tempfile.mkdtemp(prefix="ces2pg-pg-"))
        self.pgdata = self.dir / "data"
        self.log_path = self.dir / "postgresql.log"
        if self.run_as:
            os.chown(self.dir, self.run_as.pw_uid, self.run_as.pw_gid)
        os.chmod(self.dir, 0o755)  # the log must stay readable to root tools
        self.started = False

    def _cmd(self, args):
        if self.run_as:
            return ["runuser", "-u", self.run_as.pw_name, "--"] + args
        return args

    def _run(self, args, **kw):
        return subprocess.run(
            self._cmd(args), capture_output=True, text=True, cwd=self.dir, **kw
        )

    def initdb(self):
        r = self._run(
            [str(PG_BINDIR / "initdb"), "-D", str(self.pgdata), "-U",
             PG_SUPERUSER, "--auth=trust", "--no-sync", "-E", "UTF8",
             "--locale=C"],
            timeout=120,
        )
        if r.returncode:
            raise RuntimeError(f"initdb failed:\n{r.stdout}\n{r.stderr}")
        with open(self.pgdata / "postgresql.conf", "a") as f:
            f.write(
                "\n# ces2pg integration tests\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\n"
                "fsync = off\n"
                "synchronous_commit = off\n"
                "full_page_writes = off\n"
                "shared_buffers = 32MB\n"
                "max_connections = 50\n"
                # lets tests count the statements ces2pg executed (its bulk path)
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "log_line_prefix = '%m [%p] %q%u@%d %a: '\n"
                "log_min_messages = warning\n"
                "log_connections = off\n"
                "TimeZone = 'UTC'\n"
            )

    def start(self, attempts=5):
        last = ""
        for _ in range(attempts):
            port = free_port()
            r = self._run(
                [str(PG_BINDIR / "pg_ctl"), "start", "-w", "-t", "60", "-D",
                 str(self.pgdata), "-l", str(self.log_path), "-o",
                 f"-p {port}"],
                timeout=90,
            )
            if r.returncode == 0:
                self.port = port
                self.started = True
                return
            last = r.stdout + r.stderr + tail_text(self.log_path)[-2000:]
            if "Address already in use" not in last:
                break
        raise RuntimeError(f"pg_ctl start failed:\n{last}")

    def stop(self, mode="fast"):
        """pg_ctl stop: "fast" cuts the sessions; "immediate" is a crash (no checkpoint, what
        was not written to the WAL is lost)."""
        if self.started:
            r = self._run(
                [str(PG_BINDIR / "pg_ctl"), "stop", "-w", "-m", mode, "-D",
                 str(self.pgdata)],
                timeout=60,
            )
            assert r.returncode == 0, f"pg_ctl stop -m {mode}: {r.stdout}{r.stderr}"
            self.started = False

    def restart(self, down_seconds=0.0, mode="fast"):
        """Stops the server (mode as for stop), optionally stays down for a while, and starts
        it again on the same port."""
        self.stop(mode)
        if down_seconds:
            time.sleep(down_seconds)  # the outage itself is what is tested, not a wait
        self.start_again()

    def start_again(self):
        """Starts the stopped server on its old port."""
        r = self._run(
            [str(PG_BINDIR / "pg_ctl"), "start", "-w", "-t", "60", "-D",
             str(self.pgdata), "-l", str(self.log_path), "-o", f"-p {self.port}"],
            timeout=90,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        self.started = True

    def _hba_rule(self, role):
        name = '"' + role.replace('"', '""') + '"'
        return "".join(f"{kind} all {name} {addr} scram-sha-256 # ces2pg-test password\n"
                       for kind, addr in (("local", ""), ("host", "127.0.0.1/32"),
                                          ("host", "::1/128")))

    def require_password(self, role):
        """Makes role log in with its password (scram-sha-256) instead of the
        cluster's trust, over TCP and the socket: pg_hba.conf rules in front of
        the others, in force when this returns. Other roles keep trust."""
        hba = self.pgdata / "pg_hba.conf"
        text = hba.read_text()
        rule = self._hba_rule(role)
        if rule not in text:
            hba.write_text(rule + text)  # in place: the server's user keeps it
        self._reload_hba(role, required=True)

    def stop_requiring_password(self, role):
        """Undoes require_password(role)."""
        hba = self.pgdata / "pg_hba.conf"
        hba.write_text(hba.read_text().replace(self._hba_rule(role), ""))
        self._reload_hba(role, required=False)

    def _reload_hba(self, role, required):
        # pg_reload_conf() only signals the postmaster: wait until a login of
        # the role without a password is asked for one (or no longer is).
        self.sql("SELECT pg_reload_conf()")

        def in_force():
            try:
                psycopg2.connect(host=self.host, port=self.port, dbname=self.dbname,
                                 user=role, password="", passfile=str(self.dir / "none"),
                                 connect_timeout=5).close()
                asked = False
            except psycopg2.OperationalError as e:
                asked = "no password supplied" in str(e)
            return asked == required

        deadline = time.monotonic() + 30
        while not in_force():
            assert time.monotonic() < deadline, (
                f"pg_hba.conf rule for {role} not in force after 30s:\n"
                + tail_text(self.log_path)[-2000:])
            time.sleep(0.05)

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_size(self):
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def conninfo_for(self, dbname):
        return (f"host={self.host} port={self.port} dbname={dbname} "
                f"user={self.user}")

    @property
    def conninfo(self):
        return self.conninfo_for(self.dbname)

    def connect(self, dbname=None):
        conn = psycopg2.connect(self.conninfo_for(dbname or self.dbname))
        conn.autocommit = True
        return conn

    def sql(self, query, args=None, dbname=None):
        """Runs one statement; returns all rows (or None)."""
        with contextlib.closing(self.connect(dbname)) as conn:
            with conn.cursor() as cur:
                cur.execute(query, args)
                return cur.fetchall() if cur.description else None


class Database:
    """One test's database in the session server."""

    def __init__(self, server, name, tmp_path):
        self.server = server
        self.name = name
        self.tmp_path = tmp_path
        self.conninfo = server.conninfo_for(name)

    def connect(self):
        """A psycopg2 connection with autocommit on."""
        return self.server.connect(self.name)

    def query(self, sql, args=None):
        """Runs one statement in a new session; returns all rows (or None)."""
        return self.server.sql(sql, args, dbname=self.name)

    def scalar(self, sql, args=None):
        rows = self.query(sql, args)
        assert rows and len(rows) == 1 and len(rows[0]) == 1, rows
        return rows[0][0]

    def table_exists(self, qualified):
        return self.scalar("SELECT to_regclass(%s) IS NOT NULL", (qualified,))
