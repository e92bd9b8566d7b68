# SPDX-License-Identifier: Apache-2.0
# The registry of lower tier kinds that live in folders of their own. Only
# set_property/file commands: it also runs in script mode, where
# tests/cmake/lower_kinds_test.cmake drives it (PROJECT_BINARY_DIR set by
# hand).

# kvtier_lower_kind(NAME fs MEMBER fs SETTINGS FsTierSettings SETTINGS_HEADER tiers/fs/fs_settings.h
#                   CONFIG FsTierKind CONFIG_HEADER tiers/fs/fs_kind_config.h CONFIG_LIB kvtier_tier_fs_config
#                   OPEN OpenFsTier OPEN_HEADER tiers/fs/fs_kind.h OPEN_LIB kvtier_tier_fs_kind)
# A kind of lower tier that lives in a folder of its own registers itself
# here, from that folder's CMakeLists.txt: its settings struct becomes the
# Config member MEMBER, its config half (CONFIG() returns its LowerTierKind)
# joins daemon/lower_kinds.cc's list and its library joins kvtier_config,
# its daemon half (OPEN(config, name) opens the tier under its chain name) joins the tier registry and
# its library joins kvtier_daemon. kvtier_write_lower_kinds() writes the
# lists out once every kind has registered (tiers/CMakeLists.txt), so the
# only line outside a kind's folder is the add_subdirectory() that finds it.
# What the lists are written from, per kind; the libraries are kept apart.
set(KVTIER_LOWER_KIND_FIELDS MEMBER SETTINGS SETTINGS_HEADER CONFIG CONFIG_HEADER OPEN OPEN_HEADER)

function(kvtier_lower_kind)
  cmake_parse_arguments(K "" "NAME;${KVTIER_LOWER_KIND_FIELDS};CONFIG_LIB;OPEN_LIB" "" ${ARGN})
  foreach(arg NAME ${KVTIER_LOWER_KIND_FIELDS} CONFIG_LIB OPEN_LIB)
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
  foreach(arg ${KVTIER_LOWER_KIND_FIELDS})
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
  set(head "// SPDX-License-Identifier: Apache-2.0\n// Written by kvtier_write_lower_kinds() (cmake/KvtierLowerKinds.cmake) from the\n// kinds of lower tier that registered with kvtier_lower_kind(). Do not edit.\n")
  get_property(names GLOBAL PROPERTY KVTIER_LOWER_KIND_NAMES)
  foreach(part SETTINGS_INCLUDES MEMBERS CONFIG_INCLUDES CONFIGS OPEN_INCLUDES OPENERS)
    set(${part} "")
  endforeach()
  foreach(n IN LISTS names)
    foreach(arg ${KVTIER_LOWER_KIND_FIELDS})
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
