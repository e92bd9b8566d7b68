# SPDX-License-Identifier: Apache-2.0
# The lower tier kinds' registry (cmake/KvtierLowerKinds.cmake), in script
# mode: cmake -DSOURCE=<repo> -DOUT=<empty dir> -DCASE=<case> -P this file.
#   lists:     two kinds register; the three headers list both, in order,
#              and a second write with the same kinds leaves them untouched
#   twice:     the same name twice stops the configure (expected to fail)
#   late:      a kind after the lists are written stops it (expected to fail)
#   missing:   a registration without OPEN stops it (expected to fail)
cmake_minimum_required(VERSION 3.25)
include(${SOURCE}/cmake/KvtierLowerKinds.cmake)
set(PROJECT_BINARY_DIR ${OUT})

function(register name)
  kvtier_lower_kind(NAME ${name} MEMBER ${name}_member SETTINGS ${name}Settings SETTINGS_HEADER tiers/${name}/s.h
                    CONFIG ${name}Kind CONFIG_HEADER tiers/${name}/c.h CONFIG_LIB lib_${name}_config
                    OPEN Open${name} OPEN_HEADER tiers/${name}/o.h OPEN_LIB lib_${name}_open ${ARGN})
endfunction()

function(expect file text)
  file(READ ${OUT}/generated/tiers/${file} got)
  string(FIND "${got}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${file} lacks \"${text}\":\n${got}")
  endif()
endfunction()

if(CASE STREQUAL "lists")
  register(alpha)
  register(beta)
  kvtier_write_lower_kinds()
  expect(lower_kind_settings.h "#include \"tiers/alpha/s.h\"\n#include \"tiers/beta/s.h\"")
  expect(lower_kind_settings.h "#define KVTIER_LOWER_KIND_SETTINGS \\\n  alphaSettings alpha_member{}; \\\n  betaSettings beta_member{};\n")
  expect(lower_kind_configs.h "#define KVTIER_LOWER_KIND_CONFIGS \\\n  alphaKind(), \\\n  betaKind(),\n")
  expect(lower_kind_openers.h "#define KVTIER_LOWER_KIND_OPENERS \\\n  {\"alpha\", &Openalpha}, \\\n  {\"beta\", &Openbeta},\n")
  get_property(libs GLOBAL PROPERTY KVTIER_LOWER_KIND_CONFIG_LIBS)
  if(NOT libs STREQUAL "lib_alpha_config;lib_beta_config")
    message(FATAL_ERROR "config libraries: ${libs}")
  endif()
  get_property(libs GLOBAL PROPERTY KVTIER_LOWER_KIND_OPEN_LIBS)
  if(NOT libs STREQUAL "lib_alpha_open;lib_beta_open")
    message(FATAL_ERROR "daemon libraries: ${libs}")
  endif()
  # Unchanged text: the files keep their times (nothing rebuilds).
  file(TIMESTAMP ${OUT}/generated/tiers/lower_kind_configs.h before "%s%f" UTC)
  execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1.1)
  set_property(GLOBAL PROPERTY KVTIER_LOWER_KINDS_WRITTEN FALSE)
  kvtier_write_lower_kinds()
  file(TIMESTAMP ${OUT}/generated/tiers/lower_kind_configs.h after "%s%f" UTC)
  if(NOT before STREQUAL after)
    message(FATAL_ERROR "unchanged lists were rewritten (${before} -> ${after})")
  endif()
elseif(CASE STREQUAL "twice")
  register(alpha)
  register(alpha)
elseif(CASE STREQUAL "late")
  register(alpha)
  kvtier_write_lower_kinds()
  register(beta)
elseif(CASE STREQUAL "missing")
  kvtier_lower_kind(NAME gamma MEMBER g SETTINGS G SETTINGS_HEADER g.h CONFIG GK CONFIG_HEADER gk.h CONFIG_LIB gl
                    OPEN_HEADER go.h OPEN_LIB gol)
else()
  message(FATAL_ERROR "unknown CASE \"${CASE}\"")
endif()
