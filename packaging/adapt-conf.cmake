# cmake -DIN=conf/ces2pg.conf -DOUT=FILE -P packaging/adapt-conf.cmake
# Writes the configuration the Debian package installs as /etc/ces2pg/ces2pg.conf: the annotated
# reference, with a head that says what to fill in and how to start the service, pointers to the
# installed files instead of the repository's, and PostgreSQL over the local socket with peer
# authentication as the service user (no secret needed). Every change must find its text: when
# conf/ces2pg.conf changes under it, the build fails here instead of shipping a stale file.

file(READ "${IN}" conf)

function(change from to)
  string(FIND "${conf}" "${from}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "packaging/adapt-conf.cmake: '${from}' is no longer in ${IN}: adapt the "
                        "change to it")
  endif()
  string(REPLACE "${from}" "${to}" changed "${conf}")
  set(conf "${changed}" PARENT_SCOPE)
endfunction()

change("# ces2pg configuration (libconfig syntax: `key = value;`, groups in `{ }`, lists in `[ ]`).
#
" "# ces2pg configuration (libconfig syntax: `key = value;`, groups in `{ }`, lists in `[ ]`).
#
# This is /etc/ces2pg/ces2pg.conf, read by the ces2pg service (ces2pg.conf(5), ces2pg(8)). Fill
# in kafka.brokers (or an Event Hubs connection string), kafka.topics and postgres.conninfo, then
#     ces2pg --check-config -c /etc/ces2pg/ces2pg.conf
#     systemctl enable --now ces2pg
# The service runs as the system user ces2pg, which may read this file (mode 0640, group ces2pg)
# but not change it. Put secrets in root's files beside it (mode 0600), which systemd hands over:
# see CREDENTIALS in ces2pg(8). /usr/share/doc/ces2pg/examples/ces2pg.conf.gz is the original.
#
")
change("(systemd's LoadCredential=, see
# systemd/ces2pg.service)" "(systemd's LoadCredential=, see
# /lib/systemd/system/ces2pg.service)")
change("  conninfo = \"host=127.0.0.1 port=5432 dbname=target user=ces2pg\";
" "  # Here: a PostgreSQL on this host, over its Unix socket, with peer authentication as the
  # service user ces2pg (createuser ces2pg; createdb -O ces2pg target): no password needed.
  conninfo = \"host=/run/postgresql dbname=target\";
")

file(WRITE "${OUT}" "${conf}")
