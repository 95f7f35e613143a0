"""The course covers every hook API of the installed torch, and its reference table lists them.

The census (by introspection of the installed torch, so a torch upgrade that adds a hook API makes
these tests fail until the course covers it):
* every public attribute named ``register_*hook*`` or ``set_*hook*`` of ``torch.Tensor``,
  ``torch.nn.Module``, ``torch.optim.Optimizer`` and ``torch.autograd.graph.Node``, and of a saved
  tensor (``torch._C._autograd.SavedTensor.register_hooks``, what ``grad_fn._raw_saved_*`` are);
* every name containing ``hook`` in the ``__all__`` of ``torch.nn.modules.module``,
  ``torch.optim.optimizer``, ``torch.autograd.graph`` and ``torch.utils.hooks``, whatever it is
  called: the ``register_*`` functions, context managers such as ``saved_tensors_hooks`` and
  ``node_creation_hook``, the decorator ``unserializable_hook`` and ``warn_if_has_hooks``, so a new
  hook API of another shape is noticed too; and every class in those ``__all__`` that is a kind of
  ``saved_tensors_hooks`` (``save_on_cpu``);
* the ``register_*hook*`` and ``set_*hook*`` methods that the distributed wrappers
  ``DistributedDataParallel``, ``FullyShardedDataParallel`` and FSDP2's ``FSDPModule`` define
  themselves (their communication hooks, ``set_all_reduce_hook``).
Private APIs (``Module._register_load_state_dict_pre_hook``, ``Module._register_state_dict_hook``)
are not public and not counted. Public hook APIs outside these owners (CUDA graphs, process groups,
``register_ddp_comm_hook``, DDP's ``join_hook``, ``torch.package``) are out of scope:
``OUT_OF_SCOPE`` lists them, and a test checks that they exist and that the "Not covered" section
of the field guide G6 names them.

How a call is recognised in a notebook: the code cells of every notebook under ``notebooks/``
(solutions included) are parsed with ``ast`` (IPython ``%``/``!`` lines are dropped). A call
counts when it is written as a call: ``x.register_forward_hook(...)`` (an attribute call, any
receiver) or ``register_module_forward_hook(...)`` (a bare name, after ``from ... import``).
A decorator counts as a call (``@unserializable_hook``, ``@torch.utils.hooks.unserializable_hook``).
Mentions in comments, strings, markdown or an attribute without a call do not count. Some
names are shared by two owners, and the receiver decides which one is meant:
* ``register_hook``: ``Node.register_hook`` when the receiver mentions ``grad_fn`` or
  ``next_functions`` (``y.grad_fn.register_hook(...)``), or is a variable the notebook assigns
  from such an expression (``node = y.grad_fn``); otherwise ``Tensor.register_hook``.
* the four state-dict hooks: ``Optimizer.*`` when the receiver's text contains ``optim``
  (``optimizer.…``, ``torch.optim.SGD(...).…``) or is a variable assigned from a call of an
  optimizer class (``sgd = SGD(params)``); otherwise ``Module.*``.
* ``register_comm_hook``: ``DistributedDataParallel``'s or ``FullyShardedDataParallel``'s when the
  receiver is a variable assigned from a call of that class (or of ``DDP`` / ``FSDP``); neither
  for any other receiver.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import urllib.parse
from pathlib import Path

import pytest
import torch
from torch.autograd import graph as graph_module
from torch.nn.modules import module as module_module
from torch.optim import optimizer as optimizer_module
from torch.utils import hooks as utils_hooks_module

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
TABLE_NOTEBOOK = NOTEBOOK_DIR / "guide" / "G6_firing_order_and_reference.ipynb"
LESSON_06 = NOTEBOOK_DIR / "06_hooks_around_training.ipynb"
GUIDE_G7 = NOTEBOOK_DIR / "guide" / "G7_hooks_around_training.ipynb"
TABLE_HEADING = r"(?:\d+\.\s+)?Reference table"
HOOK_NAME = re.compile(r"^(?:register|set)_\w*hook")

#: APIs the course does not call, each with the reason. Keep it short.
EXCLUDED: dict[str, str] = {
    "torch.utils.hooks.BackwardHook": "the wrapper nn.Module builds for its own full backward hooks; user code never "
                                      "creates or registers it (guide G3 section 3 shows its views)",
}

#: public hook APIs outside the owners above, each with the text the "Not covered" section of the
#: guide G6 must contain: the course says out loud that its reference table does not reach them
OUT_OF_SCOPE = {
    "torch.cuda.graphs.register_graph_capture_start_hook": "torch.cuda.graphs.register_graph_*_hook",
    "torch.cuda.graphs.register_graph_destroy_hook": "torch.cuda.graphs.register_graph_*_hook",
    "torch.cuda.CUDAGraph.register_replay_start_hook": "torch.cuda.CUDAGraph.register_*_hook",
    "torch.distributed.ProcessGroup.register_pre_hook": "torch.distributed.ProcessGroup.register_pre_hook",
    "torch.distributed.ProcessGroup.register_post_hook": "register_post_hook",
    "torch.distributed.ProcessGroup.register_abort_hook": "register_abort_hook",
    "torch.distributed.algorithms.ddp_comm_hooks.register_ddp_comm_hook": (
        "torch.distributed.algorithms.ddp_comm_hooks.register_ddp_comm_hook"
    ),
    "torch.package.PackageExporter.register_intern_hook": "torch.package.PackageExporter.register_intern_hook",
    "torch.package.PackageExporter.register_extern_hook": "register_extern_hook",
    "torch.package.PackageExporter.register_mock_hook": "register_mock_hook",
    "torch.nn.parallel.DistributedDataParallel.join_hook": "torch.nn.parallel.DistributedDataParallel.join_hook",
}
NOT_COVERED_HEADING = r"(?:\d+\.\s+)?Not covered"


def _owners():
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    classes = {
        "torch.Tensor": (torch.Tensor, False),
        "torch.nn.Module": (torch.nn.Module, False),
        "torch.optim.Optimizer": (torch.optim.Optimizer, False),
        "torch.autograd.graph.Node": (torch.autograd.graph.Node, False),
        "torch._C._autograd.SavedTensor": (torch._C._autograd.SavedTensor, False),
        # only what these wrappers define themselves: they inherit Module's hooks
        "torch.nn.parallel.DistributedDataParallel": (DistributedDataParallel, True),
        "torch.distributed.fsdp.FullyShardedDataParallel": (FullyShardedDataParallel, True),
        "torch.distributed.fsdp.FSDPModule": (FSDPModule, True),
    }
    modules = (module_module, optimizer_module, graph_module, utils_hooks_module)
    return classes, modules


def hook_apis() -> dict[str, str]:
    """``{qualified API name: short name}`` for every hook-registering API found in torch."""
    classes, modules = _owners()
    found = {}
    for label, (cls, own_only) in classes.items():
        names = vars(cls) if own_only else dir(cls)
        for name in names:
            if HOOK_NAME.match(name) and callable(getattr(cls, name)):
                found[f"{label}.{name}"] = name
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            saved_tensor_hooks = isinstance(value, type) and issubclass(value, graph_module.saved_tensors_hooks)
            if "hook" in name.lower() or saved_tensor_hooks:
                found[f"{module.__name__}.{name}"] = name
    return dict(sorted(found.items()))


# ----- recognising calls ------------------------------------------------------------------------

_MODULE_LABELS = {"torch.nn.modules.module", "torch.optim.optimizer", "torch.autograd.graph", "torch.utils.hooks"}
_NODE_TEXT = re.compile(r"\bgrad_fn\b|\bnext_functions\b")
_OPTIMIZER_CLASSES = {"Optimizer"}
_pending = [torch.optim.Optimizer]
while _pending:
    for sub in _pending.pop().__subclasses__():
        _OPTIMIZER_CLASSES.add(sub.__name__)
        _pending.append(sub)


#: the distributed wrappers, by class name and the short names notebooks import them as
_WRAPPERS = {"DistributedDataParallel": "ddp", "DDP": "ddp", "FullyShardedDataParallel": "fsdp", "FSDP": "fsdp"}


def _owner_kind(label: str) -> str:
    if label.endswith(".Node"):
        return "node"
    if label.endswith(".Optimizer"):
        return "optimizer"
    return _WRAPPERS.get(label.rsplit(".", 1)[-1], "default")


def _root_name(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _value_kinds(value: ast.expr) -> set[str]:
    text = ast.unparse(value)
    kinds = set()
    if _NODE_TEXT.search(text):
        kinds.add("node")
    if isinstance(value, ast.Call):
        callee = ast.unparse(value.func)
        if "optim" in callee.lower() or callee.rsplit(".", 1)[-1] in _OPTIMIZER_CLASSES:
            kinds.add("optimizer")
        if callee.rsplit(".", 1)[-1] in _WRAPPERS:
            kinds.add(_WRAPPERS[callee.rsplit(".", 1)[-1]])
    return kinds


def _bindings(tree: ast.AST) -> dict[str, set[str]]:
    """Which kinds of object each variable name of the notebook is ever assigned."""
    bound: dict[str, set[str]] = {}

    def bind(target: ast.expr, kinds: set[str]) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and kinds:
                bound.setdefault(node.id, set()).update(kinds)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, _value_kinds(node.value))
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            bind(node.target, _value_kinds(node.value))
        elif isinstance(node, (ast.For, ast.comprehension)):
            bind(node.target, _value_kinds(node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            bind(node.optional_vars, _value_kinds(node.context_expr))
    return bound


def _receiver_kinds(receiver: ast.expr, bound: dict[str, set[str]]) -> set[str]:
    text = ast.unparse(receiver)
    if _NODE_TEXT.search(text):
        return {"node"}
    if "optim" in text.lower():
        return {"optimizer"}
    return bound.get(_root_name(receiver) or "", set()) or {"default"}


def parse_cells(sources: list[str]) -> ast.Module:
    """One module from a notebook's code cells, IPython magics and shell lines dropped."""
    body = []
    for source in sources:
        lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
        body.extend(ast.parse("\n".join(lines)).body)
    return ast.Module(body=body, type_ignores=[])


