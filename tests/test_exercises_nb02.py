"""Predictions and checkers of notebook 02: each checker accepts worked answers and rejects the wrong
ones a student is likely to write, naming the slip; each prediction computes what the lesson shows."""

from __future__ import annotations

import pytest
import torch
from answers import failed, run_then_remove
from torch import nn

from hooklab.exercises import exercises, grade, nb02

IDS = sorted(id for id in exercises() if id.startswith("02."))


def test_notebook_02_has_five_predictions_and_four_exercises():
    assert IDS == ["02.1", "02.2", "02.3", "02.4", "02.a", "02.b", "02.c", "02.d", "02.e"]


@pytest.mark.parametrize(("id", "answer"), [("02.1", nb02.output_stds), ("02.2", nb02.rescale_to_unit_std),
                                            ("02.3", nb02.StepStats), ("02.4", nb02.CallRecorder)])  # fmt: skip
def test_the_worked_answers_the_lesson_falls_back_on_pass(id, answer):
    result = grade(id, answer)
    assert result.passed, result.detail


# ----- predictions ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("id", "truth"), [("02.a", 8.38), ("02.b", 14.0), ("02.c", 3.11),
                                           ("02.d", [True, False, True, False]), ("02.e", 75)])  # fmt: skip
def test_each_prediction_computes_what_the_lesson_shows(id, truth):
    assert grade(id, truth).passed
    assert exercises()[id].checker.__wrapped__.truth() == truth


def test_02a_why_quotes_the_measured_factors():
    factors = {name: round(f, 1) for name, f in nb02._shrink_factors().items()}
    assert factors == {"features.0": 35.8, "features.2": 8.4, "features.5": 6.9, "head.2": 16.6}  # the lesson's table


def test_02c_accepts_half_a_decade_either_way_and_asks_for_the_power_of_ten():
    assert round(nb02._bias_over_weight(), -2) == 1300  # the lesson's "1.3e+03 times the weight's"
    assert all(grade("02.c", guess).passed for guess in (3, 3.0, 2.6, 3.6))
    assert not any(grade("02.c", guess).passed for guess in (2, 2.5, 3.7, 4))
    failed("02.c", 1000, "log10 of the factor", "not 100")
    failed("02.c", "3", "without quotes")


def test_02a_accepts_ten_percent_either_side_of_the_measured_divisor_and_no_further():
    assert all(grade("02.a", guess).passed for guess in (7.6, 8, 8.3, 8.33, 8.4, 9.0, 9.2))
    assert not any(grade("02.a", guess).passed for guess in (6.2, 7.0, 7.3, 9.5, 10.0))


@pytest.mark.parametrize(("id", "guess", "words"), [
    ("02.a", 0.12, "multiplies"), ("02.a", 25, "16 channels × 3×3"),
    ("02.a", 5.9, "32 × 3×3 = 288"), ("02.b", 8.0, "pre-hook ran too"),
    ("02.b", 7.0, "replaces the output"), ("02.c", 0, "only if the inputs were of size 1"),
    ("02.c", -3, "the other way round"),
    ("02.a", 100, "√144 = 12"), ("02.a", 12, "0.01·12 = 0.12"),
    ("02.e", 67, "twice"), ("02.d", [True, True, True, True], "shares memory"),
    ("02.d", [True, False, True, True], "forward hook runs after"),
])  # fmt: skip
def test_a_common_wrong_guess_gets_its_own_hint(id, guess, words):
    failed(id, guess, words)


# ----- 02.1 -------------------------------------------------------------------------------------------
def stds_answer(which="leaves", late=False, of="output", key="name", in_finally=True, returns=False):
    """An answer to 02.1: one forward hook per leaf keeps its output's std (variations: wrong).
    ``returns``: the hook is a lambda that returns a tuple, which replaces the output."""
    def output_stds(model, x):
        stds, handles = {}, []

        def run():
            items = list(model.named_modules())[1:] if which != "children" else list(model.named_children())
            for name, module in items:
                if which == "leaves" and next(module.children(), None) is not None:
                    continue
                if late:
                    hook = lambda m, args, out: stds.__setitem__(name, out.std().item())  # noqa: B023, E731
                elif returns:
                    hook = lambda m, args, out, name=name: (stds.__setitem__(name, out.std().item()), out)  # noqa: E731
                else:
                    def hook(m, args, out, name=name):
                        value = out if of == "output" else args[0]
                        stds[name if key == "name" else m] = value.std().item()
                handles.append(module.register_forward_hook(hook))
            model(x)

        run_then_remove(run, handles, in_finally=in_finally)
        return stds

    return output_stds


