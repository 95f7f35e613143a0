"""Each checker of notebook 05 accepts a correct answer and rejects wrong ones."""

from __future__ import annotations

import torch

from hooklab.exercises import grade


def test_05_1_guided_hook():
    assert grade("05.1", lambda m, gi, go: (gi[0].clamp(min=0),)).passed
    unchanged = grade("05.1", lambda m, gi, go: None)
    assert not unchanged.passed and "did not change" in unchanged.detail
    assert not grade("05.1", lambda m, gi, go: (go[0].clamp(min=0),)).passed
    assert not grade("05.1", lambda m, gi, go: (gi[0].abs(),)).passed
    bare = grade("05.1", lambda m, gi, go: gi[0].clamp(min=0))
    assert not bare.passed and "tuple" in bare.detail


def test_05_2_cam_map():
    def right(a, g):
        return (g.mean(dim=(1, 2))[:, None, None] * a).sum(0).relu()

    assert grade("05.2", right).passed
    no_relu = grade("05.2", lambda a, g: (g.mean(dim=(1, 2))[:, None, None] * a).sum(0))
    assert not no_relu.passed and "positive part" in no_relu.detail
    assert not grade("05.2", lambda a, g: (g * a).sum(0).relu()).passed


def _dead(model, layer, x, remove=True, images="all"):
    outputs = []
    handle = model.get_submodule(layer).register_forward_hook(lambda m, i, o: outputs.append(o.detach()))
    try:
        model(x)
    finally:
        if remove:
            handle.remove()
    out = outputs[0]
    per_image = (out == 0).all(dim=3).all(dim=2)
    return getattr(per_image, images)(dim=0).nonzero().flatten().tolist()


def test_05_3_dead_channels():
    assert grade("05.3", _dead).passed
    leaky = grade("05.3", lambda m, layer, x: _dead(m, layer, x, remove=False))
    assert not leaky.passed and "left registered" in leaky.detail
    assert not grade("05.3", lambda m, layer, x: [2, 9]).passed
    some_image = grade("05.3", lambda m, layer, x: _dead(m, layer, x, images="any"))
    assert not some_image.passed and "every image" in some_image.detail
    # "zero somewhere" is not "dead"
    assert not grade("05.3", lambda m, layer, x: torch.arange(16).tolist()).passed
