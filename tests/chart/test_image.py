"""The Dockerfile, read as a reviewer would (no Docker engine here to build it).

Building the image is checked on a machine with Docker (``docker build .``); what can
be checked without one is that the image and the pods agree: the user id, the
commands the chart and the operator run, and what the build context lets in.
"""

from __future__ import annotations

import re
from pathlib import Path

from keyshift.controller.kubernetes.objects import WORKER_UID
from tests.chart.render import one, render
from tests.support import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def stages() -> list[list[str]]:
    """The instructions of each stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def test_multi_stage_slim_and_no_build_tools_in_the_final_image() -> None:
    *builders, final = stages()
    assert builders, "a build stage keeps the compilers out of the final image"
    assert re.match(r"FROM python:\$\{PYTHON_VERSION\}-slim", final[0])
    assert not any(i.upper().startswith("RUN") and "apt-get install" in i for i in final)
    assert any("build-essential" in i for stage in builders for i in stage)


def test_the_image_runs_as_the_user_the_pods_run_as() -> None:
    final = stages()[-1]
    (user,) = [i.split()[1] for i in final if i.upper().startswith("USER ")]
    uid = user.split(":")[0]
    assert uid == str(WORKER_UID) != "0"
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == WORKER_UID


def test_the_commands_the_pods_run_are_on_the_path() -> None:
    final = " ".join(stages()[-1])
    assert "PATH=/opt/keyshift/bin:$PATH" in final  # `keyshift` and the venv's `python`
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["keyshift"]
    assert "PYTHONPATH=/app" in final and "COPY --from=build /app /app" in final  # examples


def test_the_build_context_has_what_the_dockerfile_copies() -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    copied = [
        source.rstrip("/")
        for instruction in stages()[0]
        if instruction.startswith("COPY ") and "--from" not in instruction
        for source in instruction.split()[1:-1]
    ]
    assert copied
    for source in copied:
        assert source in allowed, f"{source} is copied but .dockerignore leaves it out"
        assert Path(REPO / source).exists(), source


def test_the_image_installs_a_wheel_with_the_hot_modules_compiled() -> None:
    """``pip install .`` builds the wheel through hatch_build.py, which compiles the
    per-record path with mypyc; without the hook the build fails, without a C compiler
    the image would be pure Python (tests/test_compiled.py)."""
    build = stages()[0]
    copies = [i for i in build if i.startswith("COPY ") and "--from" not in i]
    installs = [n for n, i in enumerate(build) if "pip install ." in i]
    assert installs
    hook = [n for n, i in enumerate(build) if i in copies and "hatch_build.py" in i.split()]
    assert hook and hook[0] < installs[0], "hatch_build.py is copied before the install"
    assert "KEYSHIFT_COMPILE=0" not in " ".join(build)
    assert any("build-essential" in i for i in build[: installs[0]])
