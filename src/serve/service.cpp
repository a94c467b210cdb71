// What a Service answers for the routes it does not implement.
#include "afterburner/serve/service.h"

#include <fmt/format.h>

#include "afterburner/monitor/dashboard.h"
#include "afterburner/serve/protocol.h"

namespace afterburner::serve {

void Service::infer_images(ModelRef model, std::vector<std::string>, int64_t, ReplyCallback reply) {
  reply(error_reply(415, fmt::format("model '{}' takes no images", model.name)));
}

void Service::infer_tensors(ModelRef model, const TensorRequest&, TensorReplyCallback reply) {
  TensorReply refused;
  refused.status = 501;
  refused.error = fmt::format("model '{}': this server takes no tensor requests", model.name);
  reply(std::move(refused));
}

Reply Service::repository_index(std::string_view) const {
  return error_reply(501, "this server has no model repository");
}

void Service::load_model(std::string_view model, ReplyCallback reply) {
  reply(error_reply(501, fmt::format("model '{}': this server cannot load models", model)));
}

void Service::unload_model(std::string_view model, ReplyCallback reply) {
  reply(error_reply(501, fmt::format("model '{}': this server cannot unload models", model)));
}

Reply Service::dashboard() const {
  return Reply{200, "text/html; charset=utf-8",
               monitor::dashboard_page(monitor::DashboardPage().kind(monitor::DashboardKind::serving).title(
                   "afterburner serve")),
               {}};
}

Reply Service::dashboard_data() const { return error_reply(404, "this dashboard reads /metrics"); }

}  // namespace afterburner::serve
