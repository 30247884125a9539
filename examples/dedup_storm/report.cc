#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace storm {
namespace {

// The seed's production figures, by the layers a configuration runs.
constexpr std::pair<const char*, double> kSeedRates[] = {
    {"none", 11.7}, {"request-id", 3.1}, {"redis", 0.42}, {"all", 0.08}};

// The layers that stop duplicates, in the order the chart stacks them, with their colours.
constexpr std::pair<const char*, const char*> kLayerColours[] = {{"request_id", "#8fb3d9"},
                                                                 {"redis_guard", "#d9534f"},
                                                                 {"fingerprint", "#f0ad4e"},
                                                                 {"pg_sink", "#336699"}};
constexpr const char* kThroughColour = "#222222";
constexpr const char* kRunColour = "#2a7ab0";
constexpr const char* kSeedColour = "#b0b0b0";

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

// A percentage with the digits a small one needs, trailing zeros dropped: 11.7, 3.1, 0.42, 0.
std::string percent(double value) {
  std::string text = fixed(value, value >= 10 ? 1 : 2);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text;
}

std::string seed_text(const std::string& config) {
  const auto seed = seed_duplicate_rate_percent(config);
  return seed ? percent(*seed) : "-";
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The smallest of 1, 2, 5 × 10^n at or above `value` (> 0): a chart's axis maximum.
double nice_ceiling(double value) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(value)));
  for (const double step : {1.0, 2.0, 5.0, 10.0}) {
    if (step * magnitude >= value) return step * magnitude;
  }
  return 10 * magnitude;
}

// Grouped bars: per configuration, this run's duplicate rate and the seed's production figure.
std::string rate_chart(const Results& results) {
  constexpr double kLeft = 60, kTop = 30, kHeight = 260, kGroup = 150, kBar = 50;
  double top = 1;
  for (const auto& [config, r] : results) {
    top = std::max(
        {top, r.duplicate_rate_percent(), seed_duplicate_rate_percent(config).value_or(0)});
  }
  top = nice_ceiling(top);
  const double width = kLeft + kGroup * static_cast<double>(results.size()) + 20;
  const auto y = [&](double value) { return kTop + kHeight - value / top * kHeight; };
  std::ostringstream svg;
  svg << "<svg role=\"img\" aria-label=\"duplicate rate per configuration\" width=\"" << width
      << "\" height=\"" << kTop + kHeight + 60 << "\" viewBox=\"0 0 " << width << ' '
      << kTop + kHeight + 60 << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  for (int tick = 0; tick <= 5; ++tick) {
    const double value = top * tick / 5;
    svg << "<line x1=\"" << kLeft << "\" x2=\"" << width - 10 << "\" y1=\"" << y(value)
        << "\" y2=\"" << y(value) << "\" stroke=\"#e5e5e5\"/>"
        << "<text x=\"" << kLeft - 6 << "\" y=\"" << y(value) + 4 << "\" text-anchor=\"end\">"
        << percent(value) << " %</text>\n";
  }
  double x = kLeft + 20;
  for (const auto& [config, r] : results) {
    const std::optional<double> seed = seed_duplicate_rate_percent(config);
    const std::pair<double, const char*> bars[] = {{r.duplicate_rate_percent(), kRunColour},
                                                   {seed.value_or(0), kSeedColour}};
    for (std::size_t b = 0; b < 2; ++b) {
      if (b == 1 && !seed) continue;
      const double bx = x + static_cast<double>(b) * (kBar + 6);
      const double by = y(bars[b].first);
      svg << "<rect x=\"" << bx << "\" y=\"" << by << "\" width=\"" << kBar << "\" height=\""
          << std::max(kTop + kHeight - by, 1.0) << "\" fill=\"" << bars[b].second << "\"><title>"
          << html_escape(config) << (b == 0 ? ", this run: " : ", seed: ") << percent(bars[b].first)
          << " %</title></rect>"
          << "<text x=\"" << bx + kBar / 2 << "\" y=\"" << by - 5 << "\" text-anchor=\"middle\">"
          << percent(bars[b].first) << " %</text>\n";
    }
    svg << "<text x=\"" << x + kBar + 3 << "\" y=\"" << kTop + kHeight + 20
        << "\" text-anchor=\"middle\" font-weight=\"bold\">" << html_escape(config) << "</text>\n";
    x += kGroup;
  }
  const double legend = kTop + kHeight + 45;
  svg << "<rect x=\"" << kLeft << "\" y=\"" << legend - 10
      << "\" width=\"12\" height=\"12\" fill=\"" << kRunColour << "\"/><text x=\"" << kLeft + 18
      << "\" y=\"" << legend << "\">this run: duplicate effects / deliveries</text>"
      << "<rect x=\"" << kLeft + 300 << "\" y=\"" << legend - 10
      << "\" width=\"12\" height=\"12\" fill=\"" << kSeedColour << "\"/><text x=\"" << kLeft + 318
      << "\" y=\"" << legend << "\">the seed's production, same layers</text>\n"
      << "</svg>\n";
  return svg.str();
}

