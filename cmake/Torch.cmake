# pipetrain_torch: Torch's headers and libraries, all a user of pipetrain's public headers needs.
# pipetrain_c10d: what the library's own sources add to compile c10d's process groups. Torch's
# imported target carries no c10d definitions; the Gloo and NCCL process-group headers need them.
# Gloo where its headers are (Debian's libgloo-dev; the PyTorch wheels ship none), NCCL where
# Torch has CUDA (nccl.h from the nvidia-nccl wheel next to torch, or PIPETRAIN_NCCL_INCLUDE_DIR).
# PIPETRAIN_HAS_GLOO / PIPETRAIN_HAS_CUDA say which, to the library and its tests alone.
add_library(pipetrain_torch INTERFACE)
target_include_directories(pipetrain_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
add_library(pipetrain_c10d INTERFACE)

# A CUDA build of Torch exports the torch_cuda target; Debian's CPU libtorch has none.
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(PIPETRAIN_CUDA ON)
else()
  set(PIPETRAIN_CUDA OFF)
endif()

find_path(PIPETRAIN_GLOO_INCLUDE_DIR gloo/rendezvous/store.h HINTS ${TORCH_INCLUDE_DIRS})
if(PIPETRAIN_GLOO_INCLUDE_DIR)
  target_include_directories(pipetrain_c10d SYSTEM INTERFACE ${PIPETRAIN_GLOO_INCLUDE_DIR})
  target_compile_definitions(pipetrain_c10d INTERFACE USE_C10D_GLOO PIPETRAIN_HAS_GLOO)
endif()

if(PIPETRAIN_CUDA)
  # The wheel's libtorch carries std::filesystem symbols of its own; resolving ours from it crashed
  # (remove_all). Naming libstdc++ before Torch binds them to the system's.
  target_link_libraries(pipetrain_torch INTERFACE stdc++)
  if(NOT PIPETRAIN_NCCL_INCLUDE_DIR)
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c
                "import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], 'include'))"
        OUTPUT_VARIABLE nccl_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(EXISTS "${nccl_dir}/nccl.h")
        set(PIPETRAIN_NCCL_INCLUDE_DIR "${nccl_dir}" CACHE PATH "Directory holding nccl.h")
      endif()
    endif()
  endif()
  find_path(PIPETRAIN_NCCL_INCLUDE_DIR nccl.h HINTS ENV NCCL_INCLUDE_DIR ${CUDAToolkit_INCLUDE_DIRS})
  if(NOT PIPETRAIN_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "Torch has CUDA but nccl.h was not found: install the nvidia-nccl wheel "
                        "Torch depends on, or pass -DPIPETRAIN_NCCL_INCLUDE_DIR=<dir>")
  endif()
  target_include_directories(pipetrain_c10d SYSTEM INTERFACE ${PIPETRAIN_NCCL_INCLUDE_DIR})
  target_compile_definitions(pipetrain_c10d INTERFACE USE_C10D_NCCL PIPETRAIN_HAS_CUDA)
  # pipetrain's own kernels (src/**/*.cu) where nvcc is found; without it, ATen's ops do the work.
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES native)  # the GPUs of the building machine
    endif()
    set(CMAKE_CUDA_STANDARD 17)
    enable_language(CUDA)
    set(PIPETRAIN_CUDA_KERNELS ON)
  endif()
endif()

target_link_libraries(pipetrain_torch INTERFACE ${TORCH_LIBRARIES} Threads::Threads)

if(NOT PIPETRAIN_GLOO_INCLUDE_DIR AND NOT PIPETRAIN_CUDA)
  message(FATAL_ERROR "pipetrain needs Gloo's headers (CPU; Debian: libgloo-dev) or a CUDA Torch")
endif()
message(STATUS "pipetrain: Torch ${Torch_VERSION}, CUDA ${PIPETRAIN_CUDA}, "
               "CUDA kernels ${PIPETRAIN_CUDA_KERNELS}, "
               "Gloo ${PIPETRAIN_GLOO_INCLUDE_DIR}")
