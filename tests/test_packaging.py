"""velvetrope installed the way users install it, and the image's install line.

* The wheel built from this checkout: its package data (the example config and the KEDA
  object, byte for byte the checkout's ``examples/gateway.yaml`` and
  ``deploy/keda/scaledobject.yaml``; the Lua scripts; the engine profiles), no test or
  deploy file, and metadata whose base requirements leave out every extra's packages.
* ``pyproject.toml``'s extras agree with :data:`velvetrope.extras.EXTRA_MODULES`.
* The base install (integration): the pure wheel into a fresh virtualenv, only the gateway's
  dependencies, resolved exactly to ``deploy/constraints.txt``; there ``velvetrope serve``
  serves a real completion in front of a real ``velvetrope engine`` (the OpenAI client),
  ``engine --help``, ``init`` and ``config check`` work, ``simulate``/``plan`` and an exact
  tokenizer exit 2 naming the extra, and the image's compile check fails (pure Python).
* ``deploy/Dockerfile``: it installs the package with no extra under the constraints file,
  runs the compile check after the install (and the check passes on the compiled dev
  install), and every file it COPYs exists and passes the root ``.dockerignore``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import yaml

from harness.wheelenv import (
    CONSTRAINTS,
    build_wheel,
    freeze,
    install,
    make_venv,
    read_constraints,
)
from velvetrope.compiled import compiled_modules
from velvetrope.extras import COMMAND_EXTRA, EXTRA_MODULES, extra_for
from velvetrope.serving import launch

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRA_PACKAGES = frozenset(
    {"numpy", "scipy", "matplotlib", "distributed", "dask", "bpe-openai", "tokenizers"}
)
"""Distributions that only an extra may bring."""
DIST_MODULE = {"bpe-openai": "bpe_openai"}
"""Distribution name -> its import name, where they differ."""


def _requirement_name(req: str) -> str:
    m = re.match(r"[A-Za-z0-9_.-]+", req)
    assert m, req
    return m.group().lower().replace("_", "-")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"), pure=True)


# --------------------------------------------------------------------------- the wheel


def test_the_wheel_ships_the_examples_and_no_repository_files(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        shipped = {
            "velvetrope/data/examples/gateway.yaml": ROOT / "examples" / "gateway.yaml",
            "velvetrope/data/examples/scaledobject.yaml": ROOT / "deploy/keda/scaledobject.yaml",
        }
        for inside, checkout in shipped.items():
            assert z.read(inside) == checkout.read_bytes(), inside
    assert {"velvetrope/py.typed", "velvetrope/store/lua/reserve_leased.lua"} <= names
    assert "velvetrope/engine/profiles/llama3-8b-a100.yaml" in names
    with zipfile.ZipFile(wheel) as z:  # setup.py writes the commit it was built from
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert z.read("velvetrope/BUILD_COMMIT").decode().strip() == head
    tops = {n.split("/")[0] for n in names}
    assert tops == {"velvetrope", "velvetrope-0.1.0.dist-info"}, tops


def test_the_wheels_base_requirements_leave_the_extras_out(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        meta = z.read("velvetrope-0.1.0.dist-info/METADATA").decode()
    base: set[str] = set()
    extras: dict[str, set[str]] = {}
    for line in meta.splitlines():
        if line.startswith("Requires-Dist: "):
            req = line.removeprefix("Requires-Dist: ")
            m = re.search(r"""extra\s*==\s*["']([\w-]+)["']""", req)
            target = extras.setdefault(m.group(1), set()) if m else base
            target.add(_requirement_name(req))
    assert base, "no base requirements in the wheel's metadata"
    assert not base & EXTRA_PACKAGES, base & EXTRA_PACKAGES
    assert {"uvicorn", "pydantic", "redis", "httpx", "typer"} <= base
    assert set(extras) == {*EXTRA_MODULES, "all", "dev", "docs"}
    assert extras["all"] == {"velvetrope"} and extras["dev"] >= {"velvetrope", "pytest"}
    (all_extras,) = PYPROJECT["optional-dependencies"]["all"]
    assert set(all_extras.removeprefix("velvetrope[").rstrip("]").split(",")) == set(EXTRA_MODULES)
    assert "velvetrope[all]" in PYPROJECT["optional-dependencies"]["dev"]


def test_the_extras_table_agrees_with_pyproject() -> None:
    declared = PYPROJECT["optional-dependencies"]
    for extra, modules in EXTRA_MODULES.items():
        dists = {_requirement_name(r) for r in declared[extra]}
        assert {DIST_MODULE.get(d, d) for d in dists} == set(modules), extra
    assert set(COMMAND_EXTRA.values()) <= set(EXTRA_MODULES)


def test_a_missing_module_names_the_extra_that_brings_it() -> None:
    assert extra_for("simulate", "numpy.linalg") == "sim"
    assert extra_for("simulate", "matplotlib") == "sim"  # simulate's own extra has it
    assert extra_for("simulate", "distributed") == "cluster"  # --cluster only
    assert extra_for("plan", "scipy.stats") == "plan"
    assert extra_for("plan", "matplotlib.figure") == "plot"  # plan --plot
    assert extra_for("serve", "bpe_openai") == "tokenizers"
    assert extra_for("serve", "numpy") is None  # the gateway never needs it: a bug, re-raised
    assert extra_for("serve", "yaml") is None  # a base dependency missing: a broken install
    assert extra_for(None, None) is None


# --------------------------------------------------------------------------- the base install


@dataclass
class BaseInstall:
    python: Path
    bin: Path
    workdir: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "velvetrope"), *args],
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def base(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> BaseInstall:
    """The pure wheel in a fresh virtualenv with the base dependencies, as pinned."""
    env = tmp_path_factory.mktemp("base-venv")
    python = make_venv(env / "venv")
    install(python, str(wheel), CONSTRAINTS, compile=False)
    workdir = tmp_path_factory.mktemp("base-work")  # not the checkout: no source on sys.path
    return BaseInstall(python, python.parent, workdir)


@pytest.mark.integration
def test_the_base_install_is_the_constraints_file_and_no_extra(base: BaseInstall) -> None:
    installed = freeze(base.python)
    assert installed == read_constraints(), (
        "deploy/constraints.txt is not what a base install resolves to: run `make constraints`"
    )
    names = {line.split("==")[0] for line in installed}
    assert not names & EXTRA_PACKAGES, names & EXTRA_PACKAGES


@pytest.mark.integration
def test_the_base_install_serves_a_completion(base: BaseInstall) -> None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    version = base.run("--version")  # no git here: the commit the wheel's build wrote
    assert version.returncode == 0 and f"(commit {head})" in version.stdout, version
    out = base.run("init", "conf")
    assert out.returncode == 0, out.stderr
    config = base.workdir / "conf" / "gateway.yaml"
    assert (base.workdir / "conf" / "scaledobject.yaml").exists()
    check = base.run("config", "check", str(config))
    assert check.returncode == 0 and check.stdout.startswith("ok: "), check.stderr
    for command in ("engine", "top"):
        assert base.run(command, "--help").returncode == 0, command
    again = base.run("init", "conf")
    assert again.returncode == 2 and "--force" in again.stderr
    program = [str(base.bin / "velvetrope")]
    eport = launch.free_port()
    engine = launch.start(
        ["engine", "--host", "127.0.0.1", "--port", str(eport), "--speed", "50"],
        f"http://127.0.0.1:{eport}",
        "/health",
        program=program,
    )
    try:
        text = config.read_text()
        for old in set(re.findall(r"http://127\.0\.0\.1:\d+", text)):
            text = text.replace(old, engine.url)
        config.write_text(text)
        port = launch.free_port()
        url = f"http://127.0.0.1:{port}"
        serve = ["serve", "--config", str(config), "--port", str(port)]
        with launch.start(serve, url, "/readyz", program=program):
            client = openai.OpenAI(base_url=url + "/v1", api_key="sk-acme-demo-key")
            reply = client.chat.completions.create(
                model=client.models.list().data[0].id,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=4,
            )
            assert reply.choices[0].message.content
    finally:
        engine.stop()


@pytest.mark.integration
def test_commands_of_a_missing_extra_exit_2_naming_it(base: BaseInstall) -> None:
    listing = base.run("--help")
    assert listing.returncode == 0, listing.stderr
    assert "velvetrope[sim]" in listing.stdout and "serve" in listing.stdout
    for args, extra in (
        (["simulate"], "sim"),
        (["simulate", "--help"], "sim"),
        (["plan", "--profile", "llama3-8b-h100"], "plan"),
    ):
        out = base.run(*args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert f"install 'velvetrope[{extra}]'" in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr
    cfg = yaml.safe_load((ROOT / "examples" / "gateway.yaml").read_text())
    cfg.setdefault("gateway", {})["tokenizer"] = "cl100k_base"
    config = base.workdir / "tokenizer.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = base.run("serve", "--config", str(config))
    assert out.returncode == 2 and "install 'velvetrope[tokenizers]'" in out.stderr, out.stderr


@pytest.mark.integration
def test_the_images_compile_check_fails_on_pure_python_and_passes_compiled(
    base: BaseInstall,
) -> None:
    check = ["-P", "-m", "velvetrope.compiled", str(ROOT / "setup.py")]
    pure = subprocess.run(
        [str(base.python), *check], capture_output=True, text=True, cwd=base.workdir, check=False
    )
    n = len(compiled_modules(ROOT / "setup.py"))
    assert pure.returncode == 1 and f"not compiled ({n} of {n})" in pure.stderr, pure.stderr
    # the dev install (make install) compiles: the same check passes on it
    compiled = subprocess.run(
        [sys.executable, *check], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert compiled.returncode == 0, compiled.stderr
    assert f"{len(compiled_modules(ROOT / 'setup.py'))} compiled modules" in compiled.stdout


# --------------------------------------------------------------------------- the Dockerfile


def _instructions() -> Iterator[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, rest = line.partition(" ")
            yield instr.upper(), rest.strip()


def _dockerignore_admits(path: str) -> bool:
    """Whether the root .dockerignore lets ``path`` into the build context: the last
    pattern matching the path or one of its parent directories decides (``!`` admits)."""
    patterns = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    admitted = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        regex = re.escape(pat).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, p) for p in prefixes):
            admitted = negate
    return admitted


def test_the_dockerignore_reading_is_right() -> None:
    assert _dockerignore_admits("velvetrope/cli.py")
    assert not _dockerignore_admits("tests/test_deploy.py")
    assert not _dockerignore_admits(".venv/bin/python")
    assert not _dockerignore_admits("velvetrope/__pycache__/cli.cpython-311.pyc")
    assert _dockerignore_admits("deploy/constraints.txt")
    assert not _dockerignore_admits("deploy/helm/velvetrope/values.yaml")


def test_the_image_installs_the_base_package_pinned_and_checks_the_compile() -> None:
    steps = list(_instructions())
    runs = [rest for instr, rest in steps if instr == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert len(installs) == 1, installs
    args = installs[0].split("&&")[0].split()
    assert args[:2] == ["pip", "install"]
    assert args[2:] == ["--constraint", "deploy/constraints.txt", "."], (
        "the image installs the package itself, no [extra], under the constraints file"
    )
    check = runs.index("python -P -m velvetrope.compiled setup.py")
    assert check > runs.index(installs[0]), "the compile check runs after the install"
    copied: list[str] = []
    for instr, rest in steps:
        if instr == "COPY" and not rest.startswith("--from"):
            copied += rest.split()[:-1]
    assert {"setup.py", "deploy/constraints.txt", "velvetrope/"} <= set(copied)
    for src in copied:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert _dockerignore_admits(src), f"COPY {src}: .dockerignore leaves it out"
    text = DOCKERFILE.read_text()
    assert re.search(r"# Expected size: about \d+ MB", text), "state the image's size"
    assert "matplotlib" not in text.split("ARG PYTHON_IMAGE")[1].lower()
    assert not (ROOT / "deploy" / "Dockerfile.dockerignore").exists(), "one .dockerignore"
