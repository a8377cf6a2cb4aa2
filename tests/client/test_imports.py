"""The client and the user commands run without the server's code: no Django, no Celery, no ONNX."""

from __future__ import annotations

import hashlib
import subprocess
import sys

# Any import of these now raises ImportError.
BLOCK = (
    "import sys\n"
    "for name in ('django', 'celery', 'onnx', 'onnxruntime', 'onnxkit', 'registry', 'inference', 'storage'):\n"
    "    sys.modules[name] = None\n"
)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=60, env=env)


def test_the_client_imports_with_the_server_code_unimportable():
    done = run_python(
        "import modelyard.client, modelyard.client.commands\n"
        "server = ('django', 'celery', 'onnx', 'onnxkit', 'registry', 'inference', 'storage', 'modelyard.settings')\n"
        "print(sorted(m for m, module in sys.modules.items() if module is not None and m.startswith(server)))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert done.stderr == ""


def test_a_user_command_runs_with_the_server_code_unimportable():
    done = run_python(
        "from modelyard.cli import main\n"
        "sys.exit(main(['models', '--url', 'http://127.0.0.1:9', '--token', 'my_x_y']))\n"
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("modelyard models: cannot reach http://127.0.0.1:9: ")


def test_the_client_leaves_the_signing_library_until_a_command_needs_it():
    done = run_python(
        "import modelyard.client, modelyard.client.commands\n"
        "signing = ('cryptography', 'model_signing', 'modelyard.provenance')\n"
        "print(sorted(m for m in sys.modules if m.startswith(signing)))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_only_the_commands_that_carry_tensors_import_numpy():
    """numpy is a sixth of the command line's start-up: commands without tensors run with it unimportable."""
    done = run_python(
        "sys.modules['numpy'] = None\n"
        "from modelyard.cli import main\n"
        "sys.exit(main(['models', '--url', 'http://127.0.0.1:9', '--token', 'my_x_y']))\n"
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("modelyard models: cannot reach http://127.0.0.1:9: ")

    done = run_python(
        "from modelyard.client import Client\n"
        "client = Client('http://127.0.0.1:9', token='my_x_y')\n"
        "before = 'numpy' in sys.modules\n"
        "try:\n"
        "    client.infer('m', {})\n"
        "except Exception as exc:\n"
        "    print(before, 'numpy' in sys.modules, type(exc).__name__)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "ConnectionFailed"]


def test_verify_checks_a_folder_with_the_server_code_unimportable(tmp_path):
    from modelyard.provenance import Signer, generate_private_key

    key = generate_private_key()
    (tmp_path / "key.pub.pem").write_bytes(Signer(key).public_pem)
    (tmp_path / "pulled").mkdir()
    (tmp_path / "pulled" / "model.onnx").write_bytes(b"not really a model")
    digest = hashlib.sha256(b"not really a model").hexdigest()
    (tmp_path / "pulled" / "model.sig").write_bytes(Signer(key).sign({"model.onnx": digest}))

    done = run_python(
        "from modelyard.cli import main\n"
        f"sys.exit(main(['verify', {str(tmp_path / 'pulled')!r}, '--key', {str(tmp_path / 'key.pub.pem')!r}]))\n"
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{tmp_path / 'pulled'}: 1 file(s) match model.sig, signed with ")
