# Decides whether the CUDA backend is built (CTXBANK_CUDA = AUTO | ON | OFF) and defines the
# ctxbank_cuda static library when it is. Sets CTXBANK_WITH_CUDA.
set(CTXBANK_WITH_CUDA OFF)
string(TOUPPER "${CTXBANK_CUDA}" CTXBANK_CUDA)
if(NOT CTXBANK_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "CTXBANK_CUDA must be AUTO, ON or OFF (got '${CTXBANK_CUDA}')")
endif()

if(NOT CTXBANK_CUDA STREQUAL "OFF")
  # The compiler native/cuda/install-nvcc.sh installs, when nothing else names one.
  set(_ctxbank_cached_nvcc "$ENV{HOME}/.cache/ctxbank/cuda-13.0/nvidia/cu13/bin/nvcc")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS "${_ctxbank_cached_nvcc}")
    find_program(_ctxbank_path_nvcc nvcc)
    if(NOT _ctxbank_path_nvcc)
      set(CMAKE_CUDA_COMPILER "${_ctxbank_cached_nvcc}")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CTXBANK_WITH_CUDA ON)
  elseif(CTXBANK_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CTXBANK_CUDA=ON but no CUDA compiler was found: run native/cuda/install-nvcc.sh, "
                        "or set CUDACXX / -DCMAKE_CUDA_COMPILER to nvcc")
  else()
    message(STATUS "ctxbank: no CUDA compiler found; building the CPU engine only")
  endif()
endif()

if(CTXBANK_WITH_CUDA)
  # H100 (sm_90a) first; sm_80 (A100) too unless told otherwise. Override with
  # -DCMAKE_CUDA_ARCHITECTURES=... (e.g. 90a alone for a faster build).
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "90a;80")
  endif()
  # The runtime is linked statically: the addon then loads on a machine without a driver (the
  # runtime looks for libcuda at the first call and reports "no driver", which auto turns into
  # the CPU). No cuBLAS: the GEMMs are our own kernels (src/cuda/gemm.cu), so no CUDA shared
  # library is needed at load time.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  message(STATUS "ctxbank: CUDA backend ON (${CMAKE_CUDA_COMPILER}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  file(GLOB CTXBANK_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/cuda/*.cu)
  add_library(ctxbank_cuda STATIC ${CTXBANK_CUDA_SOURCES})
  # The CUDA headers too: host-compiled tests include kernels.cuh (cuda_fp16.h) for the host-side types.
  target_include_directories(ctxbank_cuda PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/src ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
  set_target_properties(ctxbank_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_RUNTIME_LIBRARY Static)
  target_compile_options(ctxbank_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-O3 -lineinfo -Xcompiler=-fPIC>)
  # The host side of the static runtime needs dl, rt and pthread; the CXX targets that link this
  # library (the addon, the tests) get them from here.
  # (Found by hand: FindCUDAToolkit wants libcudart.so, which the PyPI wheels do not ship.)
  get_filename_component(_ctxbank_cuda_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  find_library(CTXBANK_CUDART_STATIC NAMES cudart_static REQUIRED
               HINTS ${CMAKE_CUDA_IMPLICIT_LINK_DIRECTORIES} "${_ctxbank_cuda_bin}/../lib64" "${_ctxbank_cuda_bin}/../lib")
  target_link_libraries(ctxbank_cuda PUBLIC ${CTXBANK_CUDART_STATIC} Threads::Threads ${CMAKE_DL_LIBS} rt)
endif()
