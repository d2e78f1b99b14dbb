"""The README a newcomer reads first: short, its two commands the ones CI runs, every exit code
and verb in it, its example config real, and every link to docs/ going somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.base.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DEMO = "bash tests/bootstrap.sh && .venv/bin/python -m sandbox start && .venv/bin/deployctl -c .sandbox/deployctl.yaml up"
TESTS = "bash tests/bootstrap.sh && .venv/bin/python -m pytest -q"


def sh_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_the_readme_is_short():
    assert len(README.encode()) < 25 * 1024


def test_the_two_commands_come_first_demo_then_tests():
    assert sh_blocks(README)[:2] == [DEMO, TESTS]


def test_ci_runs_exactly_the_readmes_test_command_then_mypy():
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    [command] = [line for line in lines if "pytest" in line and not line.startswith("#")]
    assert command.startswith(TESTS) and command[len(TESTS):].strip() in ("", "|| status=$?"), command
    assert any(line.startswith(".venv/bin/python -m mypy") for line in lines)


def exit_table(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", text, re.M)}


@pytest.mark.parametrize("page", ["README.md", "docs/exit-codes.md"])
def test_every_exit_code_is_in_the_table(page):
    table = exit_table((REPO / page).read_text())
    assert sorted(table) == sorted(int(code) for code in ExitCode), page


def test_every_verb_is_listed():
    from deploy.cli.main import cli

    listed = set(re.findall(r"^\s*deployctl ([a-z-]+)", README, re.M))
    assert set(cli.commands) <= listed, set(cli.commands) - listed


def test_the_minimal_config_is_a_real_one(tmp_path):
    from deploy.config.loader import load_config

    [block] = re.findall(r"```yaml\n(.*?)```", README.split("## Use it on real hosts")[1], re.S)[:1]
    path = tmp_path / "deployctl.yaml"
    path.write_text("\n".join(line[3:] if line.startswith("   ") else line for line in block.splitlines()))
    config = load_config(path)
    assert [h.name for h in config.hosts] and [r.name for r in config.runs]


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_goes_somewhere(page):
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{page.name}: {target}"
        if anchor:
            assert anchor in anchors(path.read_text()), f"{page.name}: {target}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_sends_a_reader_to_an_old_place(page):
    text = page.read_text()
    assert "deploy/playbooks" not in text  # playbooks/ is at the top of the repository
    assert "only import downwards" not in text  # the code has upward imports (issue 16)


def test_the_fixers_exit_codes_are_deployctls():
    """Issue 37: the host-side fixer (stdlib only, so it cannot import ExitCode) keeps its own EXIT_*
    numbers; each is tied here to the one table, by name (a change needed is FAILED's 1, like
    `fix-keys --check`), so the README's and docs/exit-codes.md's tables (above) cover them too."""
    from deploy.remote.fixer import errors, store

    aliases = {"CHANGE_NEEDED": "FAILED", "NO_SGLANG_VERSION": "FAILED"}
    found = {name[5:]: value for module in (errors, store) for name, value in vars(module).items()
             if name.startswith("EXIT_") and isinstance(value, int)}
    assert found and "CHANGE_NEEDED" in found
    for name, value in found.items():
        assert value == ExitCode[aliases.get(name, name)], name
