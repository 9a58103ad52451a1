# `cpack -G DEB` (run in the build tree) builds troupe_<version>_amd64.deb: the installed layout
# of apps/CMakeLists.txt under /usr (/usr/bin/troupe, /usr/share/troupe/{models,examples}), the
# systemd unit /lib/systemd/system/troupe.service and its topology /etc/troupe/troupe.toml (a
# conffile). Depends: dpkg-shlibdeps reads it off the binary's shared libraries (CAF, UCX,
# spdlog, ...). README.md, "Installing"; tests/package_test.cpp.

# The unit and the conffile have absolute paths: only the package installs them (the `deb`
# component, left out of a plain `cmake --install`, which must not write /etc).
install(FILES ${CMAKE_CURRENT_LIST_DIR}/packaging/troupe.toml DESTINATION /etc/troupe COMPONENT deb EXCLUDE_FROM_ALL)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/packaging/troupe.service DESTINATION /lib/systemd/system COMPONENT deb
  EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME troupe)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "troupe maintainers <troupe@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "LLM inference engine on the C++ Actor Framework")
set(CPACK_PACKAGE_DESCRIPTION "troupe serves LLMs through an OpenAI-compatible HTTP API and a msgpack protocol: \
continuous batching, a paged KV cache with prefix reuse, reproducible sampling. Ships the stories260K model and \
a systemd unit serving it (troupe.service, /etc/troupe/troupe.toml).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# Everything a plain install installs, then the package's own files.
set(CPACK_INSTALL_CMAKE_PROJECTS "${PROJECT_BINARY_DIR};troupe;ALL;/" "${PROJECT_BINARY_DIR};troupe;deb;/")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # troupe_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/packaging/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
