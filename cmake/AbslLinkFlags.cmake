# Debian's abseil CMake targets, which gRPC's link, each carry
# "-Wl,--push-state,--as-needed;-latomic;-Wl,--pop-state". CMake de-duplicates link flags repeated
# across targets and can leave a --pop-state without its --push-state ("ld: no state pushed
# before popping"): keep -latomic alone. Included after find_package(gRPC), by our build and by
# the installed package's afterburnerConfig.cmake.
get_property(afterburner_imported_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
foreach(target IN LISTS afterburner_imported_targets)
  get_target_property(libraries ${target} INTERFACE_LINK_LIBRARIES)
  if(libraries AND "${libraries}" MATCHES "--push-state")
    list(REMOVE_ITEM libraries "-Wl,--push-state,--as-needed" "-Wl,--pop-state")
    set_target_properties(${target} PROPERTIES INTERFACE_LINK_LIBRARIES "${libraries}")
  endif()
endforeach()
