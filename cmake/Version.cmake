# cmake/Version.cmake: run at every build (cmake -P, the ckv_version target) to write ckverify's version
# header: the project version and the commit the build was made from (`git describe --always --dirty`,
# "unknown" outside a git checkout). The file is rewritten only when that changes, so only version.cpp
# compiles again. Reports carry it, and `merge` refuses shards of different versions.
execute_process(
  COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
  OUTPUT_VARIABLE commit
  OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_QUIET
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
endif()
file(CONFIGURE OUTPUT "${OUT}" CONTENT "#define CKVERIFY_VERSION \"${VERSION}+${commit}\"\n" @ONLY)
