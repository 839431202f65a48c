// plugins/stamp_plugin.cpp: plugins with a wrong stamp, for the loader's refusal tests. Built without
// LibTorch (the stamp is all the loader reads before it refuses): STAMP_INTERFACE, STAMP_TORCH_MAJOR,
// STAMP_TORCH_MINOR and STAMP_ABI are set per target; NO_STAMP builds a library with no entry points.
#ifndef NO_STAMP
extern "C" {
struct ckverify_plugin_stamp {
  int interface_version;
  int torch_major, torch_minor;
  int cxx11_abi;
};
__attribute__((visibility("default"))) const ckverify_plugin_stamp* ckverify_plugin_stamp_v1() {
  static const ckverify_plugin_stamp s{STAMP_INTERFACE, STAMP_TORCH_MAJOR, STAMP_TORCH_MINOR, STAMP_ABI};
  return &s;
}
__attribute__((visibility("default"))) void* ckverify_plugin_create(const void*) {
  return nullptr;
}
}
#else
extern "C" __attribute__((visibility("default"))) int not_a_ckverify_plugin() {
  return 0;
}
#endif