// One stacked bar per configuration: its injected duplicates, by the layer that stopped them,
// and those that got through (booked twice).
std::string stopped_chart(const Results& results) {
  constexpr double kLeft = 100, kTop = 10, kBarHeight = 28, kGap = 14, kWidth = 600;
  std::size_t most = 1;
  for (const auto& [config, r] : results) most = std::max(most, r.duplicates_injected);
  const double height = kTop + (kBarHeight + kGap) * static_cast<double>(results.size()) + 40;
  std::ostringstream svg;
  svg << "<svg role=\"img\" aria-label=\"what stopped the duplicates\" width=\""
      << kLeft + kWidth + 20 << "\" height=\"" << height << "\" viewBox=\"0 0 "
      << kLeft + kWidth + 20 << ' ' << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  double y = kTop;
  for (const auto& [config, r] : results) {
    svg << "<text x=\"" << kLeft - 8 << "\" y=\"" << y + kBarHeight / 2 + 4
        << "\" text-anchor=\"end\" font-weight=\"bold\">" << html_escape(config) << "</text>\n";
    double x = kLeft;
    const auto segment = [&](const std::string& name, double count, const char* colour) {
      if (count <= 0) return;
      const double w = count / static_cast<double>(most) * kWidth;
      svg << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\""
          << kBarHeight << "\" fill=\"" << colour << "\"><title>" << html_escape(config) << ": "
          << html_escape(name) << " " << count << "</title></rect>\n";
      x += w;
    };
    for (const auto& [layer, colour] : kLayerColours) {
      const auto stopped = r.stopped_by_layer.find(layer);
      segment("stopped by " + std::string(layer),
              stopped == r.stopped_by_layer.end() ? 0 : static_cast<double>(stopped->second),
              colour);
    }
    segment("got through", static_cast<double>(r.duplicate_effects), kThroughColour);
    y += kBarHeight + kGap;
  }
  double x = kLeft;
  const auto legend = [&](const std::string& name, const char* colour) {
    svg << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"12\" height=\"12\" fill=\"" << colour
        << "\"/><text x=\"" << x + 16 << "\" y=\"" << y + 10 << "\">" << html_escape(name)
        << "</text>";
    x += 125;
  };
  for (const auto& [layer, colour] : kLayerColours) legend(layer, colour);
  legend("got through", kThroughColour);
  svg << "\n</svg>\n";
  return svg.str();
}

}  // namespace

double ConfigResult::duplicate_rate_percent() const {
  return deliveries == 0
             ? 0.0
             : 100.0 * static_cast<double>(duplicate_effects) / static_cast<double>(deliveries);
}

