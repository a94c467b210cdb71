// The dashboard: one self-contained HTML page (uPlot and its styles inside; it fetches nothing
// but its data) that plots a training run or a server as it runs, or a finished run from data
// written into the page.
//
//   // live: fetches the TrainingHistory JSON from /dashboard/data every second
//   std::string live = afterburner::monitor::dashboard_page(afterburner::monitor::DashboardPage());
//   // a server: fetches its Prometheus text from /metrics
//   std::string served = afterburner::monitor::dashboard_page(
//       afterburner::monitor::DashboardPage().kind(afterburner::monitor::DashboardKind::serving));
//   // a report: the data inside, opened from disk later
//   std::string report = afterburner::monitor::dashboard_page(afterburner::monitor::DashboardPage().data(json));
#pragma once

#include <nlohmann/json.hpp>
#include <torch/arg.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace afterburner::monitor {

// training: loss, test accuracy against training time, samples/s, the step-time breakdown and
// memory, from a TrainingHistory's JSON (train/history.h). serving: requests/s, 503s, latency
// percentiles, the batch-size histogram and pending requests, from a server's /metrics.
enum class DashboardKind { training, serving };

struct DashboardPage {
  TORCH_ARG(DashboardKind, kind) = DashboardKind::training;
  TORCH_ARG(std::string, title) = "afterburner";
  // Fetched every `refresh`; empty: /dashboard/data for training, /metrics for serving.
  TORCH_ARG(std::string, data_url) = "";
  TORCH_ARG(std::chrono::milliseconds, refresh) = std::chrono::seconds(1);
  // A finished run's data, written into the page: then it fetches nothing.
  TORCH_ARG(std::optional<nlohmann::json>, data) = std::nullopt;
};

std::string dashboard_page(const DashboardPage& page);

// Where to listen, from "[HOST:]PORT" (HOST 127.0.0.1 when left out: loopback unless told).
struct ListenAddress {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
};

// Throws UsageError naming `flag` for a port that is no number in 0-65535 or an empty host.
ListenAddress parse_listen_address(std::string_view text, const std::string& flag);

}  // namespace afterburner::monitor
