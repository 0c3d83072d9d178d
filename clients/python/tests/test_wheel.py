"""The platform wheel `scripts/build-wheel` makes from the release binary:
installed alone into a fresh virtualenv, it gives `import ratekeeper` and a
`ratekeeper` command in the virtualenv's bin directory, and the two talk.

It reuses the release binary the README's test builds (`cargo build
--release` is a no-op when it is fresh) and installs with `--no-index
--no-deps`: the client has no dependencies, and nothing else is fetched.
Building the wheel fetches its backend (hatchling) like any `pip install`
of the client does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from _daemon import Daemon

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
ROOT = PACKAGE_ROOT.parents[1]

CONFIG = """
[[limits]]
name = "gpt"
tokens_per_minute = 60000
"""

#: Run by the virtualenv's python: the installed client, not this checkout's.
ACQUIRE_AND_REPORT = """
import json, sys
import ratekeeper
client = ratekeeper.Client(sys.argv[1], timeout=10)
lease = client.acquire("gpt", 100, max_tokens=50)
returned = lease.report(input_tokens=100, output_tokens=20)
print(json.dumps({"file": ratekeeper.__file__, "granted": lease.tokens, "returned": returned}))
"""


def release_binary() -> Path:
    """`cargo build --release` (a no-op when fresh), as the README's test does."""
    subprocess.run(
        ["cargo", "build", "--release", "--locked", "--bin", "ratekeeper"],
        cwd=ROOT,
        check=True,
        # A release build on two cores takes minutes.
        timeout=1800,
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR") or "target")
    return (target if target.is_absolute() else ROOT / target) / "release" / "ratekeeper"


def client_version() -> str:
    text = (PACKAGE_ROOT / "pyproject.toml").read_text()
    found = re.search(r'^version = "([^"]+)"$', text, re.MULTILINE)
    assert found, "no version in pyproject.toml"
    return found.group(1)


def build_wheel(binary: Path, out_dir: Path) -> Path:
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-wheel"), "--out-dir", str(out_dir), str(binary)],
        env=dict(os.environ, PYTHON=sys.executable, PIP_DISABLE_PIP_VERSION_CHECK="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"build-wheel exited {done.returncode}\n{done.stderr}"
    wheel = Path(done.stdout.strip())
    assert wheel.parent == out_dir, done.stdout
    return wheel


# A release build, when the README's test has not made one yet, takes minutes.
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_wheel_installs_the_client_and_the_daemon(tmp_path: Path, monkeypatch) -> None:
    wheel = build_wheel(release_binary(), tmp_path / "wheels")

    # The name says the client's version and a manylinux tag for this machine.
    machine = os.uname().machine
    assert re.fullmatch(
        rf"ratekeeper-{re.escape(client_version())}-py3-none-manylinux_2_\d+_{machine}\.whl",
        wheel.name,
    ), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        script = archive.getinfo(f"ratekeeper-{client_version()}.data/scripts/ratekeeper")
        assert stat.S_IMODE(script.external_attr >> 16) == 0o755
        wheel_file = archive.read(f"ratekeeper-{client_version()}.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in wheel_file

    # A fresh virtualenv (no system site packages) and only the wheel in it.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "VIRTUAL_ENV", "RATEKEEPER_"))
    }
    env["PATH"] = os.pathsep.join([str(env_dir / "bin"), env.get("PATH", "")])
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", str(wheel)],
        env=dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1"),
        check=True,
        timeout=120,
    )
    command = shutil.which("ratekeeper", path=env["PATH"])
    assert command == str(env_dir / "bin" / "ratekeeper")
    version = subprocess.run(
        ["ratekeeper", "--version"], env=env, capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("ratekeeper "), version.stdout

    # The installed daemon, on a socket in a private (0700) temporary directory.
    monkeypatch.setenv("RATEKEEPER_BIN", command)
    daemon = Daemon(CONFIG)
    try:
        assert stat.S_IMODE(daemon.dir.stat().st_mode) == 0o700
        daemon.start()  # polls the socket until it answers, within a deadline
        answered = subprocess.run(
            [str(python), "-I", "-c", ACQUIRE_AND_REPORT, daemon.socket],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert answered.returncode == 0, f"{answered.stderr}\n{daemon.log()}"
        result = json.loads(answered.stdout)
        assert Path(result["file"]).is_relative_to(env_dir), result["file"]
        assert result["granted"] == 150  # the prompt plus max_tokens
        assert result["returned"] == 30  # 150 reserved, 120 used
        assert daemon.terminate() == 0, daemon.log()
    except BaseException:
        print(f"\n--- daemon log ---\n{daemon.log()[-6000:]}")
        raise
    finally:
        daemon.close()
