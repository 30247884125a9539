#include "workload.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <utility>

namespace storm {
namespace {

constexpr const char* kReasons[] = {"商品未收到",
                                    "Doppelte Abbuchung",
                                    "Возврат по заявке",
                                    "late delivery \"express\"",
                                    "retour: colis abîmé 📦",
                                    "تم الإلغاء",
                                    "wrong size\tM→L",
                                    "Ελαττωματικό προϊόν"};
constexpr const char* kCurrencies[] = {"CNY", "EUR", "USD", "RUB", "GBP"};

std::string payload_for(std::mt19937_64& rng, const Delivery& d) {
  nlohmann::json items = nlohmann::json::array();
  const auto item_count = 1 + rng() % 4;
  for (std::uint64_t i = 0; i < item_count; ++i) {
    items.push_back({{"sku", "SKU-" + std::to_string(rng() % 100000)},
                     {"qty", 1 + rng() % 3},
                     {"unit_price", static_cast<double>(rng() % 100000) / 100.0}});
  }
  nlohmann::json payload = {
      {"order_id", d.order_id},
      {"user_id", d.user},
      {"amount",
       {{"value", static_cast<double>(d.amount_cents) / 100.0},
        {"currency", kCurrencies[rng() % std::size(kCurrencies)]}}},
      {"reason", kReasons[rng() % std::size(kReasons)]},
      {"items", std::move(items)},
      {"ledger_seq", 9007199254740993ULL + rng() % 1000000},
      {"meta", {{"channel", rng() % 2 ? "app" : "web"}, {"retry_ok", true}, {"note", nullptr}}}};
  return payload.dump();
}

std::string request_id_for(std::mt19937_64& rng) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "req-";
  for (int i = 0; i < 24; ++i) id.push_back(kHex[rng() % 16]);
  return id;
}

}  // namespace

Mix parse_mix(const std::string& text, double duplicate_share) {
  if (!(duplicate_share >= 0 && duplicate_share < 1)) {
    throw std::invalid_argument("--duplicates must be a share in [0, 1), e.g. 0.117");
  }
  Mix mix;
  mix.duplicate_share = duplicate_share;
  std::size_t from = 0;
  while (from < text.size()) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string item = text.substr(from, comma - from);
    from = comma + 1;
    const std::size_t equals = item.find('=');
    const std::string name = item.substr(0, equals);
    double weight = -1;
    try {
      std::size_t used = 0;
      if (equals != std::string::npos) weight = std::stod(item.substr(equals + 1), &used);
      if (used != item.size() - equals - 1) weight = -1;
    } catch (const std::exception&) {
      weight = -1;
    }
    if (!(weight >= 0) || !std::isfinite(weight)) {
      throw std::invalid_argument("--mix: '" + item + "' is not source=weight (weight >= 0)");
    }
    if (name == "double-click") {
      mix.double_click = weight;
    } else if (name == "redelivery") {
      mix.redelivery = weight;
    } else if (name == "racing-retry") {
      mix.racing_retry = weight;
    } else if (name == "late") {
      mix.late_redelivery = weight;
    } else {
      throw std::invalid_argument("--mix: unknown source '" + name +
                                  "' (double-click, redelivery, racing-retry, late)");
    }
  }
  if (mix.double_click + mix.redelivery + mix.racing_retry + mix.late_redelivery <= 0) {
    throw std::invalid_argument("--mix: the weights must not all be 0");
  }
  return mix;
}

Workload make_workload(std::uint64_t seed, std::size_t logical_requests, std::int64_t accounts,
                       const Mix& mix) {
  std::mt19937_64 rng(seed);
  // Duplicates per logical request such that they make up duplicate_share of all deliveries:
  // d / (1 + d) = share. The whole part always, the fraction by chance.
  const double per_request = mix.duplicate_share / (1.0 - mix.duplicate_share);
  const double whole = std::floor(per_request);
  const double fraction = per_request - whole;
  const double weights = mix.double_click + mix.redelivery + mix.racing_retry + mix.late_redelivery;
  const double click_below = mix.double_click / weights;
  const double redelivery_below = click_below + mix.redelivery / weights;
  const double racing_below = redelivery_below + mix.racing_retry / weights;
  std::uniform_real_distribution<double> unit(0.0, 1.0);

  // (position, delivery): originals at 10*i, duplicates placed relative to their original.
  std::vector<std::pair<std::uint64_t, Delivery>> placed;
  Workload workload;
  workload.logical_requests = logical_requests;
  for (std::uint32_t i = 0; i < logical_requests; ++i) {
    Delivery original;
    original.logical = i;
    original.request_id = request_id_for(rng);
    const auto account = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(accounts));
    original.account = account;
    original.user = "u-" + std::to_string(account);
    original.order_id = "order-" + std::to_string(i);
    original.amount_cents = 100 + static_cast<std::int64_t>(rng() % 50000);
    original.payload = payload_for(rng, original);
    const std::uint64_t position = 10ULL * i;
    placed.emplace_back(position, original);
    const auto count = static_cast<int>(whole) + (unit(rng) < fraction ? 1 : 0);
    for (int n = 0; n < count; ++n) {
      Delivery duplicate = original;
      const double kind = unit(rng);
      ++workload.duplicates;
      if (kind < click_below) {
        duplicate.source = Source::kDoubleClick;
        duplicate.request_id = request_id_for(rng);
        placed.emplace_back(position + 10 * (1 + rng() % 3) + 5, std::move(duplicate));
      } else if (kind < redelivery_below) {
        duplicate.source = Source::kRedelivery;
        placed.emplace_back(position + 10 * (20 + rng() % 180) + 5, std::move(duplicate));
      } else if (kind < racing_below) {
        duplicate.source = Source::kRacingRetry;
        placed.emplace_back(position + 1, std::move(duplicate));
      } else {
        duplicate.source = Source::kLateRedelivery;
        workload.late_deliveries.push_back(std::move(duplicate));
      }
    }
  }
  std::stable_sort(placed.begin(), placed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  workload.deliveries.reserve(placed.size());
  for (auto& [position, delivery] : placed) workload.deliveries.push_back(std::move(delivery));
  return workload;
}

}  // namespace storm
