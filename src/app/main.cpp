// zeropipe: the command-line entry point. Subcommands arrive with the issues that build them.
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  std::fprintf(stderr, "usage: zeropipe <train|parity|generate|eval|convert|inspect> [options]\n");
  return argc > 1 && std::strcmp(argv[1], "--help") == 0 ? 0 : 2;
}
