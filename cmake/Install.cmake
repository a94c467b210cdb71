# `cmake --install build [--prefix DIR]`: the library, its headers, a CMake package
# (find_package(afterburner) gives afterburner::afterburner, with LibTorch, oneDNN and the rest of
# its dependencies found as this build found them) and a pkg-config file, for C++ users.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(AFTERBURNER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/afterburner)
install(TARGETS afterburner afterburner_deps EXPORT afterburnerTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/afterburner DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT afterburnerTargets NAMESPACE afterburner:: DESTINATION ${AFTERBURNER_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/afterburnerConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/afterburnerConfig.cmake INSTALL_DESTINATION ${AFTERBURNER_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/afterburnerConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/afterburnerConfig.cmake ${PROJECT_BINARY_DIR}/afterburnerConfigVersion.cmake
        ${PROJECT_SOURCE_DIR}/cmake/AbslLinkFlags.cmake DESTINATION ${AFTERBURNER_CMAKE_DIR})

# pkg-config: the static library and everything it links, as absolute paths (LibTorch and oneDNN
# install no .pc files of their own), plus LibTorch's include directories and ABI flag; the prefix
# is where the .pc file lies (`--prefix` moves it).
function(imported_location target output)
  get_target_property(location ${target} IMPORTED_LOCATION)
  if(NOT location)
    get_target_property(configurations ${target} IMPORTED_CONFIGURATIONS)
    list(GET configurations 0 configuration)
    get_target_property(location ${target} IMPORTED_LOCATION_${configuration})
  endif()
  set(${output} ${location} PARENT_SCOPE)
endfunction()
get_filename_component(torch_dir ${TORCH_LIBRARY} DIRECTORY)
set(pkg_libs "${TORCH_LIBRARY} ${torch_dir}/libtorch_cpu.so ${torch_dir}/libc10.so")
foreach(library IN ITEMS ${DNNL_LIBRARY} ${LIBZIP_LIBRARY} ${JPEG_LIBRARY} ${TURBOJPEG_LIBRARY} ${SPNG_LIBRARY} ${LAPACK_LIBRARY})
  string(APPEND pkg_libs " ${library}")
endforeach()
foreach(target IN ITEMS fmt::fmt tomlplusplus::tomlplusplus simdjson::simdjson)
  get_target_property(type ${target} TYPE)
  if(NOT type STREQUAL "INTERFACE_LIBRARY")
    imported_location(${target} location)
    string(APPEND pkg_libs " ${location}")
  endif()
endforeach()
string(REPLACE ";" " -I" pkg_includes "${TORCH_INCLUDE_DIRS}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/afterburner.pc.in ${PROJECT_BINARY_DIR}/afterburner.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/afterburner.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