std::optional<double> seed_duplicate_rate_percent(const std::string& config) {
  for (const auto& [name, rate] : kSeedRates) {
    if (config == name) return rate;
  }
  return std::nullopt;
}

std::string format_table(const Results& results) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-11s %10s %10s %11s %10s %7s %6s  %-44s %12s %9s %9s\n",
                "config", "deliveries", "dups_in", "dup_effects", "dup_rate_%", "seed_%", "lost",
                "stopped by layer", "deliveries/s", "p50_us", "p99_us");
  out += line;
  for (const auto& [config, r] : results) {
    std::string stopped;
    for (const auto& [layer, n] : r.stopped_by_layer) {
      stopped += (stopped.empty() ? "" : " ") + layer + "=" + std::to_string(n);
    }
    std::snprintf(
        line, sizeof line, "%-11s %10zu %10zu %11lld %10s %7s %6lld  %-44s %12.0f %9.0f %9.0f\n",
        config.c_str(), r.deliveries, r.duplicates_injected,
        static_cast<long long>(r.duplicate_effects), percent(r.duplicate_rate_percent()).c_str(),
        seed_text(config).c_str(), static_cast<long long>(r.lost_requests),
        stopped.empty() ? "-" : stopped.c_str(), r.deliveries_per_s, r.p50_us, r.p99_us);
    out += line;
  }
  return out;
}

void write_json_report(const std::string& path, const Results& results,
                       const std::string& topology) {
  nlohmann::json configs = nlohmann::json::object();
  for (const auto& [name, r] : results) {
    nlohmann::json config = {{"deliveries", r.deliveries},
                             {"duplicates_injected", r.duplicates_injected},
                             {"duplicate_effects", r.duplicate_effects},
                             {"late_duplicate_effects", r.late_duplicate_effects},
                             {"duplicate_rate_percent", r.duplicate_rate_percent()},
                             {"in_doubt_duplicate_effects", r.in_doubt_duplicate_effects},
                             {"lost_requests", r.lost_requests},
                             {"redeliveries", r.redeliveries},
                             {"stopped_by_layer", r.stopped_by_layer},
                             {"outcomes", r.outcomes},
                             {"deliveries_per_s", r.deliveries_per_s},
                             {"p50_us", r.p50_us},
                             {"p99_us", r.p99_us},
                             {"chaos", to_json(r.chaos)},
                             {"unavailable_ms", max_unavailable_ms(r.chaos)}};
    if (const auto seed = seed_duplicate_rate_percent(name)) {
      config["seed_duplicate_rate_percent"] = *seed;
    }
    configs[name] = std::move(config);
  }
  std::ofstream out(path);
  out << nlohmann::json{{"topology", topology}, {"configs", configs}}.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path);
}

void write_html_report(const std::string& path, const Results& results, const std::string& run) {
  std::ofstream out(path);
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      << "<title>idem-storm: the duplicate-storm demo</title>\n"
      << "<style>body{font-family:sans-serif;margin:2em;max-width:70em;color:#222}"
      << "pre{background:#f6f6f6;padding:1em;overflow-x:auto}h2{margin-top:1.5em}</style>\n"
      << "</head>\n<body>\n<h1>idem-storm: the duplicate-storm demo</h1>\n<p>" << html_escape(run)
      << "</p>\n"
      << "<h2>Duplicate rate: duplicate effects / deliveries</h2>\n"
      << "<p>Refunds booked more than once (counted from the Postgres ledger) per delivery, for "
         "each configuration of idem's layers, beside the seed's production figure with the "
         "same layers.</p>\n"
      << rate_chart(results) << "<h2>What stopped the injected duplicates</h2>\n"
      << "<p>Each bar is one configuration's injected duplicates: the layer that answered each "
         "one, and those that got through.</p>\n"
      << stopped_chart(results) << "<h2>The table</h2>\n<pre>" << html_escape(format_table(results))
      << "</pre>\n</body>\n</html>\n";
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace storm
