"""What holds for every exercise of the course: how an unsolved one is reported, and that checking
an answer leaves the student's random stream as it was."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hooklab.audit import clear_global_hooks, global_hooks
from hooklab.exercises import _CHECKED, Outcome, check, checked, exercises, grade, hint_for, kind_of

EXERCISES = exercises()
PREDICTIONS = [id for id, ex in EXERCISES.items() if ex.kind == "prediction"]
EXAMPLE_PREDICTION = PREDICTIONS[0]
#: the stub each notebook gives: a function raising NotImplementedError, or None for G6.1,
#: whose answer is a list
STUB_IS_NONE = {"G6.1"}
#: ... or a pair of such functions for 07.4, whose answer is (pack, unpack)
STUB_IS_PAIR = {"07.4", "07.5"}


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("id", [id for id in EXERCISES if id not in PREDICTIONS])
def test_the_notebook_stub_prints_not_solved_yet(id, capsys):
    check(id, None if id in STUB_IS_NONE else (stub, stub) if id in STUB_IS_PAIR else stub)
    assert capsys.readouterr().out == f"Exercise {id} ({EXERCISES[id].title}): not solved yet\n"


@pytest.mark.parametrize("id", PREDICTIONS)
def test_the_notebook_guess_stub_prints_no_guess_yet(id, capsys):
    check(id, ...)  # the lesson's `guess = ...`
    assert capsys.readouterr().out.startswith(f"Prediction {id} ({EXERCISES[id].title}): no guess yet — ")


@pytest.mark.parametrize("id", EXERCISES)
def test_checking_leaves_the_students_random_stream_as_it_was(id):
    """Checkers seed the generator to build their models; the student's next draw must not change."""
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with contextlib.suppress(Exception):
        EXERCISES[id].checker(stub)
    assert torch.equal(torch.rand(3), expected)


def call_like_pytorch(module, x):
    """A right answer to 00.1."""
    output = module.forward(x)
    for hook in module._forward_hooks.values():
        result = hook(module, (x,), output)
        output = output if result is None else result
    return output


def no_return(module, x):
    """A wrong answer to 00.1."""
    call_like_pytorch(module, x)


def test_grade_returns_the_outcome_that_check_prints(capsys):
    outcome = grade("00.1", call_like_pytorch)
    check("00.1", call_like_pytorch)
    assert outcome.passed and capsys.readouterr().out.endswith(f"passed — {outcome.detail}\n")
    wrong = grade("00.1", no_return)
    assert not wrong.passed and "missing return?" in wrong.detail


def test_checked_keeps_the_last_verdict_of_each_check(capsys):
    """What `make grade` collects from a student's kernel: the last check of each exercise wins,
    with the detail `check` printed; `grade` (for scripts) leaves it alone."""
    check("00.1", no_return)
    assert checked()["00.1"] == ("failed", grade("00.1", no_return).detail)
    check("00.1", call_like_pytorch)
    check("00.2", stub)
    check("00.3", lambda model: 1 / 0)
    printed = capsys.readouterr().out.splitlines()
    verdicts = checked()
    assert verdicts["00.1"] == ("passed", grade("00.1", call_like_pytorch).detail)
    assert verdicts["00.2"] == ("not solved yet", "")
    assert verdicts["00.3"] == ("failed", "your code raised ZeroDivisionError: division by zero")
    assert printed[-1].endswith("failed — your code raised ZeroDivisionError: division by zero")
    grade("00.1", no_return)
    assert checked()["00.1"][0] == "passed"


def test_passed_says_whether_the_last_check_passed(capsys):
    """What a lesson asks before it goes on with a worked answer instead of the student's."""
    from hooklab.exercises import passed

    _CHECKED.pop("00.1", None)
    assert not passed("00.1")  # never checked
    check("00.1", stub)
    assert not passed("00.1")  # not solved yet
    check("00.1", call_like_pytorch)
    assert passed("00.1")
    check("00.1", no_return)
    assert not passed("00.1")  # the last check wins
    grade("00.1", call_like_pytorch)
    assert not passed("00.1")  # grade() is not a check
    check(EXAMPLE_PREDICTION, ...)
    assert not passed(EXAMPLE_PREDICTION) and not passed("99.9")


def test_grade_lets_the_answers_exception_through_and_names_known_exercises():
    with pytest.raises(NotImplementedError):
        grade("00.1", stub)
    with pytest.raises(KeyError, match=r"known: 00\.1, 00\.2"):
        grade("99.1", stub)


