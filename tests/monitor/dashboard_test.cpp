#include "afterburner/monitor/dashboard.h"


#include "afterburner/core/error.h"
#include "testing.h"

namespace afterburner::monitor {
namespace {

using afterburner::testing::Contains;
using afterburner::testing::dashboard_config;
using afterburner::testing::error_message;

TEST(Dashboard, ThePageCarriesUplotAndItsConfiguration) {
  const std::string page = dashboard_page(DashboardPage());
  EXPECT_TRUE(Contains(page, "/*! https://github.com/leeoniya/uPlot (v1.6.32) */"));
  EXPECT_TRUE(Contains(page, ".uplot"));  // its styles
  for (const char* marker : {"/*UPLOT_CSS*/", "/*UPLOT_JS*/", "/*CONFIG*/"}) EXPECT_FALSE(Contains(page, marker));
  EXPECT_EQ(dashboard_config(page), nlohmann::json::parse(R"({"kind":"training","title":"afterburner",
      "data_url":"/dashboard/data","refresh_ms":1000,"data":null})"));
  EXPECT_EQ(dashboard_config(dashboard_page(DashboardPage().kind(DashboardKind::serving)))["data_url"], "/metrics");
  const std::string fast = dashboard_page(DashboardPage().data_url("/x").refresh(std::chrono::milliseconds(250)));
  EXPECT_EQ(dashboard_config(fast)["refresh_ms"], 250);
  EXPECT_EQ(dashboard_config(fast)["data_url"], "/x");
  EXPECT_EQ(dashboard_page(DashboardPage()), page);  // twice the same page
}

// A report's data goes inside the page; a "</script>" in it (a model named so) cannot end the script.
TEST(Dashboard, DataInsideThePageCannotEndItsScript) {
  const nlohmann::json run{{"model", "</script><script>alert(1)</script>"}, {"steps", {{"loss", {1.5, 0.5}}}}};
  const std::string page = dashboard_page(DashboardPage().data(run).title("a </b> title"));
  EXPECT_FALSE(Contains(page, "</script><script>alert"));
  EXPECT_EQ(dashboard_config(page)["data"], run);
  EXPECT_EQ(dashboard_config(page)["title"], "a </b> title");
}

TEST(Dashboard, ListenAddressesAreHostAndPort) {
  EXPECT_EQ(parse_listen_address("8080", "--dashboard").host, "127.0.0.1");
  EXPECT_EQ(parse_listen_address("8080", "--dashboard").port, 8080);
  EXPECT_EQ(parse_listen_address("0", "--dashboard").port, 0);
  EXPECT_EQ(parse_listen_address("0.0.0.0:9000", "--dashboard").host, "0.0.0.0");
  EXPECT_EQ(parse_listen_address("[::1]:9000", "--dashboard").host, "::1");
  EXPECT_EQ(parse_listen_address("[::1]:9000", "--dashboard").port, 9000);
  for (const char* bad : {"", "http", "65536", "-1", "8080x", "host:", ":8080"}) {
    const std::string message = error_message<UsageError>([&] { parse_listen_address(bad, "--dashboard"); });
    EXPECT_TRUE(Contains(message, "--dashboard: '" + std::string(bad) + "'")) << message;
  }
}

}  // namespace
}  // namespace afterburner::monitor
