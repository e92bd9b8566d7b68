# SPDX-License-Identifier: Apache-2.0
# Runs at install time (cmake --install, cpack): writes kvtierd.service with
# the paths of the prefix being installed to, and puts the sysusers and
# tmpfiles snippets and the default config in place. Expects
# KVTIER_SOURCE_DIR; CMAKE_INSTALL_PREFIX and DESTDIR are the install's.
set(prefix "${CMAKE_INSTALL_PREFIX}")
if(prefix STREQUAL "/usr")
  set(etc "/etc")
else()
  set(etc "${prefix}/etc")
endif()
set(KVTIERD "${prefix}/bin/kvtierd")
set(KVTIER_CONFIG "${etc}/kvtier/kvtierd.toml")
set(root "$ENV{DESTDIR}")  # configure_file does not add it; file(INSTALL) does
configure_file("${KVTIER_SOURCE_DIR}/systemd/kvtierd.service.in"
               "${root}${prefix}/lib/systemd/system/kvtierd.service" @ONLY)
message(STATUS "Installing: ${root}${prefix}/lib/systemd/system/kvtierd.service")
file(INSTALL "${KVTIER_SOURCE_DIR}/systemd/kvtier.sysusers" DESTINATION "${prefix}/lib/sysusers.d"
     RENAME kvtier.conf)
file(INSTALL "${KVTIER_SOURCE_DIR}/systemd/kvtier.tmpfiles" DESTINATION "${prefix}/lib/tmpfiles.d"
     RENAME kvtier.conf)
# An operator's edited config is never overwritten.
if(EXISTS "${root}${KVTIER_CONFIG}")
  message(STATUS "Keeping: ${root}${KVTIER_CONFIG}")
else()
  file(INSTALL "${KVTIER_SOURCE_DIR}/systemd/kvtierd.toml" DESTINATION "${etc}/kvtier")
endif()