@pytest.mark.parametrize("id", EXERCISES)
def test_a_global_hook_left_by_earlier_code_fails_the_check_by_name(id):
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:
        outcome = grade(id, stub)
    finally:
        handle.remove()
    assert not outcome.passed and "a global forward hook is still registered" in outcome.detail


def counter_that_leaks(leak):
    """A right answer to 00.1 that also leaves something global active."""

    def leaking(module, x):
        leak()
        return call_like_pytorch(module, x)

    return leaking


class PassThrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


LEAKS = {
    "global hook": lambda: torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: None),
    "saved-tensor hooks": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__(),
    "torch function mode": lambda: PassThrough().__enter__(),
}


@pytest.mark.parametrize("kind", LEAKS)
def test_what_an_answer_leaves_global_is_removed_and_fails_it(kind):
    outcome = grade("00.1", counter_that_leaks(LEAKS[kind]))
    assert not outcome.passed and "your answer left something global active" in outcome.detail
    assert global_hooks() == []
    assert grade("00.1", counter_that_leaks(lambda: None)).passed  # the next check is not spoiled


def test_clear_global_hooks_is_the_way_out_when_a_handle_is_lost():
    LEAKS["global hook"]()
    LEAKS["saved-tensor hooks"]()
    assert "hooklab.audit.clear_global_hooks()" in grade("00.1", stub).detail
    removed = clear_global_hooks()
    assert removed == [
        "a global forward hook (torch.nn.modules.module.register_module_forward_hook)",
        "saved-tensor hooks never exited: 1 (torch.autograd.graph.saved_tensors_hooks)",
    ]
    assert global_hooks() == []


def test_hint_for_turns_a_known_error_into_a_hint_and_raises_any_other():
    hints = {"NoneType": "a .grad was None", "in-place": "clone first"}
    outcome = hint_for(TypeError("unsupported operand type(s) for +: 'NoneType' and 'int'"), hints)
    assert outcome == Outcome(False, "a .grad was None")
    unknown = ValueError("something else")
    with pytest.raises(ValueError, match="something else") as raised:
        hint_for(unknown, hints)
    assert raised.value is unknown


def test_kind_of_names_the_type_spells_out_a_tuple_and_hints_at_a_missing_return():
    assert kind_of([1, 2]) == "list"
    assert kind_of(3) == "int"
    assert kind_of((1, "a")) == "(int, str)"
    assert kind_of(()) == "()"
    assert kind_of(None) == "None (missing return?)"


def test_a_prediction_computes_its_truth_and_says_right_or_not_quite(capsys):
    from hooklab.exercises import _REGISTRY, check, prediction

    calls = []

    @prediction("99.a", "what 2 + 2 is", why="2 + 2 is 4", wrong=[(5, "that is one too many")])
    def _four():
        calls.append(1)
        return torch.tensor(2.0).add(2).item()

    try:
        check("99.a", ...)
        check("99.a", 4)
        check("99.a", 5)
        check("99.a", [4])
        lines = capsys.readouterr().out.splitlines()
        assert lines == [
            "Prediction 99.a (what 2 + 2 is): no guess yet — replace the ... with your guess, run this cell, then "
            "the next one",
            "Prediction 99.a (what 2 + 2 is): right — 2 + 2 is 4",
            "Prediction 99.a (what 2 + 2 is): not quite — that is one too many",
            "Prediction 99.a (what 2 + 2 is): not quite — 2 + 2 is 4",
        ]
        assert len(calls) == 3  # computed at every check that has a guess
        assert checked()["99.a"] == ("not quite", "2 + 2 is 4")
    finally:
        _REGISTRY.pop("99.a")
        _CHECKED.pop("99.a", None)


def test_a_prediction_takes_none_as_a_guess_and_tells_a_number_written_as_a_string(capsys):
    """Only `guess = ...` is "no guess yet": a prediction whose answer is None takes None (or "None") as a
    guess; a number in quotes is told to drop them, not that it is wrong."""
    from hooklab.exercises import _REGISTRY, prediction

    @prediction("99.b", "which slot is empty", why="nothing was computed for it")
    def _empty():
        return None

    @prediction("99.c", "a quarter", why="it is 1/4", wrong=[(0.5, "that is a half")])
    def _quarter():
        return torch.tensor(0.25).item()

    try:
        assert grade("99.b", None).passed and grade("99.b", "None").passed and not grade("99.b", 0).passed
        check("99.b", None)
        assert capsys.readouterr().out.startswith("Prediction 99.b (which slot is empty): right — ")
        for quoted in ("0.25", " '0.3' "):
            detail = grade("99.c", quoted).detail
            assert "write a number, not a string" in detail and "without quotes" in detail, detail
        assert grade("99.c", "0.5").detail.startswith("write a number")  # the quotes first, then the number
        assert grade("99.c", "a quarter").detail == "it is 1/4"  # words are not a number written as a string
        assert grade("99.c", 0.25).passed
    finally:
        for id in ("99.b", "99.c"):
            _REGISTRY.pop(id)
            _CHECKED.pop(id, None)


