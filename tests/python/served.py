"""`afterburner serve` from Python tests: a real server on loopback over a model repository, and
Open Inference Protocol v2 requests to it, as JSON or with the binary tensor extension."""
import contextlib
import json
import os
import re
import struct
import subprocess
import urllib.request

import torch

BINARY = os.environ.get("AFTERBURNER_BINARY", "")


def classifier_config(max_batch_size):
    """A model's config.toml for tensors of Fashion-MNIST's shape in and 10 logits out."""
    return f"""max_batch_size = {max_batch_size}
[[input]]
name = "input"
datatype = "FP32"
dims = [1, 28, 28]
[[output]]
name = "output"
datatype = "FP32"
dims = [10]
"""


@contextlib.contextmanager
def running_server(repo, stderr_file=None):
    """Starts `afterburner serve --repo REPO` on a free port, yields the port, stops it (SIGTERM).
    The server's stderr goes to `stderr_file` (an open file) where given, for a test to read."""
    server = subprocess.Popen([BINARY, "serve", "--repo", str(repo), "--port", "0"], stdout=subprocess.PIPE,
                              stderr=stderr_file or subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stdout:
            match = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        exited = server.poll() is not None and server.stderr
        assert port, f"the server did not start: {server.stderr.read() if exited else ''}"
        yield port
    finally:
        server.terminate()
        server.wait(timeout=60)


def _post(port, model, body, headers):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer", body, headers)
    with urllib.request.urlopen(request, timeout=120) as reply:
        return reply.read(), reply.headers


def infer_json(port, model, x, input_name="input"):
    """The model's first output for `x` (float32), request and response as JSON."""
    body = json.dumps({"inputs": [{"name": input_name, "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.flatten().tolist()}]}).encode()
    content, _ = _post(port, model, body, {"Content-Type": "application/json"})
    output = json.loads(content)["outputs"][0]
    return torch.tensor(output["data"], dtype=torch.float32).view(output["shape"])


def infer_binary(port, model, x, input_name="input"):
    """The model's first output for `x` (float32), both tensors as raw little-endian bytes after
    the JSON header (the binary tensor extension)."""
    data = x.contiguous().numpy().astype("<f4").tobytes()
    header = json.dumps({"inputs": [{"name": input_name, "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(data)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    content, headers = _post(port, model, header + data, {"Content-Type": "application/octet-stream",
                                                          "Inference-Header-Content-Length": str(len(header))})
    json_length = int(headers["Inference-Header-Content-Length"])
    output = json.loads(content[:json_length])["outputs"][0]
    raw = content[json_length:json_length + output["parameters"]["binary_data_size"]]
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    return torch.tensor(values, dtype=torch.float32).view(output["shape"])
