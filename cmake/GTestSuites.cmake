# Run as a script after a test binary links: writes `output`, one ctest test per GoogleTest suite
# of `executable` (from its --gtest_list_tests), named <prefix>.<Suite> and running that suite's
# cases in one process, with AFTERBURNER_SOURCE_DIR=`source_dir` and AFTERBURNER_BINARY=`cli`.
# A process per case spent more in LibTorch's start-up (0.7 s) than in most cases themselves: it
# was half of the whole suite's time.
#
#   cmake -D executable=... -D output=... -D prefix=... -D source_dir=... -D cli=... -P GTestSuites.cmake
execute_process(COMMAND "${executable}" --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE result
                TIMEOUT 60)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${executable} --gtest_list_tests failed (${result}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(tests "")
foreach(line IN LISTS lines)
  # A suite's line is its name and a dot, then for typed suites a comment; its cases are indented.
  if(line MATCHES "^([^ #]+)\\.( +#.*)?$")
    set(name "${prefix}.${CMAKE_MATCH_1}")
    string(APPEND tests "add_test([==[${name}]==] [==[${executable}]==] [==[--gtest_filter=${CMAKE_MATCH_1}.*]==])\n"
           "set_tests_properties([==[${name}]==] PROPERTIES ENVIRONMENT\n"
           "  [==[AFTERBURNER_SOURCE_DIR=${source_dir};AFTERBURNER_BINARY=${cli}]==])\n")
  endif()
endforeach()
if(tests STREQUAL "")
  message(FATAL_ERROR "${executable} --gtest_list_tests named no suite:\n${listing}")
endif()
file(WRITE "${output}" "${tests}")
