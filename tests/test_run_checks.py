"""``make test`` runs its checks through tools/run_checks.py: every check is a Makefile target,
together they are what ``make unit``, ``make nbval``, ``make variants`` and ``make browser`` run,
and a failing check fails the run and shows the end of its log."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import run_checks  # noqa: E402

MAKEFILE = (ROOT / "Makefile").read_text()


def recipe(target: str) -> str:
    match = re.search(rf"(?m)^{re.escape(target)}:.*\n((?:\t.*\n|#.*\n)*)", MAKEFILE)
    assert match, f"the Makefile has no target {target}"
    return match.group(1)


def test_every_check_is_a_makefile_target_and_make_test_runs_them_all():
    for target in run_checks.CHECKS:
        assert recipe(target).strip(), target
    assert "tools/run_checks.py" in recipe("test")


def test_the_two_unit_parts_run_every_unit_test_once():
    assert "--ignore=tests/test_sections.py tests" in recipe("unit-core")
    assert recipe("sections").strip().endswith("tests/test_sections.py")
    assert '-m "not browser" tests' in recipe("unit") and "--ignore" not in recipe("unit")


def test_the_variant_targets_run_as_make_variants_does():
    both = recipe("variants")
    assert "$(NO_SIMD_2_THREADS) $(NBVAL)" in both and "$(NO_SIMD_2_THREADS) $(NBVAL)" in recipe("variant-no-simd")
    assert "$(AVX2_1_THREAD) $(NBVAL)" in both and "$(AVX2_1_THREAD) $(NBVAL)" in recipe("variant-avx2")


@pytest.mark.parametrize(("text", "expected"), [
    ("...\n============ 481 passed in 147.08s (0:02:27) ============\n", "481 passed in 147.08s (0:02:27)"),
    ("F.\n= 1 failed, 3 passed in 2.00s =\nmake: *** [Makefile:9: nbval] Error 1\n", "1 failed, 3 passed in 2.00s"),
    ("", "no output"),
])
def test_a_check_is_summed_up_by_its_last_pytest_line(tmp_path, text, expected):
    log = tmp_path / "x.log"
    log.write_text(text)
    assert run_checks.summary(log) == expected


def test_a_failing_check_fails_the_run_and_shows_its_log(tmp_path, monkeypatch, capsys):
    makefile = tmp_path / "Makefile"
    makefile.write_text("good:\n\t@echo '= 2 passed in 0.1s ='\nbad:\n\t@echo 'the reason'; exit 3\n")
    monkeypatch.setattr(run_checks, "ROOT", tmp_path)
    monkeypatch.setattr(run_checks, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(run_checks, "CHECKS", {"good": 2, "bad": 1})
    assert run_checks.main([]) == 1
    out = capsys.readouterr().out
    assert "ok     good: 2 passed in 0.1s" in out and "FAIL   bad" in out and "    the reason" in out
    assert "1 of 2 checks failed" in out and (tmp_path / "logs" / "bad.log").is_file()
    assert run_checks.main(["good"]) == 0 and "1 of 1 checks passed" in capsys.readouterr().out


def test_an_unknown_check_is_a_usage_error_naming_the_checks(capsys):
    with pytest.raises(SystemExit):
        run_checks.main(["bogus"])
    assert "choose from " + ", ".join(run_checks.CHECKS) in capsys.readouterr().err


def test_make_test_runs_lint_first():
    dry = subprocess.run(["make", "--no-print-directory", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", "MAKEFLAGS": ""}).stdout  # fmt: skip
    assert dry.index("ruff check") < dry.index("tools/run_checks.py")
