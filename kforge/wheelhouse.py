"""A folder of wheels for a GPU host without internet (`kforge wheelhouse DIR`).

On a machine with internet, `build_wheelhouse` downloads, for a target Python and platform, the wheels of
everything kforge needs except torch: the `[project] dependencies` of pyproject.toml, the `llm` and `dev`
extras and the build requirements (setuptools, wheel, for the offline editable install), resolved with their
own dependencies by `pip download --only-binary=:all:`. torch is left out because the GPU host has its own
CUDA build; nothing else here depends on torch, so its dependencies (nvidia-*, triton, ...) stay out too,
unless kforge names one itself (the `dev` extra's nvidia-cuda-nvrtc). It also builds kforge's own wheel
and writes DIR/kforge-requirements.txt, which `scripts/install.sh --wheelhouse DIR` installs with no index.

pyproject.toml is read with tomllib (Python 3.11+), else tomli when installed, else a small reader that
understands the part of TOML these requirement lists use (tables, strings, arrays of strings).
"""

from __future__ import annotations

import ast
import email.parser
import platform as host_platform
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS_FILE = "kforge-requirements.txt"
EXTRAS = ("llm", "dev")
# The GPU host brings its own CUDA torch; pulling it (and its nvidia-* wheels, gigabytes) would replace it.
EXCLUDED = frozenset({"torch"})
# Needed offline by the editable install (`pip install --no-build-isolation -e .`).
BUILD_TOOLS = ("wheel",)


class WheelhouseError(RuntimeError):
    """A step failed; the message is one line naming it (pip's last line when pip failed)."""


@dataclass
class Wheelhouse:
    dest: Path
    wheels: list[Path]
    requirements_file: Path
    own_wheel: Path | None
    python_version: str
    platforms: list[str]
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        own = f", {self.own_wheel.name}" if self.own_wheel else ""
        return (
            f"{len(self.wheels)} wheels for cp{self.python_version.replace('.', '')} {self.platforms[0]} "
            f"in {self.dest} ({REQUIREMENTS_FILE}{own}); on the GPU host: bash scripts/install.sh --wheelhouse "
            f"{self.dest}"
        )


# pyproject.toml


def load_toml(path: Path) -> dict:
    text = path.read_text()
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return parse_simple_toml(text)
    return tomllib.loads(text)


def _logical_lines(text: str) -> Iterable[str]:
    """Lines with comments removed and the newlines inside brackets joined (strings respected)."""
    line: list[str] = []
    depth, quote, i = 0, "", 0
    while i < len(text):
        c = text[i]
        if quote:
            line.append(c)
            if c == "\\" and quote == '"' and i + 1 < len(text):
                line.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
            line.append(c)
        elif c == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif c == "\n":
            if depth > 0:
                line.append(" ")
            else:
                yield "".join(line).strip()
                line = []
        else:
            depth += c == "["
            depth -= c == "]"
            line.append(c)
        i += 1
    yield "".join(line).strip()


def parse_simple_toml(text: str) -> dict:
    """Tables with string and string-array values: enough for pyproject's requirement lists (Python 3.10)."""
    data: dict = {}
    table = data
    for line in _logical_lines(text):
        if not line:
            continue
        header = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\]", line)
        if header:
            table = data
            for part in header.group(1).split("."):
                table = table.setdefault(part.strip().strip("\"'"), {})
            continue
        if line.startswith("[["):  # arrays of tables: not needed, kept apart
            table = {}
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            continue  # numbers, booleans, inline tables: not needed here
        if isinstance(parsed, str) or (isinstance(parsed, list) and all(isinstance(v, str) for v in parsed)):
            table[key.strip().strip("\"'")] = parsed
    return data


def _name(requirement: str) -> str:
    try:
        name = Requirement(requirement).name
    except InvalidRequirement as exc:
        raise WheelhouseError(f"pyproject.toml: cannot read the requirement {requirement!r} ({exc})") from None
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(pyproject: Path | None = None, extras: Sequence[str] = EXTRAS) -> list[str]:
    """kforge's dependencies, the given extras' and the build requirements, without torch, as written."""
    pyproject = pyproject or PROJECT_ROOT / "pyproject.toml"
    try:
        data = load_toml(pyproject)
    except OSError as exc:
        raise WheelhouseError(f"{pyproject}: {exc.strerror} (run from a kforge checkout)") from None
    project = data.get("project", {})
    listed = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise WheelhouseError(f"{pyproject}: no extra {extra!r} in [project.optional-dependencies]")
        listed += optional[extra]
    listed += list(data.get("build-system", {}).get("requires", [])) + list(BUILD_TOOLS)
    own = _name(project.get("name", "kforge"))
    requirements, seen = [], set()
    for requirement in listed:
        if _name(requirement) in EXCLUDED | {own} or requirement in seen:
            continue
        seen.add(requirement)
        requirements.append(requirement)
    return requirements