def test_02_1_accepts_numbers_and_rejects_tensors():
    result = grade("02.1", stds_answer())
    assert result.passed, result.detail

    def tensors(model, x):
        stds, handles = {}, []
        for name, module in model.named_modules():
            if name and not list(module.children()):
                keep = lambda m, a, out, name=name: stds.update({name: out.std()}) or out  # noqa: E731
                handles.append(module.register_forward_hook(keep))
        run_then_remove(lambda: model(x), handles)
        return stds

    failed("02.1", tensors, "keeps a tensor", ".item()")  # as 02.3 says

    def numbers(model, x):
        stds, handles = {}, []
        for name, module in model.named_modules():
            if name and not list(module.children()):
                keep = lambda m, a, out, name=name: stds.update({name: out.std().item()}) or out  # noqa: E731
                handles.append(module.register_forward_hook(keep))
        run_then_remove(lambda: model(x), handles)
        return stds

    assert grade("02.1", numbers).passed  # returning the output itself replaces nothing


def test_02d_takes_ones_and_zeros_and_a_short_list_as_slips_of_form():
    outcome = grade("02.d", [1, 0, 1, 0])
    assert not outcome.passed and outcome.form and "[True, False, True, False]" in outcome.detail
    outcome = grade("02.d", [True, False, True])
    assert not outcome.passed and outcome.form and "has 3" in outcome.detail
    outcome = grade("02.d", [False, False, False, False])
    assert not outcome.passed and not outcome.form  # a wrong guess in the form asked


def test_02_1_names_the_slip():
    failed("02.1", stds_answer(late=True), "name=name", "loop variable")
    failed("02.1", stds_answer(which="children"), "container", "leaves")
    failed("02.1", stds_answer(which="all"), "container")
    failed("02.1", stds_answer(of="input"), "spreads of the inputs")
    failed("02.1", stds_answer(key="module"), "keys are modules")
    outcome = failed("02.1", stds_answer(in_finally=False), "finally", "forward hook is still registered on layer")
    assert "_forward" not in outcome.detail
    failed("02.1", lambda model, x: None, "None (missing return?)")


def test_02_1_names_unbiased_when_the_std_divides_by_n():
    def population(model, x):
        stds, handles = {}, []
        for name, module in model.named_modules():
            if name and not list(module.children()):
                keep = lambda m, a, out, name=name: stds.update({name: out.std(unbiased=False).item()})  # noqa: E731
                handles.append(module.register_forward_hook(keep))
        run_then_remove(lambda: model(x), handles)
        return stds

    failed("02.1", population, "population std", "unbiased=False", "use .std()")


def test_02_1_says_when_a_hook_returned_a_value_that_replaced_the_output():
    failed("02.1", stds_answer(returns=True), "received a tuple", "your hook returned a value",
           "replaced the layer's output", "returns None")


def test_02_1_says_which_leaves_are_missing_and_when_nothing_ran():
    def only_linear(model, x):
        stds, handles = {}, []
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear):
                keep = lambda m, a, out, name=name: stds.update({name: out.std().item()})  # noqa: E731
                handles.append(module.register_forward_hook(keep))
        run_then_remove(lambda: model(x), handles)
        return stds

    failed("02.1", only_linear, "every leaf", "whatever its type")
    failed("02.1", lambda model, x: {}, "empty")

    def listed_types(model, x):  # the types of the lesson's model and of the check's, but no convolution of 1-d
        stds, handles = {}, []
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear | nn.ReLU | nn.Tanh | nn.Conv2d | nn.MaxPool2d):
                keep = lambda m, a, out, name=name: stds.update({name: out.std().item()})  # noqa: E731
                handles.append(module.register_forward_hook(keep))
        run_then_remove(lambda: model(x), handles)
        return stds

    failed("02.1", listed_types, "'1.1.conv'", "Conv1d", "whatever its type", "list of types")


