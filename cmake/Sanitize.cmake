# -DAFTERBURNER_SANITIZE=ON: everything (the precompiled header included, which is why the flags
# are global) built with AddressSanitizer and UndefinedBehaviorSanitizer. Any finding ends the
# program with an error, so a test or fuzz run fails on it. LibTorch itself is not instrumented.
#
# -DAFTERBURNER_FUZZ=ON (the default in a sanitizer build with clang): also the libFuzzer
# targets of tests/fuzz, and the coverage instrumentation that guides them in all our code.
#
#   CXX=clang++ cmake -S . -B build-asan -G Ninja -DAFTERBURNER_SANITIZE=ON
#   cmake --build build-asan --target sanitizer_tests fuzzers && ctest --test-dir build-asan
option(AFTERBURNER_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)

set(AFTERBURNER_FUZZ_DEFAULT OFF)
if(AFTERBURNER_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(AFTERBURNER_FUZZ_DEFAULT ON)
endif()
option(AFTERBURNER_FUZZ "Build the libFuzzer targets (clang, with AFTERBURNER_SANITIZE)" ${AFTERBURNER_FUZZ_DEFAULT})

if(AFTERBURNER_SANITIZE)
  # vptr: UBSan's dynamic type check needs the typeinfo of LibTorch's classes, which
  # libtorch 1.13 does not export (`typeinfo for c10::DynamicType`): it cannot link.
  set(sanitizers -fsanitize=address,undefined -fno-sanitize=vptr)
  add_compile_options(${sanitizers} -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1)
  add_link_options(${sanitizers})
  message(STATUS "afterburner: building with AddressSanitizer and UndefinedBehaviorSanitizer")
endif()

if(AFTERBURNER_FUZZ)
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=fuzzer)
  check_cxx_source_compiles([[
    #include <cstddef>
    #include <cstdint>
    extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }]] AFTERBURNER_HAVE_LIBFUZZER)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(NOT AFTERBURNER_SANITIZE OR NOT AFTERBURNER_HAVE_LIBFUZZER)
    set(AFTERBURNER_FUZZ OFF)
  else()
    add_compile_options(-fsanitize=fuzzer-no-link)
  endif()
endif()
if(NOT AFTERBURNER_FUZZ)
  message(STATUS "afterburner: fuzz targets skipped (they need clang with libFuzzer and -DAFTERBURNER_SANITIZE=ON)")
endif()

# What the sanitizer runs (ctest in a sanitizer build, and the fuzzers) set in their environment.
set(AFTERBURNER_SANITIZER_ENV
    "ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1"
    "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
# Only where archives are fuzzed: LibTorch's own leak on malformed ones (see the file). It names
# a module, which would also hide leaks of tensors we allocate, so nothing else gets it.
set(AFTERBURNER_ARCHIVE_LEAK_ENV
    "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/cmake/lsan.supp:print_suppressions=0")
