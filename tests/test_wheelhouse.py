"""`kforge wheelhouse` and `scripts/install.sh --wheelhouse`, offline: real pip against a local folder of wheels."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kforge import wheelhouse
from kforge.cli import app
from kforge.wheelhouse import host_packages, leave_out, target_environment

ROOT = Path(__file__).resolve().parent.parent


def _offline_env(**extra: str) -> dict[str, str]:
    """No pip configuration of this machine (extra indexes, find-links, constraints): only what the test names."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "VIRTUAL_ENV"}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


@pytest.fixture
def offline_pip(monkeypatch):
    for name in [name for name in os.environ if name.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")


def _tiny_project(folder: Path, name: str, dependencies: list[str] = ()) -> Path:
    (folder / name).mkdir(parents=True)
    (folder / name / f"{name}.py").write_text(f"NAME = {name!r}\n")
    (folder / name / "pyproject.toml").write_text(
        textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "1.0"
        dependencies = {list(dependencies)!r}

        [tool.setuptools]
        py-modules = ["{name}"]
        """).replace("'", '"')
    )
    return folder / name


def test_requirements_from_pyproject_leave_torch_out():
    requirements = wheelhouse.project_requirements(ROOT / "pyproject.toml")
    names = {wheelhouse._name(r) for r in requirements}
    for needed in ("prefect", "fastapi", "pandas", "pyarrow", "jinja2", "typer", "openai", "langchain-openai"):
        assert needed in names
    for needed in ("pytest", "ruff", "setuptools", "wheel"):
        assert needed in names
    assert "torch" not in names and "kforge" not in names
    assert "prefect==3.8.8" in requirements  # the pins stay as written


def test_small_toml_reader_matches_tomllib():
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "pyproject.toml").read_text()
    full, small = tomllib.loads(text), wheelhouse.parse_simple_toml(text)
    assert small["project"]["dependencies"] == full["project"]["dependencies"]
    assert small["project"]["optional-dependencies"] == full["project"]["optional-dependencies"]
    assert small["build-system"]["requires"] == full["build-system"]["requires"]
    tricky = 'a = ["x[y]>=1", # a comment ]\n  "z; python_version < \'3.11\'"]  # end\n[t.u]\nb = "#not a comment"\n'
    assert wheelhouse.parse_simple_toml(tricky) == {
        "a": ["x[y]>=1", "z; python_version < '3.11'"],
        "t": {"u": {"b": "#not a comment"}},
    }


def test_target_platform_and_markers():
    tags = wheelhouse.target_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert wheelhouse.target_platforms("macosx_11_0_arm64") == ["macosx_11_0_arm64"]
    nvrtc = "nvidia-cuda-nvrtc==13.0.88; platform_system == 'Linux' and platform_machine == 'x86_64'"
    linux = wheelhouse.target_environment("3.12", "manylinux_2_28_x86_64")
    mac = wheelhouse.target_environment("3.12", "macosx_11_0_arm64")
    assert wheelhouse.for_target([nvrtc, "pandas>=2.2"], linux) == ["nvidia-cuda-nvrtc==13.0.88", "pandas>=2.2"]
    assert wheelhouse.for_target([nvrtc, "pandas>=2.2"], mac) == ["pandas>=2.2"]
    assert wheelhouse.for_target(["tomli; python_version < '3.11'"], linux) == []


def test_wheelhouse_then_offline_install(tmp_path, offline_pip):
    """The same pip calls as on a real machine, with --no-index --find-links a local folder instead of PyPI."""
    index = tmp_path / "index"
    for name in ("kfalpha", "kfbeta"):
        project = _tiny_project(tmp_path / "src", name)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", index, project],
            check=True,
        )
    own = _tiny_project(tmp_path / "src", "kfgamma", ["kfalpha", "kfbeta", "torch>=2.4"])
    assert wheelhouse.project_requirements(own / "pyproject.toml", extras=()) == [
        "kfalpha",
        "kfbeta",
        "setuptools>=61",
        "wheel",
    ]

    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    dest = tmp_path / "wh"
    built = wheelhouse.build_wheelhouse(
        dest,
        python_version=python,
        platform="manylinux_2_28_x86_64",
        requirements=["kfalpha", "kfbeta>=1.0; platform_system == 'Linux'", "kfdelta; platform_system == 'Windows'"],
        find_links=[index],
        project=own,
        build_isolation=False,  # no setuptools wheel offline: this environment's builds it
    )
    names = sorted(w.name.split("-")[0] for w in built.wheels)
    assert names == ["kfalpha", "kfbeta", "kfgamma"]
    assert built.own_wheel and built.own_wheel.name.startswith("kfgamma-1.0-")
    listed = [line for line in built.requirements_file.read_text().splitlines() if not line.startswith("#")]
    assert listed == ["kfalpha", "kfbeta>=1.0"]
    assert f"3 wheels for cp{python.replace('.', '')} manylinux_2_28_x86_64 in {dest}" in built.summary()

    venv = tmp_path / "venv"
    result = subprocess.run(
        ["bash", ROOT / "scripts" / "install.sh", "--wheelhouse", dest, "--requirements-only"],
        env=_offline_env(KFORGE_VENV=str(venv), PYTHON=sys.executable),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == f"kforge's requirements installed from {dest} into {venv}"
    imported = subprocess.run(
        [venv / "bin" / "python", "-c", "import kfalpha, kfbeta; print(kfalpha.NAME, kfbeta.NAME)"],
        capture_output=True,
        text=True,
    )
    assert imported.stdout.strip() == "kfalpha kfbeta", imported.stderr


def test_failed_download_is_one_line_and_exit_1(tmp_path, offline_pip):
    (tmp_path / "index").mkdir()
    with pytest.raises(wheelhouse.WheelhouseError) as failure:
        wheelhouse.build_wheelhouse(
            tmp_path / "wh", requirements=["kfnowhere"], find_links=[tmp_path / "index"], project=None
        )
    assert str(failure.value).startswith("pip download failed: ERROR: ")
    assert "kfnowhere" in str(failure.value) and "\n" not in str(failure.value)

    result = CliRunner().invoke(
        app, ["wheelhouse", "--python", "3.12", "--find-links", str(tmp_path / "index"), str(tmp_path / "wh")]
    )
    assert result.exit_code == 1
    assert result.output.startswith("error: pip download failed: ERROR: ") and result.output.count("\n") == 1
    bad = CliRunner().invoke(app, ["wheelhouse", "--python", "twelve", str(tmp_path / "wh")])
    assert bad.exit_code == 1 and "--python 'twelve'" in bad.output


def test_install_script_without_torch_says_so_in_one_line(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "kforge-requirements.txt").write_text("")
    script = ["bash", ROOT / "scripts" / "install.sh"]
    stub = tmp_path / "bin"  # an nvidia-smi that fails: a plain venv, without a GPU host's torch, wherever this runs
    stub.mkdir()
    (stub / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
    (stub / "nvidia-smi").chmod(0o755)
    path = f"{stub}{os.pathsep}{os.environ['PATH']}"
    env = _offline_env(KFORGE_VENV=str(tmp_path / "venv"), PATH=path)
    misused = subprocess.run([*script, "--requirements-only"], env=env, capture_output=True, text=True)
    assert misused.returncode == 2 and "goes with --wheelhouse" in misused.stderr
    result = subprocess.run([*script, "--wheelhouse", wh], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: no torch in {tmp_path / 'venv'}: ") and result.stderr.count("\n") == 1


def fake_wheel(folder: Path, name: str, version: str, requires: list[str] = ()) -> Path:
    """A wheel holding only its METADATA (what leave_out reads)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
    return path


def test_wheels_of_packages_the_gpu_host_has_in_an_accepted_version_are_left_out(tmp_path):
    freeze = "numpy==2.5.2\nPandas==3.0.0\ncertifi==2026.7.22\npackaging==26.3\nh2==2.0.0\nprefect\n"
    freeze += "# a comment\n-e git+https://x/y\npyarrow @ file:///w\nkforge==0.0.1\n"
    fake_wheel(tmp_path, "pandas", "3.1.1", ["numpy>=2", 'pytz; python_version < "3.0"'])
    fake_wheel(tmp_path, "numpy", "2.5.5")
    fake_wheel(tmp_path, "langchain_core", "1.2.0", ["certifi>=2026.10.19", "packaging<27"])
    fake_wheel(tmp_path, "certifi", "2026.11.1")
    fake_wheel(tmp_path, "packaging", "26.4")
    fake_wheel(tmp_path, "httpx", "0.28.1", ['h2<5,>=3; extra == "http2"'])
    fake_wheel(tmp_path, "h2", "4.3.0")
    fake_wheel(tmp_path, "pyarrow", "26.0.1")
    fake_wheel(tmp_path, "prefect", "3.8.8", ["httpx[http2]>=0.23"])
    fake_wheel(tmp_path, "kforge", "0.1.0")

    installed = host_packages(freeze)
    top = ["pandas>=3", "langchain-core", "prefect==3.8.8", "pyarrow>=15"]
    dropped = leave_out(
        tmp_path, installed, keep=["kforge"], top=top, environment=target_environment("3.12", "manylinux_2_28_x86_64")
    )

    assert installed["pandas"] == "3.0.0" and installed["pyarrow"] is None and installed["prefect"] is None
    assert "comment" not in str(installed) and len(installed) == 8
    # numpy, pandas and packaging: the host's versions fit every requirement on them.
    assert sorted(p.name.split("-")[0] for p in dropped) == ["numpy", "packaging", "pandas"]
    # certifi: langchain-core wants a newer one; h2: httpx[http2] (asked by prefect) wants >=3; pyarrow and
    # prefect: the host's version is not known; kforge: its own.
    left = sorted(p.name.split("-")[0] for p in tmp_path.glob("*.whl"))
    assert left == ["certifi", "h2", "httpx", "kforge", "langchain_core", "prefect", "pyarrow"]