def test_02_1_names_a_hook_that_kept_the_first_call_of_a_module_called_twice():
    def keep_first(model, x):
        stds, handles = {}, []
        for name, module in model.named_modules():
            if name and not list(module.children()):
                def keep(m, a, out, name=name):
                    if name not in stds:
                        stds[name] = out.std().item()

                handles.append(module.register_forward_hook(keep))
        run_then_remove(lambda: model(x), handles)
        return stds

    failed("02.1", keep_first, "'1.1.second' runs twice", "first call", "last call")


# ----- 02.2 -------------------------------------------------------------------------------------------
def rescaling(how="in place", grad_off=True, one_pass=False, passes=1, in_finally=True):
    """An answer to 02.2: one layer per pass, its forward hook divides its weight by its output's std
    (``one_pass``: every hook at once, ``passes`` forward passes; ``how="both"``: the hook also returns
    the rescaled output, which makes one pass enough)."""
    def unit_std(module, args, output):
        std = output.std()
        if how in ("in place", "both"):
            module.weight.div_(std)
        elif how == "new Parameter":
            module.weight = nn.Parameter(module.weight.detach() / std)
        elif how == "population":
            std = output.std(unbiased=False)
            module.weight.div_(std)
            return output / std
        elif how == "tuple":
            module.weight.div_(std)
            return output / std, std
        if how in ("output", "both"):
            return output / std
        return None

    def forward(model, x):
        if grad_off:
            with torch.no_grad():
                model(x)
        else:
            model(x)

    def rescale_to_unit_std(model, x):
        layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        if one_pass:
            handles = []
            run_then_remove(lambda: [handles.append(m.register_forward_hook(unit_std)) for m in layers]
                            and [forward(model, x) for _ in range(passes)], handles, in_finally=in_finally)
            return
        for layer in layers:
            handles = [layer.register_forward_hook(unit_std)]
            run_then_remove(lambda: forward(model, x), handles, in_finally=in_finally)

    return rescale_to_unit_std


def test_02_2_accepts_one_pass_returning_the_output_enough_passes_or_the_population_std():
    for answer in (rescaling(how="both", one_pass=True), rescaling(one_pass=True, passes=4),
                   rescaling(how="population", one_pass=True)):
        result = grade("02.2", answer)
        assert result.passed, result.detail


def test_02_2_rejects_one_layer_per_pass_in_registration_order_naming_it():
    """The check's model registers '2.b' before '2.a' and runs '2.a' first: rescaling the layers one per pass
    in the order model.modules() lists them measures '2.b' before its input is rescaled."""
    assert [n for n, m in nb02._rescale_model().named_modules() if n.startswith("2.")] == ["2.b", "2.a"]
    failed("02.2", rescaling(), "'2.b'", "registered", "runs after it", "output / std")


def test_02_2_names_the_slip():
    failed("02.2", rescaling(how="new Parameter"), "new weight Parameter", "in place")
    failed("02.2", rescaling(grad_off=False), "torch.no_grad()")
    failed("02.2", rescaling(one_pass=True), "gives std", "measured before the layers before it", "output / std")
    failed("02.2", rescaling(how="output"), "no weight changed")
    failed("02.2", rescaling(how="both", one_pass=True, in_finally=False), "finally")
    failed("02.2", rescaling(how="tuple", one_pass=True), "received a tuple", "replaced the layer's output")


def test_02_2_names_the_nested_layers_a_loop_over_children_missed():
    def top_level_only(model, x):
        for layer in [m for m in model.children() if isinstance(m, nn.Conv2d | nn.Linear)]:
            def hook(m, a, out):
                m.weight.div_(out.std())

            with torch.no_grad():
                run_then_remove(lambda: model(x), [layer.register_forward_hook(hook)])

    failed("02.2", top_level_only, "no weight changed", "model.children() does not open", "model.modules()")