def called_apis(tree: ast.Module, apis: dict[str, str]) -> set[str]:
    """The APIs of ``apis`` that ``tree`` calls (see the module docstring for the rules)."""
    by_name: dict[str, list[str]] = {}
    for key, name in apis.items():
        by_name.setdefault(name, []).append(key)
    bound = _bindings(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # @unserializable_hook counts as a call
            for decorator in node.decorator_list:
                if isinstance(decorator, (ast.Name, ast.Attribute)):
                    as_call = ast.Module(body=[ast.Expr(ast.Call(decorator, [], []))], type_ignores=[])
                    found |= called_apis(as_call, apis)
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in by_name:
            keys = by_name[func.attr]
            if len(keys) > 1:
                kinds = _receiver_kinds(func.value, bound)
                keys = [k for k in keys if _owner_kind(k.rsplit(".", 1)[0]) in kinds] or [
                    k for k in keys if _owner_kind(k.rsplit(".", 1)[0]) == "default"
                ]
            found.update(keys)
        elif isinstance(func, ast.Name) and func.id in by_name:
            found.update(k for k in by_name[func.id] if k.rsplit(".", 1)[0] in _MODULE_LABELS)
    return found


def _notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOK_DIR.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def _cells(path: Path, kind: str) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == kind]


@pytest.fixture(scope="module")
def apis() -> dict[str, str]:
    return hook_apis()


