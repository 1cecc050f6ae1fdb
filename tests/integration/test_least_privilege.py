"""ces2pg under the least privilege README documents ("Least privilege"): a
login role that may create schemas in its database (CREATE on the database)
and nothing more, or, where the target schemas already exist, USAGE and
CREATE on them. No superuser, no ownership of anything it did not create."""

from harness.daemon import parse_replay_summary, run_replay
from harness.events import generate
from harness.progress import dead_letters
from harness.tables import assert_tables_match

ROLE = "ces2pg_least"


def least_privilege_role(db, grant_database=True):
    """The role, made once per server (roles are the cluster's), with CREATE on
    db only when grant_database; returns its connection string to db."""
    db.query(f"""DO $$ BEGIN
        CREATE ROLE {ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT;
    EXCEPTION WHEN duplicate_object THEN NULL; END $$""")
    if grant_database:
        db.query(f'GRANT CREATE ON DATABASE "{db.name}" TO {ROLE}')
    return db.conninfo.replace(f"user={db.server.user}", f"user={ROLE}")


def mixed_stream(tmp_path, seed):
    """Inserts, updates, deletes and key changes over three tables, as a file."""
    return generate(tmp_path, seed=seed, events=3000, tables=3,
                    extra_args=["--mix", "50,35,15", "--txn-size", "1-10",
                                "--pk-changes", "--reuse-deleted-keys"])


def test_applies_with_create_on_the_database_only(tmp_path, db):
    conninfo = least_privilege_role(db)
    assert db.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (ROLE,)) is False
    expect = mixed_stream(tmp_path, 20261207)
    rc, out, err = run_replay(db, expect["_out"], conninfo=conninfo)
    assert rc == 0, err
    records, applied, dead = parse_replay_summary(out)
    assert (records, dead) == (expect["records"], 0), out
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    # What it made is its own: the metadata schema, the target schema and tables.
    owners = db.query("""SELECT DISTINCT pg_get_userbyid(nspowner) FROM pg_namespace
                         WHERE nspname IN ('ces2pg', 'dbo')""")
    assert owners == [(ROLE,)], owners
    assert db.scalar("""SELECT count(*) FROM pg_tables
                        WHERE schemaname = 'dbo' AND tableowner <> %s""", (ROLE,)) == 0


def test_applies_into_a_schema_it_was_granted(tmp_path, db):
    """The application owns the target schema; ces2pg may use it and create in it."""
    conninfo = least_privilege_role(db)
    db.query("CREATE SCHEMA dbo")
    db.query(f"GRANT USAGE, CREATE ON SCHEMA dbo TO {ROLE}")
    expect = mixed_stream(tmp_path, 20261208)
    rc, out, err = run_replay(db, expect["_out"], conninfo=conninfo)
    assert rc == 0, err
    assert_tables_match(db, expect)
    assert dead_letters(db) == []
    assert db.scalar("SELECT pg_get_userbyid(nspowner) FROM pg_namespace "
                     "WHERE nspname = 'dbo'") == db.server.user


def test_without_create_it_stops_and_says_why(tmp_path, db):
    """A role that may not create its metadata schema: a clear error, not a loop."""
    conninfo = least_privilege_role(db, grant_database=False)
    db.query(f'REVOKE CREATE ON DATABASE "{db.name}" FROM {ROLE}')
    expect = mixed_stream(tmp_path, 20261209)
    rc, out, err = run_replay(db, expect["_out"], conninfo=conninfo, timeout=60)
    assert rc != 0, out
    assert "permission denied" in err, err
    assert not db.table_exists("ces2pg.offsets")
