"""Every command in the README's and the manual's shell blocks runs as
written, or says why not; every relative link in them leads to a file.

The README and the manual (`docs/*.md`, the client's own README) are the
first thing a user copies from. Each line of their ```sh and ```console
blocks is either run here, page after page (the README first, then `docs/`
in name order, then `clients/python/README.md`), in order, from the
repository root (the client's README from its own directory), or it matches
an entry of `NOT_RUN` with the reason: `ratekeeper` is the binary the
README's own `cargo install` line installed (into a scratch directory first
on PATH), `pip` is a fresh virtualenv's, the daemon's socket is in a
temporary directory, and the README's `serve` line runs in the background
until the last command. A new command on any page fails
`test_every_command_is_run_or_excused` until it is one or the other, and an
excuse no command needs any more fails it too. A ```console block's output
must be exactly what the command prints.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
CLIENT_README = ROOT / "clients" / "python" / "README.md"


def pages() -> list:
    """The pages whose commands run, in the order they run: the README, the
    manual's pages, the client's README."""
    return [README, *sorted((ROOT / "docs").glob("*.md")), CLIENT_README]


def workdir(page: Path) -> Path:
    """Where a page's commands run: the client's README speaks from its own
    directory, every other page from the repository root."""
    return page.parent if page == CLIENT_README else ROOT


#: Pages whose relative links must lead to a file (with the pages above).
LINKED_PAGES = [ROOT / "bench" / "README.md", ROOT / "bench" / "provider" / "MEASUREMENTS.md"]

#: Commands that cannot run here, by a pattern of their start, with why.
NOT_RUN = {
    r"scripts/test": "the command that runs this test",
    r"sudo ": "installs into the machine's /etc and /usr/local and needs systemd as PID 1; "
    "tests/it/deploy_examples.rs checks the unit and its config (systemd-analyze verify)",
    r"echo '[^']*' \| sudo ": "part of the systemd installation (see sudo)",
    r"kubectl ": "needs a Kubernetes cluster; tests/it/deploy_examples.rs checks the manifests",
    r"RATEKEEPER_SOCKET=\$RK/[ab]\.sock ratekeeper ": "the quick start's two sidecars need a "
    "Redis at 127.0.0.1:6379; clients/python/tests/test_redis.py runs two sidecars on one Redis",
    r"export RK=": "the quick start's directory for its two sockets (see the lines after it)",
    r"python3 -m venv \.\./\.\./target/python-venv$": "the development virtualenv these tests "
    "run in: making it again would change it under them",
    r"\.\./\.\./target/python-venv/bin/pip install ": "installs into the development "
    "virtualenv these tests run in",
    r"cargo build$": "the debug daemon the client's tests start; built before they run",
    r"\.\./\.\./target/python-venv/bin/pytest": "the test suite this test is part of",
    r"python scripts/unasync\.py$": "rewrites the generated files in place; its `--check` line "
    "runs instead",
}

#: What a command's output must match, where the README says what it prints
#: in a comment rather than a ```console block.
OUTPUT_PATTERNS = {
    "ratekeeper --version": r"ratekeeper \d+\.\d+\.\d+ \([0-9a-f]{7,}\)\n",
}


@dataclass
class Command:
    line: int
    text: str
    #: A ```console block's output, else None.
    output: Optional[str]
    #: The page it is on.
    page: Path = README


@dataclass
class Block:
    line: int
    commands: list


def blocks(page: Path = README) -> list:
    """A page's shell blocks, each with its commands (continuation lines
    joined, comments dropped)."""
    found = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        fence = re.fullmatch(r"```(sh|console)", lines[index])
        index += 1
        if not fence:
            continue
        start, body = index, []
        while not lines[index].startswith("```"):
            body.append(lines[index])
            index += 1
        index += 1
        parse = _console if fence.group(1) == "console" else _shell
        commands = parse(start, body)
        for command in commands:
            command.page = page
        found.append(Block(start, commands))
    return found


def all_commands() -> list:
    """Every page's commands, in the order they run."""
    return [command for page in pages() for block in blocks(page) for command in block.commands]


