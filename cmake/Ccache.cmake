# Use ccache when present. PCH-friendly sloppiness lets ccache hit on files that use the
# precompiled header (otherwise every compile of a PCH user is a miss).
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${CCACHE_PROGRAM})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # clang records the precompiled header's timestamp, which a cached copy does not keep.
    add_compile_options("SHELL:-Xclang -fno-pch-timestamp")
  endif()
  message(STATUS "afterburner: compiling through ccache (${CCACHE_PROGRAM})")
endif()
