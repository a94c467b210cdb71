"""A Python torch.distributed rank for afterburner's interoperability tests.

Joins a Gloo group through init_process_group over tcp:// (Debian's python3-torch), all-reduces
arange(4) + 10 * rank, receives a broadcast of 3 floats from rank 0 (rank 0 sends 7, 8, 9), and
prints both results as one JSON line.

    /usr/bin/python3 tests/dist/python_peer.py --port 29500 --rank 1 --world-size 2
"""
import argparse
import datetime
import json

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world_size, timeout=datetime.timedelta(seconds=30))
    summed = torch.arange(4, dtype=torch.float32) + 10 * args.rank
    dist.all_reduce(summed)
    received = torch.tensor([7.0, 8.0, 9.0]) if args.rank == 0 else torch.zeros(3)
    dist.broadcast(received, src=0)
    print(json.dumps({"allreduce": summed.tolist(), "broadcast": received.tolist()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