# ----- the introspection and the recogniser themselves --------------------------------------------


def test_introspection_finds_every_family(apis):
    for key in (
        "torch.Tensor.register_hook",
        "torch.Tensor.register_post_accumulate_grad_hook",
        "torch.autograd.graph.Node.register_prehook",
        "torch.nn.Module.register_forward_hook",
        "torch.nn.Module.register_load_state_dict_post_hook",
        "torch.optim.Optimizer.register_load_state_dict_post_hook",
        "torch.optim.Optimizer.register_step_pre_hook",
        "torch.nn.modules.module.register_module_full_backward_pre_hook",
        "torch.nn.modules.module.register_module_buffer_registration_hook",
        "torch.optim.optimizer.register_optimizer_step_post_hook",
        "torch.autograd.graph.register_multi_grad_hook",
        "torch.autograd.graph.saved_tensors_hooks",
        "torch.autograd.graph.node_creation_hook",
        "torch.autograd.graph.save_on_cpu",
        "torch._C._autograd.SavedTensor.register_hooks",
        "torch.distributed.fsdp.FSDPModule.set_all_reduce_hook",
        "torch.utils.hooks.unserializable_hook",
        "torch.utils.hooks.warn_if_has_hooks",
    ):
        assert key in apis
    assert not any(name.startswith("_") for name in apis.values())
    # inherited Module hooks are counted once, on Module, not again on the distributed wrappers
    assert "torch.nn.parallel.DistributedDataParallel.register_forward_hook" not in apis


