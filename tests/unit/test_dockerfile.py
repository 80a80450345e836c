"""deploy/docker/Dockerfile and .dockerignore, checked by parsing (no docker daemon on CI), and the
image the Kubernetes manifests run is the one the Dockerfile documents and runs as its user."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per line, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(ins)
    return found


def test_multi_stage_with_the_base_image_a_build_argument():
    args = [rest for word, rest in instructions() if word == "ARG"]
    assert any(a.split("=")[0] == "BASE_IMAGE" for a in args)
    froms = [stage[0][1] for stage in stages()]
    assert len(froms) >= 2
    assert all(re.search(r"\s+AS\s+\w+", f, re.IGNORECASE) for f in froms), froms
    assert all("${BASE_IMAGE}" in f or "$BASE_IMAGE" in f for f in froms), froms
    final = stages()[-1]
    assert any(w == "COPY" and "--from=" in r for w, r in final), "the final stage copies from a build stage"


def test_final_stage_runs_as_a_non_root_user_with_epd_as_entrypoint():
    final = stages()[-1]
    users = [rest for word, rest in final if word == "USER"]
    assert users, "no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    entrypoint = [rest for word, rest in final if word == "ENTRYPOINT"][-1]
    assert entrypoint == '["epd"]'
    install = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert "pip install" in install


def test_dockerignore_keeps_the_venv_and_git_out():
    patterns = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".git", "**/__pycache__", ".pytest_cache"} <= patterns


def test_kubernetes_runs_the_documented_image_as_the_dockerfile_user():
    text = DOCKERFILE.read_text()
    documented = set(re.findall(r"-t (epd-cluster:[\w.-]+)", text))
    manifests = "\n".join(p.read_text() for p in (ROOT / "deploy" / "k8s").rglob("*.yaml"))
    images = set(re.findall(r"image:\s*(\S+)", manifests))
    assert images == {"epd-cluster:0.1.0"} and images <= documented
    tags = set(re.findall(r"newTag:\s*(\S+?)}?$", manifests, re.MULTILINE))
    assert {f"epd-cluster:{t}" for t in tags} <= documented, tags
    uid = [rest for word, rest in stages()[-1] if word == "USER"][-1].split(":")[0]
    assert set(re.findall(r"runAsUser:\s*(\d+)", manifests)) == {uid}
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert "docker build -f deploy/docker/Dockerfile" in readme and "-t epd-cluster:0.1.0 ." in readme
