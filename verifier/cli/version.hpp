// verifier/cli/version.hpp: which ckverify this is, "VERSION+COMMIT" (the project version and the commit
// it was built from, with "-dirty" for uncommitted changes): `ckverify --version` and every report.
#pragma once

namespace ckv::cli {

const char* version();

}  // namespace ckv::cli
