# wick.pc, the pkg-config file installed beside the CMake package (LIBDIR/pkgconfig). Included by
# the top-level CMakeLists.txt after the wick target and its dependencies (cmake/
# wickDependencies.cmake) are known.
#
# A static libwick.a needs its dependencies in every link: they go to Requires and Libs, so that
# `pkg-config --libs wick` and `--libs --static` both link. A shared libwick.so carries them
# itself: `--libs` gives -lwick alone, and they go to Requires.private and Libs.private.

# The link flags of libraries given as files (-L<dir> -l<name>; no -L for the linker's own
# directories), flags (kept) or bare names (-l<name>).
function(wick_pc_link_flags out)
  set(flags "")
  foreach(lib ${ARGN})
    if(lib MATCHES "^-")
      list(APPEND flags "${lib}")
    elseif(IS_ABSOLUTE "${lib}")
      get_filename_component(dir "${lib}" DIRECTORY)
      get_filename_component(file "${lib}" NAME)
      string(REGEX REPLACE "^lib" "" name "${file}")
      string(REGEX REPLACE "\\.(so|a|dylib)(\\.[0-9.]*)?$" "" name "${name}")
      if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
        list(APPEND flags "-L${dir}")
      endif()
      list(APPEND flags "-l${name}")
    else()
      list(APPEND flags "-l${lib}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES flags)
  string(JOIN " " joined ${flags})
  set(${out} "${joined}" PARENT_SCOPE)
endfunction()

get_target_property(wick_pc_type wick TYPE)
set(wick_pc_deps "")
if(wick_built_with_cuda)
  wick_pc_link_flags(cuda_flags -L${CUDAToolkit_LIBRARY_DIR} cublas cublasLt cudart)
  list(APPEND wick_pc_deps ${cuda_flags})
endif()
wick_pc_link_flags(other_flags ${ICU_UC_LIBRARIES} ${BLAS_LIBRARIES} ${BLAS_LINKER_FLAGS})
list(APPEND wick_pc_deps ${other_flags})
string(JOIN " " wick_pc_deps ${wick_pc_deps})
set(WICK_PC_REQUIRES "libpcre2-8 libzip")
if(wick_pc_type STREQUAL "STATIC_LIBRARY")
  set(WICK_PC_KIND "static")
  set(WICK_PC_PRIVATE "")
  set(WICK_PC_LIBS "${wick_pc_deps} -pthread")
  set(WICK_PC_LIBS_PRIVATE "")
else()
  set(WICK_PC_KIND "shared")
  set(WICK_PC_PRIVATE ".private")
  set(WICK_PC_LIBS "-pthread")
  set(WICK_PC_LIBS_PRIVATE "${wick_pc_deps}")
endif()

# Paths relative to the file's own folder (${pcfiledir}), so that an installed tree can be moved
# (cmake --install --prefix elsewhere); absolute where the install dirs are absolute.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(WICK_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(WICK_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(WICK_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" up "${up}")
  set(WICK_PC_PREFIX "\${pcfiledir}/${up}")
  set(WICK_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(WICK_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()

configure_file(${CMAKE_CURRENT_LIST_DIR}/wick.pc.in ${CMAKE_CURRENT_BINARY_DIR}/wick.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/wick.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT wick)
