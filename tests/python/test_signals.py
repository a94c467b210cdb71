"""Python's signal handlers while afterburner's ops run oneDNN's GEMM (include/afterburner/core/signals.h).

oneDNN's f32 GEMM kernels point rsp into the heap while they run; CPython installs its handlers with
SA_ONSTACK, and importing afterburner gives the importing thread an alternate signal stack, so a
signal that lands inside the GEMM runs its handler there and the heap stays intact. Each case runs
in a fresh interpreter: pytest's faulthandler gives its own thread an alternate stack, which would
hide a missing one.
"""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import ctypes, signal, sys, threading, time
    import torch

    class Stack(ctypes.Structure):
        _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]

    SS_DISABLE = 2
    libc = ctypes.CDLL(None)

    def alternate_stack():
        current = Stack()
        assert libc.sigaltstack(None, ctypes.byref(current)) == 0
        return None if current.flags & SS_DISABLE else current.size

    before = alternate_stack()
    import afterburner  # noqa: F401,E402
    print("before import:", before, "after import:", alternate_stack())

    handled = 0

    def count(signum, frame):
        global handled
        handled += 1

    signal.signal(signal.SIGUSR1, count)
    main = threading.main_thread().ident
    done = threading.Event()

    def signal_main():
        while not done.is_set():
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.0002)

    torch.manual_seed(0)
    x = torch.randn(192, 768, requires_grad=True)
    weight, bias, grad = torch.randn(320, 768), torch.randn(320), torch.randn(192, 320)
    x64 = x.detach().double().requires_grad_()
    y64 = torch.relu(x64 @ weight.double().T + bias.double())
    (expected,) = torch.autograd.grad(y64, x64, grad.double())
    signaller = threading.Thread(target=signal_main)
    signaller.start()
    # The input's gradient: oneDNN's GEMM of grad and weight, as they are.
    gradients = [torch.autograd.grad(torch.ops.afterburner.linear_relu(x, weight, bias), x, grad)[0] for _ in range(300)]
    done.set()
    signaller.join()
    intact = all(torch.allclose(g.double(), expected, rtol=1e-5, atol=1e-3) for g in gradients)
    print("handled:", handled, "intact:", intact)
    sys.exit(0 if intact and handled > 0 else 1)
    """
)


def test_importing_afterburner_gives_the_thread_an_alternate_signal_stack_and_handlers_leave_the_heap_intact():
    # With the alternate stack disabled after the import, this run aborted in glibc's free
    # ("corrupted size vs. prev_size") on oneDNN 2.6.
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("before import: None after import: "), first
    assert int(first.rsplit(" ", 1)[1]) >= 64 * 1024, first
