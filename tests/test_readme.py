"""The README's two commands are the ones the project actually runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (REPO / "README.md").read_text())


def test_readme_has_exactly_two_setup_commands() -> None:
    cmds = readme_commands()
    assert len(cmds) == 2
    main_job, tests = cmds
    assert "pip install -e ." in main_job and "traces/" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines


def test_main_job_trace_is_bundled() -> None:
    main_job = readme_commands()[0]
    trace = re.search(r"(traces/\S+)", main_job).group(1)
    assert (REPO / trace).is_file()


def test_no_merge_conflict_markers_in_tracked_text() -> None:
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout
    for name in files.split():
        path = REPO / name
        if path.suffix not in {".py", ".md", ".toml", ".txt", ""} or not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            assert not line.startswith(("<<<<<<< ", ">>>>>>> ")), f"conflict marker in {name}"
