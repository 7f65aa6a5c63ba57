# `cmake --install`: headers, the stage libraries, the `shardflow` tool and a
# CMake package, so that another project does
#   find_package(shardflow CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE shardflow::shardflow)
include(CMakePackageConfigHelpers)

# One target for the whole library, as users link it; the stages stay
# available as shardflow::<stage>.
add_library(shardflow_all INTERFACE)
set_target_properties(shardflow_all PROPERTIES EXPORT_NAME shardflow)
get_property(shardflow_stage_libraries GLOBAL PROPERTY SHARDFLOW_STAGE_LIBRARIES)
target_link_libraries(shardflow_all INTERFACE ${shardflow_stage_libraries})

set(SHARDFLOW_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/shardflow)
install(DIRECTORY include/shardflow TYPE INCLUDE)
install(TARGETS ${shardflow_stage_libraries} shardflow_all EXPORT shardflowTargets)
install(TARGETS shardflow RUNTIME)
install(EXPORT shardflowTargets NAMESPACE shardflow:: DESTINATION ${SHARDFLOW_CMAKE_DIR})
configure_package_config_file(cmake/shardflowConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/shardflowConfig.cmake
                              INSTALL_DESTINATION ${SHARDFLOW_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/shardflowConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/shardflowConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/shardflowConfigVersion.cmake
        DESTINATION ${SHARDFLOW_CMAKE_DIR})
