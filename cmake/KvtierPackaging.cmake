# SPDX-License-Identifier: Apache-2.0
# `cpack -G DEB` in a build folder makes Debian packages in Debian's shape,
# one per install component:
#   kvtierd          the daemon, its unit, sysusers/tmpfiles snippets, the config
#                    (a conffile), kvtierd(8), kvtierd.toml(5), the ledger library
#   libkvtier0       the engine library (shlibs and ldconfig trigger generated)
#   libkvtier-dev    headers, the unversioned .so, the CMake package, kvtier.pc
#   python3-kvtier   the Python module with the vLLM and SGLang integrations
#   kvtier-tools     kvtierctl, kvtier-replay, kvtier-bench, their pages, completion
# stripped, with debug symbols split into -dbgsym packages (.ddeb), and
# dependencies from dpkg-shlibdeps. tests/packaging/deb_test.sh builds them,
# checks their contents and dependencies, runs lintian, and starts the daemon
# from the packages unpacked into a throwaway root.
set(KVTIER_PACKAGE_CONTACT "kvtier maintainers <kvtier@example.org>" CACHE STRING
    "Maintainer field of the Debian packages (set your own when you publish them)")
set(kvtier_packages kvtierd libkvtier0 libkvtier-dev python3-kvtier kvtier-tools)

# Debian wants /usr/share/doc/<package>/copyright and changelog.gz in every package.
configure_file(${PROJECT_SOURCE_DIR}/systemd/debian/changelog.in ${PROJECT_BINARY_DIR}/debian/changelog @ONLY)
execute_process(COMMAND gzip -9nc INPUT_FILE ${PROJECT_BINARY_DIR}/debian/changelog
                OUTPUT_FILE ${PROJECT_BINARY_DIR}/debian/changelog.gz RESULT_VARIABLE gzip_rc)
if(NOT gzip_rc EQUAL 0)
  message(FATAL_ERROR "gzip of the Debian changelog failed")
endif()
foreach(pkg ${kvtier_packages})
  install(FILES ${PROJECT_SOURCE_DIR}/systemd/debian/copyright ${PROJECT_BINARY_DIR}/debian/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${pkg} COMPONENT ${pkg})
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VENDOR "kvtier")
set(CPACK_PACKAGE_CONTACT "${KVTIER_PACKAGE_CONTACT}")
set(CPACK_SET_DESTDIR ON)  # the install script writes the unit with the final paths
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
# Not CPACK_STRIP_FILES: the debug-info step below needs the symbols, and it
# strips each binary itself (--strip-unneeded) once they are copied out.
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
# A component's dependency on another becomes "Depends: <package> (= version)".
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL ${kvtier_packages})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# libkvtier.so.0 of this build, for dpkg-shlibdeps on the packages that link it.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/client)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "")

set(CPACK_DEBIAN_KVTIERD_PACKAGE_NAME kvtierd)
set(CPACK_DEBIAN_KVTIERD_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_KVTIERD_PACKAGE_DEPENDS "systemd")
set(CPACK_DEBIAN_KVTIERD_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/systemd/debian/conffiles;${PROJECT_SOURCE_DIR}/systemd/debian/postinst;${PROJECT_SOURCE_DIR}/systemd/debian/prerm;${PROJECT_SOURCE_DIR}/systemd/debian/postrm")
set(CPACK_COMPONENT_KVTIERD_DESCRIPTION
    "tiered KV-cache block store for LLM inference engines (daemon)\n kvtierd keeps the KV-cache blocks of inference engines across GPU memory,\n pinned host memory, NVMe and a shared Redis Cluster tier, so that engines\n reuse prefixes instead of recomputing them. Engines attach through\n libkvtier (shared memory); administrators use kvtierctl.")

set(CPACK_DEBIAN_LIBKVTIER0_PACKAGE_NAME libkvtier0)
set(CPACK_DEBIAN_LIBKVTIER0_PACKAGE_SECTION libs)
# The shlibs file (only libkvtier.so.0 has a soname) and ldconfig as a
# trigger, which Debian wants instead of the ldconfig calls CPack would write
# into maintainer scripts of its own (ours, which do nothing, replace them).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIBKVTIER0_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/systemd/debian/libkvtier0/triggers;${PROJECT_SOURCE_DIR}/systemd/debian/libkvtier0/postinst;${PROJECT_SOURCE_DIR}/systemd/debian/libkvtier0/postrm")
set(CPACK_COMPONENT_LIBKVTIER0_DESCRIPTION
    "kvtier engine client library\n libkvtier connects an inference engine to kvtierd over shared memory:\n lookups, loads and stores of KV-cache blocks, layer-by-layer loads into\n a registered KV cache. C ABI and C++20 API.")

set(CPACK_DEBIAN_LIBKVTIER-DEV_PACKAGE_NAME libkvtier-dev)
set(CPACK_DEBIAN_LIBKVTIER-DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_LIBKVTIER-DEV_DEPENDS libkvtier0)
set(CPACK_COMPONENT_LIBKVTIER-DEV_DESCRIPTION
    "kvtier engine client library (development files)\n Headers of libkvtier's C ABI and C++20 API, the unversioned library link,\n the CMake package (find_package(kvtier CONFIG): kvtier::kvtier) and\n kvtier.pc for pkg-config.")

set(CPACK_DEBIAN_PYTHON3-KVTIER_PACKAGE_NAME python3-kvtier)
set(CPACK_DEBIAN_PYTHON3-KVTIER_PACKAGE_SECTION python)
if(NOT KVTIER_PYTHON_DEPENDS)
  set(KVTIER_PYTHON_DEPENDS "python3")
endif()
set(CPACK_DEBIAN_PYTHON3-KVTIER_PACKAGE_DEPENDS "${KVTIER_PYTHON_DEPENDS}, python3-numpy")
set(CPACK_COMPONENT_PYTHON3-KVTIER_DEPENDS libkvtier0)
set(CPACK_COMPONENT_PYTHON3-KVTIER_DESCRIPTION
    "kvtier engine client for Python, with vLLM and SGLang integrations\n The kvtier module: attach to kvtierd, look up, load and store KV-cache\n blocks with NumPy views of the shared arena. kvtier.vllm is a KV connector\n for vLLM; kvtier.sglang a HiCache storage backend for SGLang.")

set(CPACK_DEBIAN_KVTIER-TOOLS_PACKAGE_NAME kvtier-tools)
set(CPACK_DEBIAN_KVTIER-TOOLS_PACKAGE_SECTION admin)
set(CPACK_COMPONENT_KVTIER-TOOLS_DEPENDS libkvtier0)
set(CPACK_COMPONENT_KVTIER-TOOLS_DESCRIPTION
    "kvtier administration and measurement tools\n kvtierctl inspects and steers a running kvtierd; kvtier-replay replays\n request traces through it or simulates eviction policies; kvtier-bench\n runs microbenchmarks against baselines measured in the same run.")

# Until 0.1.0 everything came in one package, kvtier: each of these takes
# over its files.
foreach(comp KVTIERD LIBKVTIER0 LIBKVTIER-DEV PYTHON3-KVTIER KVTIER-TOOLS)
  set(CPACK_DEBIAN_${comp}_PACKAGE_CONFLICTS "kvtier")
  set(CPACK_DEBIAN_${comp}_PACKAGE_REPLACES "kvtier")
endforeach()

include(CPack)
