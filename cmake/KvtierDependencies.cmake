# SPDX-License-Identifier: Apache-2.0
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
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)  # libsystemd-dev (sd_notify)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)  # libcpp-httplib-dev (metrics endpoint)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)    # libhiredis-dev (the remote tier's protocol)
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)          # libzmq3-dev; cppzmq-dev's zmq.hpp (KV events)
find_path(KVTIER_CPPZMQ_INCLUDE zmq.hpp)        # cppzmq-dev (header-only)
find_path(KVTIER_MSGPACK_INCLUDE msgpack.hpp)   # libmsgpack-cxx-dev (header-only)
if(NOT KVTIER_CPPZMQ_INCLUDE OR NOT KVTIER_MSGPACK_INCLUDE)
  message(FATAL_ERROR "kvtier: KV events need cppzmq-dev and libmsgpack-cxx-dev (scripts/install-deps installs them)")
endif()
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
    # The kernels are compiled for these GPUs (A100 = 80, H100/H200 = 90);
    # e.g. -DKVTIER_CUDA_ARCHITECTURES="80;90;100".
    set(KVTIER_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures the kernels are built for")
    if(NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    endif()
    set(CMAKE_CUDA_ARCHITECTURES ${KVTIER_CUDA_ARCHITECTURES})
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 does not know nvcc 13 takes C++20; the .cu needs 17
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # The CUDA runtime is linked in statically (CUDA::cudart_static, which
    # NVIDIA's licence lets us ship): kvtierd and libkvtier then need no
    # libcudart.so, which no Debian package provides, and start on nodes
    # without the toolkit. The runtime finds the NVIDIA driver (libcuda.so.1)
    # with dlopen at the first CUDA call; kvtier looks for it first itself so
    # that its absence is a clear reason to fall back, not an error
    # (tiers/device_select.cc). docs/decisions.md says why not a dlopen of
    # libcudart.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
    enable_language(CUDA)
    message(STATUS "kvtier: CUDA toolkit ${CUDAToolkit_VERSION} found; CUDA pieces are built for sm ${KVTIER_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "kvtier: no CUDA toolkit; building without CUDA pieces")
  endif()
endif()
