"""What the one-op benchmarks (dropout.py, gelu.py, layer_norm.py, conv_small_images.py,
add_activation.py) share: their arguments, the timing of a call, the rounds that check and time
the sides in turn, and a row's cells, median [min, max] of each side's
milliseconds per call, and the ratio."""
import argparse
import statistics
import time


def arguments(doc):
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def seconds_per_call(call, calls):
    """The mean seconds of `calls` calls of call()."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def alternating_times(calls_by_side, check, reps, calls):
    """{side: [seconds per call, one per round]} over `reps` rounds: each round runs check() (which
    asserts that the sides agree), then times `calls` calls of each side's call() in turn."""
    times = {side: [] for side in calls_by_side}
    for _ in range(reps):
        check()
        for side, call in calls_by_side.items():
            times[side].append(seconds_per_call(call, calls))
    return times


def cells(times, width):
    """`times`: {"torch": [seconds per call, ...], "ours": [...]} -> the row's two cells and the
    ratio of the medians (torch's over ours)."""
    row = []
    for side in ("torch", "ours"):
        ms = [t * 1e3 for t in times[side]]
        row.append(f"{statistics.median(ms):8.3f} [{min(ms):6.3f}, {max(ms):6.3f}]".rjust(width))
    ratio = statistics.median(times["torch"]) / statistics.median(times["ours"])
    return row[0], row[1], ratio
