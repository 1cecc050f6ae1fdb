# Shared shell functions for scripts/demo, scripts/test and bench/. Source it; do not run it.

# The Debian packages ces2pg builds and runs with.
CES2PG_BUILD_PACKAGES="build-essential cmake pkg-config librdkafka-dev libpq-dev libyajl-dev
  libavro-dev libconfig-dev libmicrohttpd-dev libsystemd-dev zlib1g-dev libcurl4-openssl-dev libssl-dev"
# What the demo needs on top: a PostgreSQL server and the generator's Kafka client.
CES2PG_DEMO_PACKAGES="postgresql-15 postgresql-client-15 python3 python3-confluent-kafka
  python3-psycopg2"
# What the tests need on top of that.
# (systemd for systemd-analyze, which checks the unit's hardening; python3-yaml reads the compose file
# and docker-compose, Compose 1.29, validates it with `docker-compose config` where the docker compose
# plugin is absent; prometheus for promtool, which checks contrib/'s alerting rules and dashboard
# queries; groff-base and man-db render the manual pages for ctest's man_pages.)
CES2PG_TEST_PACKAGES="libcmocka-dev python3-pytest python3-avro kcat valgrind openssl clang libclang-rt-14-dev
  systemd python3-yaml docker-compose prometheus groff-base man-db"
# The real-broker tier (tests/realbroker): a JDK for Apache Kafka and Maven to fetch it (openssl,
# for its certificates, is a test package above). scripts/test installs them when missing only under
# CI; elsewhere the tier is skipped without them.
CES2PG_KAFKA_PACKAGES="openjdk-17-jdk-headless maven"
# scripts/check-image: podman (with runc and slirp4netns) builds docker/Dockerfile on a base made by
# debootstrap and runs the images.
CES2PG_IMAGE_PACKAGES="podman runc slirp4netns debootstrap"
# scripts/check-package: dpkg-dev for CPack's dpkg-shlibdeps, lintian, debootstrap for a fresh
# Debian 12 to install into, file, and man-db and groff-base to render the manual pages (man/check-man).
CES2PG_PACKAGE_PACKAGES="dpkg-dev lintian debootstrap file man-db groff-base"

log() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Installs the Debian packages given that are not installed yet (apt-get only when needed).
ensure_packages() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

# The mirror apt on this machine uses for SUITE/main ($2 when there is none).
debian_mirror_for() {
    apt-cache policy | awk -v s="$1/main" '$3 == s { print $2; exit }' | grep . || echo "$2"
}

# Makes a minimal Debian 12 in directory $1 (removed first) with debootstrap from this machine's own
# Debian mirror, with the apt sources of debian:12-slim (security updates included) and no package
# lists or archives left; debootstrap's output goes to $2. For scripts/check-image and
# scripts/check-package; needs root.
make_debian_root() {
    local root=$1 output=$2 mirror security
    mirror=$(debian_mirror_for bookworm http://deb.debian.org/debian)
    security=$(debian_mirror_for bookworm-security http://deb.debian.org/debian-security)
    log "making a Debian 12 with debootstrap from $mirror"
    rm -rf "$root"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$output" 2>&1 ||
        { tail -20 "$output"; die "debootstrap failed"; }
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
}

# Configures and builds into $1 with extra CMake arguments.
build_into() {
    local dir=$1
    shift
    cmake -S "$CES2PG_ROOT" -B "$dir" -DCES2PG_WERROR=ON "$@" >/dev/null
    cmake --build "$dir" -j"$(nproc)"
}

PG_BIN=/usr/lib/postgresql/15/bin

# PostgreSQL refuses to run as root: servers run as this unprivileged user.
pg_user() {
    if [ "$(id -u)" -ne 0 ]; then
        id -un
        return
    fi
    id ces2pg-test >/dev/null 2>&1 ||
        useradd --system --no-create-home --shell /usr/sbin/nologin ces2pg-test
    echo ces2pg-test
}

as_pg_user() {
    local user
    user=$(pg_user)
    if [ "$(id -un)" = "$user" ]; then "$@"; else runuser -u "$user" -- "$@"; fi
}

# A free TCP port on 127.0.0.1.
free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts a throwaway PostgreSQL in directory $1; sets PG_PORT and PG_CONNINFO.
start_postgres() {
    local dir=$1
    mkdir -p "$dir"
    chown "$(pg_user)" "$dir"
    as_pg_user "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 ||
        { cat "$dir/initdb.log"; die "initdb failed"; }
    local tries
    for tries in 1 2 3 4 5; do
        PG_PORT=$(free_port)
        if as_pg_user "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
            -o "-p $PG_PORT -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
            start >/dev/null; then
            PG_CONNINFO="host=127.0.0.1 port=$PG_PORT dbname=postgres user=postgres"
            return 0
        fi
    done
    cat "$dir/postgres.log" >&2
    die "PostgreSQL did not start"
}

stop_postgres() {
    local dir=$1
    [ -d "$dir/data" ] && as_pg_user "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}
