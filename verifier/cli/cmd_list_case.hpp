// verifier/cli/cmd_list_case.hpp: `ckverify list` (the properties, the implementations and the specs
// of others, the Case fields) and `ckverify case` (a Case in line form as a Case file).
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace ckv::cli {

CLI::App* add_list(CLI::App& app);
int run_list();

struct CaseArgs {
  std::vector<std::string> words;  // key=value
};

CLI::App* add_case(CLI::App& app, CaseArgs& a);
int run_case(const CaseArgs& a);

}  // namespace ckv::cli
