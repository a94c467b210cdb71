# afterburner_deps carries everything an area compiles and links against.
add_library(afterburner_deps INTERFACE)
target_include_directories(afterburner_deps INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include> ${DNNL_INCLUDE_DIR} ${IDEEP_INCLUDE_DIR} ${LIBZIP_INCLUDE_DIR}
  ${JPEG_INCLUDE_DIR} ${TURBOJPEG_INCLUDE_DIR} ${SPNG_INCLUDE_DIR})
target_link_libraries(afterburner_deps INTERFACE
  ${TORCH_LIBRARIES} ${DNNL_LIBRARY} OpenMP::OpenMP_CXX Threads::Threads ZLIB::ZLIB ${LIBZIP_LIBRARY} ${JPEG_LIBRARY} ${TURBOJPEG_LIBRARY}
  ${SPNG_LIBRARY} ${LAPACK_LIBRARY} ${CMAKE_DL_LIBS}
  nlohmann_json::nlohmann_json fmt::fmt tomlplusplus::tomlplusplus simdjson::simdjson Boost::headers
  gRPC::grpc++ protobuf::libprotobuf)
# -Wno-psabi: the kernels pass GCC vectors by value only between always-inlined helpers compiled
# per instruction set (kernels/simd.h), where the ABI note about such arguments never applies.
# Our warnings, not an installed package's users' (cmake/Install.cmake).
target_compile_options(afterburner_deps INTERFACE $<BUILD_INTERFACE:-Wall -Wextra -Wno-unused-parameter -Wno-psabi>)

# The torch headers dominate compile time: one precompiled header, reused by every area,
# tool and test (they share compile flags).
add_library(afterburner_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
target_link_libraries(afterburner_pch PUBLIC afterburner_deps)
target_precompile_headers(afterburner_pch PUBLIC ${PROJECT_SOURCE_DIR}/cmake/pch.h)

set(AFTERBURNER_AREA_OBJECTS "" CACHE INTERNAL "")

# afterburner_area(<name> [DEPENDS <area>...]): object library afterburner_<name> from src/<name>.
function(afterburner_area name)
  cmake_parse_arguments(AREA "" "" "DEPENDS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${name}/*.cpp)
  if(NOT sources)
    return()
  endif()
  add_library(afterburner_${name} OBJECT ${sources})
  target_link_libraries(afterburner_${name} PUBLIC afterburner_deps)
  target_precompile_headers(afterburner_${name} REUSE_FROM afterburner_pch)
  # Object libraries hand their objects only to targets that link them directly, so each
  # area records its closure for the tests that link one area on its own.
  set(closure afterburner_${name})
  foreach(dep IN LISTS AREA_DEPENDS)
    if(NOT TARGET afterburner_${dep})
      continue()
    endif()
    target_link_libraries(afterburner_${name} PUBLIC afterburner_${dep})
    list(APPEND closure ${AFTERBURNER_CLOSURE_${dep}})
  endforeach()
  list(REMOVE_DUPLICATES closure)
  set(AFTERBURNER_CLOSURE_${name} ${closure} CACHE INTERNAL "")
  set(AFTERBURNER_AREA_OBJECTS ${AFTERBURNER_AREA_OBJECTS} $<TARGET_OBJECTS:afterburner_${name}>
      CACHE INTERNAL "")
endfunction()

# afterburner_test(<area>): tests/<area>/*.cpp as one GoogleTest executable, linked with
# that area's objects and those it depends on; ctest runs each of its suites as the test
# <area>.<Suite> (cmake/GTestSuites.cmake lists them each time the executable links).
function(afterburner_test area)
  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/${area}/*.cpp)
  if(NOT sources)
    return()
  endif()
  add_executable(test_${area} ${sources})
  target_link_libraries(test_${area} PRIVATE ${AFTERBURNER_CLOSURE_${area}} afterburner_testing
                        GTest::gtest GTest::gtest_main)
  target_precompile_headers(test_${area} REUSE_FROM afterburner_pch)
  if(AFTERBURNER_SANITIZE)
    return()  # a sanitizer build runs whole test binaries (tests/CMakeLists.txt)
  endif()
  set(suites_file ${CMAKE_CURRENT_BINARY_DIR}/test_${area}_suites.cmake)
  add_custom_command(TARGET test_${area} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D executable=$<TARGET_FILE:test_${area}> -D output=${suites_file} -D prefix=${area}
            -D source_dir=${PROJECT_SOURCE_DIR} -D cli=$<TARGET_FILE:afterburner_cli>
            -P ${PROJECT_SOURCE_DIR}/cmake/GTestSuites.cmake
    BYPRODUCTS ${suites_file} VERBATIM)
  # Until the executable has linked once, ctest shows one failing test saying so.
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/test_${area}_include.cmake)
  file(WRITE ${include_file} "if(EXISTS [[${suites_file}]])\n  include([[${suites_file}]])\n"
                             "else()\n  add_test(${area}.NOT_BUILT test_${area}_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
