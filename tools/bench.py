"""Hook Lab's benchmark (``make bench``): four groups of figures, printed as tables and written to
``artifacts/bench.json`` (and ``artifacts/bench.md``, the table the README shows).

1. Recording overhead: resnet18 (random weights) at 224×224, batch 1, one thread. Bare model vs
   ``hooklab.record`` on every leaf module vs plain hooks vs torchvision's
   ``create_feature_extractor`` on the same layer calls (vs torchlens, when it installs from the
   registry into a throwaway venv). The variants run interleaved, round after round, so that
   load from other processes hits all of them alike; each figure is the median over rounds of
   the time ratio to the bare pass of the same round (time: the process's CPU time). The row the
   recorder is judged by is its cost over hand-written ``.detach().clone()`` hooks: the median over
   rounds of (record − clone hooks) / bare, target ≤ 0.03. Each recorder is also checked: how many of
   the values it returns differ from what the module really produced (a later in-place op, such
   as ResNet's ``ReLU(inplace=True)`` or ``out += identity``, overwrote them); the reference is
   a copy taken the moment each module returned. One row is a floor rather than a recorder: plain
   hooks that copy only the outputs ResNet overwrites later, picked by hand, the least any
   recorder returning the right outputs can copy. The group runs twice with freed memory kept
   (see ``hooklab.course.reuse_freed_memory``) and once with glibc's defaults; the second of the
   two runs is a child process pinned to the AVX2 kernels (what a CPU without AVX-512 runs), so
   that the ratios are shown both for the best kernels of the CPU it runs on and for AVX2.
2. Memory: growth of the process's resident memory over 200 recorded forward+backward passes of
   the digits CNN (flat is right: records are detached and dropped with the recording).
3. Widget redraw: median time of the whole ``LayerExplorer`` widget redraw (text + picture) after
   moving to a new layer and to a new channel, on the digits CNN and on resnet18 at 224×224
   (target: 30 ms), beside ``view`` and ``summary``; and the ``GradCamPicker`` widget on resnet18
   with a 224×224 photo: 16 moves of its 6 controls, each timed from the move to the new text and
   picture, the moves that ran a backward pass counted apart (targets: a median of at most 50 ms a
   move, at most 200 ms for a move that runs a backward pass). Run this group alone with
   ``make bench BENCH_ARGS="--only redraw"``.
4. Whole course: wall time of each notebook under strict nbval and its slowest cells (every
   notebook under ``notebooks/``: the lessons, ``guide/`` and ``solutions/``).

Timing figures depend on the machine and its load; the JSON records both.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
TORCHLENS_VENV = Path(tempfile.gettempdir()) / "hooklab-bench-torchlens"

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import psutil  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(1)


# ----- helpers ---------------------------------------------------------------------------------
def machine() -> dict:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import torchvision

    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "threads": torch.get_num_threads(),
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def interleaved(variants: dict, rounds: int, warmup: int = 2, against: str | None = None) -> dict:
    """Time every variant once per round, in the same order; median ratio to ``bare`` per round,
    and with ``against`` (a variant's name) the median of each round's (variant − against) / bare.

    The time is the process's CPU time (user + system, so page faults count): torch runs on one
    thread here, and CPU time leaves out the moments a shared machine gives the core to another
    process, which wall time would add to whichever variant happened to be running.
    """
    times = {name: [] for name in variants}
    for r in range(warmup + rounds):
        for name, run in variants.items():
            start = time.process_time()
            run()
            elapsed = time.process_time() - start
            if r >= warmup:
                times[name].append(elapsed)
    bare = times["bare"]
    found = {
        name: {
            "median_ms": round(statistics.median(t) * 1e3, 2),
            "ratio": round(statistics.median(a / b for a, b in zip(t, bare, strict=True)), 3),
            "min_ms": round(min(t) * 1e3, 2),
            "ratio_of_minima": round(min(t) / min(bare), 3),
            "rounds": len(t),
        }
        for name, t in times.items()
    }
    if against:
        ref = times[against]
        for name, t in times.items():
            found[name]["minus_reference"] = round(
                statistics.median((a - c) / b for a, c, b in zip(t, ref, bare, strict=True)), 4)
            found[name]["reference"] = against
    return found


def by_call(pairs: list) -> dict:
    """``{(name, call): tensor}`` from ``(name, tensor)`` pairs stored in call order."""
    calls: dict = {}
    found = {}
    for name, tensor in pairs:
        call = calls.get(name, 0)
        calls[name] = call + 1
        found[(name, call)] = tensor
    return found


def count_wrong(got: dict, reference: dict) -> str:
    """``"k of n"``: values that differ from the reference (or are missing)."""
    wrong = sum(1 for key, ref in reference.items() if key not in got or not torch.equal(got[key], ref))
    return f"{wrong} of {len(reference)}"


# ----- 1. recording overhead ---------------------------------------------------------------------
#: the row hooklab.record is judged against: hand-written forward hooks keeping output.detach().clone()
CLONE_HOOKS = "plain hooks, .detach().clone()"
#: record's budget over those hooks, as a fraction of the bare pass
CLONE_HOOKS_TARGET = 0.03


def overhead(rounds: int) -> dict:
    from torchvision.models import resnet18
    from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

    from hooklab.audit import leftover_hooks
    from hooklab.layers import select_layers
    from hooklab.recording import record

    torch.manual_seed(0)
    model = resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    leaves = select_layers(model, None)
    node_names = get_graph_node_names(model)[1]
    # FX names a module's second call "<name>_1": map every such node back to (name, call)
    node_key = {}
    for node in node_names:
        base, _, suffix = node.rpartition("_")
        if node in leaves:
            node_key[node] = (node, 0)
        elif base in leaves and suffix.isdigit():
            node_key[node] = (base, int(suffix))
    extractor = create_feature_extractor(model, return_nodes={n: n for n in node_key})

    # The floor for any recorder that returns the right outputs: plain hooks that copy only the
    # outputs a later in-place op overwrites, picked by hand for ResNet (the stem's bn1 and each
    # block's bn1 before ReLU(inplace=True), each block's bn2 before `out += identity`). A recorder
    # that does not know the model in advance cannot copy less.
    overwritten = {n for n in leaves if n == "bn1" or n.endswith((".bn1", ".bn2"))}

    def plain_hooks(copied: set, store: list):
        def hook(name):
            cloned = name in copied

            def keep(module, args, output):
                store.append((name, output.detach().clone() if cloned else output.detach()))

            return keep

        return [m.register_forward_hook(hook(n)) for n, m in leaves.items()]

    floor = f"plain hooks, copying only the {len(overwritten)} outputs overwritten later (picked by hand)"
    results = {}
    for mode in ("forward", "forward+backward"):
        backward = mode != "forward"

        def step(fn, backward=backward):
            if backward:
                model.zero_grad(set_to_none=True)
                fn().sum().backward()
            else:
                with torch.no_grad():
                    fn()

        def bare(step=step):
            step(lambda: model(x))

        def hooklab_record(step=step, **options):
            with record(model, **options) as rec:
                step(lambda: model(x))
            return rec

        def plain(copied: set, step=step):
            store: list = []
            handles = plain_hooks(copied, store)
            try:
                step(lambda: model(x))
            finally:
                for h in handles:
                    h.remove()
            return store

        def fx(step=step):
            out: dict = {}

            def run():
                out.update(extractor(x))
                return out["fc"]

            step(run)
            return out

        variants = {
            "bare": bare,
            "hooklab.record": hooklab_record,
            CLONE_HOOKS: lambda: plain(set(leaves)),
            "plain hooks, .detach() (no copy)": lambda: plain(set()),
            floor: lambda: plain(overwritten),
            "create_feature_extractor": fx,
        }
        if backward:
            variants["hooklab.record(backward=True)"] = lambda: hooklab_record(backward=True)
        timing = interleaved(variants, rounds if not backward else max(5, rounds // 2), against=CLONE_HOOKS)

        # correctness: which returned values are not what the module produced (a copy taken
        # the moment each module returned is the reference)
        reference = by_call(plain(set(leaves)))
        checks = {
            "hooklab.record": {(r.name, r.call): r.output for r in hooklab_record()},
            CLONE_HOOKS: reference,
            "plain hooks, .detach() (no copy)": by_call(plain(set())),
            floor: by_call(plain(overwritten)),
            "create_feature_extractor": {node_key[k]: v.detach() for k, v in fx().items()},
        }
        if backward:
            checks["hooklab.record(backward=True)"] = {
                (r.name, r.call): r.output for r in hooklab_record(backward=True)
            }
        for name, got in checks.items():
            timing[name]["wrong_values"] = "reference" if got is reference else count_wrong(got, reference)
        results[mode] = timing
    assert not leftover_hooks(model), "a benchmarked recorder left hooks behind"

    results["setup"] = "resnet18(weights=None).eval(), input (1, 3, 224, 224), one thread"
    return results


TORCHLENS_SCRIPT = r"""
import json, statistics, sys, time
import torch, torchlens
from torchvision.models import resnet18
torch.set_num_threads(1)
torch.manual_seed(0)
model = resnet18(weights=None).eval()
x = torch.randn(1, 3, 224, 224)
rounds = int(sys.argv[1])
def bare():
    with torch.no_grad():
        model(x)
def trace():
    torchlens.trace(model, x)
times = {"bare": [], "trace": []}
for r in range(1 + rounds):
    for name, fn in (("bare", bare), ("trace", trace)):
        t = time.perf_counter(); fn(); elapsed = time.perf_counter() - t
        if r:
            times[name].append(elapsed)
ratio = statistics.median(a / b for a, b in zip(times["trace"], times["bare"]))
print(json.dumps({"version": torchlens.__version__, "bare_ms": round(statistics.median(times["bare"]) * 1e3, 2),
                  "median_ms": round(statistics.median(times["trace"]) * 1e3, 2), "ratio": round(ratio, 3),
                  "rounds": rounds}))
"""


def torchlens_overhead(rounds: int) -> dict:
    """torchlens' ``trace`` (every op) in a throwaway venv that sees the project's packages."""
    import site

    python = TORCHLENS_VENV / "bin" / "python"
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(TORCHLENS_VENV)], check=True, capture_output=True)
            # The project's packages (torch, torchvision...) without copying them: a .pth file.
            purelib = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True, capture_output=True, text=True,
            ).stdout.strip()  # fmt: skip
            (Path(purelib) / "hooklab_project.pth").write_text(site.getsitepackages()[0] + "\n")
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "torchlens"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if install.returncode:
            return {"skipped": "torchlens did not install from the registry: " + install.stderr.strip()[-300:]}
        run = subprocess.run(
            [str(python), "-c", TORCHLENS_SCRIPT, str(max(3, rounds // 3))],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if run.returncode:
            return {"skipped": "torchlens trace failed: " + run.stderr.strip()[-300:]}
        result = json.loads(run.stdout.strip().splitlines()[-1])
        result["where"] = f"separate process, throwaway venv {TORCHLENS_VENV} (ratio to that process's bare forward)"
        return result
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return {"skipped": f"torchlens could not be set up: {error}"}


# ----- 2. memory -------------------------------------------------------------------------------
class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]  # fmt: skip


def memory_in_use() -> tuple[int, str]:
    """Bytes malloc has handed out and not got back (glibc's mallinfo2), else resident memory.

    Resident memory is blind once freed memory is kept for reuse (``hooklab.setup()`` does that):
    a leak would then be served from memory the process already holds.
    """
    try:
        mallinfo2 = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return psutil.Process().memory_info().rss, "resident memory"
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd, "memory allocated and in use (mallinfo2)"


def memory(passes: int = 200) -> dict:
    from hooklab.data import digits
    from hooklab.models import DigitsCNN
    from hooklab.recording import Record, record

    model = DigitsCNN()
    data = digits()
    x, y = data.x_train[:64], data.y_train[:64]
    loss_fn = nn.CrossEntropyLoss()

    def one_pass():
        with record(model, backward=True) as rec:
            loss_fn(model(x), y).backward()
        model.zero_grad(set_to_none=True)
        return rec

    for _ in range(10):  # warm-up: allocator pools, lazy imports
        one_pass()
    gc.collect()
    start, metric = memory_in_use()
    samples = {}
    for i in range(1, passes + 1):
        records = len(one_pass())
        if i % 50 == 0:
            gc.collect()
            samples[i] = round((memory_in_use()[0] - start) / 2**20, 2)
    gc.collect()
    live = sum(type(o) is Record for o in gc.get_objects())

    # control: the same passes keeping every recording alive must show growth, or the probe is blind
    kept = []
    control_start = memory_in_use()[0]
    for _ in range(passes // 4):
        kept.append(one_pass())
    gc.collect()
    control = round((memory_in_use()[0] - control_start) / 2**20, 2)
    del kept
    return {
        "setup": f"DigitsCNN, batch 64, record(model, backward=True) around forward+backward; {records} records a pass",
        "passes": passes,
        "metric": metric,
        "growth_mb": samples,
        "live_records_after": live,
        "control_keeping_recordings": {"passes": passes // 4, "growth_mb": control},
    }


# ----- 3. widget redraw ----------------------------------------------------------------------------
#: The course's target for one LayerExplorer redraw (text and picture), at the median.
REDRAW_TARGET_MS = 30


def redraw(repeats: int) -> dict:
    """What a student waits for after moving a control of ``LayerExplorer.widget()``: the whole
    redraw (the printed text, the picture drawn to PNG, both handed to the widgets), for a layer
    not drawn before and for a new channel of the layer with the most values; then ``view``
    (text + picture, no widgets) and ``summary`` alone. Then the Grad-CAM picker's moves
    (``picker_moves``)."""
    from torchvision.models import resnet18

    from hooklab.data import digits, photo
    from hooklab.models import DigitsCNN

    torch.manual_seed(0)
    cases = {
        "digits CNN (random weights), one 8×8 digit": (DigitsCNN().eval(), digits().x_test[:1]),
        "resnet18 (random weights), 224×224 photo": (resnet18(weights=None).eval(), photo()),
    }
    found = {label: redraw_times(model, x, repeats) for label, (model, x) in cases.items()}
    found[PICKER] = picker_moves(resnet18(weights=None).eval(), photo(), rounds=3)
    return found


#: the GradCamPicker case of the redraw group, and its targets (ms): the median move, and a move
#: that runs a backward pass
PICKER = "GradCamPicker: resnet18 (random weights), 224×224 photo"
PICKER_MEDIAN_TARGET_MS, PICKER_BACKWARD_TARGET_MS = 50, 200
#: 16 moves of the picker's 6 controls (one photo: the image slider is off), from the widget's start
#: (the last layer, the predicted class, guided Grad-CAM, own scale, trained weights)
PICKER_MOVES = [
    ("target", 281), ("layer", "layer3"), ("method", "Grad-CAM"), ("signed", True), ("scale", "shared"),
    ("target", 282), ("layer", "layer2"), ("method", "HiResCAM"), ("weights", "random"), ("target", 281),
    ("method", "Layer-CAM"), ("signed", False), ("scale", "own"), ("layer", "layer4"), ("weights", "trained"),
    ("method", "guided Grad-CAM"),
]  # fmt: skip


def picker_moves(model: nn.Module, x: torch.Tensor, rounds: int) -> dict:
    """``PICKER_MOVES`` on a new ``GradCamPicker`` widget, ``rounds`` times (nothing kept between
    rounds): the wall time of each move (the control set, the text and the PNG handed to the
    widgets), its median over rounds, and whether the move ran a backward pass (every
    ``torch.autograd.grad`` and ``Tensor.backward`` call is counted). Freed memory is kept for
    reuse, as ``hooklab.setup()`` does in the notebook the widget runs in."""
    from hooklab.cam_widgets import GradCamPicker
    from hooklab.course import reuse_freed_memory

    reuse_freed_memory()

    backwards = []
    grad, backward = torch.autograd.grad, torch.Tensor.backward

    def counted(fn):
        def call(*args, **kwargs):
            backwards.append(1)
            return fn(*args, **kwargs)

        return call

    times, cpu, ran_backward = [[] for _ in PICKER_MOVES], [[] for _ in PICKER_MOVES], [0] * len(PICKER_MOVES)
    torch.autograd.grad, torch.Tensor.backward = counted(grad), counted(backward)
    try:
        for _ in range(rounds):
            picker = GradCamPicker(model, x, [281], ["layer2", "layer3", "layer4"])
            panel = picker.widget()
            gc.collect()
            for i, (name, value) in enumerate(PICKER_MOVES):
                before = len(backwards)
                start, start_cpu = time.perf_counter(), time.process_time()
                getattr(panel, name).value = value
                times[i].append(time.perf_counter() - start)
                cpu[i].append(time.process_time() - start_cpu)
                ran_backward[i] = max(ran_backward[i], len(backwards) - before)
            del picker, panel
    finally:
        torch.autograd.grad, torch.Tensor.backward = grad, backward
    ms = lambda seconds: round(seconds * 1e3, 1)  # noqa: E731
    moves = [{"control": name, "value": value, "ms": ms(statistics.median(t)), "cpu_ms": ms(statistics.median(c)),
              "backward_passes": ran_backward[i]}
             for i, ((name, value), t, c) in enumerate(zip(PICKER_MOVES, times, cpu, strict=True))]  # fmt: skip
    found = {"moves": moves, "rounds": rounds, "moves_with_backward": sum(bool(m["backward_passes"]) for m in moves),
             "median_target_ms": PICKER_MEDIAN_TARGET_MS, "backward_target_ms": PICKER_BACKWARD_TARGET_MS}  # fmt: skip
    for clock, key in (("wall", "ms"), ("cpu", "cpu_ms")):  # the targets are judged on both clocks
        heavy = [m[key] for m in moves if m["backward_passes"]]
        median = round(statistics.median(m[key] for m in moves), 1)
        found[clock] = {
            "median_ms": median,
            "max_ms": max(m[key] for m in moves),
            "max_with_backward_ms": max(heavy, default=0.0),
            "max_without_backward_ms": max((m[key] for m in moves if not m["backward_passes"]), default=0.0),
            "median_passes": median <= PICKER_MEDIAN_TARGET_MS,
            "backward_passes": max(heavy, default=0.0) <= PICKER_BACKWARD_TARGET_MS,
        }
    return found


def picker_table(r: dict) -> list[str]:
    """The picker's moves as a table, then one pass/fail line per target, on both clocks."""
    verdict = lambda ok: "**pass**" if ok else "**FAIL**"  # noqa: E731
    out = [f"**{PICKER}**: `GradCamPicker.widget()`, layers layer2, layer3, layer4; each move timed from "
           f"setting the control to the new text and PNG, median over {r['rounds']} rounds, each on a new picker. "
           "Wall time is what the student waits; on a shared machine it adds the turns other processes get, "
           "which CPU time (this process's) leaves out.", "",
           "| # | move | wall | CPU | backward passes |", "|---:|---|---:|---:|---:|"]  # fmt: skip
    for i, m in enumerate(r["moves"], 1):
        out.append(f"| {i} | {m['control']} → {m['value']} | {m['ms']:.0f} ms | {m['cpu_ms']:.0f} ms | "
                   f"{m['backward_passes'] or ''} |")
    wall, cpu = r["wall"], r["cpu"]
    out += ["",
            f"- median move: {wall['median_ms']:.0f} ms wall, {cpu['median_ms']:.0f} ms CPU "
            f"(target ≤ {r['median_target_ms']} ms): {verdict(wall['median_passes'])} (wall), "
            f"{verdict(cpu['median_passes'])} (CPU)",
            f"- slowest of the {r['moves_with_backward']} moves that ran a backward pass: "
            f"{wall['max_with_backward_ms']:.0f} ms wall, {cpu['max_with_backward_ms']:.0f} ms CPU "
            f"(target ≤ {r['backward_target_ms']} ms): {verdict(wall['backward_passes'])} (wall), "
            f"{verdict(cpu['backward_passes'])} (CPU)",
            f"- slowest move without a backward pass: {wall['max_without_backward_ms']:.0f} ms wall, "
            f"{cpu['max_without_backward_ms']:.0f} ms CPU", ""]  # fmt: skip
    return out


def redraw_times(model: nn.Module, x: torch.Tensor, repeats: int) -> dict:
    from hooklab.widgets import LayerExplorer

    start = time.perf_counter()
    explorer = LayerExplorer(model, x)
    build = time.perf_counter() - start
    layers = explorer.layers
    largest = max(layers, key=lambda n: explorer.activations[n].numel())  # the most values to draw
    n_channels = explorer.activations[largest].shape[0]

    def timed(fn, *args):
        start = time.perf_counter()
        fn(*args)
        return time.perf_counter() - start

    def move(control, value):
        control.value = value

    # the widget first, so that every layer it moves to is drawn for the first time
    panel = explorer.widget(layers[-1])
    order = [layers[i] for i in range(0, len(layers) - 1, max(1, (len(layers) - 1) // repeats))][:repeats]
    widget_layer = [timed(move, panel.layer, layer) for layer in order]
    move(panel.layer, largest)
    widget_channel = [timed(move, panel.channel, (7 * c) % n_channels) for c in range(1, repeats + 1)]

    def quietly(fn, *args):
        with contextlib.redirect_stdout(io.StringIO()):
            fn(*args)

    view = [timed(quietly, explorer.view, largest, (5 * c) % n_channels, "gradient") for c in range(1, repeats + 1)]
    text_only = [timed(explorer.summary, largest, c % n_channels) for c in range(1, repeats + 1)]
    median = lambda times: round(statistics.median(times) * 1e3, 1)  # noqa: E731
    return {
        "layers": len(layers),
        "explorer_built_ms": round(build * 1e3, 1),
        "widget_redraw_layer_ms": median(widget_layer),
        "widget_redraw_channel_ms": median(widget_channel),
        "widget_redraw_max_ms": round(max(widget_layer + widget_channel) * 1e3, 1),
        "view_new_channel_ms": median(view),
        "text_only_ms": round(statistics.median(text_only) * 1e3, 2),
        "png_bytes": len(panel.png),
        "samples": repeats,
    }


# ----- 4. whole course -------------------------------------------------------------------------
def course(paths: list[Path], slowest: int = 5) -> dict:
    results = {}
    for path in paths:
        command = [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval", "--nbval-kernel-name", "hooklab",
            "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"), "--nbval-cell-timeout=300",
            "--durations=0", "--durations-min=0", str(path.relative_to(ROOT)),
        ]  # fmt: skip
        print(f"  nbval {path.relative_to(ROOT)} ...", flush=True)
        start = time.perf_counter()
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        cells = []
        for match in re.finditer(r"^([\d.]+)s (call|setup|teardown)\s+\S+::Cell (\d+)$", run.stdout, re.M):
            seconds, phase, cell = float(match[1]), match[2], int(match[3])
            if phase == "call":
                cells.append((seconds, cell))
        cells.sort(reverse=True)
        summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr.strip()[-200:]
        results[str(path.relative_to(ROOT / "notebooks"))] = {
            "wall_s": round(wall, 1),
            "cells_s": round(sum(s for s, _ in cells), 1),
            "passed": run.returncode == 0,
            "result": summary.strip("= "),
            "slowest": [{"cell": c, "s": round(s, 2), "first_line": first_line(path, c)} for s, c in cells[:slowest]],
        }
    return results


def first_line(path: Path, code_cell: int) -> str:
    import nbformat

    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    lines = [ln for ln in cells[code_cell].source.splitlines() if ln.strip() and not ln.startswith("#")]
    return (lines[0] if lines else "")[:70]


# ----- report ----------------------------------------------------------------------------------
def overhead_table(o: dict, allocator: str) -> list[str]:
    out = [
        f"**Recording overhead, {allocator}** ({o['setup']}; median over interleaved rounds of the ratio "
        "to the bare pass in the same round; *wrong values*: recorded outputs that differ from what the module "
        "produced)",
        "",
        "| variant | forward | ratio | forward+backward | ratio | wrong values (fwd / fwd+bwd) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    fwd, both = o["forward"], o["forward+backward"]
    for name in both:
        f = fwd.get(name)
        b = both[name]
        fcols = f"{f['median_ms']:.1f} ms | {f['ratio']:.2f}×" if f else "— | —"
        wrong = f"{f['wrong_values'] if f and 'wrong_values' in f else '—'} / {b.get('wrong_values', '—')}"
        out.append(f"| {name} | {fcols} | {b['median_ms']:.1f} ms | {b['ratio']:.2f}× | {wrong} |")
    notes = {"hooklab.record": f"target ≤ {CLONE_HOOKS_TARGET:.2f}×",  # the budget: clone hooks + 3 % of bare
             "hooklab.record(backward=True)": "it records the gradients too"}  # fmt: skip
    for name, note in notes.items():
        gaps = [minus_clone_hooks(o[mode], name) for mode in ("forward", "forward+backward")]
        if any(g is not None for g in gaps):
            f, b = (f"{g:+.3f}×" if g is not None else "—" for g in gaps)
            out.append(f"| {name} minus plain `.detach().clone()` hooks, median per round ({note}) | | {f} | | {b} | |")
    tl = o.get("torchlens")
    if tl and "skipped" in tl:
        out.append(f"| torchlens | skipped: {tl['skipped'][:120]} | | | | |")
    elif tl:
        out.append(f"| torchlens {tl['version']} `trace` (every op) | {tl['median_ms']:.1f} ms | "
                   f"{tl['ratio']:.2f}× | — | — | — |")  # fmt: skip
    out.append("")
    return out


def minus_clone_hooks(timing: dict, name: str) -> float | None:
    """What ``name`` costs over the clone hooks, in bare passes: the median of the per-round
    differences (a report written before they were kept: the difference of the two median ratios)."""
    if name not in timing or CLONE_HOOKS not in timing:
        return None
    if timing[name].get("reference") == CLONE_HOOKS:
        return timing[name]["minus_reference"]
    return timing[name]["ratio"] - timing[CLONE_HOOKS]["ratio"]


#: the AVX2 kernels of PyTorch, oneDNN and MKL (the Makefile's AVX2 variant of the notebook checks)
AVX2_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}


def overhead_avx2_kernels(rounds: int) -> dict:
    """The overhead group (freed memory kept) again in a child process pinned to the AVX2 kernels,
    so that the table also shows the ratios a CPU without AVX-512 would see."""
    env = {**os.environ, **AVX2_PINS}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "overhead.json"
        subprocess.run([sys.executable, __file__, "--rounds", str(rounds), "--overhead-json", str(out)],
                       env=env, check=True)  # fmt: skip
        return json.loads(out.read_text())


def markdown(report: dict) -> str:
    m = report["machine"]
    out = [
        f"Measured {m['date']} on {m['cpu']} ({m['usable_cores']} usable cores, shared; load average "
        f"{m['load_average_at_start'][0]} at start), torch {m['torch']}, torchvision {m['torchvision']}, "
        f"Python {m['python']}, {m['threads']} thread, {m.get('cpu_kernels', 'unrecorded')} CPU kernels.",
        "",
    ]
    kept = "freed memory kept for reuse, as `hooklab.setup()` does"
    for key, allocator in (
        ("overhead_default_allocator", "glibc's default allocator settings"),
        ("overhead", kept),
    ):
        if key in report:
            out += overhead_table(report[key], allocator)
    avx2 = report.get("overhead_avx2_kernels")
    if avx2 and "skipped" in avx2:
        out += [f"**Recording overhead with the AVX2 kernels**: skipped ({avx2['skipped']}).", ""]
    elif avx2:
        out += overhead_table(avx2, f"{kept}, and the {avx2['cpu_kernels']} kernels (pinned)")
    if "memory" in report:
        mem = report["memory"]
        growth = ", ".join(f"{k}: {v:+.1f} MB" for k, v in mem["growth_mb"].items())
        control = mem["control_keeping_recordings"]
        out += [f"**Memory** ({mem['setup']}): growth of {mem.get('metric', 'resident memory')} after passes {growth}; "
                f"records alive afterwards: {mem['live_records_after']}. Control, the same passes keeping every "
                f"recording: {control['growth_mb']:+.1f} MB after {control['passes']}.", ""]  # fmt: skip
    if "redraw" in report:
        out += [
            f"**Widget redraw** (`LayerExplorer.widget()`: the whole redraw after a control moves, text and "
            f"picture; target ≤ {REDRAW_TARGET_MS} ms at the median; `view` = text + picture without widgets)",
            "",
            "| model | layers | widget, new layer | widget, new channel | slowest | view | text |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for label, r in report["redraw"].items():
            if "view_new_channel_ms" not in r:  # a report written before the picture was drawn to PNG
                continue
            out.append(f"| {label} | {r['layers']} | {r['widget_redraw_layer_ms']:.1f} ms | "
                       f"{r['widget_redraw_channel_ms']:.1f} ms | {r['widget_redraw_max_ms']:.0f} ms | "
                       f"{r['view_new_channel_ms']:.1f} ms | {r['text_only_ms']:.1f} ms |")  # fmt: skip
        out.append("")
        if PICKER in report["redraw"]:
            out += picker_table(report["redraw"][PICKER])
    if "course" in report:
        out += ["**Whole course** (strict nbval, one notebook at a time)", "",
                "| notebook | wall | result | slowest cells |", "|---|---:|---|---|"]  # fmt: skip
        for name, r in report["course"].items():
            slow = "; ".join(f"cell {c['cell']} {c['s']:.1f} s (`{c['first_line']}`)" for c in r["slowest"][:2])
            out.append(f"| {name} | {r['wall_s']:.0f} s | {r['result']} | {slow.replace('|', '/')} |")
        total = sum(r["wall_s"] for r in report["course"].values())
        out += ["", f"Total: {total:.0f} s."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="timing rounds for the overhead group")
    parser.add_argument("--only", nargs="*", choices=["overhead", "memory", "redraw", "course"],
                        help="run only these groups")  # fmt: skip
    parser.add_argument("--no-torchlens", action="store_true", help="skip the throwaway torchlens venv")
    parser.add_argument("--notebooks", nargs="*", type=Path, help="course group: these notebooks only")
    parser.add_argument("--table-only", action="store_true", help="print the table of the last artifacts/bench.json")
    parser.add_argument("--no-avx2-run", action="store_true",
                        help="overhead group: skip the second run pinned to the AVX2 kernels")  # fmt: skip
    parser.add_argument("--overhead-json", type=Path, help=argparse.SUPPRESS)  # the child of that second run
    args = parser.parse_args(argv)
    if args.overhead_json:
        from hooklab.course import reuse_freed_memory

        reuse_freed_memory()
        result = overhead(args.rounds)
        result["cpu_kernels"] = torch.backends.cpu.get_cpu_capability()
        args.overhead_json.write_text(json.dumps(result))
        return 0
    if args.table_only:
        print(markdown(json.loads((ARTIFACTS / "bench.json").read_text())), end="")
        return 0
    groups = args.only or ["overhead", "memory", "redraw", "course"]

    report: dict = {"machine": machine()}
    print(f"machine: {report['machine']}", flush=True)
    if "overhead" in groups:
        from hooklab.course import reuse_freed_memory

        print("1/4 recording overhead (resnet18), glibc's default allocator settings ...", flush=True)
        report["overhead_default_allocator"] = overhead(args.rounds)
        print("    ... and with freed memory kept for reuse, as hooklab.setup() does ...", flush=True)
        reuse_freed_memory()
        report["overhead"] = overhead(args.rounds)
        report["overhead"]["torchlens"] = (
            {"skipped": "--no-torchlens"} if args.no_torchlens else torchlens_overhead(args.rounds)
        )
        if args.no_avx2_run:
            report["overhead_avx2_kernels"] = {"skipped": "--no-avx2-run"}
        elif torch.backends.cpu.get_cpu_capability() == "AVX2":
            report["overhead_avx2_kernels"] = {"skipped": "this CPU's best kernels are AVX2: the table above"}
        else:
            print("    ... and with the AVX2 kernels ...", flush=True)
            report["overhead_avx2_kernels"] = overhead_avx2_kernels(args.rounds)
    if "memory" in groups:
        print("2/4 memory over 200 recorded passes ...", flush=True)
        report["memory"] = memory()
    if "redraw" in groups:
        print("3/4 widget redraw ...", flush=True)
        report["redraw"] = redraw(repeats=8)
    if "course" in groups:
        print("4/4 whole course under nbval ...", flush=True)
        paths = args.notebooks or sorted(
            p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
        )
        report["course"] = course([p.resolve() for p in paths])
    report["machine"]["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]

    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (ARTIFACTS / "bench.md").write_text(table)
    print()
    print(table)
    print(f"written: {ARTIFACTS / 'bench.json'} and {ARTIFACTS / 'bench.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