def test_every_public_name_with_hook_in_the_namespaces_is_found(apis):
    """Not only ``register_*``: whatever a namespace exports with "hook" in its name is an API to cover."""
    for module in _owners()[1]:
        for name in module.__all__:
            if "hook" in name.lower():
                assert f"{module.__name__}.{name}" in apis


def test_exclusions_are_found_and_explained(apis):
    for key, reason in EXCLUDED.items():
        assert key in apis, f"{key} is excluded but torch no longer has it: drop the exclusion"
        assert len(reason.split()) >= 8, f"say why {key} is excluded"
    assert len(EXCLUDED) <= 5


def _calls(source: str, apis) -> set[str]:
    return called_apis(parse_cells([source]), apis)


def test_a_call_counts_but_a_mention_does_not(apis):
    assert _calls("h = layer.register_forward_hook(f)", apis) == {"torch.nn.Module.register_forward_hook"}
    assert _calls(
        "from torch.nn.modules.module import register_module_forward_hook\nregister_module_forward_hook(f)", apis
    ) == {"torch.nn.modules.module.register_module_forward_hook"}
    assert _calls("import torch.nn.modules.module as mm\nmm.register_module_forward_hook(f)", apis) == {
        "torch.nn.modules.module.register_module_forward_hook"
    }
    assert _calls("with torch.autograd.graph.saved_tensors_hooks(pack, unpack):\n    pass", apis) == {
        "torch.autograd.graph.saved_tensors_hooks"
    }
    silent = (
        "# layer.register_forward_hook(f)\ns = 'layer.register_forward_pre_hook(f)'\n"
        "m = layer.register_full_backward_hook\n"
    )
    assert _calls(silent, apis) == set()
    assert _calls("%time x = 1\n!ls\ny = x.register_hook(f)", apis) == {"torch.Tensor.register_hook"}
    decorated = "@torch.utils.hooks.unserializable_hook\ndef f(grad):\n    pass"
    assert _calls(decorated, apis) == {"torch.utils.hooks.unserializable_hook"}
    assert _calls("from torch.utils.hooks import unserializable_hook\n@unserializable_hook\ndef f(grad):\n    pass",
                  apis) == {"torch.utils.hooks.unserializable_hook"}
    assert _calls("@functools.cache\ndef f():\n    pass", apis) == set()


