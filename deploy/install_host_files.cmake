# Installs rackhubd.service and the example rackhubd.toml; run by
# `cmake --install` (install(CODE) in deploy/CMakeLists.txt), where
# CMAKE_INSTALL_PREFIX is the prefix of this install and DESTDIR (if set) is
# honoured by file(INSTALL). The caller sets RACKHUB_UNIT_SOURCE,
# RACKHUB_CONFIG_SOURCE, RACKHUB_BINDIR and RACKHUB_UNITDIR (relative to the
# prefix unless absolute) and RACKHUB_STAGING_DIR (in the build tree).

# The FHS rule GNUInstallDirs applies: configuration of the /usr prefix lives
# in /etc, of any other prefix in PREFIX/etc.
if(CMAKE_INSTALL_PREFIX MATCHES "^/usr/?$")
  set(etc_dir /etc)
else()
  set(etc_dir "${CMAKE_INSTALL_PREFIX}/etc")
endif()
set(config_path "${etc_dir}/rackhub/rackhubd.toml")
set(binary_path "${CMAKE_INSTALL_PREFIX}/${RACKHUB_BINDIR}/rackhubd")
if(IS_ABSOLUTE "${RACKHUB_BINDIR}")
  set(binary_path "${RACKHUB_BINDIR}/rackhubd")
endif()
set(unit_dir "${CMAKE_INSTALL_PREFIX}/${RACKHUB_UNITDIR}")
if(IS_ABSOLUTE "${RACKHUB_UNITDIR}")
  set(unit_dir "${RACKHUB_UNITDIR}")
endif()

# deploy/rackhubd.service is the hand-installable unit (/usr/local/bin/rackhubd,
# /etc/rackhub/rackhubd.toml); the installed one names this install's paths.
# Its leading comment (how to copy it by hand) is replaced.
file(READ "${RACKHUB_UNIT_SOURCE}" unit)
foreach(literal "/usr/local/bin/rackhubd " "/etc/rackhub/rackhubd.toml")
  string(FIND "${unit}" "${literal}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${RACKHUB_UNIT_SOURCE}: no '${literal}' to replace with the installed path")
  endif()
endforeach()
string(REPLACE "/usr/local/bin/rackhubd " "${binary_path} " unit "${unit}")
string(REPLACE "/etc/rackhub/rackhubd.toml" "${config_path}" unit "${unit}")
string(FIND "${unit}" "[Unit]" unit_start)
string(SUBSTRING "${unit}" ${unit_start} -1 unit)
file(WRITE "${RACKHUB_STAGING_DIR}/rackhubd.service"
"# systemd unit for rackhubd, installed from deploy/rackhubd.service with this
# install's paths. Enable it with: systemctl enable --now rackhubd
${unit}")
file(INSTALL DESTINATION "${unit_dir}" TYPE FILE FILES "${RACKHUB_STAGING_DIR}/rackhubd.service")

# The example config. An existing, different rackhubd.toml (an administrator's
# edits) is kept; the example then goes next to it as rackhubd.toml.dist.
# (The .deb marks it a conffile: dpkg does the same on upgrades.)
set(existing "$ENV{DESTDIR}${config_path}")
if(EXISTS "${existing}")
  file(SHA256 "${existing}" have)
  file(SHA256 "${RACKHUB_CONFIG_SOURCE}" want)
  if(NOT have STREQUAL want)
    message(STATUS "Keeping ${existing} (it differs from the example); "
                   "the example is installed as rackhubd.toml.dist")
    file(INSTALL DESTINATION "${etc_dir}/rackhub" TYPE FILE FILES "${RACKHUB_CONFIG_SOURCE}"
      RENAME rackhubd.toml.dist)
    return()
  endif()
endif()
file(INSTALL DESTINATION "${etc_dir}/rackhub" TYPE FILE FILES "${RACKHUB_CONFIG_SOURCE}")
