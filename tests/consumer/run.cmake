# The consumer tests (CTest "consumer" and "consumer_pkgconfig"): install the built wick into a
# temporary prefix, check the exported package, then build and run tests/consumer/main.cpp against
# it: MODE cmake configures tests/consumer (find_package, wick::wick, no C++ standard of its own);
# MODE pkgconfig compiles and links main.cpp with `pkg-config --cflags --libs wick` alone (and,
# for a static libwick.a, with `--libs --static` too). Only the consumer compiles: the library is
# the one already built.
#
# cmake -DMODE=cmake|pkgconfig -DWICK_BUILD_DIR=... -DCONSUMER_SOURCE=... -DWORK=... -DGENERATOR=...
#       -DCXX=... [-DLAUNCHER=ccache] [-DDEPS_PREFIX_PATH=a|b] [-DDEPS_LIBRARY_PATH=c|d]
#       [-DDEPS_LINK_DIRS=e|f] -P run.cmake
cmake_minimum_required(VERSION 3.24)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer: ${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "consumer: ${what}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
# Where dependencies are carried in a private root (the GPU machine: scripts/gpu-env.sh), their
# .pc files are read through PKG_CONFIG_SYSROOT_DIR, which pkg-config prepends to every -I and -L
# outside that root: the package goes under the root too, so that its own paths stay right, and
# the linker also searches the build's link directories outside it (DEPS_LINK_DIRS: CUDA's).
if(MODE STREQUAL "pkgconfig" AND DEFINED ENV{PKG_CONFIG_SYSROOT_DIR})
  if(NOT "$ENV{PKG_CONFIG_SYSROOT_DIR}" STREQUAL "")
    set(prefix $ENV{PKG_CONFIG_SYSROOT_DIR}${WORK}/prefix)
    file(REMOVE_RECURSE ${prefix})
    string(REPLACE "|" ";" link_dirs "${DEPS_LINK_DIRS}")
    if(DEFINED ENV{LIBRARY_PATH} AND NOT "$ENV{LIBRARY_PATH}" STREQUAL "")
      list(APPEND link_dirs "$ENV{LIBRARY_PATH}")
    endif()
    string(REPLACE ";" ":" link_dirs "${link_dirs}")
    set(ENV{LIBRARY_PATH} "${link_dirs}")
  endif()
endif()
run("install" ${CMAKE_COMMAND} --install ${WICK_BUILD_DIR} --prefix ${prefix} --component wick)

file(GLOB shared_libs ${prefix}/lib*/libwick.so*)
if(shared_libs)
  set(shared ON)
  message(STATUS "consumer: the package holds a shared libwick")
else()
  set(shared OFF)
  message(STATUS "consumer: the package holds a static libwick")
endif()

if(MODE STREQUAL "pkgconfig")
  find_program(PKG_CONFIG pkg-config REQUIRED)
  file(GLOB pc_dirs ${prefix}/lib*/pkgconfig)
  if(NOT pc_dirs)
    message(FATAL_ERROR "consumer: no lib*/pkgconfig folder in the installed package")
  endif()
  if(DEFINED ENV{PKG_CONFIG_PATH} AND NOT "$ENV{PKG_CONFIG_PATH}" STREQUAL "")
    set(pc_dirs "${pc_dirs}:$ENV{PKG_CONFIG_PATH}")
  endif()
  set(ENV{PKG_CONFIG_PATH} "${pc_dirs}")
  run("pkg-config --cflags" ${PKG_CONFIG} --cflags wick)
  separate_arguments(cflags UNIX_COMMAND "${last_output}")
  run("pkg-config --libs" ${PKG_CONFIG} --libs wick)
  separate_arguments(libs UNIX_COMMAND "${last_output}")
  run("pkg-config --libs --static" ${PKG_CONFIG} --libs --static wick)
  separate_arguments(static_libs UNIX_COMMAND "${last_output}")
  run("pkg-config --variable=libdir" ${PKG_CONFIG} --variable=libdir wick)
  string(STRIP "${last_output}" libdir)
  # A shared libwick.so links with -lwick alone (and -pthread): its dependencies are private.
  if(shared AND NOT libs MATCHES "^-L[^;]*;-lwick;-pthread$")
    message(FATAL_ERROR "consumer: pkg-config --libs wick of a shared libwick gives ${libs}")
  endif()

  file(MAKE_DIRECTORY ${WORK}/pc)
  run("compile with pkg-config's cflags" ${LAUNCHER} ${CXX} -c ${CONSUMER_SOURCE}/main.cpp
      ${cflags} -o ${WORK}/pc/main.o)
  set(variants libs)
  if(NOT shared)
    list(APPEND variants static_libs)
  endif()
  foreach(v ${variants})
    run("link with pkg-config's ${v}" ${CXX} ${WORK}/pc/main.o ${${v}} -Wl,-rpath,${libdir}
        -o ${WORK}/pc/consumer_${v})
    run("run (${v})" ${WORK}/pc/consumer_${v})
    message(STATUS "${last_output}")
  endforeach()
  return()
endif()

# The package exports wick::wick only: no internal flag targets, no build-machine paths or flags;
# it asks its consumers for C++20.
file(GLOB targets_files ${prefix}/lib*/cmake/wick/wickTargets*.cmake)
set(all_targets_text "")
foreach(f ${targets_files})
  file(READ ${f} text)
  string(APPEND all_targets_text "${text}")
  foreach(bad wick_flags wick_warnings -march -Werror ${WICK_BUILD_DIR})
    string(FIND "${text}" "${bad}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "consumer: ${f} mentions ${bad}")
    endif()
  endforeach()
endforeach()
if(NOT all_targets_text MATCHES "INTERFACE_COMPILE_FEATURES \"cxx_std_20\"")
  message(FATAL_ERROR "consumer: wick::wick does not ask its consumers for cxx_std_20")
endif()

# <wick/wick.h> reaches every installed header (the compiler's list of the files it reads).
file(GLOB_RECURSE headers RELATIVE ${prefix}/include ${prefix}/include/wick/*.h)
file(WRITE ${WORK}/all.cpp "#include <wick/wick.h>\n")
run("list the headers of wick.h" ${CXX} -std=c++20 -I${prefix}/include -M ${WORK}/all.cpp)
string(REGEX REPLACE "[ \\\\\n]+" ";" read_files "${last_output}")
foreach(h ${headers})
  if(NOT "${prefix}/include/${h}" IN_LIST read_files)
    message(FATAL_ERROR "consumer: <wick/wick.h> does not include <${h}>")
  endif()
endforeach()

# Where the build found its dependencies, for the package's find_dependency calls.
foreach(var PREFIX LIBRARY)
  if(DEPS_${var}_PATH)
    string(REPLACE "|" ":" paths "${DEPS_${var}_PATH}")
    set(ENV{CMAKE_${var}_PATH} "${paths}")
  endif()
endforeach()

set(configure ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX})
if(LAUNCHER)
  list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
# A shared libwick.so needs none of its private dependencies in the consumer's build: not the
# CUDA toolkit (of a CUDA-enabled build), BLAS, ICU or pkg-config.
if(shared)
  foreach(pkg CUDAToolkit BLAS ICU PkgConfig)
    list(APPEND configure -DCMAKE_DISABLE_FIND_PACKAGE_${pkg}=ON)
  endforeach()
endif()

# A version the package does not claim to be compatible with is refused.
execute_process(COMMAND ${configure} -B ${WORK}/build-0.3 -DWICK_VERSION_WANTED=0.3
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(rc EQUAL 0)
  message(FATAL_ERROR "consumer: find_package(wick 0.3) succeeded against wick 0.2")
endif()

run("configure" ${configure} -B ${WORK}/build)
run("build" ${CMAKE_COMMAND} --build ${WORK}/build)
run("run" ${WORK}/build/consumer)
message(STATUS "${last_output}")

# The package as a CUDA-enabled build installs it (wickConfig.cmake's wick_built_with_cuda ON),
# with the CUDA toolkit out of reach: a shared libwick's consumer still configures, a static
# one's needs the toolkit for its link and must not.
file(GLOB config_file ${prefix}/lib*/cmake/wick/wickConfig.cmake)
file(READ ${config_file} config_text)
string(REPLACE "set(wick_built_with_cuda OFF)" "set(wick_built_with_cuda ON)" cuda_config_text
               "${config_text}")
if(cuda_config_text STREQUAL config_text AND NOT config_text MATCHES "wick_built_with_cuda ON")
  message(FATAL_ERROR "consumer: ${config_file} does not set wick_built_with_cuda")
endif()
file(WRITE ${config_file} "${cuda_config_text}")
execute_process(COMMAND ${configure} -B ${WORK}/build-cuda -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
file(WRITE ${config_file} "${config_text}")
if(shared AND NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer: a CUDA-enabled shared libwick needs the CUDA toolkit:\n${out}")
elseif(NOT shared AND (rc EQUAL 0 OR NOT out MATCHES "CUDAToolkit"))
  message(FATAL_ERROR "consumer: a CUDA-enabled static libwick did not ask for the CUDA toolkit "
                      "(${rc}):\n${out}")
endif()
if(shared)
  message(STATUS "consumer: CUDA-enabled shared package without the CUDA toolkit: configures")
else()
  message(STATUS "consumer: CUDA-enabled static package without the CUDA toolkit: refused")
endif()