def test_the_receiver_decides_between_owners(apis):
    assert _calls("y.register_hook(f)", apis) == {"torch.Tensor.register_hook"}
    assert _calls("y.grad_fn.register_hook(f)", apis) == {"torch.autograd.graph.Node.register_hook"}
    assert _calls("node = y.grad_fn\nnode.register_hook(f)", apis) == {"torch.autograd.graph.Node.register_hook"}
    loop = "for fn, _ in y.grad_fn.next_functions:\n    fn.register_hook(f)"
    assert _calls(loop, apis) == {"torch.autograd.graph.Node.register_hook"}
    assert _calls("model.register_state_dict_pre_hook(f)", apis) == {"torch.nn.Module.register_state_dict_pre_hook"}
    assert _calls("optimizer.register_state_dict_pre_hook(f)", apis) == {
        "torch.optim.Optimizer.register_state_dict_pre_hook"
    }
    assert _calls("sgd = SGD(model.parameters(), lr=0.1)\nsgd.register_load_state_dict_post_hook(f)", apis) == {
        "torch.optim.Optimizer.register_load_state_dict_post_hook"
    }
    ddp = "DDP = torch.nn.parallel.DistributedDataParallel\nwrapped = DDP(model)\nwrapped.register_comm_hook(None, f)"
    assert _calls(ddp, apis) == {"torch.nn.parallel.DistributedDataParallel.register_comm_hook"}
    fsdp = "sharded = FullyShardedDataParallel(model)\nsharded.register_comm_hook(None, f)"
    assert _calls(fsdp, apis) == {"torch.distributed.fsdp.FullyShardedDataParallel.register_comm_hook"}
    assert _calls("unknown.register_comm_hook(None, f)", apis) == set()  # no owner guessed


# ----- the course ---------------------------------------------------------------------------------


def test_every_hook_api_is_called_in_some_notebook(apis):
    called: dict[str, list[str]] = {}
    for path in _notebooks():
        for key in called_apis(parse_cells(_cells(path, "code")), apis):
            called.setdefault(key, []).append(path.name)
    missing = [key for key in apis if key not in called and key not in EXCLUDED]
    assert not missing, "hook APIs no notebook calls yet:\n  " + "\n  ".join(missing)
    needlessly_excluded = [key for key in EXCLUDED if key in called]
    assert not needlessly_excluded, f"excluded but called (drop the exclusion): {needlessly_excluded}"


def _table_rows() -> dict[str, str]:
    """``{API: the row's markdown}`` from the reference table of the guide G6."""
    for source in _cells(TABLE_NOTEBOOK, "markdown"):
        if re.search(rf"^#+ {TABLE_HEADING}\b", source, re.MULTILINE):
            rows = {}
            for line in source.splitlines():
                match = re.match(r"\|\s*`([\w.]+)`", line)
                if match:
                    rows[match.group(1)] = line
            return rows
    pytest.fail(f"{TABLE_NOTEBOOK.name} has no markdown cell headed {TABLE_HEADING!r}")


