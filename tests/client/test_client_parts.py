"""The client's parts without a server: binary tensors, saved profiles, and the streamed multipart body."""

from __future__ import annotations

import email.message
import email.parser
import io
import json
import os
import stat
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from modelyard.client import ConfigError, config_path, read_profiles, save_profile
from modelyard.client.commands import ProgressBar
from modelyard.client.config import resolve
from modelyard.client.multipart import MultipartBody
from modelyard.client.tensors import decode_response, encode_request

# --- Binary tensors --------------------------------------------------------------------------------


def test_inputs_encode_as_a_json_header_followed_by_little_endian_bytes():
    x = np.array([[1.5, -2.0]], dtype=np.float32)
    ids = np.array([7, 8, 9], dtype=np.int64)
    text = np.array(["héllo", "x"], dtype=object)
    body, header_length = encode_request({"x": x, "ids": ids, "text": text}, outputs=["y"])
    header = json.loads(body[:header_length])
    assert header == {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
            {"name": "ids", "datatype": "INT64", "shape": [3], "parameters": {"binary_data_size": 24}},
            {"name": "text", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 15}},
        ],
        "parameters": {"binary_data_output": True},
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
    raw = body[header_length:]
    assert raw[:8] == x.astype("<f4").tobytes()
    assert raw[8:32] == ids.astype("<i8").tobytes()
    assert raw[32:] == b"\x06\x00\x00\x00h\xc3\xa9llo\x01\x00\x00\x00x"


def test_binary_and_json_outputs_decode_to_arrays():
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    words = b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    header = json.dumps(
        {
            "model_name": "m",
            "outputs": [
                {"name": "y", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
                {"name": "w", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(words)}},
                {"name": "n", "datatype": "FP64", "shape": [2], "data": ["NaN", 1.0]},
            ],
        }
    ).encode()
    outputs = decode_response(header + y.tobytes() + words, str(len(header)))
    np.testing.assert_array_equal(outputs["y"], y)
    assert outputs["y"].dtype == np.float32
    assert outputs["w"].tolist() == [b"ab", b""]
    assert np.isnan(outputs["n"][0]) and outputs["n"][1] == 1.0


def test_a_dtype_the_protocol_lacks_is_refused():
    with pytest.raises(TypeError, match="complex64 has no Open Inference Protocol datatype"):
        encode_request({"x": np.zeros(2, dtype=np.complex64)})


# --- Profiles --------------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    for name in ("MODELYARD_URL", "MODELYARD_TOKEN", "MODELYARD_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_profiles_are_saved_under_xdg_config_home_readable_by_their_owner_only(home):
    path = save_profile("default", url="http://a:1", token="my_a_secret")
    save_profile("bob", url="http://b:2", token='my_b_"quoted"')
    assert path == home / "xdg" / "modelyard" / "config.toml" == config_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_profiles() == {
        "default": {"url": "http://a:1", "token": "my_a_secret"},
        "bob": {"url": "http://b:2", "token": 'my_b_"quoted"'},
    }
    save_profile("default", url="http://a:3", token="my_a_new")  # replaced, bob kept
    assert read_profiles()["default"] == {"url": "http://a:3", "token": "my_a_new"}
    assert read_profiles()["bob"]["url"] == "http://b:2"
    assert [p.name for p in path.parent.iterdir()] == ["config.toml"]  # no draft left behind


