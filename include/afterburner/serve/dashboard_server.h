// A live dashboard for something that is not a model server (a training run): GET /dashboard
// serves the training page (monitor/dashboard.h), GET /dashboard/data what `data` returns, on
// its own HTTP server and thread for the life of the object.
//
//   auto history = std::make_shared<afterburner::train::TrainingHistory>();
//   afterburner::serve::DashboardServer dashboard([history] { return history->to_json(); },
//                                                 afterburner::serve::HttpOptions().port(0));
//   std::cout << dashboard.url() << "\n";   // http://127.0.0.1:<port>/dashboard
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

#include "afterburner/serve/http_server.h"

namespace afterburner::serve {

class DashboardServer {
 public:
  // `data` is called on the server's thread for each fetch. Throws Error if it cannot listen.
  DashboardServer(std::function<nlohmann::json()> data, HttpOptions options, std::string title = "afterburner train");
  ~DashboardServer();  // stops serving
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  int port() const;
  std::string url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace afterburner::serve
