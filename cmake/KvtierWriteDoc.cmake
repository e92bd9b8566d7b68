# SPDX-License-Identifier: Apache-2.0
# Build step: runs PROGRAM ARG (a program printing its own manual page or
# completion script) into OUT, gzipped when GZIP is set (Debian installs
# manual pages compressed).
#   cmake -DPROGRAM=... -DARG=--man -DOUT=... [-DGZIP=1] -P KvtierWriteDoc.cmake
execute_process(COMMAND ${PROGRAM} ${ARG} OUTPUT_FILE ${OUT}.tmp RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} ${ARG} failed (${rc}): ${err}")
endif()
file(RENAME ${OUT}.tmp ${OUT})
if(GZIP)
  execute_process(COMMAND gzip -9nf ${OUT} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gzip of ${OUT} failed")
  endif()
endif()
