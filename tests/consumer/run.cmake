# The consumer test (CTest "consumer"): installs the built wick into a temporary prefix, checks the
# exported package, then configures, builds and runs tests/consumer against it. Only the consumer
# compiles: the library is the one already built.
#
# cmake -DWICK_BUILD_DIR=... -DCONSUMER_SOURCE=... -DWORK=... -DGENERATOR=... -DCXX=...
#       [-DLAUNCHER=ccache] [-DDEPS_PREFIX_PATH=a|b] [-DDEPS_LIBRARY_PATH=c|d] -P run.cmake

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
run("install" ${CMAKE_COMMAND} --install ${WICK_BUILD_DIR} --prefix ${prefix} --component wick)

# The package exports wick::wick only: no internal flag targets, no build-machine paths or flags.
file(GLOB targets_files ${prefix}/lib*/cmake/wick/wickTargets*.cmake)
foreach(f ${targets_files})
  file(READ ${f} text)
  foreach(bad wick_flags wick_warnings -march -Werror ${WICK_BUILD_DIR})
    string(FIND "${text}" "${bad}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "consumer: ${f} mentions ${bad}")
    endif()
  endforeach()
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
