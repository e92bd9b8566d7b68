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

# kvtier_lower_kind(NAME fs MEMBER fs SETTINGS FsTierSettings SETTINGS_HEADER tiers/fs/fs_settings.h
#                   CONFIG FsTierKind CONFIG_HEADER tiers/fs/fs_kind_config.h CONFIG_LIB kvtier_tier_fs_config
#                   OPEN OpenFsTier OPEN_HEADER tiers/fs/fs_kind.h OPEN_LIB kvtier_tier_fs_kind)
# A kind of lower tier that lives in a folder of its own registers itself
# here, from that folder's CMakeLists.txt: its settings struct becomes the
# Config member MEMBER, its config half (CONFIG() returns its LowerTierKind)
# joins daemon/lower_kinds.cc's list and its library joins kvtier_config,
# its daemon half (OPEN(config) opens the tier) joins the tier registry and
# its library joins kvtier_daemon. kvtier_write_lower_kinds() writes the
# lists out once every kind has registered (tiers/CMakeLists.txt), so the
# only line outside a kind's folder is the add_subdirectory() that finds it.
function(kvtier_lower_kind)
  cmake_parse_arguments(K "" "NAME;MEMBER;SETTINGS;SETTINGS_HEADER;CONFIG;CONFIG_HEADER;CONFIG_LIB;OPEN;OPEN_HEADER;OPEN_LIB"
                        "" ${ARGN})
  foreach(arg NAME MEMBER SETTINGS SETTINGS_HEADER CONFIG CONFIG_HEADER CONFIG_LIB OPEN OPEN_HEADER OPEN_LIB)
    if(NOT K_${arg})
      message(FATAL_ERROR "kvtier_lower_kind(${K_NAME}): ${arg} is missing")
    endif()
  endforeach()
  get_property(written GLOBAL PROPERTY KVTIER_LOWER_KINDS_WRITTEN)
  if(written)
    message(FATAL_ERROR "kvtier_lower_kind(${K_NAME}): called after kvtier_write_lower_kinds(); add its folder "
                        "before that call in tiers/CMakeLists.txt")
  endif()
  get_property(names GLOBAL PROPERTY KVTIER_LOWER_KIND_NAMES)
  if(K_NAME IN_LIST names OR K_NAME STREQUAL "nvme" OR K_NAME STREQUAL "redis")
    message(FATAL_ERROR "kvtier_lower_kind: a kind named \"${K_NAME}\" is already registered")
  endif()
  set_property(GLOBAL APPEND PROPERTY KVTIER_LOWER_KIND_NAMES ${K_NAME})
  foreach(arg MEMBER SETTINGS SETTINGS_HEADER CONFIG CONFIG_HEADER OPEN OPEN_HEADER)
    set_property(GLOBAL PROPERTY KVTIER_LOWER_KIND_${K_NAME}_${arg} ${K_${arg}})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY KVTIER_LOWER_KIND_CONFIG_LIBS ${K_CONFIG_LIB})
  set_property(GLOBAL APPEND PROPERTY KVTIER_LOWER_KIND_OPEN_LIBS ${K_OPEN_LIB})
endfunction()

# Writes the registered kinds' lists as three headers under
# ${PROJECT_BINARY_DIR}/generated/tiers (every library's include path):
# lower_kind_settings.h (Config's members), lower_kind_configs.h (the config
# halves) and lower_kind_openers.h (the daemon halves). A file is rewritten
# only when its text changes.
function(kvtier_write_lower_kinds)
  set_property(GLOBAL PROPERTY KVTIER_LOWER_KINDS_WRITTEN TRUE)
  set(out ${PROJECT_BINARY_DIR}/generated/tiers)
  set(head "// SPDX-License-Identifier: Apache-2.0\n// Written by kvtier_write_lower_kinds() (cmake/KvtierHelpers.cmake) from the\n// kinds of lower tier that registered with kvtier_lower_kind(). Do not edit.\n")
  get_property(names GLOBAL PROPERTY KVTIER_LOWER_KIND_NAMES)
  foreach(part SETTINGS_INCLUDES MEMBERS CONFIG_INCLUDES CONFIGS OPEN_INCLUDES OPENERS)
    set(${part} "")
  endforeach()
  foreach(n IN LISTS names)
    foreach(arg MEMBER SETTINGS SETTINGS_HEADER CONFIG CONFIG_HEADER OPEN OPEN_HEADER)
      get_property(${arg} GLOBAL PROPERTY KVTIER_LOWER_KIND_${n}_${arg})
    endforeach()
    string(APPEND SETTINGS_INCLUDES "#include \"${SETTINGS_HEADER}\"\n")
    string(APPEND MEMBERS " \\\n  ${SETTINGS} ${MEMBER}{};")
    string(APPEND CONFIG_INCLUDES "#include \"${CONFIG_HEADER}\"\n")
    string(APPEND CONFIGS " \\\n  ${CONFIG}(),")
    string(APPEND OPEN_INCLUDES "#include \"${OPEN_HEADER}\"\n")
    string(APPEND OPENERS " \\\n  {\"${n}\", &${OPEN}},")
  endforeach()
  file(CONFIGURE OUTPUT ${out}/lower_kind_settings.h CONTENT
       "${head}#pragma once\n${SETTINGS_INCLUDES}// Config's members, one per kind: its settings struct.\n#define KVTIER_LOWER_KIND_SETTINGS${MEMBERS}\n" @ONLY)
  file(CONFIGURE OUTPUT ${out}/lower_kind_configs.h CONTENT
       "${head}#pragma once\n${CONFIG_INCLUDES}// LowerTierKinds()'s entries, one per kind.\n#define KVTIER_LOWER_KIND_CONFIGS${CONFIGS}\n" @ONLY)
  file(CONFIGURE OUTPUT ${out}/lower_kind_openers.h CONTENT
       "${head}#pragma once\n${OPEN_INCLUDES}// The tier registry's openers, one per kind.\n#define KVTIER_LOWER_KIND_OPENERS${OPENERS}\n" @ONLY)
endfunction()
