"""Images in, class names out: a `cnn` trained on Fashion-MNIST and exported by `afterburner train
--export` (its class-free IDX labels named by a classes file), served with an image input; JPEG and
PNG files of Fashion-MNIST items POSTed as the body or as multipart parts answer the class Python's
own pipeline (PIL's decoder, torchvision's Resize + CenterCrop, the exported normalisation, the
same model file) predicts, with the same logits; and torchvision's MobileNetV3-Small scripted in
Python (no metadata: the config's normalisation and class names, the default Resize + CenterCrop)
answers colour photographs as torchvision's own preprocessing and the same file do."""
import gzip
import io
import json
import struct
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import numpy
import torch
import torchvision
import torchvision.transforms.functional as TF
from PIL import Image

from served import BINARY, classifier_config, running_server

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
COLOURS = ["red", "green", "blue", "cyan", "magenta"]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

pytestmark = pytest.mark.skipif(not BINARY, reason="AFTERBURNER_BINARY is set by ctest")


def idx_array(name):
    path = FASHION_MNIST / name
    raw = path.read_bytes() if path.exists() else gzip.open(f"{path}.gz").read()
    dims = struct.unpack(f">{raw[3]}I", raw[4:4 + 4 * raw[3]])
    return torch.frombuffer(bytearray(raw[4 + 4 * raw[3]:]), dtype=torch.uint8).view(dims)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(port, model file, repository) of a trained cnn served with an image input."""
    root = tmp_path_factory.mktemp("images")
    model = root / "cnn.pt"
    run = subprocess.run([BINARY, "train", "--model", "cnn", "--epochs", "1", "--max-steps", "150", "--threads", "2",
                          "--export", str(model)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    repo = root / "repo"
    for name, config in (("fashion", '''max_batch_size = 8
max_queue_delay_us = 1000
[[input]]
name = "input"
datatype = "FP32"
dims = [1, 28, 28]
format = "image"
classes_file = "classes.txt"
[[output]]
name = "output"
datatype = "FP32"
dims = [10]
'''), ("tensors", classifier_config(8))):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.toml").write_text(config)
        (repo / name / "model.pt").write_bytes(model.read_bytes())
    (repo / "fashion" / "classes.txt").write_text("\n".join(NAMES) + "\n")
    torch.manual_seed(0)
    mobilenet = torch.jit.script(torchvision.models.mobilenet_v3_small(num_classes=len(COLOURS)).eval())
    (repo / "mobilenet").mkdir()
    mobilenet.save(str(repo / "mobilenet" / "model.pt"))
    (repo / "mobilenet" / "colours.txt").write_text("\n".join(COLOURS) + "\n")
    (repo / "mobilenet" / "config.toml").write_text(f'''max_batch_size = 4
[[input]]
name = "input"
datatype = "FP32"
dims = [3, 64, 64]
format = "image"
mean = {MEAN}
std = {STD}
classes_file = "colours.txt"
[[output]]
name = "output"
datatype = "FP32"
dims = [{len(COLOURS)}]
''')
    with running_server(repo) as port:
        yield port, model


def encoded(pixels, form="JPEG", mode="L"):
    """A uint8 [H, W] image as the bytes of a JPEG or PNG file (RGB: the gray repeated)."""
    image = Image.fromarray(pixels.numpy()).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=form, quality=95)
    return buffer.getvalue()


def python_logits(model_file, files):
    """Python's answer: PIL decodes, convert("L"), torchvision's Resize(28) + CenterCrop(28), the
    exported normalisation, the exported model."""
    metadata = {"afterburner.json": ""}
    model = torch.jit.load(str(model_file), _extra_files=metadata).eval()
    exported = json.loads(metadata["afterburner.json"])["input"]
    assert exported["transforms"] == "resize28,centre28"
    images = []
    for data in files:
        image = TF.pil_to_tensor(Image.open(io.BytesIO(data)).convert("L")).float()
        image = TF.center_crop(TF.resize(image, 28, antialias=True), [28, 28])
        images.append((image / 255 - exported["mean"][0]) / exported["std"][0])
    with torch.no_grad():
        return model(torch.stack(images))


def post(port, model, body, content_type, query=""):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer{query}", body,
                                     {"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def multipart(files, boundary="afterburner-test-boundary"):
    body = b"".join(b"--" + boundary.encode() + b"\r\nContent-Disposition: form-data; name=\"image\"; filename=\"" +
                    f"{i}.jpg".encode() + b"\"\r\nContent-Type: image/jpeg\r\n\r\n" + data + b"\r\n"
                    for i, data in enumerate(files))
    return body + b"--" + boundary.encode() + b"--\r\n", f'multipart/form-data; boundary="{boundary}"'


def test_a_posted_jpeg_of_a_fashion_item_returns_its_class_name(served):
    port, model_file = served
    images = idx_array("t10k-images-idx3-ubyte")[:40]
    labels = idx_array("t10k-labels-idx1-ubyte")[:40].long()
    files = [encoded(image) for image in images]
    expected = python_logits(model_file, files)
    named = 0
    for index, data in enumerate(files):
        for _ in range(2):  # a second call gives the same answer
            status, answer = post(port, "fashion", data, "image/jpeg", "?top_k=3")
            assert status == 200, answer
            logits = torch.tensor(answer["outputs"][0]["data"]).view(1, 10)
            assert torch.allclose(logits, expected[index:index + 1], atol=1e-4, rtol=1e-4), index
            best = answer["classes"][0]
            assert len(best) == 3 and best[0]["index"] == int(expected[index].argmax())
            assert best[0]["name"] == NAMES[best[0]["index"]]
            shares = torch.softmax(expected[index].double(), 0)
            assert abs(best[0]["probability"] - float(shares.max())) < 1e-5
        named += best[0]["name"] == NAMES[labels[index]]
    assert named >= 28  # the model learnt: most items come back with their own class name


def test_a_batch_of_parts_pngs_and_colour_images_answer_as_one_by_one(served):
    port, model_file = served
    images = idx_array("t10k-images-idx3-ubyte")[40:47]
    files = [encoded(images[0], "PNG"), encoded(images[1], "JPEG", "RGB"), *[encoded(image) for image in images[2:]]]
    big = Image.fromarray(images[0].numpy()).resize((70, 90))  # resized and cropped as torchvision's
    buffer = io.BytesIO()
    big.save(buffer, format="PNG")
    files.append(buffer.getvalue())
    expected = python_logits(model_file, files)
    body, content_type = multipart(files)
    status, answer = post(port, "fashion", body, content_type)
    assert status == 200, answer
    logits = torch.tensor(answer["outputs"][0]["data"]).view(len(files), 10)
    assert torch.allclose(logits, expected, atol=1e-4, rtol=1e-4)
    assert [best[0]["index"] for best in answer["classes"]] == expected.argmax(1).tolist()
    assert all(len(best) == 5 for best in answer["classes"])  # top_k defaults to 5


def photograph(seed, height, width):
    """A smooth colour picture, as photographs are smooth."""
    y, x = numpy.mgrid[0:height, 0:width]
    channels = [128 + 100 * numpy.sin(x / (9.0 + c + seed) + y / (13.0 + 2 * c)) for c in range(3)]
    return numpy.stack(channels, axis=2).astype(numpy.uint8)


def test_a_model_written_in_python_answers_photographs_as_torchvisions_preprocessing(served):
    port, _ = served
    files = []
    for seed, (height, width) in enumerate([(90, 120), (64, 64), (150, 100), (97, 71)]):
        buffer = io.BytesIO()
        Image.fromarray(photograph(seed, height, width)).save(buffer, format="JPEG" if seed % 2 else "PNG", quality=95)
        files.append(buffer.getvalue())
    model = torch.jit.load(str(Path(served[1]).parent / "repo" / "mobilenet" / "model.pt")).eval()
    images = []
    for data in files:  # Resize(64 * 256 // 224) + CenterCrop(64), ToTensor, Normalize
        image = TF.pil_to_tensor(Image.open(io.BytesIO(data)).convert("RGB")).float()
        image = TF.center_crop(TF.resize(image, 73, antialias=True), [64, 64]) / 255
        images.append(TF.normalize(image, MEAN, STD))
    with torch.no_grad():
        expected = model(torch.stack(images))
    for batch in ([files[0]], files):  # one image, then all four in one multipart request
        body, content_type = (batch[0], "image/png") if len(batch) == 1 else multipart(batch)
        for _ in range(2):
            status, answer = post(port, "mobilenet", body, content_type, "?top_k=2")
            assert status == 200, answer
            logits = torch.tensor(answer["outputs"][0]["data"]).view(len(batch), len(COLOURS))
            assert torch.allclose(logits, expected[:len(batch)], atol=1e-4, rtol=1e-3)
            assert [best[0]["name"] for best in answer["classes"]] == \
                [COLOURS[i] for i in expected[:len(batch)].argmax(1).tolist()]


def test_bad_images_and_requests_are_one_line_4xx(served):
    port, _ = served
    jpeg = encoded(idx_array("t10k-images-idx3-ubyte")[0])
    for model, body, content_type, query, status, fragment in (
            ("fashion", jpeg[:len(jpeg) // 2], "image/jpeg", "", 400, "image 1: "),
            ("fashion", b"GIF89a not an image", "image/gif", "", 400, "image 1: "),
            ("fashion", jpeg, "image/jpeg", "?top_k=0", 400, "top_k"),
            ("fashion", b"--x\r\nno end", "multipart/form-data; boundary=x", "", 400, "multipart/form-data body"),
            ("fashion", b"--x--\r\n", "multipart/form-data", "", 400, "no boundary"),
            ("fashion", multipart([jpeg] * 9)[0], multipart([jpeg])[1], "", 400, "max_batch_size 8"),
            ("tensors", jpeg, "image/jpeg", "", 415, "takes tensors"),
            ("absent", jpeg, "image/jpeg", "", 404, "unknown model")):
        code, answer = post(port, model, body, content_type, query)
        assert code == status and fragment in answer["error"], (model, query, answer)
        assert "\n" not in answer["error"]
    status, answer = post(port, "fashion", jpeg, "image/jpeg")  # the server still answers
    assert status == 200 and len(answer["classes"]) == 1