@pytest.mark.parametrize(("guess", "truth", "expected"), [
    ("Pre-Hook ", "pre-hook", True), ("'None'", None, True), (None, None, True), ([1, 2.0], (1.0, 2), True),
    (torch.Size([2, 3]), (2, 3), True), (0.401, 0.4, True), (0.41, 0.4, False), (1, True, False),
    ([1, 2], [1, 2, 3], False), (3, 3.0, True), ("4", 4, False), ([0.25, float("inf")], [0.25, float("inf")], True),
    (float("nan"), float("nan"), True), (float("inf"), float("-inf"), False),
])  # fmt: skip
def test_guesses_are_compared_the_way_a_person_writes_them(guess, truth, expected):
    from hooklab.exercises import same

    assert same(guess, truth) is expected


def test_prediction_ids_are_a_number_and_a_letter():
    from hooklab.exercises import prediction

    with pytest.raises(ValueError, match="a number and a letter"):
        prediction("99.1", "t", why="w")(lambda: 1)


def make_counter(layer):
    """A student's function for 00.1 that returns what it made, not a function."""
    return layer, {}


def test_a_value_where_a_function_is_wanted_names_the_fix_not_the_students_code(capsys):
    layer = torch.nn.Linear(2, 2)
    check("00.1", "str")
    check("00.1", make_counter(layer))
    first, second = capsys.readouterr().out.splitlines()
    assert first.endswith("failed — pass the function itself, not a str: check('00.1', your_function), the name "
                          "without parentheses; the check calls it")  # fmt: skip
    assert second.endswith("failed — pass the function itself, not `make_counter(...)`: check('00.1', "
                           "make_counter); the check calls it")  # fmt: skip
    assert "your code raised" not in first + second


def test_swapped_arguments_are_named():
    with pytest.raises(TypeError, match=r"the arguments are swapped: write check\('00\.1', your_answer\)"):
        check(call_like_pytorch, "00.1")
    with pytest.raises(TypeError, match=r"check's first argument is the exercise's id, like check\('00\.1'"):
        check(call_like_pytorch, call_like_pytorch)


def test_an_answer_that_hangs_is_stopped_after_the_time_limit(capsys, monkeypatch):
    import signal
    import time

    import hooklab.exercises as registry

    def hangs(module, x):
        while True:
            time.sleep(0.01)

    monkeypatch.setattr(registry, "TIME_LIMIT", 1)
    start = time.monotonic()
    check("00.1", hangs)
    assert time.monotonic() - start < 10
    assert capsys.readouterr().out.endswith("failed — stopped after 1 s: your answer was still running (an endless "
                                            "loop? a hook that calls its own module?); make it finish, then check "
                                            "again\n")  # fmt: skip
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    assert global_hooks() == []
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a kernel whose setup cell did not run
    try:
        check("00.1", hangs)
    finally:
        torch.set_num_threads(threads)
    assert "runs torch on 2 threads" in capsys.readouterr().out
    check("00.1", call_like_pytorch)  # the next check runs as before
    assert capsys.readouterr().out.split(": ", 1)[1].startswith("passed")


def test_a_long_error_message_is_shortened_no_tensor_dumps():
    def dumps(module, x):
        raise ValueError(f"bad value {torch.arange(900.0)}")

    check("00.1", dumps)
    detail = checked()["00.1"][1]
    assert detail.startswith("your code raised ValueError: bad value tensor([") and len(detail) < 360
    assert detail.endswith("characters cut)") and "\n" not in detail


GRADING_KERNEL = """
import json, sys
from pathlib import Path
import hooklab.exercises as ex
folder = Path(sys.argv[1])
ex._start_grading(str(folder))
assert not (folder / "key").exists()  # read and deleted: no cell finds it
ex.check("00.1", lambda module, x: None)
real = ex._verdict
ex._verdict = lambda *args: ("passed", "looks great")
ex.check("00.1", None)
ex._verdict = real
ex.check("00.2", None)
"""


