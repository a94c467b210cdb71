// Signal handlers that stay safe while oneDNN computes on the interrupted thread.
//
//   extern "C" void on_interrupt(int);                        // sets an atomic flag
//   struct sigaction previous = afterburner::handle_signal(SIGINT, on_interrupt);
//   ...
//   sigaction(SIGINT, &previous, nullptr);                    // the previous handler back
//
// oneDNN's f32 GEMM kernels before 3.11 (jit_avx512_common_gemm_f32 and jit_avx_gemm_f32, behind
// dnnl_sgemm and the gemm:jit primitives; Debian packages 2.6) point rsp into a heap buffer while
// they run (uxlfoundation/oneDNN#4845). A handler run on that thread's own stack pushes its frame,
// vector registers and all, into the heap below the buffer, and the process crashes later in
// malloc or free: Ctrl-C during `afterburner train` did so in 5 of 49 runs here. A handler
// installed here runs on the alternate signal stack (SA_ONSTACK) of the thread that installed it,
// and Linux hands a signal sent to the process to its main thread first. The thread that loads
// the library (the main thread of the CLI, the importing thread in Python, whose own handlers
// ask for SA_ONSTACK) gets an alternate stack at load time.
#pragma once

#include <csignal>

namespace afterburner {

// Gives the calling thread an alternate signal stack for as long as it lives, unless it has
// one already (a runtime's, Python's faulthandler's), which it keeps.
void ensure_alternate_signal_stack();

// Installs `handler` for `signal` to run on the calling thread's alternate signal stack, with
// `flags` (SA_RESTART, ...) added, and returns the action it replaced. Throws Error naming the
// signal where sigaction refuses it.
struct sigaction handle_signal(int signal, void (*handler)(int), int flags = 0);

}  // namespace afterburner