def _shell(start: int, body: list) -> list:
    commands, pending, first = [], "", 0
    for offset, line in enumerate(body):
        text = _without_comment(line).rstrip()
        if not pending:
            first = start + offset + 1
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        text = (pending + text).strip()
        pending = ""
        if text:
            commands.append(Command(first, text, None))
    return commands


def _console(start: int, body: list) -> list:
    commands: list = []
    pending, first = "", 0
    for offset, line in enumerate(body):
        if line.startswith("$ ") or pending:
            if not pending:
                first = start + offset + 1
            text = line[2:] if line.startswith("$ ") else line
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            commands.append(Command(first, (pending + text).strip(), ""))
            pending = ""
        else:
            commands[-1].output += line + "\n"
    return commands


def _without_comment(line: str) -> str:
    """The line up to a `#` that starts a shell comment (outside quotes)."""
    quote = None
    for position, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position]
    return line


def excuse(command: Command) -> Optional[str]:
    for pattern, reason in NOT_RUN.items():
        if re.match(pattern, command.text):
            return reason
    return None


def test_every_command_is_run_or_excused() -> None:
    readme = [command for block in blocks() for command in block.commands]
    assert len(readme) >= 5, "the README's shell blocks were not found"
    assert len(pages()) >= 10, "the manual's pages in docs/ were not found"
    commands = all_commands()
    assert len(commands) >= 20, "the pages' shell blocks were not found"
    assert any(excuse(command) is None for command in commands)
    for page in (README, ROOT / "docs" / "deployment.md", CLIENT_README):
        assert any(command.page == page for command in commands), f"no commands in {page}"
    for pattern in NOT_RUN:
        assert any(re.match(pattern, command.text) for command in commands), (
            f"NOT_RUN excuses {pattern!r}, which no command of the pages needs any more"
        )


def test_the_readme_parser_reads_blocks_as_a_shell_would() -> None:
    text = "echo '# kept' \\\n    | cat   # dropped\n# only a comment\n"
    commands = _shell(10, text.splitlines())
    assert [(c.line, c.text) for c in commands] == [(11, "echo '# kept'      | cat")]
    console = _console(3, ["$ echo a \\", "    b", "a b", "$ true"])
    assert [(c.line, c.text, c.output) for c in console] == [
        (4, "echo a      b", "a b\n"),
        (7, "true", ""),
    ]


@pytest.fixture
def shell_env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """PATH with a fresh virtualenv's `pip` (nothing installed yet) and the bin
    directory `cargo install` fills, and a private socket for the daemon."""
    scratch = tmp_path_factory.mktemp("readme")
    env_dir = scratch / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join([str(env_dir / "bin"), env["PATH"]])
    env["RATEKEEPER_SOCKET"] = str(scratch / "ratekeeper.sock")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # `cargo install` puts the binary into a bin directory of the scratch
    # space, first on PATH, so the commands after it run what it installed;
    # it builds in the repository's target directory, where `cargo build
    # --release` then finds its work done.
    env["CARGO_INSTALL_ROOT"] = str(scratch / "cargo")
    env["CARGO_TARGET_DIR"] = env.get("CARGO_TARGET_DIR", str(ROOT / "target"))
    env["PATH"] = os.pathsep.join([str(scratch / "cargo" / "bin"), env["PATH"]])
    env["RATEKEEPER_README_SCRATCH"] = str(scratch)
    return env


