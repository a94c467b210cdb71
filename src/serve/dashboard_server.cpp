#include "afterburner/serve/dashboard_server.h"

#include <thread>

#include "afterburner/monitor/dashboard.h"
#include "afterburner/serve/protocol.h"
#include "afterburner/serve/service.h"

namespace afterburner::serve {
// Named rather than anonymous: DashboardServer::Impl, which has linkage, holds a DashboardService.
namespace dashboard_detail {

// A Service of no models: live and ready, its dashboard the training page over `data`.
class DashboardService : public Service {
 public:
  DashboardService(std::function<nlohmann::json()> data, std::string title)
      : data_(std::move(data)), title_(std::move(title)) {}

  bool live() const override { return true; }
  bool ready() const override { return true; }
  Reply server_metadata() const override { return Reply{200, "application/json", R"({"name":"afterburner"})", {}}; }
  Reply model_metadata(ModelRef model) const override { return no_model(model); }
  Reply model_ready(ModelRef model) const override { return no_model(model); }
  void infer(ModelRef model, std::string, std::optional<std::size_t>, ReplyCallback reply) override {
    reply(no_model(model));
  }
  std::string metrics() const override { return ""; }

  Reply dashboard() const override {
    return Reply{200, "text/html; charset=utf-8", monitor::dashboard_page(monitor::DashboardPage().title(title_)), {}};
  }
  Reply dashboard_data() const override {
    return Reply{200, "application/json",
                 data_().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), {}};
  }

 private:
  static Reply no_model(ModelRef model) {
    return error_reply(404, "unknown model '" + std::string(model.name) + "': this server shows a dashboard");
  }

  std::function<nlohmann::json()> data_;
  std::string title_;
};

}  // namespace dashboard_detail

struct DashboardServer::Impl {
  Impl(std::function<nlohmann::json()> data, const HttpOptions& options, std::string title)
      : host(options.host()),
        service(std::move(data), std::move(title)),
        server(service, options),
        thread([this] { server.run(); }) {}
  ~Impl() {
    server.stop();
    thread.join();
  }

  std::string host;
  dashboard_detail::DashboardService service;
  HttpServer server;
  std::thread thread;
};

DashboardServer::DashboardServer(std::function<nlohmann::json()> data, HttpOptions options, std::string title)
    : impl_(std::make_unique<Impl>(std::move(data), options, std::move(title))) {}

DashboardServer::~DashboardServer() = default;

int DashboardServer::port() const { return impl_->server.port(); }

std::string DashboardServer::url() const {
  const std::string& host = impl_->host;
  const bool ipv6 = host.find(':') != std::string::npos;
  return "http://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port()) + "/dashboard";
}

}  // namespace afterburner::serve
