#include "workload.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

namespace storm {
namespace {

// Share of duplicates among all deliveries in the seed incident.
constexpr double kDuplicateShare = 0.117;

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

Workload make_workload(std::uint64_t seed, std::size_t logical_requests, std::int64_t accounts) {
  std::mt19937_64 rng(seed);
  // Per logical request, the chance of one duplicate such that duplicates make up
  // kDuplicateShare of all deliveries: d / (1 + d) = share.
  const double duplicate_chance = kDuplicateShare / (1.0 - kDuplicateShare);
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
    if (unit(rng) >= duplicate_chance) continue;

    Delivery duplicate = original;
    const double kind = unit(rng);
    ++workload.duplicates;
    if (kind < 0.35) {
      duplicate.source = Source::kDoubleClick;
      duplicate.request_id = request_id_for(rng);
      placed.emplace_back(position + 10 * (1 + rng() % 3) + 5, std::move(duplicate));
    } else if (kind < 0.65) {
      duplicate.source = Source::kRedelivery;
      placed.emplace_back(position + 10 * (20 + rng() % 180) + 5, std::move(duplicate));
    } else if (kind < 0.90) {
      duplicate.source = Source::kRacingRetry;
      placed.emplace_back(position + 1, std::move(duplicate));
    } else {
      duplicate.source = Source::kLateRedelivery;
      workload.late_deliveries.push_back(std::move(duplicate));
    }
  }
  std::stable_sort(placed.begin(), placed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  workload.deliveries.reserve(placed.size());
  for (auto& [position, delivery] : placed) workload.deliveries.push_back(std::move(delivery));
  return workload;
}

}  // namespace storm
