// verifier/cli/cmd_list_case.cpp: see cmd_list_case.hpp.
#include "verifier/cli/cmd_list_case.hpp"

#include <CLI/CLI.hpp>

#include <iostream>

#include "properties/property.hpp"
#include "verifier/case/case.hpp"
#include "verifier/cli/args.hpp"
#include "verifier/impls/registry.hpp"

namespace ckv::cli {

CLI::App* add_list(CLI::App& app) {
  return app.add_subcommand("list",
                            "List the properties, the implementations (builtin and the faults) and the Case fields.");
}

int run_list() {
  std::cout << "Properties (report order; a failure names the first):\n";
  for (const auto& p : properties()) std::cout << "  " << p.name << "\n      " << p.holds_when << "\n";
  std::cout << "\nImplementations (--impl):\n";
  for (const auto& e : known_impls()) {
    const ImplInfo& i = e.info;
    std::cout << "  " << i.name;
    if (!i.killed_by.empty())
      std::cout << "  [fault; killed by " << i.killed_by << "; shows with " << i.exposed_by << "]";
    std::cout << "\n      " << i.what << "\n";
  }
  std::cout
      << "\nSpecs for other implementations (--impl) and strategies (--strategy):\n"
         "  PATH.so[:key=value,...]\n"
         "      a C++ plugin built against <ckverify/plugin.hpp>; a strategy when it overrides is_strategy()\n"
         "  py:MODULE:CALLABLE[:key=value,...]\n"
         "      a Python callable; values typed (true/false, none, numbers, JSON [..] {..} \"..\", else strings);\n"
         "      keys starting with @ are ckverify's:\n"
         "      @convention=function  CALLABLE(segment, *ARGS, *segment_args, **options) (default)\n"
         "      @convention=wrapper   CALLABLE(segment, **options) -> module, called as module(*segment_args)\n"
         "      @convention=strategy  CALLABLE(blocks, x, **options) -> output (what --strategy sets)\n"
         "      @args=[...]           ARGS: positional arguments between the function and the segment's\n"
         "      segment: a ckverify.Segment (nn.Module; parameters(), index, step, micro); blocks: a\n"
         "      ckverify.Blocks (nn.ModuleList of them). An adapter may name its own convention.\n"
         "      Shipped adapters (python/ckverify/adapters.py):\n"
         "        py:ckverify.adapters:torch_checkpoint            torch's checkpoint marking its recomputes\n"
         "        py:ckverify.adapters:selective:ops=[...]         torch's selective activation checkpointing\n"
         "        py:ckverify.adapters:checkpoint_sequential       torch's checkpoint_sequential (a strategy)\n"
         "        py:ckverify.adapters:deepspeed[:reentrant=false,cpu_streams=true,CONFIGURE_OPTION=...]\n"
         "                                                         DeepSpeed's configure() + checkpoint\n"
         "        py:ckverify.adapters:transformers[:gradient_checkpointing_kwargs={...},offload=true]\n"
         "                                                         transformers' gradient_checkpointing_enable\n"
         "      (deepspeed and transformers: ci/setup.sh --frameworks; fairscale's checkpoint_wrapper needs\n"
         "      no adapter: py:fairscale.nn.checkpoint:checkpoint_wrapper:@convention=wrapper)\n";
  std::cout << "\nCase fields (line form key=value; JSON uses the same keys):\n";
  for (const auto& f : case_field_infos())
    std::cout << "  " << f.key << "=" << f.values << "\n      " << f.help << "\n";
  return kExitOk;
}

CLI::App* add_case(CLI::App& app, CaseArgs& a) {
  CLI::App* case_cmd =
      app.add_subcommand("case", "Print a Case given in line form (key=value ...) as a Case file (JSON) for repro.");
  case_cmd->add_option("keys", a.words, "Case fields as key=value (see `ckverify list`); the rest default");
  return case_cmd;
}

int run_case(const CaseArgs& a) {
  std::string line;
  for (const auto& w : a.words) line += (line.empty() ? "" : " ") + w;
  const Case c = case_from_line(line);
  std::cout << to_json(c);
  return kExitOk;
}

}  // namespace ckv::cli
