# The Debian package, made by CPack from the release build:
#   cmake --build build && cd build && cpack -G DEB      ->  ces2pg_<version>_amd64.deb
# scripts/check-package builds it, runs lintian on it and installs it into a fresh Debian 12.
# On top of the binary and the manual pages (CMakeLists.txt) it holds
#   /etc/ces2pg/ces2pg.conf              a conffile: conf/ces2pg.conf adapted to the installed
#                                        service (adapt-conf.cmake); made 0640 root:ces2pg by
#                                        postinst with dpkg-statoverride
#   /lib/systemd/system/ces2pg.service   the unit (systemd/), neither enabled nor started
#   /usr/lib/sysusers.d/ces2pg.conf      the system user and group ces2pg (systemd/ces2pg.sysusers)
#   /usr/share/doc/ces2pg/               README.md.gz, changelog.gz, copyright,
#                                        examples/ces2pg.conf.gz (the annotated reference)
#   /usr/share/lintian/overrides/ces2pg  what lintian warns about on purpose, with the reasons
# and the maintainer scripts of deb/, which do what debhelper's dh_installsysusers and
# dh_installsystemd --no-enable --no-start would.

set(CES2PG_PKG ${CMAKE_CURRENT_BINARY_DIR}/packaging)

# The configuration the package installs, and whether it is one ces2pg accepts (ctest).
add_custom_command(
  OUTPUT ${CES2PG_PKG}/ces2pg.conf
  COMMAND ${CMAKE_COMMAND} -DIN=${PROJECT_SOURCE_DIR}/conf/ces2pg.conf
          -DOUT=${CES2PG_PKG}/ces2pg.conf -P ${PROJECT_SOURCE_DIR}/packaging/adapt-conf.cmake
  DEPENDS ${PROJECT_SOURCE_DIR}/conf/ces2pg.conf ${PROJECT_SOURCE_DIR}/packaging/adapt-conf.cmake
  COMMENT "Adapting conf/ces2pg.conf to the packaged service")

# Documentation larger than 4 KB and changelogs are compressed (Debian policy 12.3), without a
# name or time stamp in the header, so that the package is reproducible.
set(CES2PG_PKG_FILES ${CES2PG_PKG}/ces2pg.conf)
function(ces2pg_gzip src out)
  add_custom_command(
    OUTPUT ${CES2PG_PKG}/${out}.gz
    COMMAND ${CMAKE_COMMAND} -E copy ${src} ${CES2PG_PKG}/${out}
    COMMAND gzip -9nf ${CES2PG_PKG}/${out}
    DEPENDS ${src})
  set(CES2PG_PKG_FILES ${CES2PG_PKG_FILES} ${CES2PG_PKG}/${out}.gz PARENT_SCOPE)
endfunction()
configure_file(${PROJECT_SOURCE_DIR}/packaging/deb/changelog.in ${CES2PG_PKG}/changelog.in @ONLY)
ces2pg_gzip(${CES2PG_PKG}/changelog.in changelog)
ces2pg_gzip(${PROJECT_SOURCE_DIR}/README.md README.md)
ces2pg_gzip(${PROJECT_SOURCE_DIR}/conf/ces2pg.conf examples/ces2pg.conf)
add_custom_target(package-files ALL DEPENDS ${CES2PG_PKG_FILES})

# Absolute destinations: CPack puts them in the package as they are (the rest under /usr).
# 0644 in the package, like any conffile: the example holds no secret. postinst gives it mode 0640
# and the group ces2pg through dpkg-statoverride, which keeps them across upgrades.
install(FILES ${CES2PG_PKG}/ces2pg.conf DESTINATION /etc/ces2pg)
install(FILES ${PROJECT_SOURCE_DIR}/systemd/ces2pg.service DESTINATION /lib/systemd/system)
install(FILES ${PROJECT_SOURCE_DIR}/systemd/ces2pg.sysusers DESTINATION /usr/lib/sysusers.d
        RENAME ces2pg.conf)
install(FILES ${CES2PG_PKG}/README.md.gz ${CES2PG_PKG}/changelog.gz
              ${PROJECT_SOURCE_DIR}/packaging/deb/copyright
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${CES2PG_PKG}/examples/ces2pg.conf.gz DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/deb/lintian-overrides
        DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides RENAME ces2pg)

set(CPACK_PACKAGE_NAME ces2pg)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT
    "ces2pg maintainers <maintainers@users.noreply.a-seed-78fe81ba.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "SQL Server Change Event Streaming to PostgreSQL replicator")
# The extended description, in lines of at most 80 characters.
string(JOIN "\n" CPACK_PACKAGE_DESCRIPTION
  "ces2pg reads the change events that SQL Server or Azure SQL Change Event"
  "Streaming publishes to Azure Event Hubs, or to any Kafka-protocol broker, and"
  "applies each row change to PostgreSQL as an idempotent upsert or delete keyed"
  "on the source primary key, exactly once: consumer positions are stored in"
  "PostgreSQL in the transaction of the rows they cover. Source transactions stay"
  "whole, events split into segments are joined, and what cannot be applied is"
  "kept in a dead-letter table."
  "."
  "This package holds the daemon, its systemd unit (neither enabled nor started),"
  "the system user ces2pg, the configuration /etc/ces2pg/ces2pg.conf and the"
  "manual pages.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # ces2pg_<version>_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION database)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The libraries ces2pg links, with versions, from dpkg-shlibdeps (dpkg-dev); systemd-sysusers
# for postinst, as dh_installsysusers would add; procps for the unit's ExecReload=/bin/kill (as
# openssh-server does); CA certificates for Event Hubs' TLS.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "systemd | systemd-standalone-sysusers | systemd-sysusers, procps")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS ca-certificates)
set(CPACK_DEBIAN_PACKAGE_SUGGESTS postgresql)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/packaging/deb/conffiles ${PROJECT_SOURCE_DIR}/packaging/deb/postinst
    ${PROJECT_SOURCE_DIR}/packaging/deb/prerm ${PROJECT_SOURCE_DIR}/packaging/deb/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Stripped as dh_strip does: CPack strips the binary, then the compiler's notes go too.
set(CPACK_STRIP_FILES ON)
install(CODE "
  if(CMAKE_INSTALL_DO_STRIP)
    execute_process(COMMAND \"${CMAKE_OBJCOPY}\" --remove-section=.comment --remove-section=.note
                            \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/ces2pg\"
                    COMMAND_ERROR_IS_FATAL ANY)
  endif()")
set(CPACK_GENERATOR DEB)
include(CPack)
