"""Old name of ``hooklab.saliency``, kept until the notebooks import from there."""

from .saliency import GradCAM, GuidedBackprop, grad_cam, guided_grad_cam, upsample  # noqa: F401
