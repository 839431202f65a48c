# ckv_layer(TARGET PATH...): the layering the build enforces. A layer's sources see only the headers of
# the layers below it: instead of the source root, TARGET's include directory is a tree of symbolic
# links under the build directory holding just PATHs (directories or files, relative to the source
# root), so an #include that reaches up a layer (model/ into run/, impls/ into run/) fails to compile
# with "No such file or directory". The directory is PUBLIC: a layer above sees it too, and its own
# tree is a superset. Tests, tools and the CLI, above every layer, include from the source root.
function(ckv_layer target)
  set(root "${PROJECT_BINARY_DIR}/layers/${target}")
  file(REMOVE_RECURSE "${root}")
  foreach(path IN LISTS ARGN)
    if(NOT EXISTS "${PROJECT_SOURCE_DIR}/${path}")
      message(FATAL_ERROR "ckv_layer(${target}): no ${path} in the source tree")
    endif()
    get_filename_component(parent "${root}/${path}" DIRECTORY)
    file(MAKE_DIRECTORY "${parent}")
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/${path}" "${root}/${path}" SYMBOLIC)
  endforeach()
  target_include_directories(${target} PUBLIC "${root}")
endfunction()

# The layers, bottom up, each with what it may include (the closure of the layers it builds on).
set(CKV_LAYER_REFERENCE reference)
set(CKV_LAYER_CASE ${CKV_LAYER_REFERENCE} verifier/case)
set(CKV_LAYER_COMPARE ${CKV_LAYER_CASE} properties/compare.hpp properties/tolerance.hpp)
set(CKV_LAYER_CHECKPOINT verifier/checkpoint)
set(CKV_LAYER_MODEL ${CKV_LAYER_CASE} ${CKV_LAYER_CHECKPOINT} verifier/dist verifier/model)
set(CKV_LAYER_DIST ${CKV_LAYER_CHECKPOINT} verifier/dist)
set(CKV_LAYER_IMPLS ${CKV_LAYER_CASE} ${CKV_LAYER_CHECKPOINT} verifier/impls)
set(CKV_LAYER_RUN ${CKV_LAYER_COMPARE} ${CKV_LAYER_CHECKPOINT} verifier/dist verifier/model verifier/impls verifier/run)
set(CKV_LAYER_PROPERTIES ${CKV_LAYER_CASE} ${CKV_LAYER_CHECKPOINT} verifier/dist verifier/model verifier/impls verifier/run properties)
set(CKV_LAYER_REPORTS reports)
