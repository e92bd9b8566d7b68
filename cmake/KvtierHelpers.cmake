# SPDX-License-Identifier: Apache-2.0
# kvtier_warnings(target): the warnings we hold our own code to.
# KVTIER_WERROR=OFF (the fuzz preset: clang's thread-safety analysis finds
# what gcc builds never checked) keeps them warnings, except in the fuzz
# targets themselves (tests/CMakeLists.txt).
option(KVTIER_WERROR "Warnings are errors in our code" ON)
function(kvtier_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>)
  if(KVTIER_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>)
  endif()
endfunction()

# Sanitizer flags apply to every target we build (not to Debian's libraries).
# nvcc takes none of them: CUDA sources are left out.
if(KVTIER_SANITIZE STREQUAL "asan")
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address,undefined> $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=address,undefined)
  add_compile_definitions(KVTIER_SANITIZER=1)
elseif(KVTIER_SANITIZE STREQUAL "tsan")
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=thread> $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=thread)
  add_compile_definitions(KVTIER_SANITIZER=1 KVTIER_TSAN=1)
elseif(NOT KVTIER_SANITIZE STREQUAL "")
  message(FATAL_ERROR "KVTIER_SANITIZE must be '', 'asan' or 'tsan', not '${KVTIER_SANITIZE}'")
endif()

# KVTIER_FUZZ: every target we build is instrumented for libFuzzer's
# coverage (the decoders live in the libraries, not in the fuzz targets);
# only the fuzz targets link libFuzzer (tests/CMakeLists.txt).
if(KVTIER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KVTIER_FUZZ needs clang (cmake --preset fuzz)")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
endif()

# kvtier_cc_library(NAME name SRCS ... DEPS ... [PUBLIC_DEPS ...])
# One static library per top-level folder. Sources are compiled with -fPIC so
# libkvtier.so can take them in.
function(kvtier_cc_library)
  cmake_parse_arguments(K "" "NAME" "SRCS;DEPS;PUBLIC_DEPS" ${ARGN})
  add_library(${K_NAME} STATIC ${K_SRCS})
  # generated/: headers CMake writes (the lower tier kinds' lists).
  target_include_directories(${K_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                                              ${PROJECT_BINARY_DIR}/generated)
  target_link_libraries(${K_NAME} PUBLIC ${K_PUBLIC_DEPS} PRIVATE ${K_DEPS})
  kvtier_warnings(${K_NAME})
endfunction()

# kvtier_cc_test(NAME name SRCS ... DEPS ... [TIMEOUT s] [LABELS ...])
# A GoogleTest binary registered with CTest. Exit code 77 means "skipped"
# (hardware or privilege missing), as in liburing's tests.
function(kvtier_cc_test)
  cmake_parse_arguments(K "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT K_TIMEOUT)
    set(K_TIMEOUT 60)
  endif()
  add_executable(${K_NAME} ${K_SRCS})
  target_link_libraries(${K_NAME} PRIVATE ${K_DEPS} kvtier_testing GTest::gtest GTest::gmock)
  kvtier_warnings(${K_NAME})
  add_test(NAME ${K_NAME} COMMAND ${K_NAME})
  set_tests_properties(${K_NAME} PROPERTIES TIMEOUT ${K_TIMEOUT} SKIP_RETURN_CODE 77
    LABELS "${K_LABELS}"
    ENVIRONMENT "KVTIERD_BIN=$<TARGET_FILE:kvtierd>;KVTIER_BUILD_DIR=${PROJECT_BINARY_DIR}")
endfunction()

# A static library of CUDA sources (kernels that see only plain launch
# headers, so C++17 suffices): built for KVTIER_CUDA_ARCHITECTURES, position
# independent, warnings as errors, and without FMA contraction so results
# are reproducible. Only with KVTIER_HAVE_CUDA.
function(kvtier_cuda_library name)
  add_library(${name} STATIC ${ARGN})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${KVTIER_CUDA_ARCHITECTURES}"
                        POSITION_INDEPENDENT_CODE ON)
  target_compile_options(${name} PRIVATE "SHELL:-Werror all-warnings" --fmad=false)
  target_link_libraries(${name} PUBLIC CUDA::cudart_static)
endfunction()
