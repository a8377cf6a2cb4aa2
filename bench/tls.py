"""What TLS and a model-limited token cost on the served path: one client's latency, against raw ONNX Runtime.

    .venv/bin/python bench/tls.py [--blocks 10] [--per-block 40] [--keep]

MiniLM-L6 (seq 32, batch-1 requests with binary tensors) behind two ``modelyard serve --role
inference`` processes on SQLite, each with its own data folder: one plain, one started with
``--ssl-certfile/--ssl-keyfile`` (a CA and a certificate for 127.0.0.1 made here with
``cryptography``). Inference is not public: every request carries a token with only the
``inference`` role, either unlimited or limited to the model by a pattern (``--only-model 'mini*'``),
so the token check is measured as users run it.

The series, measured in turn in blocks of ``--per-block`` calls (the first of each block left out), so a
change in this shared machine's load falls on all of them:

- raw ONNX Runtime ``run()`` in this process (batch 1);
- HTTP with the unlimited token, and with the model-limited token, on one keep-alive connection;
- HTTPS with the unlimited token, on one keep-alive TLS connection (the handshake happens once);
- gRPC ``ModelInfer`` on one channel, and gRPC over TLS on one channel.

Every path's answer is checked against raw ONNX Runtime first. It prints each p50 and its overhead over
raw ``run()``, and writes bench/results/tls.json. There is no goal to meet; it records what TLS costs.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import ipaddress
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import run_in_workdir, stop_process
from serve import (
    BIN,
    GRPC_INFER,
    INFER_PATH,
    MODEL_NAME,
    MODEL_PATH,
    ROOT,
    KeepAliveClient,
    binary_body,
    decode_embedding,
    feeds,
    free_port,
    grpc_message,
    http_headers,
    modelyard_env,
    percentile_ms,
    raw_session,
)

RESULTS = ROOT / "bench" / "results" / "tls.json"


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 that it signed: (ca.pem, server.pem, server-key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("bench CA"))
        .issuer_name(name("bench CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


class Server:
    """One ``modelyard serve --role inference`` on a data folder of its own, with MiniLM on production."""

    def __init__(self, work: Path, name: str, tls: tuple[Path, Path] | None) -> None:
        self.work = work / name
        self.work.mkdir()
        self.env = modelyard_env(self.work / "data", None)
        del self.env["MODELYARD_INFERENCE_PUBLIC"]  # every request shows a token, as users' do
        bench_serve = ROOT / "bench" / "serve.py"
        subprocess.run([sys.executable, str(bench_serve), "--register", "{}"], env=self.env, check=True, cwd=ROOT)
        self.tokens = {
            "unlimited": self.createtoken(f"{name}-pipeline"),
            "limited": self.createtoken(f"{name}-limited", "--only-model", "mini*"),
        }
        self.port, self.grpc_port = free_port(), free_port()
        self.log = self.work / "serve.log"
        argv = [str(BIN / "modelyard"), "serve", "--role", "inference", "--log-level", "warning"]
        argv += ["--port", str(self.port), "--grpc-port", str(self.grpc_port)]
        if tls is not None:
            argv += ["--ssl-certfile", str(tls[0]), "--ssl-keyfile", str(tls[1])]
        self.process = subprocess.Popen(argv, env=self.env, stdout=self.log.open("w"), stderr=subprocess.STDOUT)

    def createtoken(self, username: str, *limits: str) -> str:
        argv = [str(BIN / "modelyard"), "createtoken", username, "--create-user", "--role", "inference"]
        made = subprocess.run(
            [*argv, "--only-role", "inference", *limits], env=self.env, check=True, capture_output=True, text=True
        )
        return made.stdout.strip().splitlines()[-1]

    def wait_ready(self, context: ssl.SSLContext | None, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{self.log.read_text()[-3000:]}")
            try:
                if context is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                else:
                    conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=2, context=context)
                conn.request("GET", f"/v2/models/{MODEL_NAME}/ready", headers=self.auth("unlimited"))
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"not ready in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def auth(self, which: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[which]}"}


class HttpPath:
    """Requests on one keep-alive connection (TLS when a context is given)."""

    def __init__(self, server: Server, token: str, context: ssl.SSLContext | None) -> None:
        body, header_length = binary_body(feeds(1))
        self.server, self.context = server, context
        self.request = body, {**http_headers(header_length), **server.auth(token)}
        self.client = KeepAliveClient(server.port, INFER_PATH, *self.request)
        if context is not None:
            self.client.sock = context.wrap_socket(self.client.sock, server_hostname="127.0.0.1")

    def __call__(self) -> bytes:
        status, body = self.client.post()
        if status != 200:
            raise RuntimeError(f"the server answered {status}: {body[:300]!r}")
        return body

    def embedding(self) -> np.ndarray:
        """One answer read with http.client, which gives its headers (the binary header's length)."""
        if self.context is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=60)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", self.server.port, timeout=60, context=self.context)
        try:
            conn.request("POST", INFER_PATH, body=self.request[0], headers=self.request[1])
            response = conn.getresponse()
            headers = {name.lower(): value for name, value in response.getheaders()}
            return decode_embedding(response.status, headers, response.read())
        finally:
            conn.close()

    def close(self) -> None:
        self.client.close()


