#include "afterburner/serve/dashboard_server.h"

#include <atomic>

#include "afterburner/models/zoo.h"
#include "afterburner/serve/model_service.h"
#include "cnn_repository.h"
#include "http_client.h"
#include "running_server.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Contains;
using afterburner::testing::dashboard_config;

TEST(DashboardServer, ServesThePageAndFetchesTheDataEachTime) {
  std::atomic<int> fetches{0};
  DashboardServer dashboard([&] { return nlohmann::json{{"fetch", ++fetches}}; }, HttpOptions().port(0), "run 7");
  EXPECT_EQ(dashboard.url(), "http://127.0.0.1:" + std::to_string(dashboard.port()) + "/dashboard");
  testing::HttpClient client(dashboard.port());
  const testing::HttpReply page = client.get("/dashboard");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.headers.at("content-type"), "text/html; charset=utf-8");
  EXPECT_EQ(dashboard_config(page.body)["kind"], "training");
  EXPECT_EQ(dashboard_config(page.body)["title"], "run 7");
  for (int fetch = 1; fetch <= 2; ++fetch) {
    const testing::HttpReply data = client.get("/dashboard/data");
    EXPECT_EQ(data.status, 200);
    EXPECT_EQ(nlohmann::json::parse(data.body), nlohmann::json({{"fetch", fetch}}));
  }
  const testing::HttpReply model = client.get("/v2/models/cnn");
  EXPECT_EQ(model.status, 404);
  EXPECT_TRUE(Contains(model.body, "this server shows a dashboard"));
  EXPECT_EQ(client.get("/v2/health/ready").status, 200);
}

// A model server's dashboard plots its /metrics; it has no /dashboard/data.
TEST(DashboardServer, AModelServerShowsTheServingDashboard) {
  afterburner::testing::TempDir repository;
  testing::write_cnn_model(repository.path(), models::make_model("cnn"), testing::cnn_config(8, "[8]"));
  ModelService service(repository.path().string());
  testing::RunningServer running(service);
  testing::HttpClient client(running.port());
  const testing::HttpReply page = client.get("/dashboard");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(dashboard_config(page.body)["kind"], "serving");
  EXPECT_EQ(dashboard_config(page.body)["data_url"], "/metrics");
  EXPECT_EQ(client.get("/dashboard/data").status, 404);
  EXPECT_EQ(client.post("/dashboard", "").status, 405);
}

}  // namespace
}  // namespace afterburner::serve