def heading_anchor(heading: str) -> str:
    """The anchor JupyterLab gives a heading: its rendered text, spaces turned into ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"[`*]", "", text).strip()
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors = set()
    for source in _cells(path, "markdown"):
        for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", source, re.MULTILINE):
            anchors.add(heading_anchor(match.group(1)))
    return anchors


def test_heading_anchor_follows_jupyterlab():
    assert heading_anchor("Changing inputs and outputs") == "Changing-inputs-and-outputs"
    assert heading_anchor("The `saved_tensors_hooks` pair") == "The-saved_tensors_hooks-pair"


def test_reference_table_has_a_row_for_every_api(apis):
    rows = _table_rows()
    missing = [key for key in apis if key not in rows]
    assert not missing, "APIs without a row in the reference table:\n  " + "\n  ".join(missing)
    unknown = [key for key in rows if key not in apis]
    assert not unknown, f"rows for APIs this torch does not have: {unknown}"


def test_reference_table_links_point_at_real_sections():
    problems = []
    for key, row in _table_rows().items():
        links = [link for link in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", row) if "://" not in link[0]]
        if not links:
            problems.append(f"{key}: no link to a section")
        for target, fragment in links:
            path = (TABLE_NOTEBOOK.parent / target) if target else TABLE_NOTEBOOK
            if not path.exists():
                problems.append(f"{key}: {target} does not exist")
            elif urllib.parse.unquote(fragment) not in _anchors(path):
                problems.append(f"{key}: {target or TABLE_NOTEBOOK.name} has no heading for #{fragment}")
    assert not problems, "reference-table links to fix:\n  " + "\n  ".join(problems)


def test_signatures_in_the_table_name_the_hook_arguments(apis):
    """Spot check that the table is about the installed torch: parameter names match its docs."""
    rows = _table_rows()
    doc = inspect.getdoc(torch.nn.Module.register_load_state_dict_pre_hook) or ""
    assert "missing_keys" in doc and "missing_keys" in rows["torch.nn.Module.register_load_state_dict_pre_hook"]
    assert "incompatible_keys" in rows["torch.nn.Module.register_load_state_dict_post_hook"]


@pytest.mark.parametrize("notebook", sorted(NOTEBOOK_DIR.rglob("*.ipynb")), ids=lambda p: p.stem)
def test_every_link_to_a_section_points_at_a_real_heading(notebook):
    """Every notebook's prose links to sections (its own or other notebooks'), not only the table's:
    a renamed heading breaks them silently in JupyterLab."""
    problems = []
    for source in _cells(notebook, "markdown"):
        for target, fragment in re.findall(r"\]\(([^)#\s]*\.ipynb|)#([^)\s]+)\)", source):
            path = (notebook.parent / target) if target else notebook
            if not path.exists() or urllib.parse.unquote(fragment) not in _anchors(path):
                problems.append(f"{target}#{fragment}")
    assert not problems, f"links without a matching heading: {problems}"


def _resolve(dotted: str):
    """The object named ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_hook_apis_out_of_scope_exist_and_are_named_under_not_covered():
    sections = [s for s in _cells(TABLE_NOTEBOOK, "markdown") if re.search(rf"^#+ {NOT_COVERED_HEADING}\b", s, re.M)]
    assert len(sections) == 1, f"{TABLE_NOTEBOOK.name} needs one markdown cell headed {NOT_COVERED_HEADING!r}"
    for dotted, text in OUT_OF_SCOPE.items():
        assert callable(_resolve(dotted)), f"{dotted} is gone from torch: drop it from OUT_OF_SCOPE"
        assert text in sections[0], f"the Not covered section of the guide G6 does not name {text!r} ({dotted})"


# ----- what the reference table says about return values and order, on the installed torch -------


def test_return_values_the_table_calls_errors_raise():
    leaf = torch.ones(2, requires_grad=True)
    with leaf.register_post_accumulate_grad_hook(lambda tensor: torch.zeros(2)), pytest.raises(RuntimeError):
        (leaf * 2).sum().backward()
    lin = torch.nn.Linear(2, 2)
    with lin.register_load_state_dict_post_hook(lambda module, keys: "a value"), pytest.raises(AssertionError):
        lin.load_state_dict(lin.state_dict())
    with lin.register_full_backward_hook(lambda module, grad_input, grad_output: (torch.zeros(1, 2),)):
        with pytest.raises(RuntimeError), pytest.warns(UserWarning, match="no inputs require gradients"):
            lin(torch.ones(1, 2)).sum().backward()  # no input requires grad: nothing to replace


def test_return_values_the_table_calls_ignored():
    a, b = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    with torch.autograd.graph.register_multi_grad_hook([a, b], lambda grads: [g * 0 for g in grads]):
        (a * b * 3).sum().backward()
    assert a.grad.tolist() == [3.0, 3.0]
    lin = torch.nn.Linear(2, 2)
    with lin.register_state_dict_pre_hook(lambda module, prefix, keep_vars: {"ignored": 1}):
        assert list(lin.state_dict()) == ["weight", "bias"]
    sgd = torch.optim.SGD(lin.parameters(), lr=0.1)
    with sgd.register_step_post_hook(lambda optimizer, args, kwargs: "ignored"):
        assert sgd.step() is None


