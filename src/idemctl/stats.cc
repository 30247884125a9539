// idemctl stats --url URL: the duplicate rate and per-layer decision counts of a running
// service, from the Prometheus text idem's InProcessMetrics renders on its /metrics.
#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "cli.h"
#include "idem/errors.h"
#include "idem/outcome.h"

namespace idem::ctl {
namespace {

struct StatsFlags {
  std::string url{};
  int timeout_ms = 5000;
  bool json = false;
};

// Largest metrics answer read, in bytes: idem's own is a few KiB; a bigger one is no idem
// /metrics, and reading it on would only take memory.
constexpr std::size_t kMaxMetricsBytes = 16 * 1024 * 1024;

constexpr Outcome::Kind kKinds[] = {Outcome::Kind::kExecuted, Outcome::Kind::kDuplicate,
                                    Outcome::Kind::kInProgress, Outcome::Kind::kMismatch,
                                    Outcome::Kind::kUnavailable};

// What stats reads from the metrics text.
struct Stats {
  std::optional<double> duplicate_rate{};
  // Per layer, in the order the text lists them: decisions by outcome name.
  std::vector<std::pair<std::string, std::map<std::string, std::uint64_t>>> decisions{};
  std::vector<std::pair<std::string, std::uint64_t>> backend_errors{};
  std::optional<std::uint64_t> handler_failures{};  // absent from older services
  std::uint64_t total = 0;
};

// The value of label `name` in `labels` (`{a="x",b="y"}`); empty when absent. Only a whole
// label name counts: `sublayer="x"` is no `layer`.
std::string_view label(std::string_view labels, std::string_view name) {
  const std::string needle = std::string(name) + "=\"";
  for (std::size_t at = labels.find(needle); at != std::string_view::npos;
       at = labels.find(needle, at + 1)) {
    if (at > 0 && labels[at - 1] != '{' && labels[at - 1] != ',' && labels[at - 1] != ' ') {
      continue;
    }
    const std::size_t start = at + needle.size();
    return labels.substr(start, labels.find('"', start) - start);
  }
  return {};
}

// A sample value; throws CommandError(kNoMetrics) on anything else.
double value_of(std::string_view value) {
  double number{};
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (ec != std::errc() || end != value.data() + value.size()) {
    throw CommandError(kNoMetrics, "not a metric value: '" + std::string(value) + "'");
  }
  return number;
}

// A counter's value: a whole number, written as an integer or a float ("90.0", as the text
// format allows), below 2^53 so that a sum of counters stays exact.
std::uint64_t count_of(std::string_view value) {
  const double number = value_of(value);
  if (!(number >= 0 && number < 9007199254740992.0) || number != std::floor(number)) {
    throw CommandError(kNoMetrics, "not a counter value: '" + std::string(value) + "'");
  }
  return static_cast<std::uint64_t>(number);
}

// Reads idem's series from Prometheus text format 0.0.4 (`name{labels} value [timestamp]`).
Stats parse(std::string_view text) {
  Stats stats;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (line.ends_with('\r')) line.remove_suffix(1);  // served with CRLF line ends
    if (line.empty() || line.front() == '#') continue;
    const std::size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::size_t labels_end = line[name_end] == '{' ? line.find('}', name_end) : name_end;
    if (labels_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    const std::string_view labels = line.substr(name_end, labels_end - name_end);
    std::string_view value = line.substr(labels_end + (line[labels_end] == '}' ? 1 : 0));
    value.remove_prefix(std::min(value.find_first_not_of(' '), value.size()));
    value = value.substr(0, value.find(' '));
    if (name == "idem_duplicate_rate") {
      stats.duplicate_rate = value_of(value);
    } else if (name == "idem_decisions_total") {
      const std::string layer(label(labels, "layer"));
      auto it = std::find_if(stats.decisions.begin(), stats.decisions.end(),
                             [&](const auto& entry) { return entry.first == layer; });
      if (it == stats.decisions.end()) it = stats.decisions.insert(it, {layer, {}});
      const std::uint64_t count = count_of(value);
      it->second[std::string(label(labels, "outcome"))] += count;
      stats.total += count;
    } else if (name == "idem_handler_failures_total") {
      stats.handler_failures = count_of(value);
    } else if (name == "idem_backend_errors_total") {
      stats.backend_errors.emplace_back(label(labels, "layer"), count_of(value));
    }
  }
  return stats;
}

// GETs `url`; throws CommandError(kUnavailable) when it cannot, kNoMetrics on a non-200 answer.
std::string fetch(const std::string& url, std::chrono::milliseconds timeout) {
  const std::size_t scheme_end = url.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    throw CommandError(kUsage,
                       "--url " + redact_credentials(url) + ": not an http:// or https:// URL");
  }
  std::string rest = url.substr(scheme_end + 3);
  rest = rest.substr(0, rest.find('#'));  // a fragment is never sent
  const std::size_t path_start = rest.find_first_of("/?");
  std::string authority = rest.substr(0, path_start);
  // No path: /metrics, with the URL's query if it has one.
  std::string path = path_start == std::string::npos ? "" : rest.substr(path_start);
  if (!path.starts_with('/')) path.insert(0, "/metrics");
  std::string user;
  std::string password;
  if (const std::size_t at = authority.rfind('@'); at != std::string::npos) {
    const std::string userinfo = authority.substr(0, at);
    user = userinfo.substr(0, userinfo.find(':'));
    if (userinfo.find(':') != std::string::npos) password = userinfo.substr(userinfo.find(':') + 1);
    authority = authority.substr(at + 1);
  }
  if (authority.empty())
    throw CommandError(kUsage, "--url " + redact_credentials(url) + ": no host");
  httplib::Client client(scheme + "://" + authority);
  if (!client.is_valid())
    throw CommandError(kUsage, "--url " + redact_credentials(url) + ": not a valid URL");
  const auto seconds = std::chrono::floor<std::chrono::seconds>(timeout);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(timeout - seconds);
  client.set_connection_timeout(seconds.count(), micros.count());
  client.set_read_timeout(seconds.count(), micros.count());
  if (!user.empty()) client.set_basic_auth(user, password);
  // httplib bounds each read, not the request: a server that trickles its answer would hold
  // the command for ever. At `timeout`, a watchdog shuts the request's socket.
  std::mutex mutex;
  std::condition_variable answered;
  bool done = false;
  bool timed_out = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    if (!answered.wait_for(lock, timeout, [&] { return done; })) {
      timed_out = true;
      client.stop();
    }
  });
  std::string body;
  bool too_big = false;
  const httplib::Result result = client.Get(path, [&](const char* data, std::size_t size) {
    too_big = body.size() + size > kMaxMetricsBytes;
    if (!too_big) body.append(data, size);
    return !too_big;
  });
  {
    std::lock_guard lock(mutex);
    done = true;
  }
  answered.notify_one();
  watchdog.join();
  if (too_big) {
    throw CommandError(kNoMetrics, "GET " + redact_credentials(url) + ": the answer is over " +
                                       std::to_string(kMaxMetricsBytes) +
                                       " bytes: no idem /metrics");
  }
  if (timed_out) {
    throw CommandError(kUnavailable, "GET " + redact_credentials(url) +
                                         ": no whole answer within " +
                                         std::to_string(timeout.count()) + " ms");
  }
  if (!result) {
    // httplib names the failed step ("Connection", "Read"); say what it means.
    const httplib::Error error = result.error();
    const std::string why =
        error == httplib::Error::Connection ? "cannot connect (refused, unreachable or timed out)"
        : error == httplib::Error::Read     ? "no HTTP answer (timed out, or not an HTTP server)"
                                            : "request failed (" + httplib::to_string(error) + ")";
    throw CommandError(kUnavailable, "GET " + redact_credentials(url) + ": " + why);
  }
  if (result->status != 200) {
    throw CommandError(kNoMetrics, "GET " + redact_credentials(url) + ": HTTP status " +
                                       std::to_string(result->status));
  }
  return body;
}