class GrpcPath:
    """ModelInfer calls on one channel (TLS when the CA's PEM is given)."""

    def __init__(self, server: Server, ca_pem: bytes | None) -> None:
        import grpc

        target = f"127.0.0.1:{server.grpc_port}"
        if ca_pem is None:
            self.channel = grpc.insecure_channel(target)
        else:
            self.channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca_pem))
        self.call = self.channel.unary_unary(GRPC_INFER)  # bytes in, bytes out
        self.message = grpc_message(feeds(1))
        self.metadata = (("authorization", f"Bearer {server.tokens['unlimited']}"),)

    def __call__(self) -> bytes:
        return bytes(self.call(self.message, metadata=self.metadata, timeout=60))

    def embedding(self) -> np.ndarray:
        from inference.grpc import grpc_service_pb2 as pb

        response = pb.ModelInferResponse.FromString(self())
        (output,) = response.outputs
        return np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(list(output.shape))

    def close(self) -> None:
        self.channel.close()


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    ca, cert, key = make_certificates(work)
    context = ssl.create_default_context(cafile=str(ca))
    plain, secure = Server(work, "plain", None), Server(work, "tls", (cert, key))
    try:
        plain.wait_ready(None)
        secure.wait_ready(context)
        session = raw_session()
        one = feeds(1)
        expected = session.run(None, one)[0]
        paths: dict[str, Any] = {
            "http": HttpPath(plain, "unlimited", None),
            "http, model-limited token": HttpPath(plain, "limited", None),
            "https": HttpPath(secure, "unlimited", context),
            "grpc": GrpcPath(plain, None),
            "grpc over TLS": GrpcPath(secure, ca.read_bytes()),
        }
        for label, path in paths.items():
            got = path.embedding()
            if not np.allclose(got, expected, atol=1e-4):
                raise RuntimeError(f"{label} answered {got.ravel()[:4]}, raw ONNX Runtime {expected.ravel()[:4]}")
        series: dict[str, Callable[[], Any]] = {"raw run()": lambda: session.run(None, one), **paths}
        times: dict[str, list[float]] = {label: [] for label in series}
        for block in range(args.blocks):
            order = list(series.items())
            for label, call in order if block % 2 == 0 else reversed(order):
                for index in range(args.per_block):
                    start = time.perf_counter()
                    call()
                    if index:
                        times[label].append(time.perf_counter() - start)
        for path in paths.values():
            path.close()
    finally:
        stop_process(plain.process)
        stop_process(secure.process)
    raw_p50 = percentile_ms(times["raw run()"], 50)
    rows = {
        label: {
            "p50_ms": percentile_ms(samples, 50),
            "p99_ms": percentile_ms(samples, 99),
            "overhead_ms": percentile_ms(samples, 50) - raw_p50,
            "samples": len(samples),
        }
        for label, samples in times.items()
    }
    return {
        "model": MODEL_PATH.name,
        "blocks": args.blocks,
        "per_block": args.per_block,
        "series": rows,
        "tls_cost_ms": {
            "http": rows["https"]["p50_ms"] - rows["http"]["p50_ms"],
            "grpc": rows["grpc over TLS"]["p50_ms"] - rows["grpc"]["p50_ms"],
        },
        "limited_token_cost_ms": rows["http, model-limited token"]["p50_ms"] - rows["http"]["p50_ms"],
    }


def report(result: dict[str, Any]) -> None:
    print(f"{'series':<28}{'p50 ms':>9}{'p99 ms':>9}{'over raw':>10}")
    for label, row in result["series"].items():
        print(f"{label:<28}{row['p50_ms']:>9.3f}{row['p99_ms']:>9.3f}{row['overhead_ms']:>+10.3f}")
    cost = result["tls_cost_ms"]
    print(f"TLS adds {cost['http']:+.3f} ms over HTTP and {cost['grpc']:+.3f} ms over gRPC at p50;")
    print(f"a model-limited token {result['limited_token_cost_ms']:+.3f} ms over an unlimited one")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=10, help="blocks of calls per series, in turn")
    parser.add_argument("--per-block", type=int, default=40, help="calls per block (the first one is left out)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, certificates)")
    args = parser.parse_args()
    if not MODEL_PATH.exists():
        sys.exit(f"{MODEL_PATH} is missing")
    return run_in_workdir(
        prefix="bench-tls-",
        run=lambda work: measure(args, work),
        report=report,
        output=RESULTS,
        keep=args.keep,
        passed=lambda result: True,
    )


if __name__ == "__main__":
    sys.exit(main())
