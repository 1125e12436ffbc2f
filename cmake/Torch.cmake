# Torch's imported target carries no c10d definitions; the Gloo (and, where
# Torch has CUDA, NCCL) process-group headers need them.
add_library(pipetrain_torch INTERFACE)
target_link_libraries(pipetrain_torch INTERFACE ${TORCH_LIBRARIES} Threads::Threads)
target_include_directories(pipetrain_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_compile_definitions(pipetrain_torch INTERFACE USE_C10D_GLOO)