def test_02_2_names_a_layer_type_the_filter_left_out_not_children():
    def only(kind):
        def rescale_to_unit_std(model, x):
            def hook(m, a, out):
                std = out.std()
                m.weight.div_(std)
                return out / std

            handles = []
            with torch.no_grad():
                run_then_remove(lambda: [handles.append(m.register_forward_hook(hook)) for m in model.modules()
                                         if isinstance(m, kind)] and model(x), handles)

        return rescale_to_unit_std

    detail = failed("02.2", only(nn.Conv2d), "your hooks skipped the Linear layers", "nn.Linear")
    assert "children()" not in detail.detail
    failed("02.2", only(nn.Linear), "your hooks skipped the Conv2d layers")


def test_02_2_rejects_weight_data_assigned_naming_the_in_place_rule():
    def via_data(model, x, in_place=False):
        def hook(m, a, out):
            if in_place:
                m.weight.data.div_(out.std())
            else:
                m.weight.data = m.weight.data / out.std().item()
            return out / out.std()

        layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        run_then_remove(lambda: model(x), [layer.register_forward_hook(hook) for layer in layers])

    failed("02.2", via_data, "weight.data = ...", "in place", "torch.no_grad()")
    assert grade("02.2", lambda model, x: via_data(model, x, in_place=True)).passed


def test_02_2_names_a_lambda_that_returns_the_weight_it_divided():
    def lambda_rescale(model, x, one_pass=False):
        layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        for group in [layers] if one_pass else [[layer] for layer in layers]:
            handles = [m.register_forward_hook(lambda m, a, out: m.weight.div_(out.std())) for m in group]
            try:
                with torch.no_grad():
                    model(x)
            finally:
                for handle in handles:
                    handle.remove()

    for one_pass in (False, True):
        failed("02.2", lambda model, x, one_pass=one_pass: lambda_rescale(model, x, one_pass),
               "returned its weight", "in-place method", "replaced the layer's output")


# ----- 02.3 -------------------------------------------------------------------------------------------
def step_stats(late=False, as_tensor=False, of="output", population=False, returns=False, near_zero=False,
               zeros="share"):
    """An answer to 02.3: one forward hook per named layer appends two numbers (variations: wrong).
    ``returns``: a lambda hook returning the tuple of its two appends, which replaces the output."""
    class StepStats:
        def __init__(self, model, names):
            self.model, self.names, self.handles = model, names, []
            self.stds = {name: [] for name in names}
            self.zeros = {name: [] for name in names}

        def __enter__(self):
            for name in self.names:
                def keep(module, args, output, name=name):
                    key = self.names[-1] if late else name
                    out = (output if of == "output" else args[0]).detach()
                    value = (lambda t: t) if as_tensor else (lambda t: t.item())
                    self.stds[key].append(value(out.std(unbiased=not population)))
                    zero = out.abs() <= 1e-4 if near_zero else out <= 0 if zeros == "nonpositive" else out == 0
                    share = zero.sum().float() if zeros == "count" else zero.float().mean()
                    self.zeros[key].append(value(100 * share if zeros == "percent" else share))

                hook = keep
                if returns:
                    hook = lambda m, a, o, name=name: (self.stds[name].append(o.std().item()),  # noqa: E731
                                                       self.zeros[name].append((o == 0).float().mean().item()))
                self.handles.append(self.model.get_submodule(name).register_forward_hook(hook))
            return self

        def __exit__(self, *exc):
            for handle in self.handles:
                handle.remove()

    return StepStats


def test_02_3_accepts_numbers_per_call():
    result = grade("02.3", step_stats())
    assert result.passed, result.detail


def test_02_3_rejects_hooks_registered_in_init_naming_lesson_00_3_s_rule():
    base = step_stats()

    class InInit(base):
        def __init__(self, model, names):
            super().__init__(model, names)
            base.__enter__(self)  # registered when made

        def __enter__(self):
            return self

    failed("02.3", InInit, "right after StepStats(model, names)", "registered on layer '1'",
           "in __enter__, not __init__", "00.3")


