# Every third-party dependency is found here, and only here. The Debian package
# that provides each one is listed in scripts/packages.txt.
find_package(Threads REQUIRED)
find_package(absl REQUIRED)               # libabsl-dev
find_package(spdlog REQUIRED)             # libspdlog-dev
find_package(fmt REQUIRED)                # libfmt-dev
find_package(tomlplusplus REQUIRED)       # libtomlplusplus-dev
find_package(OpenSSL REQUIRED)            # libssl-dev
find_package(Boost 1.74 REQUIRED)         # libboost-dev (Interprocess is header-only)
find_package(CLI11 CONFIG REQUIRED)       # libcli11-dev
find_package(nlohmann_json REQUIRED)      # nlohmann-json3-dev
find_package(PkgConfig REQUIRED)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)    # liburing-dev
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)  # libxxhash-dev
if(KVTIER_BUILD_TESTS)
  find_package(GTest REQUIRED)            # libgtest-dev, libgmock-dev
endif()
find_package(benchmark REQUIRED)          # libbenchmark-dev

set(KVTIER_HAVE_CUDA OFF)
if(KVTIER_WITH_CUDA)
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(KVTIER_HAVE_CUDA ON)
    message(STATUS "kvtier: CUDA toolkit ${CUDAToolkit_VERSION} found; CUDA pieces are built")
  else()
    message(STATUS "kvtier: no CUDA toolkit; building without CUDA pieces")
  endif()
endif()
