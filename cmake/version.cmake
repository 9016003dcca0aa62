# Writes generated/version.h: `#define FLASH_STEPS_COMMIT "<commit>"`, the commit the runner's reports,
# the benchmarks' context and flash_steps_ceilings' JSON name.
#
#   cmake -DSOURCE_DIR=<repo> -DOUTPUT=<build>/generated/version.h [-DCOMMIT=<override>] -P cmake/version.cmake
#
# Run at configure time and again at every build (the flash_steps_version target in CMakeLists.txt), so a
# build folder configured at one commit and built at another names the commit it was built from.
# COMMIT, when not empty, is -DFLASH_STEPS_COMMIT=... passed to the configure step and wins; otherwise
# `git describe --always --dirty --abbrev=12` in SOURCE_DIR, or "unknown" where that fails (no git, not
# a checkout). The file is rewritten only when its text changes (file(CONFIGURE) compares first), so a
# build at the same commit recompiles nothing.
if(NOT SOURCE_DIR OR NOT OUTPUT)
  message(FATAL_ERROR "version.cmake: pass -DSOURCE_DIR=<repository> -DOUTPUT=<version.h>")
endif()
if(NOT COMMIT)
  execute_process(COMMAND git describe --always --dirty --abbrev=12 WORKING_DIRECTORY "${SOURCE_DIR}"
                  OUTPUT_VARIABLE COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT COMMIT)
    set(COMMIT "unknown")
  endif()
endif()
file(CONFIGURE OUTPUT "${OUTPUT}" CONTENT "#pragma once\n#define FLASH_STEPS_COMMIT \"${COMMIT}\"\n")