def test_orders_the_table_states():
    lin, ran = torch.nn.Linear(2, 2), []
    with (lin.register_full_backward_hook(lambda *args: ran.append("first")),
          lin.register_full_backward_hook(lambda *args: ran.append("prepended"), prepend=True)):
        lin(torch.ones(1, 2, requires_grad=True)).sum().backward()
    assert ran == ["prepended", "first"]
    model, loaded = torch.nn.Sequential(torch.nn.Linear(2, 2)), []
    with (model.register_load_state_dict_post_hook(lambda module, keys: loaded.append("root")),
          model[0].register_load_state_dict_post_hook(lambda module, keys: loaded.append("child"))):
        model.load_state_dict(model.state_dict())
    assert loaded == ["child", "root"]


def test_measured_claims_of_lesson_06_and_its_guides():
    """What lesson 06 and the guides G6 and G7 mark as measured on the pinned version: a torch upgrade
    that changes one fails here."""
    lin, stricts = torch.nn.Linear(2, 2), []
    with lin.register_load_state_dict_pre_hook(lambda module, sd, prefix, meta, strict, *rest: stricts.append(strict)):
        lin.load_state_dict(lin.state_dict(), strict=False)
    assert stricts == [True]  # the pre-hook's strict is True whatever the caller passed
    sgd, seen = torch.optim.SGD(lin.parameters(), lr=0.0), []
    with sgd.register_step_pre_hook(lambda optimizer, args, kwargs: seen.append(args)):
        sgd.step()
    assert seen[0][0] is sgd  # args starts with the optimizer
    with sgd.register_step_pre_hook(lambda optimizer, args, kwargs: ((), {})), pytest.raises(IndexError):
        sgd.step()
    for register in ("register_state_dict_pre_hook", "register_load_state_dict_post_hook"):
        assert "prepend" in inspect.signature(getattr(torch.optim.Optimizer, register)).parameters


def test_a_buffer_reassigned_in_forward_fires_the_registration_hook():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            return x

    counter, fired = Counter(), []
    with module_module.register_module_buffer_registration_hook(lambda module, name, buffer: fired.append(name)):
        counter(torch.ones(1))
        counter(torch.ones(1))
    assert fired == ["calls", "calls"]


def test_the_early_firing_warning_comes_once_per_module_call():
    import warnings

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    handles = [model[0].register_full_backward_hook(lambda m, gi, go: None) for _ in range(2)]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(torch.randn(4, 3)).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    assert len(caught) == 1  # two hooks on one module call: one warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with module_module.register_module_full_backward_hook(lambda m, gi, go: None):
            model(torch.randn(4, 3)).sum().backward()
    assert len(caught) == 2  # the Linear and the Sequential around it, whose input needs no grad either


def test_saved_tensor_hooks_claims():
    x = torch.randn(3, requires_grad=True)
    with torch.autograd.graph.save_on_cpu():
        y = x.exp()
    assert y.grad_fn._saved_result.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()  # no copy on CPU
    packed = []
    z = x.pow(2)
    z.grad_fn._raw_saved_self.register_hooks(lambda t: packed.append("pack") or t.detach(), lambda t: t)
    assert packed == ["pack"]  # packed at once, when registered


def test_serialization_claims():
    import io
    import warnings

    @utils_hooks_module.unserializable_hook
    def quiet(grad):
        return None

    for hook, expected in ((lambda grad: None, 1), (quiet, 0)):
        t = torch.ones(2, requires_grad=True)
        t.register_hook(hook)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.save(t, io.BytesIO())
        assert len(caught) == expected


def test_the_optimizer_loads_the_checkpoints_learning_rate():
    weight = torch.nn.Parameter(torch.zeros(2))
    new = torch.optim.Adam([weight], lr=1e-3)
    new.load_state_dict(torch.optim.Adam([weight], lr=5e-3).state_dict())
    assert new.param_groups[0]["lr"] == 5e-3
