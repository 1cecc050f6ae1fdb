"""ces2pg holds the PostgreSQL password (and the Event Hubs key) in memory, so
it makes itself not dumpable: no core dump, no other process of its user
attaching. The kernel shows it in /proc/PID, whose files then belong to root
instead of the process's user; CES2PG_CORE_DUMPS=1 keeps the default."""

import os
import pwd
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from harness.common import CES2PG, child_env, require_binary
from harness.daemon import make_config
from harness.postgres import PG_USER

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="runs ces2pg as another user: needs root")


def proc_owner_while_running(db, env_extra):
    """Starts `ces2pg replay -` as the unprivileged user the harness runs
    PostgreSQL as, waits until it has connected, and returns the owner of its
    /proc/PID/status; then ends it (its input closes)."""
    require_binary(CES2PG, "ces2pg")
    user = pwd.getpwnam(PG_USER)
    # Somewhere the user can reach: the build and pytest's tmp_path may be
    # under directories only root may enter.
    work = Path(tempfile.mkdtemp(prefix="ces2pg-core-"))
    try:
        os.chmod(work, 0o755)
        binary = work / "ces2pg"
        shutil.copy2(CES2PG, binary)
        conf = work / "replay.conf"
        conf.write_text(make_config(db))
        os.chmod(conf, 0o644)
        env = dict(child_env(), **env_extra)
        p = subprocess.Popen([str(binary), "replay", "-c", str(conf), "-"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, cwd=work,
                             user=user.pw_uid, group=user.pw_gid, extra_groups=[])
        try:
            err = b""
            deadline = time.monotonic() + 30
            while b"connected to PostgreSQL" not in err:
                assert time.monotonic() < deadline, err.decode(errors="replace")
                assert p.poll() is None, err.decode(errors="replace")
                ready, _, _ = select.select([p.stderr], [], [], 0.5)
                if ready:
                    err += os.read(p.stderr.fileno(), 4096)
            owner = os.stat(f"/proc/{p.pid}/status").st_uid
        finally:
            p.stdin.close()
            rc = p.wait(timeout=60)
            p.stdout.close()
            p.stderr.close()
        assert rc == 0, rc
        return owner, user.pw_uid
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_not_dumpable_by_default(db):
    owner, user_uid = proc_owner_while_running(db, {})
    assert user_uid != 0
    assert owner == 0, "ces2pg is dumpable: its /proc/PID/status belongs to its user"


def test_core_dumps_kept_when_asked(db):
    owner, user_uid = proc_owner_while_running(db, {"CES2PG_CORE_DUMPS": "1"})
    assert owner == user_uid