def test_02_3_names_the_slip():
    failed("02.3", step_stats(late=True), "name=name", "last name")
    failed("02.3", step_stats(as_tensor=True), "keeps tensors", ".item()")
    failed("02.3", step_stats(of="input"), "expected")
    failed("02.3", step_stats(population=True), "population std", "unbiased=False", "use .std()")
    failed("02.3", step_stats(near_zero=True), "self.zeros['2.1']", "not zeros", "(output == 0)")
    failed("02.3", step_stats(zeros="count"), "a count, not a share")
    failed("02.3", step_stats(zeros="percent"), "a percentage", "fraction from 0 to 1")
    failed("02.3", step_stats(zeros="nonpositive"), "≤ 0 counts negatives")


def test_02_3_says_when_a_hook_returned_a_value_that_replaced_the_output():
    outcome = failed("02.3", step_stats(returns=True), "your hook on layer '1' returned a value, the tuple (NoneType, ",
                     "replaced the layer's output", "returns None")
    assert "TypeError" not in outcome.detail


# ----- 02.4: the recorder -------------------------------------------------------------------------
def recorder(per_call=True, where="pre", copy=lambda t: t.detach().clone(), copy_out=None, late=False,
             leaves_only=None, records_as="list", append_at="end", enter_returns_self=True, waiting="stack",
             returns_copies=False):
    """A recorder class for 02.4 (variations: wrong). ``per_call``: one ``(name, inputs, output)`` per call of
    every submodule; else, wrong, ``inputs`` and ``outputs`` dicts over the leaves. Inputs are copied in a
    pre-hook (``where="pre"``) or, wrong for in-place layers, in the forward hook. ``waiting``: how a call's
    two hooks meet: one ``stack`` for all modules, a stack or a queue per name (``name stack``, ``name queue``),
    one slot per name (``slot``) or a slot popped (``slot pop``, ``slot pop none``), right while no module is
    called again before its call ends (none in the check's model); one ``queue`` for all modules, wrong."""
    copy_out = copy_out or copy
    leaves_only = (not per_call) if leaves_only is None else leaves_only

    class Recorder:
        def __init__(self, model):
            self.model, self.handles, self.records = model, [], {} if records_as == "dict" else []
            self.waiting = [] if waiting in ("stack", "queue", "peek") else {}
            self.inputs, self.outputs = {}, {}

        def put_aside(self, name, args):
            copies = tuple(copy(a) for a in args)
            if waiting in ("stack", "queue", "peek"):
                self.waiting.append(copies)
            elif waiting in ("name stack", "name queue"):
                self.waiting.setdefault(name, []).append(copies)
            else:
                self.waiting[name] = copies
            return copies

        def take(self, name):
            if waiting == "stack":
                return self.waiting.pop()
            if waiting == "queue":
                return self.waiting.pop(0)
            if waiting == "peek":  # the last put aside, never taken off the stack
                return self.waiting[-1]
            if waiting == "name stack":
                return self.waiting[name].pop()
            if waiting == "name queue":
                return self.waiting[name].pop(0)
            if waiting == "slot pop none":  # .pop(name, None): no KeyError, a None instead
                return self.waiting.pop(name, None)
            return self.waiting.pop(name) if waiting == "slot pop" else self.waiting[name]

        def keep(self, name, inputs, output):
            if not per_call:
                self.inputs[name], self.outputs[name] = inputs, copy_out(output)
            elif records_as == "dict":
                self.records[name] = (name, inputs, copy_out(output))
            else:
                self.records.append((name, inputs, copy_out(output)))

        def __enter__(self):
            for name, module in self.model.named_modules():
                if not name or (leaves_only and next(module.children(), None) is not None):
                    continue
                if late:  # the slip: both hooks read the loop variable after the loop has ended
                    def before(m, args):
                        self.put_aside(name, args)  # noqa: B023

                    def after(m, args, output):
                        self.keep(name, self.take(name), output)  # noqa: B023
                else:
                    def before(m, args, name=name):
                        copies = self.put_aside(name, args)
                        return copies if returns_copies else None

                    def after(m, args, output, name=name):
                        kept = self.take(name) if where == "pre" else tuple(copy(a) for a in args)
                        self.keep(name, kept, output)

                if where == "pre":
                    self.handles.append(module.register_forward_pre_hook(before))
                if append_at == "start":
                    hook = lambda m, args, name=name: self.records.append((name, (), args[0].detach().clone()))  # noqa: E731
                    self.handles.append(module.register_forward_pre_hook(hook))
                else:
                    self.handles.append(module.register_forward_hook(after))
            return self if enter_returns_self else None

        def __exit__(self, *exc):
            for handle in self.handles:
                handle.remove()

    return Recorder


