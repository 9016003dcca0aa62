# Targets that are not part of the default build: they read what the compiler produced or run a
# profiler, and write reports.
#
#   cmake --build build --target resource_report
#       registers, shared memory, stack frame and local loads/stores of every step's kernels
#       (bench/resource_report.py over cuobjdump) -> build/resource_report.md, and the same table
#       between <!-- resources:begin --> and <!-- resources:end --> in notes/README.md when that file
#       has the markers. With FLASH_STEPS_RESOURCES_JSON=<file of `flash-steps resources --json`> in
#       the environment (bench/run_all.sh sets it), also the occupancy of each step's launches.
#
#   cmake -DFLASH_STEPS_PROFILE_STEP=06_ldmatrix_mma -DFLASH_STEPS_PROFILE_ARGS="--seqlen 4096" build
#   cmake --build build --target profile
#       Nsight Compute on that step with the metrics the notes cite (bench/profile.sh).
#
# Included from the top-level CMakeLists.txt after the steps and the runner are defined.

find_package(Python3 COMPONENTS Interpreter QUIET)
find_program(FLASH_STEPS_CUOBJDUMP cuobjdump HINTS ${CUDAToolkit_BIN_DIR} DOC "cuobjdump for the resource report")

get_property(_fs_tool_dirs GLOBAL PROPERTY FLASH_STEPS_STEP_DIRS)
set(_fs_report_steps)
set(_fs_report_deps)
foreach(dir IN LISTS _fs_tool_dirs)
  list(APPEND _fs_report_steps --step "${dir}=$<JOIN:$<TARGET_OBJECTS:step_${dir}>,:>")
  list(APPEND _fs_report_deps step_${dir})
endforeach()

if(Python3_Interpreter_FOUND AND FLASH_STEPS_CUOBJDUMP)
  add_custom_target(resource_report
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/resource_report.py
            --cuobjdump ${FLASH_STEPS_CUOBJDUMP}
            --out ${PROJECT_BINARY_DIR}/resource_report.md
            --notes ${PROJECT_SOURCE_DIR}/notes/README.md
            ${_fs_report_steps}
    COMMENT "Resource report of every step's kernels -> ${PROJECT_BINARY_DIR}/resource_report.md"
    VERBATIM)
else()
  add_custom_target(resource_report
    COMMAND ${CMAKE_COMMAND} -E echo "resource_report needs python3 and cuobjdump (CUDA toolkit); not found"
    COMMAND ${CMAKE_COMMAND} -E false
    VERBATIM)
endif()
if(_fs_report_deps)
  add_dependencies(resource_report ${_fs_report_deps})
endif()

set(FLASH_STEPS_PROFILE_STEP "" CACHE STRING "Step id profiled by the 'profile' target, e.g. 06_ldmatrix_mma")
set(FLASH_STEPS_PROFILE_ARGS "" CACHE STRING "Runner flags for the 'profile' target, e.g. --seqlen 4096 --causal")
separate_arguments(_fs_profile_args UNIX_COMMAND "${FLASH_STEPS_PROFILE_ARGS}")
add_custom_target(profile
  COMMAND ${CMAKE_COMMAND} -E env FLASH_STEPS_BUILD=${PROJECT_BINARY_DIR}
          bash ${PROJECT_SOURCE_DIR}/bench/profile.sh ${FLASH_STEPS_PROFILE_STEP} ${_fs_profile_args}
  USES_TERMINAL
  VERBATIM)
add_dependencies(profile flash-steps ${_fs_report_deps})
