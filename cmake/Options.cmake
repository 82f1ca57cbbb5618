include(CheckLanguage)

option(CED_BUILD_TESTS "Build the unit and property tests" ON)
option(CED_BUILD_FUZZ "Build the libFuzzer targets (needs clang)" OFF)
option(CED_BUILD_PYTHON "Build the Python module ced._core (pyproject.toml sets it)" OFF)
option(CED_PORTABLE "Link what a wheel may not depend on into the module (pyproject.toml sets it)" OFF)

# CUDA is on by default wherever nvcc is found; the CPU build never needs it.
# Where neither CMAKE_CUDA_COMPILER nor CUDACXX names it, nvcc is looked for
# on PATH, then in $CUDA_HOME and $CUDA_PATH, then in the toolkit's standard
# prefix, so the `cuda` preset needs no path of one machine.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
  find_program(CED_NVCC nvcc PATHS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin
               DOC "nvcc found for the optimized CUDA backend")
  if(CED_NVCC)
    set(CMAKE_CUDA_COMPILER "${CED_NVCC}" CACHE FILEPATH "CUDA compiler")
  endif()
endif()
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_ced_cuda_default ON)
else()
  set(_ced_cuda_default OFF)
endif()
option(CED_ENABLE_CUDA "Build the optimized CUDA backend" ${_ced_cuda_default})
set(CED_CUDA_ARCHS "90" CACHE STRING "CUDA architectures for the optimized backend")

set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "" FORCE)
endif()

# Flags every target of ours gets. The reference's bitwise properties need
# IEEE arithmetic as written: no contraction into FMA, no fast-math, and no
# -march=native (libm and the code paths must not depend on the build host).
add_library(ced_flags INTERFACE)
target_compile_options(ced_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -ffp-contract=off -fno-fast-math>)
