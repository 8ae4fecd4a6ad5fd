// zeropipe: the command-line entry point. Each subcommand parses its own options
// (Boost.ProgramOptions); bad input is reported as one clear line and a non-zero exit.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "app/parity.h"
#include "core/error.h"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "usage: zeropipe <command> [options]\n"
    "commands:\n"
    "  parity   run a reference folder (hub config, weights, io.safetensors) and compare every tensor\n"
    "run `zeropipe <command> --help` for the command's options\n";

int cmd_parity(int argc, char** argv) {
  zp::app::ParityOptions o;
  po::options_description desc("zeropipe parity options");
  desc.add_options()("help,h", "show this help")(
      "model", po::value<std::string>(&o.model_dir)->required(), "reference folder (config.json, weights, io.safetensors)")(
      "device", po::value<std::string>(&o.device)->default_value("cpu"), "cpu | cuda")(
      "dtype", po::value<std::string>(&o.dtype)->default_value("fp32"), "fp32 | bf16 (bf16 needs a GPU)");
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);
  return zp::app::run_parity(o).finish();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "parity") return cmd_parity(argc - 1, argv + 1);
    std::fprintf(stderr, "zeropipe: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const po::error& e) {
    std::fprintf(stderr, "zeropipe %s: %s\n", cmd.c_str(), e.what());
    return 2;
  } catch (const zp::Error& e) {
    std::fprintf(stderr, "zeropipe %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