// Share of decisions that were repeats at any layer (duplicate, in_progress, mismatch): what the
// "repeat rate" query of docs/operations.md plots. 0 without decisions.
double repeat_rate(const Stats& stats) {
  std::uint64_t repeats = 0;
  for (const auto& [layer, by_outcome] : stats.decisions) {
    for (const Outcome::Kind kind :
         {Outcome::Kind::kDuplicate, Outcome::Kind::kInProgress, Outcome::Kind::kMismatch}) {
      const auto count = by_outcome.find(std::string(to_string(kind)));
      if (count != by_outcome.end()) repeats += count->second;
    }
  }
  return stats.total == 0 ? 0.0 : static_cast<double>(repeats) / static_cast<double>(stats.total);
}

int run(const StatsFlags& flags) {
  const Stats stats = parse(fetch(flags.url, std::chrono::milliseconds(flags.timeout_ms)));
  if (stats.decisions.empty() || !stats.duplicate_rate) {
    throw CommandError(kNoMetrics, "GET " + redact_credentials(flags.url) +
                                       ": no idem metrics in the answer (idem_decisions_total, "
                                       "idem_duplicate_rate); is it idem's /metrics?");
  }
  if (flags.json) {
    nlohmann::ordered_json layers = nlohmann::ordered_json::object();
    for (const auto& [layer, by_outcome] : stats.decisions) {
      nlohmann::ordered_json counts = nlohmann::ordered_json::object();
      for (const Outcome::Kind kind : kKinds) {
        const std::string outcome(to_string(kind));
        counts[outcome] = by_outcome.contains(outcome) ? by_outcome.at(outcome) : 0;
      }
      layers[layer] = counts;
    }
    nlohmann::ordered_json errors = nlohmann::ordered_json::object();
    for (const auto& [layer, count] : stats.backend_errors) errors[layer] = count;
    nlohmann::ordered_json answer{{"url", redact_credentials(flags.url)},
                                  {"duplicate_rate", *stats.duplicate_rate},
                                  {"repeat_rate", repeat_rate(stats)},
                                  {"total_decisions", stats.total},
                                  {"decisions", layers},
                                  {"backend_errors", errors}};
    if (stats.handler_failures) answer["handler_failures"] = *stats.handler_failures;
    std::cout << answer.dump(2) << '\n';
    return kOk;
  }
  std::cout << redact_credentials(flags.url) << "\n"
            << "duplicate rate   " << std::fixed << std::setprecision(4) << *stats.duplicate_rate
            << "  (" << std::setprecision(2) << *stats.duplicate_rate * 100 << " % of "
            << stats.total << " decisions: (redis_guard + pg_sink rejects) / total)\n"
            << "repeat rate      " << std::setprecision(4) << repeat_rate(stats)
            << "  (duplicate, in_progress and mismatch at any layer / total)\n\n"
            << std::left << std::setw(14) << "layer";
  for (const Outcome::Kind kind : kKinds)
    std::cout << std::right << std::setw(13) << to_string(kind);
  std::cout << "\n";
  for (const auto& [layer, by_outcome] : stats.decisions) {
    std::cout << std::left << std::setw(14) << layer;
    for (const Outcome::Kind kind : kKinds) {
      const std::string outcome(to_string(kind));
      std::cout << std::right << std::setw(13)
                << (by_outcome.contains(outcome) ? by_outcome.at(outcome) : 0);
    }
    std::cout << "\n";
  }
  if (stats.handler_failures) {
    std::cout << "\nhandler failures " << *stats.handler_failures
              << "  (calls whose handler threw; not in the decisions above)\n";
  }
  if (!stats.backend_errors.empty()) {
    std::cout << "\nbackend errors  ";
    for (const auto& [layer, count] : stats.backend_errors)
      std::cout << " " << layer << "=" << count;
    std::cout << "\n";
  }
  return kOk;
}

}  // namespace

Command add_stats_command(CLI::App& app) {
  auto flags = std::make_shared<StatsFlags>();
  CLI::App* sub = app.add_subcommand(
      "stats",
      "Fetch a running service's Prometheus /metrics (idem's InProcessMetrics) and print the "
      "duplicate rate and the decision counts per layer and outcome");
  sub->add_option("--url", flags->url,
                  "The service's metrics URL, http[s]://[user:password@]host:port/metrics "
                  "(path /metrics when none is given)")
      ->envname("IDEM_METRICS_URL")
      ->required();
  sub->add_option("--timeout-ms", flags->timeout_ms,
                  "Bound on the whole request (connect, then the whole answer), in ms")
      ->check(CLI::Range(1, 3'600'000))
      ->capture_default_str();
  add_json_flag(*sub, flags->json);
  sub->footer(
      "Exit: 0 done, 2 bad arguments, 6 the URL cannot be reached, 7 it answered without idem "
      "metrics (or not with HTTP 200).");
  return {sub, [flags] { return run(*flags); }};
}

}  // namespace idem::ctl
