# cmake/CkvTorch.cmake: provides the imported target ckv::torch for one of two LibTorch builds.
#
#   primary (default): the LibTorch inside PyPI's torch wheel in .venv (pinned by ci/setup.sh), found
#     through torch.utils.cmake_prefix_path. We read the headers and libraries from that prefix and do
#     not call the wheel's TorchConfig.cmake, because on a machine that also has Debian's libtorch-dev
#     it resolves libtorch.so/libc10.so to /usr/lib (mixing two LibTorch versions in one binary), it
#     links the local CUDA toolkit's nvrtc (13.x) next to a cu128 build, and it fails outright on a
#     machine without a CUDA toolkit. The wheel's libtorch.so still pulls in libtorch_cuda.so, so CUDA
#     works at run time wherever a GPU exists, and is simply unavailable elsewhere.
#   floor (CKVERIFY_FLOOR=ON): Debian's libtorch-dev 1.13.1 through its own TorchConfig (CPU only).
option(CKVERIFY_FLOOR "Build against Debian's libtorch-dev (1.13.1) instead of the PyPI wheel" OFF)
set(CKVERIFY_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python of the virtual environment holding the pinned torch wheel (primary build)")

if(CKVERIFY_FLOOR)
  find_package(Torch REQUIRED CONFIG)
  if(Torch_VERSION VERSION_GREATER_EQUAL 2.0)
    message(FATAL_ERROR "CKVERIFY_FLOOR expects Debian's LibTorch 1.13.x, found ${Torch_VERSION}")
  endif()
  add_library(ckv::torch INTERFACE IMPORTED)
  target_link_libraries(ckv::torch INTERFACE ${TORCH_LIBRARIES})
  set(CKVERIFY_TORCH_DESC "Debian libtorch ${Torch_VERSION} (floor)")
else()
  execute_process(
    COMMAND "${CKVERIFY_PYTHON}" -W ignore -c
            "import sys, torch, torch.utils; sys.stdout.write(torch.utils.cmake_prefix_path + ';' + torch.__version__)"
    OUTPUT_VARIABLE _ckv_torch_out RESULT_VARIABLE _ckv_torch_rc ERROR_QUIET)
  if(NOT _ckv_torch_rc EQUAL 0)
    message(FATAL_ERROR "ckverify: cannot import torch from ${CKVERIFY_PYTHON}. Run ci/setup.sh first "
                        "(or pass -DCKVERIFY_FLOOR=ON to build against Debian's libtorch-dev).")
  endif()
  list(GET _ckv_torch_out 0 _ckv_prefix)
  list(GET _ckv_torch_out 1 _ckv_version)
  get_filename_component(_ckv_root "${_ckv_prefix}/../.." ABSOLUTE)  # .../site-packages/torch
  set(_ckv_lib "${_ckv_root}/lib")
  foreach(_l torch torch_cpu c10)
    if(NOT EXISTS "${_ckv_lib}/lib${_l}.so")
      message(FATAL_ERROR "ckverify: ${_ckv_lib}/lib${_l}.so is missing; the torch wheel is incomplete")
    endif()
  endforeach()
  add_library(ckv::torch INTERFACE IMPORTED)
  # SYSTEM include directories: LibTorch headers do not pass our -Wall -Wextra -Werror.
  set_target_properties(ckv::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${_ckv_root}/include;${_ckv_root}/include/torch/csrc/api/include"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_ckv_root}/include;${_ckv_root}/include/torch/csrc/api/include"
    # The wheel bundles fmt 11 headers in its include directory, which shadow Debian's fmt 9 in every
    # translation unit that includes LibTorch: such units use fmt header-only (inline namespace
    # fmt::v11, so no clash with the fmt::v9 that torch-free units link from libfmt.so).
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1;FMT_HEADER_ONLY=1"
    # --no-as-needed keeps libtorch.so (and with it libtorch_cuda.so) even though we call no symbol in it
    INTERFACE_LINK_OPTIONS "LINKER:--no-as-needed;LINKER:-rpath,${_ckv_lib}"
    INTERFACE_LINK_LIBRARIES "${_ckv_lib}/libtorch.so;${_ckv_lib}/libtorch_cpu.so;${_ckv_lib}/libc10.so")
  set(CKVERIFY_TORCH_DESC "PyPI torch ${_ckv_version} (primary)")

  # The Python bridge (verifier/impls/python_impl.cpp): embedded CPython (Debian's python3-dev, the same
  # 3.11 as the virtual environment) plus the wheel's libtorch_python and pybind11.
  option(CKVERIFY_PYTHON_BRIDGE "Build the py:MODULE:CALLABLE implementations (primary build)" ON)
  if(CKVERIFY_PYTHON_BRIDGE)
    execute_process(COMMAND "${CKVERIFY_PYTHON}" -c
                            "import sys, sysconfig as s; sys.stdout.write(';'.join([s.get_paths()['purelib'], s.get_paths()['include'], s.get_config_var('LDVERSION'), s.get_config_var('LIBDIR') or '']))"
                    OUTPUT_VARIABLE _ckv_py_out RESULT_VARIABLE _ckv_py_rc)
    list(GET _ckv_py_out 0 CKVERIFY_PYTHON_SITE)
    list(GET _ckv_py_out 1 _ckv_py_include)
    list(GET _ckv_py_out 2 _ckv_py_ldversion)
    list(GET _ckv_py_out 3 _ckv_py_libdir)
    # The venv's own interpreter library when it has one (a shared-library build), with its headers;
    # otherwise the system's (Debian's python3-dev), with the system's headers: same minor version.
    find_library(_ckv_libpython NAMES python${_ckv_py_ldversion} PATHS "${_ckv_py_libdir}" NO_DEFAULT_PATH)
    if(NOT _ckv_libpython)
      find_library(_ckv_libpython NAMES python${_ckv_py_ldversion} PATHS /usr/lib/x86_64-linux-gnu /usr/lib)
      set(_ckv_py_include "/usr/include/python${_ckv_py_ldversion}")
    endif()
    if(NOT _ckv_py_rc EQUAL 0 OR NOT EXISTS "${_ckv_py_include}/Python.h" OR NOT _ckv_libpython
       OR NOT EXISTS "${_ckv_lib}/libtorch_python.so")
      message(FATAL_ERROR "ckverify: the Python bridge needs Python.h and libpython${_ckv_py_ldversion} "
                          "(apt-get install python3-dev) and the wheel's libtorch_python.so; or pass "
                          "-DCKVERIFY_PYTHON_BRIDGE=OFF")
    endif()
    add_library(ckv::torch_python INTERFACE IMPORTED)
    set_target_properties(ckv::torch_python PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_ckv_py_include}"
      INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_ckv_py_include}"
      INTERFACE_LINK_LIBRARIES "${_ckv_lib}/libtorch_python.so;${_ckv_libpython}")
    message(STATUS "ckverify: Python bridge on (${_ckv_libpython}, modules from ${CKVERIFY_PYTHON_SITE})")
  endif()
endif()
string(REGEX MATCH "([0-9]+)\\.([0-9]+)" _ckv_mm "${CKVERIFY_TORCH_DESC}")
set(CKV_TORCH_MAJOR ${CMAKE_MATCH_1})
set(CKV_TORCH_MINOR ${CMAKE_MATCH_2})
message(STATUS "ckverify: LibTorch = ${CKVERIFY_TORCH_DESC}")
