"""The comparator behind every notebook check (tools/nbval_numbers.py): text exact, numbers to
the precision they were printed with."""

from __future__ import annotations

import pytest
from nbval_numbers import Mismatch, accept_close_numbers, mismatches, tokens, tolerance


def same(expected: str, got: str) -> bool:
    return mismatches(expected, got) == []


@pytest.mark.parametrize(("printed", "allowed"), [
    ("407.3188", 4.073188e-3), ("0.3188", 2e-4), ("97.56", 0.02), ("0.5", 0.2), ("-3.25", 0.02),
    ("1e-05", 2e-5), ("2.5e-07", 2e-8),
    ("1.0E+03", 200.0), ("123456.7", 1.234567), ("3.", 3e-5), ("0.", 0.0), ("12", 0.0), ("-7", 0.0),
])  # fmt: skip
def test_tolerance_is_two_units_of_the_last_printed_digit_or_a_relative_floor(printed, allowed):
    assert tolerance(printed) == pytest.approx(allowed, rel=1e-12)


def test_last_digit_moves_within_tolerance():
    assert same("last gradient norm: 407.3188", "last gradient norm: 407.3189")
    assert same("accuracy 97.56 %", "accuracy 97.57 %")
    assert same("mean 1.2345e-03", "mean 1.2347e-03")


def test_a_change_beyond_the_last_digits_fails_and_says_by_how_much():
    [found] = mismatches("accuracy 97.56 %", "accuracy 95.11 %")
    assert str(found) == "expected 97.56 (±0.02), got 95.11"
    assert not same("norm 407.3188", "norm 407.3298")
    assert not same("mean 1.2345e-03", "mean 1.2345e-04")  # the exponent counts


def test_a_flipped_sign_fails_unless_the_number_is_within_tolerance_of_zero():
    assert not same("slope -0.3127", "slope 0.3127")
    assert same("mean -0.0000", "mean 0.0000")
    assert same("mean -0.0001", "mean 0.0001")


def test_integers_and_versions_compare_exactly():
    [found] = mismatches("exact 12 of 19", "exact 13 of 19")
    assert found == Mismatch("12", "13", 0.0) and "compared exactly" in str(found)
    assert not same("torch 2.14.1", "torch 2.14.2")
    assert not same("1.5", "2")  # a float where an integer was: other text


def test_numbers_inside_words_are_part_of_the_word():
    assert [t.text for t in tokens("conv2d layer4.1 features.3.weight float32")] == [
        "conv2d", "layer4.1", "features.3.weight", "float32"
    ]  # fmt: skip
    assert not same("layer4.1", "layer4.2")
    assert not same("conv2d", "conv3d")


def test_tensors_shapes_and_spacing():
    assert same("tensor([ 0.1000, -0.2000])", "tensor([0.1001, -0.2001])")
    assert same("tensor([0.0000, 1.5000])", "tensor([-0.0000,  1.5000])")  # columns move with a sign
    assert not same("torch.Size([1, 3, 224, 224])", "torch.Size([1, 3, 224, 225])")
    assert not same("tensor([0.1000, 0.2000])", "tensor([0.1000, 0.2000, 0.3000])")
    assert not same("tensor([1., 0., 1.])", "tensor([1., 1., 1.])")  # whole numbers: a mask
    assert not same("a\nb", "a b")  # line ends count, spaces do not


def test_percentages_scientific_notation_nan_and_inf():
    assert same("dead: 75.00 %", "dead: 75.01 %")
    assert not same("dead: 75.00 %", "dead: 75.00 ‰")
    assert same("3.0e-08", "3.1e-08")
    assert not same("nan", "0.5") and not same("inf", "-inf") and same("nan", "nan")
    assert not same("tensor([nan, 1.])", "tensor([0., 1.])")


def test_words_and_punctuation_compare_exactly():
    assert not same("all close: True", "all close: False")
    assert not same("ReLU(inplace=True)", "ReLU(inplace=False)")
    assert not same("(1, 2)", "[1, 2]")


class FakeCell:
    name = "Cell 7"

    class parent:  # stands in for nbval's notebook item
        skip_compare = ("metadata", "traceback", "image/png")

    @staticmethod
    def sanitize(text):
        return text


def stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def test_close_outputs_take_the_reference_text_and_far_ones_are_reported():
    ref = [stream("norm 407.3188\n"), {"output_type": "execute_result", "data": {"text/plain": "0.25"}}]
    close = [stream("norm 407.3189\n"), {"output_type": "execute_result", "data": {"text/plain": "0.26"}}]
    assert accept_close_numbers(FakeCell, close, ref) == []
    assert close[0]["text"] == "norm 407.3188\n" and close[1]["data"]["text/plain"] == "0.25"

    far = [stream("norm 401.0000\n"), {"output_type": "execute_result", "data": {"text/plain": "0.25"}}]
    assert accept_close_numbers(FakeCell, far, ref) == ["Cell 7: expected 407.3188 (±0.0041), got 401.0000"]
    assert far[0]["text"] == "norm 401.0000\n"  # left for nbval to report


def test_error_messages_are_compared_like_text():
    ref = [{"output_type": "error", "ename": "ValueError", "evalue": "max |difference| 3.1e-01", "traceback": []}]
    got = [{"output_type": "error", "ename": "ValueError", "evalue": "max |difference| 3.2e-01", "traceback": []}]
    assert accept_close_numbers(FakeCell, got, ref) == [] and got[0]["evalue"] == ref[0]["evalue"]
    other = [{"output_type": "error", "ename": "TypeError", "evalue": "max |difference| 3.1e-01", "traceback": []}]
    assert accept_close_numbers(FakeCell, other, ref) == ["Cell 7: expected 'ValueError', got 'TypeError'"]


def test_images_are_left_to_nbval_which_skips_them():
    png, text = "iVBORw0KGgo" + "A" * 1000, "<Figure size 640x480 with 1 Axes>"
    ref = [{"output_type": "display_data", "data": {"image/png": png, "text/plain": text}}]
    got = [{"output_type": "display_data", "data": {"image/png": png[:-1] + "B", "text/plain": text}}]
    assert accept_close_numbers(FakeCell, got, ref) == []
    assert got[0]["data"]["image/png"].endswith("B")  # untouched
