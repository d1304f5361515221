"""The package as a user installs it, from outside the repository, each time into a fresh venv,
then used against a real server: the wheel that ``python -m build`` makes (and ``twine check``
passes: build-dist.sh), and the README's install commands (a git URL with ``#subdirectory``, a
path relative to the user's project)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import info

HERE = Path(__file__).resolve().parents[1]

# Run by the installed package, in its venv: it must come from site-packages, not the repository.
USE = r"""
import sys
import redis_lock_client
from redis_lock_client import LockClient
assert "site-packages" in redis_lock_client.__file__, redis_lock_client.__file__
with LockClient.from_url(sys.argv[1]) as client:
    with client.lock(sys.argv[2]) as guard:
        print(redis_lock_client.__version__, guard.owner.decode(), guard.token)
"""


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def fresh_venv(where: Path) -> str:
    run([sys.executable, "-m", "venv", str(where)], cwd=where.parent)
    return str(where / "bin" / "python")


def use(python: str, server_url: str, key: str, cwd: Path) -> list[str]:
    from redis_lock_client import __version__

    version, owner, token = run([python, "-c", USE, server_url, key], cwd=cwd).split()
    assert version == __version__ and int(token) > 0 and ":" in owner
    return [version, owner, token]


def test_the_built_wheel_installs_from_outside_the_repository_and_locks(server, key, tmp_path):
    built = run(["bash", str(HERE / "build-dist.sh")], cwd=HERE).split()
    wheels = [f for f in built if f.endswith(".whl")]
    assert len(wheels) == 1 and any(f.endswith(".tar.gz") for f in built), built
    python = fresh_venv(tmp_path / "venv")
    run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheels[0]],
        cwd=tmp_path)
    use(python, server.url, key, tmp_path)
    assert info(server, key) is None  # released


def _readme_install_commands() -> list[str]:
    readme = (HERE / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert block is not None
    return [line.strip() for line in block.group(1).splitlines()
            if line.strip().startswith("pip install")]


def test_the_readmes_install_commands_work_from_outside_the_repository(server, key, tmp_path):
    # What a user has: a clone of the repository (here: the library as it is now, committed in a
    # repository of its own), and a project beside it, in whose directory the commands run.
    repo = tmp_path / "redis-lock"
    shutil.copytree(HERE, repo / "clients" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*"))
    run(["git", "init", "-q"], cwd=repo)
    run(["git", "add", "-A"], cwd=repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"], cwd=repo)
    project = tmp_path / "my-service"
    project.mkdir()
    commands = _readme_install_commands()
    url_form = [c for c in commands if "git+" in c]
    path_form = [c for c in commands if "../redis-lock/clients/python" in c]
    assert len(url_form) == 1 and len(path_form) == 1, commands
    for n, command in enumerate(url_form + path_form):
        # file://localhost/...: the pip of Python 3.11's venv reads no empty host in a URL
        # requirement (an https:// URL of a git host has one).
        command = command.replace("<repository URL>", f"file://localhost{repo}")
        python = fresh_venv(tmp_path / f"venv{n}")
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        run(["bash", "-c", " ".join(pip) + command[len("pip install"):]], cwd=project)
        use(python, server.url, f"{key}:{n}", project)
        # The same form as a line of the project's requirements.txt.
        requirement = command[len("pip install"):].strip().strip('"')
        (project / "requirements.txt").write_text(requirement + "\n")
        run(pip + ["--force-reinstall", "--no-deps", "-r", "requirements.txt"], cwd=project)
        use(python, server.url, f"{key}:{n}:r", project)