# the target


def target_platforms(platform: str) -> list[str]:
    """The platform tag and the older manylinux tags a host with that glibc also runs (pip adds none of them)."""
    legacy = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform) or re.fullmatch(
        r"(manylinux2014|manylinux2010|manylinux1)_(\w+)", platform
    )
    if not match:
        return [platform]
    glibc = legacy.get(match.group(1)) or int(match.group(1))
    arch = match.group(2)
    tags = [platform]
    for minor in range(glibc, 4, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        for name, legacy_minor in legacy.items():
            if legacy_minor == minor:
                tags.append(f"{name}_{arch}")
    return list(dict.fromkeys(tags))


def target_environment(python_version: str, platform: str) -> dict[str, str]:
    """Environment-marker values of the target, for deciding which of kforge's requirements apply there."""
    env = {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    linux = re.fullmatch(r"(?:(?:many|musl)linux_\d+_\d+|manylinux\w*?|linux)_(x86_64|i686|aarch64|\w+)", platform)
    if linux:
        arch = linux.group(1)
        env.update(sys_platform="linux", platform_system="Linux", os_name="posix", platform_machine=arch)
    elif platform.startswith("macosx"):
        machine = platform.rsplit("_", 1)[-1]
        env.update(sys_platform="darwin", platform_system="Darwin", os_name="posix", platform_machine=machine)
    elif platform.startswith("win"):
        machine = {"win_amd64": "AMD64", "win32": "x86", "win_arm64": "ARM64"}.get(platform, "")
        env.update(sys_platform="win32", platform_system="Windows", os_name="nt", platform_machine=machine)
    return env


def for_target(requirements: Iterable[str], environment: dict[str, str]) -> list[str]:
    """The requirements whose markers hold on the target, markers removed (pip would judge them on this host)."""
    selected = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            requirement.marker = None
            selected.append(str(requirement))
    return selected


def _host_notes(python_version: str, platforms: list[str]) -> list[str]:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    host_linux = sys.platform == "linux" and host_platform.machine() == target_environment(
        python_version, platforms[0]
    ).get("platform_machine")
    if here == python_version and host_linux:
        return []
    return [
        f"note: pip judges the dependencies' environment markers for this Python ({here}, {sys.platform} "
        f"{host_platform.machine()}); for an exact wheelhouse run this with Python {python_version} on the target's "
        "OS and architecture"
    ]


# pip


def _pip(args: Sequence[str], what: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line.strip() for line in (result.stderr + "\n" + result.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR:")]
        last = (errors or lines or [f"pip exited with {result.returncode}"])[-1]
        raise WheelhouseError(f"{what} failed: {last}")


def host_packages(text: str) -> dict[str, str | None]:
    """Normalized name -> version from `pip list --format freeze` (or `pip freeze`) of a host; None where a
    line gives no version (a bare name, `name @ URL`)."""
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:===?\s*([^\s;]+))?", line)
        if match and not line.startswith("-"):
            found[_name(match.group(1))] = match.group(2)
    return found


def _wheel_parts(wheel: Path) -> tuple[str, str]:
    name, version = wheel.name.split("-")[:2]
    return _name(name), version


def _wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if not metadata:
            return []
        message = email.parser.BytesParser().parsebytes(archive.read(metadata[0]), headersonly=True)
    return list(message.get_all("Requires-Dist") or [])


def _applies(requirement: Requirement, environment: dict[str, str], extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**environment, "extra": extra}) for extra in extras | {""})


def requirements_on(dest: Path, top: Sequence[str], environment: dict[str, str]) -> dict[str, list[Requirement]]:
    """Every requirement on each package, from `top` (kforge's) and from the Requires-Dist of the wheels in
    `dest` that the install reaches (each wheel with the extras asked of it), markers judged for the target."""
    wheels = {_wheel_parts(w)[0]: w for w in dest.glob("*.whl")}
    on: dict[str, list[Requirement]] = {}
    extras_of: dict[str, set[str]] = {}
    queue = [Requirement(text) for text in top]
    while queue:
        requirement = queue.pop()
        name = _name(str(requirement))
        on.setdefault(name, []).append(requirement)
        new_extras = set(requirement.extras) - extras_of.get(name, set())
        if name in extras_of and not new_extras:
            continue
        extras_of[name] = extras_of.get(name, set()) | set(requirement.extras)
        if name in wheels:
            for text in _wheel_requires(wheels[name]):
                child = Requirement(text)
                if _applies(child, environment, extras_of[name]):
                    queue.append(child)
    return on


def leave_out(
    dest: Path,
    installed: dict[str, str | None],
    keep: Sequence[str] = (),
    top: Sequence[str] = (),
    environment: dict[str, str] | None = None,
) -> list[Path]:
    """Delete the wheels in `dest` of packages the GPU host already has (`installed`) in a version that every
    requirement on that package accepts (kforge's `top` ones and those of the wheels here); keep `keep`
    (kforge's own wheel) and any package whose host version is unknown or refused: the host's certifi
    2026.7 stays beside a wheelhouse certifi when langchain-core wants >=2026.10. Returns what was left out."""
    environment = environment or target_environment(f"{sys.version_info[0]}.{sys.version_info[1]}", "linux_x86_64")
    on = requirements_on(dest, top, environment)
    kept = {_name(name) for name in keep}
    dropped = []
    for wheel in sorted(dest.glob("*.whl")):
        name, wheel_version = _wheel_parts(wheel)
        host_version = installed.get(name)
        if name in kept or host_version is None:
            continue
        try:
            version = Version(host_version)
        except InvalidVersion:
            continue
        accepted = host_version == wheel_version or all(
            r.specifier.contains(version, prereleases=True) for r in on.get(name, [])
        )
        if accepted:
            wheel.unlink()
            dropped.append(wheel)
    return dropped


def build_wheelhouse(
    dest: Path | str,
    python_version: str | None = None,
    platform: str = "manylinux_2_28_x86_64",
    requirements: Sequence[str] | None = None,
    find_links: Sequence[Path | str] = (),
    project: Path | str | None = PROJECT_ROOT,
    build_isolation: bool = True,
) -> Wheelhouse:
    """Download the wheels for `requirements` (default: kforge's, without torch) into dest, for the target.

    `find_links`: take wheels only from these folders (`--no-index`), e.g. a local mirror. `project`: a
    checkout whose wheel is built into dest (None: none); its build requirements are taken from dest
    itself, with no index, unless `build_isolation` is False (then this environment's setuptools builds it)."""
    python_version = python_version or f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not re.fullmatch(r"3\.\d{1,2}", python_version):
        raise WheelhouseError(f"--python {python_version!r}: give a CPython version like 3.12")
    if not re.fullmatch(r"[a-z0-9_]+", platform):
        raise WheelhouseError(f"--platform {platform!r}: give a platform tag like manylinux_2_28_x86_64")
    dest = Path(dest).expanduser().resolve()
    dest.mkdir(parents=True, exist_ok=True)
    if requirements is None:
        pyproject = Path(project) / "pyproject.toml" if project else None
        requirements = project_requirements(pyproject)
    platforms = target_platforms(platform)
    selected = for_target(requirements, target_environment(python_version, platform))
    sources = [arg for folder in find_links for arg in ("--find-links", str(Path(folder).resolve()))]
    sources = ["--no-index", *sources] if find_links else []

    target = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    target += [arg for tag in platforms for arg in ("--platform", tag)]
    _pip(["download", "-q", *target, *sources, "-d", str(dest), *selected], "pip download")
    requirements_file = dest / REQUIREMENTS_FILE
    requirements_file.write_text(
        f"# kforge's requirements without torch, for CPython {python_version} on {platform}; install with\n"
        f"# pip install --no-index --find-links DIR -r DIR/{REQUIREMENTS_FILE}\n" + "".join(f"{r}\n" for r in selected)
    )

    own_wheel = None
    if project is not None:
        isolation = ["--no-index", "--find-links", str(dest), *sources] if build_isolation else ["--no-build-isolation"]
        _pip(["wheel", "-q", "--no-deps", *isolation, "-w", str(dest), str(Path(project).resolve())], "pip wheel")
        name = _name(load_toml(Path(project) / "pyproject.toml").get("project", {}).get("name", "kforge"))
        built = [w for w in dest.glob("*.whl") if _name(w.name.split("-")[0]) == name]
        own_wheel = max(built, key=lambda w: w.stat().st_mtime) if built else None
    return Wheelhouse(
        dest=dest,
        wheels=sorted(dest.glob("*.whl")),
        requirements_file=requirements_file,
        own_wheel=own_wheel,
        python_version=python_version,
        platforms=platforms,
        notes=_host_notes(python_version, platforms),
    )
