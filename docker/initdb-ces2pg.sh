#!/bin/sh
# Run once by the postgres image when it makes its database (/docker-entrypoint-initdb.d): the
# least-privilege role ces2pg logs in as (README, "The PostgreSQL role ces2pg needs"): a login with
# CREATE on the target database, no superuser.
set -eu
psql -v ON_ERROR_STOP=1 -q --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v pw="$(cat /run/secrets/ces2pg-password)" -v db="$POSTGRES_DB" <<'SQL'
CREATE ROLE ces2pg LOGIN PASSWORD :'pw';
GRANT CREATE ON DATABASE :"db" TO ces2pg;
SQL
