// afterburner serve: the Open Inference Protocol over HTTP for a model repository, until
// SIGTERM or SIGINT, which finish the requests in flight and exit 0.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/file_limit.h"
#include "afterburner/core/heap.h"
#include "afterburner/core/signals.h"
#include "afterburner/serve/grpc_server.h"
#include "afterburner/serve/http_server.h"
#include "afterburner/serve/model_service.h"
#include "commands.h"

namespace afterburner::tools {
namespace {

struct ServeArgs {
  std::string repo;
  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = -1;  // none
  std::string model_control = "none";
  double poll_seconds = 15;
  std::vector<std::string> load_models;
  int io_threads = 1;
  int intra_op_threads = 1;
  bool batching = true;
  bool keep_freed_memory = true;
  std::size_t max_body_bytes = 16u << 20;
  double read_timeout = 10;
  double idle_timeout = 60;
  std::size_t max_connections = 1024;
  std::size_t max_pending_body_bytes = 256u << 20;
};

// The write end of a pipe the signal handler writes to: the one thing a handler may safely do.
int stop_pipe_write = -1;

extern "C" void on_stop_signal(int) {
  const char byte = 1;
  [[maybe_unused]] ssize_t written = write(stop_pipe_write, &byte, 1);
}

// From construction on, SIGTERM and SIGINT only write to a pipe, so a signal that comes
// while the models load is kept for the server that does not exist yet.
class StopSignals {
 public:
  StopSignals() {
    if (pipe(pipe_) != 0) throw Error("cannot create the signal pipe");
    stop_pipe_write = pipe_[1];
    handle_signal(SIGTERM, on_stop_signal, SA_RESTART);
    handle_signal(SIGINT, on_stop_signal, SA_RESTART);
  }
  ~StopSignals() {
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    close(pipe_[0]);
    close(pipe_[1]);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  int read_end() const { return pipe_[0]; }

 private:
  int pipe_[2];
};

// Calls server.stop() from its own thread on the first signal (also one that came before), or
// when it goes away; declared after the server, it goes away first.
class StopServerOnSignal {
 public:
  StopServerOnSignal(const StopSignals& signals, serve::HttpServer& server)
      : watcher_([fd = signals.read_end(), &server] {
          char byte;
          while (read(fd, &byte, 1) < 0 && errno == EINTR) {
          }
          server.stop();
        }) {}
  ~StopServerOnSignal() {
    on_stop_signal(0);  // releases the watcher if no signal came
    watcher_.join();
  }
  StopServerOnSignal(const StopServerOnSignal&) = delete;
  StopServerOnSignal& operator=(const StopServerOnSignal&) = delete;

 private:
  std::thread watcher_;
};

std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// Each connection is a file descriptor; beyond the limit, connections wait unaccepted.
void warn_if_too_few_file_descriptors(std::size_t max_connections) {
  constexpr std::size_t kOtherFiles = 64;  // models, libraries, the listener
  const std::uint64_t wanted = max_connections + kOtherFiles;
  const std::uint64_t limit = raise_open_file_limit(wanted);
  if (limit < wanted) {
    std::cerr << "afterburner: warning: --max-connections " << max_connections << " needs " << wanted
              << " open files, the limit is " << limit << " (ulimit -n): connections beyond it wait to be accepted"
              << std::endl;
  }
}

int serve(const ServeArgs& args) {
  StopSignals stop_signals;  // before loading, so that a signal during it is not fatal
  // Each batch's activations would otherwise be fresh, zero-filled mappings (core/heap.h).
  if (args.keep_freed_memory) keep_freed_memory();
  std::cout << "afterburner: loading " << args.repo << std::endl;
  serve::ModelService models(args.repo,
                             serve::ModelServiceOptions()
                                 .intra_op_threads(args.intra_op_threads)
                                 .dynamic_batching(args.batching)
                                 .model_control(serve::parse_model_control(args.model_control))
                                 .poll_interval(milliseconds(args.poll_seconds))
                                 .load_models(args.load_models)
                                 .log([](const std::string& line) { std::cerr << "afterburner: " << line << std::endl; }));
  serve::HttpServer server(models, serve::HttpOptions()
                                       .host(args.host)
                                       .port(args.port)
                                       .io_threads(args.io_threads)
                                       .max_body_bytes(args.max_body_bytes)
                                       .read_timeout(milliseconds(args.read_timeout))
                                       .idle_timeout(milliseconds(args.idle_timeout))
                                       .max_connections(args.max_connections)
                                       .max_pending_body_bytes(args.max_pending_body_bytes));
  std::optional<serve::GrpcServer> grpc;
  if (args.grpc_port >= 0) grpc.emplace(models, serve::GrpcOptions().host(args.host).port(args.grpc_port));
  warn_if_too_few_file_descriptors(args.max_connections);
  StopServerOnSignal stop_on_signal(stop_signals, server);
  if (grpc) std::cout << "afterburner: gRPC on " << args.host << ":" << grpc->port() << std::endl;
  std::cout << "afterburner: serving " << args.repo << " on http://" << args.host << ":" << server.port() << std::endl;
  server.run();
  if (grpc) grpc->stop();  // its calls in flight answered, while the models are still there
  std::cout << "afterburner: stopped" << std::endl;
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto* sub = app.add_subcommand("serve", "serve a model repository over HTTP (Open Inference Protocol v2)");
  auto args = std::make_shared<ServeArgs>();
  sub->add_option("--repo", args->repo, "model repository: DIR/<model>/config.toml and model.pt (or <version>/model.pt)")->required();
  sub->add_option("--host", args->host, "address to listen on; anything but 127.0.0.1 exposes the server")
      ->capture_default_str();
  sub->add_option("--port", args->port, "port to listen on (0: any free one)")->capture_default_str();
  sub->add_option("--grpc-port", args->grpc_port,
                  "also serve KServe v2 gRPC on this port (0: any free one; default: HTTP only)");
  sub->add_option("--model-control", args->model_control,
                  "none: the repository's models load at start and stay; poll: models added, changed or removed "
                  "in the repository are loaded, reloaded or unloaded; explicit: POST "
                  "/v2/repository/models/NAME/load and /unload decide")
      ->capture_default_str();
  sub->add_option("--repository-poll-secs", args->poll_seconds, "seconds between reads of the repository (poll)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--load-model", args->load_models, "a model to load at start (explicit; repeatable)");
  sub->add_option("--io-threads", args->io_threads, "threads for the sockets")->capture_default_str();
  sub->add_option("--intra-op-threads", args->intra_op_threads, "LibTorch threads per forward")->capture_default_str();
  sub->add_flag("--batching,!--no-batching", args->batching,
                "dynamic batching, on by default (--no-batching: one request per forward)");
  sub->add_flag("--keep-freed-memory,!--no-keep-freed-memory", args->keep_freed_memory,
                "keep freed memory in the process for the next batch instead of returning it to the OS, on by default");
  sub->add_option("--max-body-bytes", args->max_body_bytes, "larger request bodies get 413")->capture_default_str();
  sub->add_option("--read-timeout", args->read_timeout, "seconds a client has to send a request")->capture_default_str();
  sub->add_option("--idle-timeout", args->idle_timeout, "seconds a keep-alive connection may stay idle")
      ->capture_default_str();
  sub->add_option("--max-connections", args->max_connections, "connections beyond get 503")->capture_default_str();
  sub->add_option("--max-pending-body-bytes", args->max_pending_body_bytes,
                  "request body bytes all connections may hold at once; requests beyond get 503")
      ->capture_default_str();
  return {sub, [args] { return serve(*args); }};
}

}  // namespace afterburner::tools
