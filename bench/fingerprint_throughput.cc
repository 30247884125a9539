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
// and, as the floor any canonicalizer built on these libraries has, its two fixed costs:
//   json_parse    simdjson's DOM parse alone (the parser the writer uses, same padded copy)
//   sha256        OpenSSL EVP SHA-256 alone, of each payload's RFC 8785 bytes
// (MB/s still counts input bytes, so 1 / (1/json_parse + 1/sha256) is comparable with
// fingerprint: the speed of a fingerprint whose canonical writing cost nothing).
#include <openssl/evp.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
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

// Seconds of the fastest of `passes` passes of `work` over the indexes of all `count` lines.
double best_pass(std::size_t count, int passes,
                 const std::function<std::size_t(std::size_t)>& work) {
  double best = 1e30;
  std::size_t sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const double start = cpu_seconds();
    for (std::size_t line = 0; line < count; ++line) sink += work(line);
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
    std::vector<std::string> canonical;
    for (const auto& line : lines) canonical.push_back(fingerprinter.canonicalize(line));
    simdjson::dom::parser parser;
    const std::unique_ptr<EVP_MD, decltype(&EVP_MD_free)> sha256(
        EVP_MD_fetch(nullptr, "SHA256", nullptr), EVP_MD_free);
    if (sha256 == nullptr) throw std::runtime_error("OpenSSL has no SHA256");
    const std::pair<const char*, std::function<std::size_t(std::size_t)>> cases[] = {
        {"fingerprint", [&](std::size_t i) { return fingerprinter.fingerprint(lines[i]).size(); }},
        {"canonicalize",
         [&](std::size_t i) { return fingerprinter.canonicalize(lines[i]).size(); }},
        {"seed_md5", [&](std::size_t i) { return seed.fingerprint(lines[i]).size(); }},
        {"json_parse",
         [&](std::size_t i) {
           return static_cast<std::size_t>(parser.parse(lines[i]).error() == simdjson::SUCCESS);
         }},
        {"sha256",
         [&](std::size_t i) {
           unsigned char digest[EVP_MAX_MD_SIZE];
           unsigned int size = 0;
           EVP_Digest(canonical[i].data(), canonical[i].size(), digest, &size, sha256.get(),
                      nullptr);
           return std::size_t{digest[0]} + size;
         }},
    };
    for (const auto& [name, work] : cases) {
      const double seconds = best_pass(lines.size(), passes, work);
      std::printf("%s %.1f %.0f\n", name, static_cast<double>(bytes) / seconds / 1e6,
                  static_cast<double>(lines.size()) / seconds);
    }
  } catch (const std::exception& error) {
    std::cerr << "idem-bench-fingerprint: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
