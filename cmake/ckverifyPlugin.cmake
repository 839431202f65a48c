# cmake/ckverifyPlugin.cmake: ckverify_add_plugin(NAME SOURCES...), a checkpoint implementation as a
# plugin that `ckverify check --impl path/to/libNAME.so` loads. Used in the source tree (the faults
# plugin) and by plugin authors through find_package(ckverify) (the installed ckverifyConfig.cmake),
# so both build plugins the same way: a MODULE library against the target ckverify::plugin (the public
# header and the LibTorch ckverify was built with), hidden visibility except for the two entry points
# CKVERIFY_PLUGIN defines, and undefined ckverify symbols left to the executable that loads it.
function(ckverify_add_plugin name)
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE ckverify::plugin)
  set_target_properties(${name} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
                                           CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON PREFIX "lib")
endfunction()