def test_a_file_made_world_readable_is_saved_back_with_mode_600(home):
    path = save_profile("default", url="http://a:1", token="t")
    path.chmod(0o644)
    save_profile("default", url="http://a:1", token="t2")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_without_xdg_the_file_is_under_home(home, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert save_profile("default", url="http://a:1", token="t") == home / ".config" / "modelyard" / "config.toml"


def test_arguments_then_environment_then_the_default_profile(home, monkeypatch):
    save_profile("default", url="http://profile:1", token="profile-token")
    assert resolve() == resolve(profile=None)
    assert (resolve().url, resolve().token, resolve().profile) == ("http://profile:1", "profile-token", "default")
    monkeypatch.setenv("MODELYARD_URL", "http://env:2/")
    monkeypatch.setenv("MODELYARD_TOKEN", "env-token")
    assert (resolve().url, resolve().token) == ("http://env:2", "env-token")
    assert (resolve(url="http://arg:3", token="arg-token").url, resolve(token="arg-token").token) == (
        "http://arg:3",
        "arg-token",
    )


def test_a_profile_named_explicitly_wins_over_the_environment(home, monkeypatch):
    save_profile("bob", url="http://bob:1", token="bob-token")
    monkeypatch.setenv("MODELYARD_TOKEN", "alice-token")
    monkeypatch.setenv("MODELYARD_URL", "http://env:2")
    target = resolve(profile="bob")
    assert (target.url, target.token, target.profile) == ("http://bob:1", "bob-token", "bob")
    monkeypatch.setenv("MODELYARD_PROFILE", "bob")  # the environment may name it too
    assert resolve().token == "alice-token"  # ... but then the environment's own token still counts


def test_unknown_profiles_and_no_server_are_config_errors(home, monkeypatch):
    with pytest.raises(ConfigError, match=r"^no server: pass --url, set MODELYARD_URL, or save a profile"):
        resolve()
    with pytest.raises(ConfigError, match=r"^no profile 'carol' in .*config\.toml; create it with `modelyard login"):
        resolve(profile="carol")
    monkeypatch.setenv("MODELYARD_PROFILE", "carol")
    with pytest.raises(ConfigError, match=r"^MODELYARD_PROFILE names no profile 'carol'"):
        resolve()
    with pytest.raises(ConfigError, match="invalid profile name"):
        save_profile("../x", url="http://a", token="t")


# --- The multipart body ------------------------------------------------------------------------------


def test_the_body_streams_files_block_by_block_with_an_exact_length(tmp_path, monkeypatch):
    big = tmp_path / "weights.bin"
    big.write_bytes(os.urandom(3 * (1 << 20) + 5))
    small = tmp_path / "model.onnx"
    small.write_bytes(b"onnx-bytes")
    reads: list[int] = []
    real_open = Path.open

    def recording_open(self, *args, **kwargs):
        stream = real_open(self, *args, **kwargs)
        real_read = stream.read

        def read(size=-1):
            reads.append(size)
            return real_read(size)

        stream.read = read
        return stream

    monkeypatch.setattr(Path, "open", recording_open)
    seen: list[tuple[int, int]] = []
    body = MultipartBody(
        [("description", "first cut"), ("metadata", '{"run": 42}')],
        [("model.onnx", small), ("weights.bin", big)],
        progress=lambda sent, total: seen.append((sent, total)),
    )
    pieces = []
    while piece := body.read(16384):
        assert len(piece) <= 16384
        pieces.append(piece)
    data = b"".join(pieces)

    assert len(data) == len(body)
    assert 0 < max(reads) <= 1 << 20  # never a whole file, never unbounded
    files = len(b"onnx-bytes") + big.stat().st_size
    assert seen[-1] == (files, files)  # the files' bytes, not the form around them
    assert [sent for sent, _ in seen] == sorted(sent for sent, _ in seen)
    message = email.parser.BytesParser().parsebytes(
        f"Content-Type: {body.content_type}\r\n\r\n".encode() + data  # parse it back as any server would
    )
    # A multipart message's payload is its list of parts; the stubs type it for any message.
    subparts = cast(list[email.message.Message], message.get_payload())
    parts = [
        (p.get_param("name", header="content-disposition"), p.get_filename(), p.get_payload(decode=True))
        for p in subparts
    ]
    assert parts == [
        ("description", None, b"first cut"),
        ("metadata", None, b'{"run": 42}'),
        ("file", "model.onnx", b"onnx-bytes"),
        ("file", "weights.bin", big.read_bytes()),
    ]


def test_push_progress_counts_the_files_bytes_not_the_multipart_around_them(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"m" * 290)
    out = io.StringIO()
    seen: list[tuple[int, int]] = []
    bar = ProgressBar("Uploading model.onnx", stream=out)

    def progress(sent: int, total: int) -> None:
        seen.append((sent, total))
        bar(sent, total)

    body = MultipartBody(
        [("description", "a cut"), ("metadata", '{"run": 1}')], [("model.onnx", model)], progress=progress
    )
    while body.read(64):
        pass
    assert len(body) > 290 + 200  # the boundaries, part headers and fields go out too
    assert seen[-1] == (290, 290)
    assert all(total == 290 and 0 < sent <= 290 for sent, total in seen)
    assert "100.0%  290 B / 290 B" in out.getvalue().splitlines()[-1]


def test_a_file_that_changes_while_uploading_stops_the_upload(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"x" * 100)
    body = MultipartBody([], [("model.onnx", path)])
    path.write_bytes(b"x" * 10)
    with pytest.raises(OSError, match="changed while it was being uploaded"):
        while body.read(8192):
            pass
