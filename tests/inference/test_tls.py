"""``modelyard serve --ssl-certfile/--ssl-keyfile [--ssl-ca-certs]``: HTTPS and gRPC over TLS from real processes.

A root CA, a server certificate for 127.0.0.1 (an IP SAN) and a client certificate are made in the test
(``tests.support.tls``). Each test starts ``python -m modelyard.cli serve`` on the test database and talks
to it with Python's ``ssl``, the ``modelyard`` command, :class:`modelyard.client.Client`, and the real
``tritonclient.http`` and ``tritonclient.grpc``; answers are compared with ONNX Runtime run here.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import gevent.ssl
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from django.conf import settings as django_settings
from tritonclient.utils import InferenceServerException

from modelyard.client import Client, ConnectionFailed
from registry.models import Role
from tests.support.onnx_models import add_model_bytes
from tests.support.people import Person, make_person
from tests.support.processes import ServeProcess, base_env, subprocess_database_url
from tests.support.registry import create_model, promote, upload_versions
from tests.support.servers import inference_env
from tests.support.tls import Chain, make_chain

pytestmark = pytest.mark.django_db(transaction=True)

BIAS = 0.5
X = np.arange(8, dtype=np.float32).reshape(2, 4)
UNTRUSTED = (
    "its TLS certificate is not trusted (unable to get local issuer certificate); pass --ca-bundle CA.pem "
    "(MODELYARD_CA_BUNDLE, Client(ca_bundle=...)) with the certificate authority that signed it"
)


@pytest.fixture
def chain(tmp_path: Path) -> Chain:
    return make_chain(tmp_path / "pki")


@pytest.fixture
def served(owner: Person, approver: Person) -> None:
    """``demo`` (y = x + 0.5) on production."""
    create_model(owner)
    upload_versions(owner, [BIAS])
    promote(owner, approver, 1)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(name: str, *, role: str, args: tuple[str, ...], tls: ssl.SSLContext) -> ServeProcess:
        env = inference_env(
            name, tmp_path / f"{name}-data", subprocess_database_url(), Path(django_settings.STORAGE.path)
        )
        server = ServeProcess(name, role, env, tmp_path / f"{name}.log", args=args, tls=tls)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.kill()


def onnx_runtime(x: np.ndarray) -> np.ndarray:
    """The answer ONNX Runtime gives here, on the bytes that were uploaded."""
    session = ort.InferenceSession(add_model_bytes(bias=BIAS), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], {"x": x})[0])


def grpc_infer(url: str, **tls: str) -> np.ndarray:
    with grpcclient.InferenceServerClient(url, ssl=True, **tls) as client:
        item = grpcclient.InferInput("x", list(X.shape), "FP32")
        item.set_data_from_numpy(X)
        return np.asarray(client.infer("demo", [item], client_timeout=30).as_numpy("y"))


def http_infer(url: str, factory: Callable[[], ssl.SSLContext]) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, ssl=True, ssl_context_factory=factory, network_timeout=30)
    try:
        item = httpclient.InferInput("x", list(X.shape), "FP32")
        item.set_data_from_numpy(X, binary_data=True)
        return np.asarray(client.infer("demo", [item]).as_numpy("y"))
    finally:
        client.close()


def modelyard(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelyard.cli", *args],
        env=base_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_serve_answers_https_and_grpc_over_tls_with_the_tests_certificate(
    served: None, chain: Chain, start_server: Callable[..., ServeProcess], tmp_path: Path
) -> None:
    args = ("--ssl-certfile", str(chain.server_cert), "--ssl-keyfile", str(chain.server_key))
    server = start_server("tls", role="all", args=args, tls=chain.context())
    assert (
        f"Modelyard (all) on https://127.0.0.1:{server.port}/, gRPC over TLS on 127.0.0.1:{server.grpc_port}  "
        "(API docs: /api/docs/)\n"
    ) in server.log()
    assert server.base == f"https://127.0.0.1:{server.port}"

    # HTTPS with the test's CA: the server presents the test's certificate, for 127.0.0.1.
    with urllib.request.urlopen(f"{server.base}/readyz", context=chain.context(), timeout=30) as response:
        assert response.status == 200
        peer = response.fp.raw._sock.getpeercert()
    assert peer["subject"] == ((("commonName", "127.0.0.1"),),)
    assert peer["issuer"] == ((("commonName", "Modelyard test root CA"),),)
    assert peer["subjectAltName"] == (("IP Address", "127.0.0.1"),)

    # Plain HTTP on the same port gets no answer; a client trusting only the system's CAs refuses the server.
    plain = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    with pytest.raises((OSError, http.client.HTTPException)):
        plain.request("GET", "/readyz")
        plain.getresponse()
    plain.close()
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(f"{server.base}/readyz", timeout=30)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)

    # The Python client: with the CA it works; without it, the clear error.
    owner_token = make_person("tls-admin", Role.ADMIN).token
    assert Client(server.base, owner_token, ca_bundle=chain.ca).whoami()["username"] == "tls-admin"
    with pytest.raises(ConnectionFailed) as untrusted:
        Client(server.base, owner_token).whoami()
    assert str(untrusted.value) == f"cannot reach {server.base}: {UNTRUSTED}"
    with pytest.raises(ConnectionFailed) as stranger:  # a CA that did not sign the server's certificate
        Client(server.base, owner_token, ca_bundle=chain.other_ca).whoami()
    assert str(stranger.value) == f"cannot reach {server.base}: {UNTRUSTED}"
    np.testing.assert_array_equal(
        Client(server.base, owner_token, ca_bundle=chain.ca).infer("demo", {"x": X})["y"], onnx_runtime(X)
    )

    # The CLI: --ca-bundle, or MODELYARD_CA_BUNDLE; without either, exit 1 and the clear error.
    done = modelyard("models", "--url", server.base, "--token", owner_token, "--ca-bundle", str(chain.ca), "--json")
    assert done.returncode == 0, done.stderr
    assert [m["name"] for m in json.loads(done.stdout)] == ["demo"]
    done = modelyard("models", "--url", server.base, "--token", owner_token, MODELYARD_CA_BUNDLE=str(chain.ca))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[0] == "demo"
    done = modelyard("models", "--url", server.base, "--token", owner_token)
    assert done.returncode == 1
    assert done.stderr == f"modelyard models: cannot reach {server.base}: {UNTRUSTED}\n"
    # `login --ca-bundle` saves the CA with the profile: the next commands need no option.
    home = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = modelyard("login", server.base, "--token", owner_token, "--ca-bundle", str(chain.ca), **home)
    assert done.returncode == 0, done.stderr
    saved = (tmp_path / "config" / "modelyard" / "config.toml").read_text()
    assert f'ca_bundle = "{chain.ca}"' in saved
    done = modelyard("models", "--json", **home)
    assert done.returncode == 0, done.stderr
    assert [m["name"] for m in json.loads(done.stdout)] == ["demo"]
    done = modelyard("models", "--url", server.base, "--ca-bundle", str(chain.ca.with_name("missing.pem")))
    assert done.returncode == 2
    assert (
        done.stderr
        == f"modelyard models: --ca-bundle (MODELYARD_CA_BUNDLE) {chain.ca.with_name('missing.pem')}: no such file\n"
    )

    # tritonclient over HTTPS and over gRPC with TLS: the answer ONNX Runtime gives here.
    expected = onnx_runtime(X)
    np.testing.assert_array_equal(expected, X + np.float32(BIAS))
    https_url = f"127.0.0.1:{server.port}"
    np.testing.assert_array_equal(
        http_infer(https_url, lambda: gevent.ssl.create_default_context(cafile=str(chain.ca))), expected
    )
    grpc_url = f"127.0.0.1:{server.grpc_port}"
    np.testing.assert_array_equal(grpc_infer(grpc_url, root_certificates=str(chain.ca)), expected)
    with pytest.raises(InferenceServerException) as grpc_untrusted:
        grpc_infer(grpc_url, root_certificates=str(chain.other_ca))
    assert grpc_untrusted.value.status() == "StatusCode.UNAVAILABLE"


def test_with_ssl_ca_certs_a_caller_without_a_client_certificate_is_refused(
    served: None, chain: Chain, start_server: Callable[..., ServeProcess]
) -> None:
    args = (
        "--ssl-certfile",
        str(chain.server_cert),
        "--ssl-keyfile",
        str(chain.server_key),
        "--ssl-ca-certs",
        str(chain.ca),
    )
    server = start_server("mtls", role="inference", args=args, tls=chain.context(client=True))
    assert (
        f"Modelyard (inference) on https://127.0.0.1:{server.port}/, gRPC over TLS on 127.0.0.1:{server.grpc_port}  "
        "(API docs: /api/docs/)  (client certificates required)\n"
    ) in server.log()
    expected = onnx_runtime(X)

    # HTTPS: with the client certificate, served; without it, the handshake is refused.
    status, _ = server.request("GET", "/v2/health/ready")
    assert status == 200
    without = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=30, context=chain.context())
    with pytest.raises(OSError):  # TLS 1.3: the server checks after the client's handshake, and hangs up
        without.request("GET", "/v2/health/ready")
        without.getresponse()
    without.close()

    # The Python client says what is missing, and is served with --client-cert/--client-key.
    with pytest.raises(ConnectionFailed) as no_certificate:
        Client(server.base, ca_bundle=chain.ca).infer("demo", {"x": X})
    assert str(no_certificate.value) == (
        f"cannot reach {server.base}: the server closed the connection without answering (a server that requires "
        "client certificates does so to callers without one: pass --client-cert CERT.pem and --client-key KEY.pem "
        "(MODELYARD_CLIENT_CERT, MODELYARD_CLIENT_KEY))"
    )
    client = Client(server.base, ca_bundle=chain.ca, client_cert=chain.client_cert, client_key=chain.client_key)
    np.testing.assert_array_equal(client.infer("demo", {"x": X})["y"], expected)

    # The CLI: --client-cert and --client-key.
    tls = ("--url", server.base, "--ca-bundle", str(chain.ca))
    done = modelyard("infer", "demo", "--input", "x=[[0,1,2,3],[4,5,6,7]]", "--json", *tls)
    assert done.returncode == 1
    assert "the server closed the connection without answering" in done.stderr
    mine = ("--client-cert", str(chain.client_cert), "--client-key", str(chain.client_key))
    done = modelyard("infer", "demo", "--input", "x=[[0,1,2,3],[4,5,6,7]]", "--json", *tls, *mine)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["y"]["data"] == expected.tolist()
    done = modelyard("infer", "demo", "--input", "x=[[0]]", *tls, "--client-key", str(chain.client_key))
    assert done.returncode == 2
    assert done.stderr == (
        "modelyard infer: --client-key (MODELYARD_CLIENT_KEY) goes with --client-cert CERT.pem "
        "(MODELYARD_CLIENT_CERT)\n"
    )

    # gRPC: the same, with tritonclient.grpc.
    grpc_url = f"127.0.0.1:{server.grpc_port}"
    with pytest.raises(InferenceServerException) as grpc_refused:
        grpc_infer(grpc_url, root_certificates=str(chain.ca))
    assert grpc_refused.value.status() == "StatusCode.UNAVAILABLE"
    served_grpc = grpc_infer(
        grpc_url,
        root_certificates=str(chain.ca),
        private_key=str(chain.client_key),
        certificate_chain=str(chain.client_cert),
    )
    np.testing.assert_array_equal(served_grpc, expected)

    # tritonclient.http with the client certificate.
    def with_certificate() -> ssl.SSLContext:
        context = gevent.ssl.create_default_context(cafile=str(chain.ca))
        context.load_cert_chain(str(chain.client_cert), str(chain.client_key))
        return context

    np.testing.assert_array_equal(http_infer(f"127.0.0.1:{server.port}", with_certificate), expected)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--ssl-certfile", "{missing}", "--ssl-keyfile", "{server_key}"), "--ssl-certfile {missing}: no such file"),
        (
            ("--ssl-certfile", "{server_cert}", "--ssl-keyfile", "{other_key}"),
            "--ssl-keyfile {other_key} is not the private key of the certificate in --ssl-certfile {server_cert}",
        ),
        (
            ("--ssl-certfile", "{server_cert}"),
            "--ssl-certfile goes with --ssl-keyfile KEY.pem (the certificate's private key)",
        ),
        (("--ssl-keyfile", "{server_key}"), "--ssl-keyfile goes with --ssl-certfile CERT.pem (the key's certificate)"),
        (
            ("--ssl-ca-certs", "{ca}"),
            "--ssl-ca-certs (client certificates) needs --ssl-certfile CERT.pem and --ssl-keyfile KEY.pem",
        ),
        (
            ("--ssl-certfile", "{server_key}", "--ssl-keyfile", "{server_key}"),
            "--ssl-certfile {server_key}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ),
        (
            ("--ssl-certfile", "{server_cert}", "--ssl-keyfile", "{server_key}", "--ssl-ca-certs", "{server_key}"),
            "--ssl-ca-certs {server_key}: holds no PEM CA certificate (-----BEGIN CERTIFICATE-----)",
        ),
    ],
)
def test_serve_refuses_unusable_tls_options_naming_the_option(
    chain: Chain, tmp_path: Path, options: tuple[str, ...], message: str
) -> None:
    paths = {
        "missing": str(tmp_path / "missing.pem"),
        "server_cert": str(chain.server_cert),
        "server_key": str(chain.server_key),
        "other_key": str(chain.other_key),
        "ca": str(chain.ca),
    }
    done = modelyard("serve", "--port", "0", "--grpc-port", "0", *(o.format(**paths) for o in options))
    assert done.returncode == 2
    assert done.stderr == f"modelyard serve: {message.format(**paths)}\n"
    assert done.stdout == ""


def test_serve_names_the_environment_variable_a_file_came_from(chain: Chain) -> None:
    done = modelyard("serve", "--port", "0", "--grpc-port", "0", MODELYARD_SSL_CERTFILE=str(chain.server_cert))
    assert done.returncode == 2
    assert done.stderr == (
        "modelyard serve: MODELYARD_SSL_CERTFILE goes with --ssl-keyfile KEY.pem (the certificate's private key)\n"
    )
    done = modelyard(
        "serve",
        "--port",
        "0",
        "--ssl-keyfile",
        str(chain.server_key),
        MODELYARD_SSL_CERTFILE=str(chain.ca),
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"modelyard serve: --ssl-keyfile {chain.server_key} is not the private key of the certificate in "
        f"MODELYARD_SSL_CERTFILE {chain.ca}\n"
    )
