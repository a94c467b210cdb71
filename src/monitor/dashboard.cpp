#include "afterburner/monitor/dashboard.h"

#include <fmt/format.h>

#include <charconv>
#include <stdexcept>

#include "afterburner/core/error.h"

namespace afterburner::monitor {

// The page and uPlot, as the build embedded them (cmake/EmbedFiles.cmake).
namespace assets {
extern const char kDashboardHtml[];
extern const char kUplotJs[];
extern const char kUplotCss[];
}  // namespace assets

namespace {

// Replaces the one `marker` of the page with `text`.
void fill(std::string& page, std::string_view marker, std::string_view text) {
  const std::size_t at = page.find(marker);
  if (at == std::string::npos) throw std::logic_error(fmt::format("src/monitor/dashboard.html lacks {}", marker));
  page.replace(at, marker.size(), text);
}

// JSON written inside a <script>: "</" would end the script where a string holds "</script>",
// so it is written "<\/", which JavaScript reads as the same two characters.
std::string script_json(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  for (std::size_t at = text.find("</"); at != std::string::npos; at = text.find("</", at + 3)) {
    text.replace(at, 2, "<\\/");
  }
  return text;
}

}  // namespace

std::string dashboard_page(const DashboardPage& page) {
  const bool training = page.kind() == DashboardKind::training;
  std::string data_url = page.data_url();
  if (data_url.empty()) data_url = training ? "/dashboard/data" : "/metrics";
  const nlohmann::json config{{"kind", training ? "training" : "serving"},
                              {"title", page.title()},
                              {"data_url", data_url},
                              {"refresh_ms", page.refresh().count()},
                              {"data", page.data() ? *page.data() : nlohmann::json(nullptr)}};
  std::string html = assets::kDashboardHtml;
  fill(html, "/*UPLOT_CSS*/", assets::kUplotCss);
  fill(html, "/*UPLOT_JS*/", assets::kUplotJs);
  fill(html, "/*CONFIG*/", script_json(config));  // last: the data may hold the other markers
  return html;
}

ListenAddress parse_listen_address(std::string_view text, const std::string& flag) {
  ListenAddress address;
  std::string_view port = text;
  const std::size_t colon = text.rfind(':');
  if (colon != std::string_view::npos) {
    std::string_view host = text.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host.empty()) throw UsageError(flag, fmt::format("'{}' has no host before the port", text));
    address.host = std::string(host);
    port = text.substr(colon + 1);
  }
  auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), address.port);
  if (port.empty() || error != std::errc() || end != port.data() + port.size() || address.port < 0 ||
      address.port > 65535) {
    throw UsageError(flag, fmt::format("'{}' is not [HOST:]PORT with a port in 0-65535", text));
  }
  return address;
}

}  // namespace afterburner::monitor
