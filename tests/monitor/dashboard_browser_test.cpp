// The dashboard in a real browser (Debian's chromium, headless): a training run's page fills as
// it trains, its --report opens later as the same page with the run inside, and a server's page
// plots its /metrics under load. The screenshots are kept in <build>/test-artifacts/.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tools/cli_helpers.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path artifacts_dir() {
  const fs::path dir = cli_binary().parent_path() / "test-artifacts";
  fs::create_directories(dir);
  return dir;
}

// Headless Chromium with a profile of its own (two at once would share the default one). Pages
// get `wait_ms` of their own time (timers run ahead; fetches take their real time) before the
// DOM is read or the screenshot taken.
class Browser {
 public:
  std::string dom(const std::string& url, int wait_ms) {
    const CommandResult result = run_browser({"--virtual-time-budget=" + std::to_string(wait_ms), "--dump-dom", url});
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return result.out;
  }

  void screenshot(const std::string& url, int wait_ms, const fs::path& png) {
    const CommandResult result = run_browser({"--virtual-time-budget=" + std::to_string(wait_ms),
                                              "--window-size=1280,1000", "--screenshot=" + png.string(), url});
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_TRUE(fs::is_regular_file(png)) << result.err;
  }

 private:
  CommandResult run_browser(const std::vector<std::string>& args) {
    std::vector<std::string> argv{"chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                  "--user-data-dir=" + profile_.path().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
  }

  TempDir profile_;
};

// What the page says of itself on <body>: data-state (loading, live, finished, report, error),
// data-updates (data fetched and drawn) and data-points (points in its charts).
struct PageState {
  std::string state;
  int updates = -1;
  int points = -1;
};

PageState state_of(const std::string& dom) {
  std::smatch body;
  if (!std::regex_search(dom, body, std::regex("<body([^>]*)>"))) return {};
  const std::string attributes = body[1].str();
  auto attribute = [&](const std::string& name) {
    std::smatch value;
    return std::regex_search(attributes, value, std::regex(name + "=\"([^\"]*)\"")) ? value[1].str() : "";
  };
  return {attribute("data-state"), std::stoi("0" + attribute("data-updates")), std::stoi("0" + attribute("data-points"))};
}

// Pixels of the PNG within 40 of the colour in every channel (PIL counts them): a chart's curve
// in the page's colours is hundreds of them, an empty card none.
int64_t pixels_like(const fs::path& png, int red, int green, int blue) {
  const std::string script =
      "import sys\n"
      "from PIL import Image\n"
      "r, g, b = (int(v) for v in sys.argv[2:5])\n"
      "print(sum(1 for p in Image.open(sys.argv[1]).convert('RGB').getdata()\n"
      "          if abs(p[0] - r) <= 40 and abs(p[1] - g) <= 40 and abs(p[2] - b) <= 40))\n";
  const CommandResult result = run({"/usr/bin/python3", "-c", script, png.string(), std::to_string(red),
                                    std::to_string(green), std::to_string(blue)});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  return result.exit_code == 0 ? std::stoll(result.out) : -1;
}

constexpr int kBlue[] = {0x25, 0x63, 0xeb};  // the first series of every chart
constexpr int kRed[] = {0xdc, 0x26, 0x26};   // the second

int64_t blue_pixels(const fs::path& png) { return pixels_like(png, kBlue[0], kBlue[1], kBlue[2]); }
int64_t red_pixels(const fs::path& png) { return pixels_like(png, kRed[0], kRed[1], kRed[2]); }

// The URL on the CLI's line that begins "afterburner: <what>".
std::string url_in(const std::string& log, const std::string& line_start) {
  const std::size_t line = log.find(line_start);
  const std::size_t url = line == std::string::npos ? line : log.find("http://", line);
  return url == std::string::npos ? "" : log.substr(url, log.find('\n', url) - url);
}

TEST(DashboardInABrowser, ATrainingRunFillsItsPageAndItsReportOpensLater) {
  TempDir dir;
  const fs::path report = dir / "run.html";
  CliProcess train(train_args(fashion_mnist_dir(), {{"--epochs", "5"},
                                                    {"--eval-every", "40"},
                                                    {"--dashboard", "0"},
                                                    {"--report", report.string()},
                                                    {"--export", (dir / "cnn.pt").string()}}),
                   dir / "train.log");
  const std::string url = url_in(train.wait_for("afterburner: dashboard on "), "afterburner: dashboard on ");
  ASSERT_TRUE(std::regex_match(url, std::regex("http://127\\.0\\.0\\.1:[0-9]+/dashboard"))) << url;

  Browser browser;
  PageState first;
  for (auto deadline = std::chrono::steady_clock::now() + 120s; std::chrono::steady_clock::now() < deadline;) {
    first = state_of(browser.dom(url, 1500));
    if (first.points > 0 && first.updates > 0) break;
  }
  ASSERT_GT(first.points, 0) << read_file(dir / "train.log");
  EXPECT_EQ(first.state, "live");
  std::this_thread::sleep_for(3s);
  const PageState later = state_of(browser.dom(url, 1500));
  EXPECT_GT(later.points, first.points) << "the page did not grow as the run trained";
  EXPECT_EQ(later.state, "live");
  const fs::path live_png = artifacts_dir() / "dashboard-training.png";
  browser.screenshot(url, 3000, live_png);
  EXPECT_GT(blue_pixels(live_png), 1000) << live_png;  // loss, accuracy, samples/s, data time, RSS
  EXPECT_GT(red_pixels(live_png), 300) << live_png;    // evaluation loss, forward time, tensor memory

  EXPECT_EQ(train.stop(SIGINT), 130);  // interrupted: the report and the model are kept
  const std::string report_url = "file://" + report.string();
  const PageState opened = state_of(browser.dom(report_url, 500));
  EXPECT_EQ(opened.state, "report");
  EXPECT_GE(opened.points, later.points);
  EXPECT_TRUE(Contains(read_file(report), R"("stop_reason":"interrupted")"));
  const fs::path report_png = artifacts_dir() / "dashboard-report.png";
  browser.screenshot(report_url, 500, report_png);
  EXPECT_GT(blue_pixels(report_png), 1000) << report_png;
  EXPECT_TRUE(fs::is_regular_file(dir / "cnn.pt"));
}

// A bad address is one line naming the flag (exit 2); a port taken is one line naming it (exit 1),
// before any data loads.
TEST(DashboardCommand, BadOrTakenAddressesAreOneLine) {
  for (const char* bad : {"abc", "65536", "host:"}) {
    EXPECT_TRUE(fails_with(run_cli(train_args(fashion_mnist_dir(), {{"--dashboard", bad}})), 2,
                           {"--dashboard: '" + std::string(bad) + "'"}));
  }
  TempDir dir;
  CliProcess serve_dashboard(train_args(fashion_mnist_dir(), {{"--epochs", "5"}, {"--dashboard", "0"}}),
                             dir / "first.log");
  const std::string taken = url_in(serve_dashboard.wait_for("afterburner: dashboard on "), "afterburner: dashboard on ");
  const std::string port = taken.substr(taken.rfind(':') + 1, taken.rfind('/') - taken.rfind(':') - 1);
  EXPECT_TRUE(fails_with(run_cli(train_args(fashion_mnist_dir(), {{"--dashboard", port}})), 1,
                         {"127.0.0.1:" + port, "cannot listen"}));
}

TEST(DashboardInABrowser, AServerPlotsItsMetricsUnderLoad) {
  TempDir dir;
  const fs::path model_dir = dir / "models" / "cnn" / "1";
  fs::create_directories(model_dir);
  const CommandResult trained =
      run_cli(train_args(fashion_mnist_dir(), {{"--max-steps", "20"}, {"--export", (model_dir / "model.pt").string()}}));
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  write_file(dir / "models" / "cnn" / "config.toml", R"(max_batch_size = 16
max_queue_delay_us = 2000
[[input]]
name = "input"
datatype = "FP32"
dims = [1, 28, 28]
[[output]]
name = "output"
datatype = "FP32"
dims = [10]
)");
  CliProcess serve({"serve", "--repo", (dir / "models").string(), "--port", "0"}, dir / "serve.log");
  const std::string server = url_in(serve.wait_for("afterburner: serving "), "afterburner: serving ");
  ASSERT_FALSE(server.empty());
  std::thread load([&] {
    const CommandResult result =
        run_cli({"loadgen", "--url", server, "--model", "cnn", "--concurrency", "8", "--duration", "10"});
    EXPECT_EQ(result.exit_code, 0) << result.err;
  });
  std::this_thread::sleep_for(1s);
  Browser browser;
  const PageState page = state_of(browser.dom(server + "/dashboard", 5000));
  EXPECT_EQ(page.state, "live");
  EXPECT_GE(page.updates, 3);
  EXPECT_GT(page.points, 0);
  const fs::path png = artifacts_dir() / "dashboard-serving.png";
  browser.screenshot(server + "/dashboard", 5000, png);
  EXPECT_GT(blue_pixels(png), 1000) << png;  // answered/s, p50, pending, the batch-size bars
  load.join();
  EXPECT_EQ(serve.stop(), 0);
}

}  // namespace
}  // namespace afterburner::testing