def test_02_4_accepts_a_dict_keyed_by_name_or_a_stack():
    """The lesson asks for a dict keyed by name; one stack for all modules is right too."""
    for waiting in ("slot pop", "slot pop none", "stack", "name stack", "name queue"):
        result = grade("02.4", recorder(waiting=waiting))
        assert result.passed, (waiting, result.detail)


def test_02_4_reports_the_first_record_a_queue_gets_wrong_and_shows_the_model():
    failed("02.4", recorder(waiting="queue"), "record 4 ('2.relu')", "another call", "waiting.pop(name)",
           "put aside last", "the check's model")


def test_02_4_names_a_stack_read_but_never_popped():
    failed("02.4", recorder(waiting="peek"), "already ended", "take them off (pop)")


def test_02_4_names_a_dict_read_but_never_popped():
    """Read and left in place, each module's last inputs still wait after the pass: a pairing slip would go
    silent instead of raising KeyError."""
    outcome = failed("02.4", recorder(waiting="slot"), "still wait", "waiting.pop(name)", "KeyError",
                     "earlier call of that module")
    assert "7 copies" in outcome.detail  # one per module: 9 calls of 7 submodules


def test_02_4_names_the_slip():
    failed("02.4", recorder(late=True), "name=name")
    failed("02.4", recorder(records_as="dict"), "can run twice")
    failed("02.4", recorder(leaves_only=True), "containers too")
    failed("02.4", recorder(append_at="start"), "wrong order", "when each call ends")
    failed("02.4", recorder(copy=lambda t: t.clone()), "autograd graph")
    failed("02.4", recorder(where="forward"), "forward pre-hook", "overwrote")
    failed("02.4", recorder(copy=lambda t: t.detach(), copy_out=lambda t: t.detach().clone()), "clone")
    failed("02.4", recorder(copy_out=lambda t: t.detach()), "output kept for record", "clone")
    failed("02.4", recorder(per_call=False), "0 records for 9 calls")
    failed("02.4", recorder(returns_copies=True), "returned a value", "replaced the layer's inputs")
    failed("02.4", recorder(enter_returns_self=False), "return self")

    class Forgets(recorder()):
        def __exit__(self, *exc):
            pass

    outcome = failed("02.4", Forgets, "pre-hook is still registered on layer", "__exit__")
    assert "_forward" not in outcome.detail


def test_no_message_names_a_private_attribute():
    """A student reads 'a forward hook is still registered on layer ...', never PyTorch's dict names."""
    details = [grade("02.1", stds_answer(in_finally=False)).detail,
               grade("02.2", rescaling(how="both", one_pass=True, in_finally=False)).detail]
    assert all("still registered" in d and "_forward" not in d and "hooks_dict" not in d for d in details)


def test_02_2_refuses_an_answer_that_registers_no_hook():
    """A loop over the layers that runs them itself measures the right stds only while forward is a plain
    chain: it is refused, whether it calls model(x) without hooks or never calls it."""
    def by_hand(model, x, call_model=False):
        with torch.no_grad():
            if call_model:
                model(x)
            h = x
            leaves = sorted((name, m) for name, m in model.named_modules() if not list(m.children()))
            for _, layer in leaves:  # in the order they run: '2.a' before '2.b'
                if layer is model.get_submodule("2.b"):
                    h = torch.relu(h)
                h = layer(h)
                if isinstance(layer, nn.Conv2d | nn.Linear):
                    layer.weight.div_(h.std())
                    h = h / h.std()

    failed("02.2", by_hand, "registered no hook and never called model(x)", "skip connection")
    failed("02.2", lambda model, x: by_hand(model, x, call_model=True), "registered no hook while model(x) ran")
    failed("02.2", lambda model, x: None, "no weight changed")  # doing nothing is told so, not "no hook"
