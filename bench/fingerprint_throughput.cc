// Throughput of idem's payload fingerprint over a JSON-lines file, for bench/fingerprint.sh.
//
// usage: idem-bench-fingerprint FILE [PASSES]
// One run: the best of PASSES (default 5) passes over every line of FILE (split on '\n' only),
// like ../shared/baselines/07_py_canon_bench.py. MB/s counts input bytes (1 MB = 10^6 B) per
// second of process CPU time (as `openssl speed` counts user time), so that other processes on
// a shared host do not distort the ratios.
// Prints "<case> <MB/s> <payloads/s>" for:
//   fingerprint   canonicalize (RFC 8785) + domain-separated SHA-256, default options
//   canonicalize  canonicalize only
//   seed_md5      python_json_dumps form + MD5 of the canonical bytes (the seed's method)
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "idem/fingerprint.h"

namespace {

std::vector<std::string> read_lines(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string("cannot open ") + path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line, '\n')) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// Seconds of the fastest of `passes` passes of `work` over all lines.
double best_pass(const std::vector<std::string>& lines, int passes,
                 const std::function<std::size_t(const std::string&)>& work) {
  double best = 1e30;
  std::size_t sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const double start = cpu_seconds();
    for (const std::string& line : lines) sink += work(line);
    best = std::min(best, cpu_seconds() - start);
  }
  if (sink == 0) std::puts("# (empty output)");
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: idem-bench-fingerprint FILE [PASSES]\n";
    return 2;
  }
  try {
    const auto lines = read_lines(argv[1]);
    const int passes = argc > 2 ? std::stoi(argv[2]) : 5;
    std::size_t bytes = 0;
    for (const auto& line : lines) bytes += line.size();
    const idem::Fingerprinter fingerprinter;
    const idem::Fingerprinter seed({.form = idem::CanonicalForm::kPythonJsonDumps,
                                    .hash = idem::HashAlgorithm::kMd5,
                                    .domain_separated = false});
    const std::pair<const char*, std::function<std::size_t(const std::string&)>> cases[] = {
        {"fingerprint",
         [&](const std::string& json) { return fingerprinter.fingerprint(json).size(); }},
        {"canonicalize",
         [&](const std::string& json) { return fingerprinter.canonicalize(json).size(); }},
        {"seed_md5", [&](const std::string& json) { return seed.fingerprint(json).size(); }},
    };
    for (const auto& [name, work] : cases) {
      const double seconds = best_pass(lines, passes, work);
      std::printf("%s %.1f %.0f\n", name, static_cast<double>(bytes) / seconds / 1e6,
                  static_cast<double>(lines.size()) / seconds);
    }
  } catch (const std::exception& error) {
    std::cerr << "idem-bench-fingerprint: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
