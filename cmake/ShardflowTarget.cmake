include(GNUInstallDirs)

# Compile options shared by every shardflow target.
function(shardflow_configure_target target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
                                           -Wnon-virtual-dtor -Wimplicit-fallthrough)
  if(SHARDFLOW_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(SHARDFLOW_SANITIZE)
    # float-cast-overflow is not part of `undefined`: a float out of an
    # integer type's range converted to it (+inf padding filled into an
    # int32 tensor read INT_MIN) is undefined behaviour all the same.
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined,float-cast-overflow
                                             -fno-sanitize-recover=undefined,float-cast-overflow
                                             -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined,float-cast-overflow)
  endif()
endfunction()

# One static library per pipeline stage: shardflow_add_library(<stage> SOURCES ... DEPS ...)
function(shardflow_add_library stage)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target shardflow_${stage})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(shardflow::${stage} ALIAS ${target})
  # Installed as shardflow::<stage> too (cmake/ShardflowInstall.cmake).
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${stage})
  set_property(GLOBAL APPEND PROPERTY SHARDFLOW_STAGE_LIBRARIES ${target})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                                       PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  shardflow_configure_target(${target})
endfunction()
