# The packages libwick links against, found in the same way by wick's own build and, through
# wickConfig.cmake, by a consumer's find_package(wick): a static libwick.a needs them in the
# consumer's link too. To add one: find it here with wick_dependency(...) (the arguments of
# find_package, without REQUIRED), link its imported target (never an absolute path) in
# src/CMakeLists.txt, and add it to the pkg-config file (cmake/wickPkgConfig.cmake).
#
# wick_dependency is find_package(... REQUIRED) in wick's build and find_dependency(...) in
# wickConfig.cmake; wick_built_with_cuda is WICK_CUDA in both. wick_private_dependencies is ON in
# wick's build and for a static libwick.a; a shared libwick.so carries its private dependencies
# itself, so its consumers need only the public ones (Threads, nlohmann-json), and not the CUDA
# toolkit.

wick_dependency(Threads)

# JSON values in the public API (wick/chat_template.h): nlohmann-json's headers, for every
# consumer, shared or static.
wick_dependency(nlohmann_json 3)

if(wick_private_dependencies)
  if(NOT DEFINED BLA_VENDOR)
    set(BLA_VENDOR OpenBLAS)
  endif()
  wick_dependency(BLAS)

  if(wick_built_with_cuda)
    wick_dependency(CUDAToolkit)
  endif()

  # Unicode classes and normal forms (tokenizers); PCRE2 (pre-split regexes) and libzip (npz)
  # through pkg-config, whose imported targets a consumer's link needs as well.
  wick_dependency(ICU COMPONENTS uc)
  wick_dependency(PkgConfig)
  pkg_check_modules(WICK_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
  pkg_check_modules(WICK_LIBZIP REQUIRED IMPORTED_TARGET libzip)
endif()