def test_a_grading_kernel_signs_each_verdict_as_it_is_checked_and_names_what_was_changed(tmp_path):
    """What tools/grade_kernel.py starts before a student's first cell, and tools/grade.py reads."""
    import subprocess
    import sys

    import grade  # tools/

    key = b"k" * 32
    (tmp_path / "key").write_bytes(key)
    subprocess.run([sys.executable, "-c", GRADING_KERNEL, str(tmp_path)], check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    verdicts, started, doubts = grade.read_log(tmp_path / "verdicts.log", key)
    assert started and doubts == []
    assert verdicts["00.1"] == ("suspect", "hooklab.exercises._verdict was replaced; the check said: passed — looks "
                                           "great")  # fmt: skip
    assert verdicts["00.2"] == ("not solved yet", "")
    # the log is read line by line: a verdict kept before the kernel died is read; a forged line is not
    with (tmp_path / "verdicts.log").open("a") as log:
        log.write('{"seq": 4, "kind": "check", "id": "00.3", "verdict": "passed"}\tfeed\n{"seq": 5, "ki')
    verdicts, _, doubts = grade.read_log(tmp_path / "verdicts.log", key)
    assert "00.3" not in verdicts and doubts == [
        "the verdict log holds lines the course's check did not write (they were left out)"]
    assert grade.read_log(tmp_path / "verdicts.log", b"another key")[1] is False


def test_a_slow_checker_gets_its_own_time_limit_and_the_limit_scales_with_the_environment(monkeypatch):
    from hooklab.exercises import TIME_LIMIT, _scaled

    assert EXERCISES["04.10"].time_limit > TIME_LIMIT and EXERCISES["00.1"].time_limit is None
    monkeypatch.setenv("HOOKLAB_CHECK_TIME_SCALE", "10")
    assert _scaled(60) == 600
    monkeypatch.setenv("HOOKLAB_CHECK_TIME_SCALE", "fast")
    assert _scaled(60) == 60


def test_a_set_of_names_matches_in_any_order_and_container_and_a_single_name_bare():
    from hooklab.exercises import same

    assert same(["5", "1"], frozenset({"1", "5"})) and same(("1", "5"), {"5", "1"}) and same({"1", "5"}, {"1", "5"})
    assert same("dbeta", frozenset({"dbeta"})) and same([" 'DBeta' "], frozenset({"dbeta"}))
    assert not same(["1"], {"1", "5"}) and not same(["1", "5", "9"], {"1", "5"}) and not same([1, 5], {"1", "5"})
    assert same([1, 5], {5, 1}) and not same([[1], [5]], {1, 5}) and not same(["1", "1"], {1})


def test_a_bool_truth_answered_with_anything_else_is_asked_for_a_bool_without_the_answer(monkeypatch):
    import hooklab.exercises as registry
    from hooklab.exercises import grade, prediction

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    prediction("99.z", "a question answered by a bool", why="because the rule says so")(lambda: False)
    for guess in (0, "no", [False]):
        detail = grade("99.z", guess).detail
        assert "write True or False" in detail and "because" not in detail
    assert grade("99.z", False).passed and not grade("99.z", True).passed


def test_a_slip_of_form_says_so_and_never_gives_the_answer(capsys, monkeypatch):
    """A guess in another form than the question asks (a quoted number, 0 for False, what ``form``
    names) prints "not in the form asked" and the form wanted, not "not quite" and the rule."""
    import hooklab.exercises as registry
    from hooklab.exercises import check, grade, prediction

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_CHECKED", {})
    one_list = lambda g: "write two numbers in one flat list" if isinstance(g, list) and g and isinstance(g[0], list) else None  # noqa: E731, E501
    prediction("99.f", "two numbers", why="both are 3, by the rule", form=one_list)(lambda: [3, 3])
    prediction("99.g", "a number", why="it is 4, by the rule")(lambda: 4.0)
    prediction("99.h", "a bool", why="no, by the rule")(lambda: False)
    for id, guess in (("99.f", [[3, 3]]), ("99.g", "4"), ("99.h", 0)):
        outcome = grade(id, guess)
        assert not outcome.passed and outcome.form and "rule" not in outcome.detail, (id, outcome)
        check(id, guess)
        assert "not in the form asked — " in capsys.readouterr().out
        assert registry.checked()[id][0] == "not in the form asked"
    for id, guess in (("99.f", [3, 4]), ("99.g", 5), ("99.h", True)):  # wrong in the right form: the rule
        outcome = grade(id, guess)
        assert not outcome.passed and not outcome.form and "rule" in outcome.detail
    assert grade("99.f", (3, 3)).passed and grade("99.g", 4).passed and grade("99.h", False).passed