# Its `cargo install` is a release build from scratch on a clean clone:
# minutes on two cores, more on a busy machine, beyond the suite's 600 s.
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_readme_commands_run_as_written(shell_env: dict) -> None:
    """The pages' commands in their order, as a reader runs them: the `serve`
    line of the README's "Run it" keeps running (in the background) for the
    blocks after it, on every later page too."""
    daemon = None
    try:
        for command in all_commands():
            if excuse(command) is not None:
                continue
            where = f"{command.page.relative_to(ROOT)}:{command.line}: {command.text}"
            if command.text.startswith("ratekeeper serve"):
                assert daemon is None, f"{where}: a second `serve` line"
                daemon = _start(command.text, shell_env, where)
                continue
            done = subprocess.run(
                ["bash", "-c", f"set -o pipefail; {command.text}"],
                cwd=workdir(command.page),
                env=shell_env,
                capture_output=True,
                text=True,
                # A release build on two cores takes minutes.
                timeout=1800,
            )
            assert done.returncode == 0, (
                f"{where}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
            )
            if command.output is not None:
                assert done.stdout == command.output, where
            pattern = OUTPUT_PATTERNS.get(command.text)
            if pattern is not None:
                assert re.fullmatch(pattern, done.stdout), f"{where}: printed {done.stdout!r}"
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
    assert daemon is not None, "no `ratekeeper serve` line was run"
    assert daemon.returncode == 0, f"serve exited {daemon.returncode}\n{_log(shell_env)}"


def _start(text: str, env: dict, where: str) -> subprocess.Popen:
    """Starts a page's `serve` line and waits until `ratekeeper ping` answers."""
    log = open(Path(env["RATEKEEPER_README_SCRATCH"]) / "serve.log", "w")  # noqa: SIM115 (closed by the caller)
    daemon = subprocess.Popen(
        ["bash", "-c", f"exec {text}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            pytest.fail(f"{where}: exited {daemon.returncode}\n{_log(env)}")
        ping = subprocess.run(["ratekeeper", "ping"], env=env, capture_output=True)
        if ping.returncode == 0:
            return daemon
        time.sleep(0.05)
    daemon.kill()
    pytest.fail(f"{where}: no answer to `ratekeeper ping` within 30 s")


def _log(env: dict) -> str:
    return (Path(env["RATEKEEPER_README_SCRATCH"]) / "serve.log").read_text()


#: A Markdown link's target: `[text](target)` or `[text](target "title")`.
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(page: Path) -> list:
    """(line, target) of every inline link on a page, outside code blocks
    and code spans."""
    found, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        prose = re.sub(r"(`+)(?:(?!\1).)+\1", "", line)
        found.extend((number, match.group(1)) for match in LINK.finditer(prose))
    return found


def anchors(page: Path) -> set:
    """The anchors a page's headings get, as GitHub makes them: lower case,
    punctuation dropped, spaces to hyphens, a repeated one numbered."""
    seen: dict = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.*)", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
    return {
        slug if n == 0 else f"{slug}-{n}" for slug, count in seen.items() for n in range(count + 1)
    }


def test_every_relative_link_leads_to_a_file() -> None:
    """A link of the README, the manual, the client's README or the
    benchmarks' list names a file or directory that exists, and an anchor
    into a Markdown file names one of its headings."""
    checked = 0
    broken = []
    for page in [*pages(), *LINKED_PAGES]:
        for number, target in links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto: ...
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            checked += 1
            if not file.exists():
                broken.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where}: no heading #{anchor}")
            elif ROOT not in file.parents and file != ROOT:
                broken.append(f"{where}: outside the repository")
    assert checked >= 100, "the pages' links were not found"
    assert not broken, "\n".join(broken)


def test_the_link_reader_skips_code_and_knows_headings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A `code` title: here\n## Again\n## Again\n"
        '[a](b.md#c) `[x](not-a-link)` [[leases]](#a-code-title-here "t")\n'
        "```sh\n[y](not-either)\n```\n"
    )
    assert links(page) == [(4, "b.md#c"), (4, "#a-code-title-here")]
    assert anchors(page) == {"a-code-title-here", "again", "again-1"}
