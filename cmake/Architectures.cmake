# Chooses CMAKE_CUDA_ARCHITECTURES before project() enables CUDA:
#   1. a value given on the command line or in the cache is kept as it is;
#   2. else the compute capability of the first GPU that nvidia-smi reports (e.g. 90 on an H200);
#   3. else FLASH_STEPS_FALLBACK_ARCHITECTURES (default 90: one architecture keeps CI's build lean).
# To build for every supported GPU: -DCMAKE_CUDA_ARCHITECTURES="80;86;89;90".
set(FLASH_STEPS_FALLBACK_ARCHITECTURES "90" CACHE STRING "CUDA architectures used when no GPU is found")
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(_fs_arch "")
  find_program(_fs_nvidia_smi nvidia-smi)
  if(_fs_nvidia_smi)
    execute_process(COMMAND ${_fs_nvidia_smi} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE _fs_cc RESULT_VARIABLE _fs_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_fs_rc EQUAL 0 AND _fs_cc MATCHES "^([0-9]+)\\.([0-9]+)")
      set(_fs_arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
      message(STATUS "flash-steps: found a GPU of compute capability ${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    endif()
  endif()
  if(_fs_arch STREQUAL "")
    set(_fs_arch "${FLASH_STEPS_FALLBACK_ARCHITECTURES}")
    message(STATUS "flash-steps: no GPU found; building for the fallback list ${_fs_arch}")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${_fs_arch}" CACHE STRING "CUDA architectures to build for")
endif()
