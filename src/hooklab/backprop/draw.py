"""``draw_222(net)``: the 2-2-2 sigmoid network of notebook 04 as a graph, with its weights on the edges.

Five columns of two nodes (``x``, ``z1``, ``s1``, ``z2``, ``s2``); a linear layer joins every node
of one column to every node of the next, labelled with its weight; a sigmoid joins each node to
the one beside it. The weights are read from the network, so a changed weight shows.
"""

from __future__ import annotations

__all__ = ["draw_222"]

COLUMNS = (("x₁", "x₂"), ("z1₁", "z1₂"), ("s1₁", "s1₂"), ("z2₁", "z2₂"), ("s2₁", "s2₂"))


def draw_222(net, ax=None):
    """Draw ``net`` (``hooklab.models.TinySigmoidNet``: ``fc1``, ``s1``, ``fc2``, ``s2``) on ``ax``
    (a new figure when None) and return the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.2))
    weights = {1: net.fc1.weight.detach(), 3: net.fc2.weight.detach()}  # by the column a layer leads into
    for right in range(1, 5):
        for i in range(2):
            for j in range(2):
                if right in weights:  # a linear layer: every input to every output
                    ax.plot([right - 1, right], [1 - i, 1 - j], color="0.6", zorder=1)
                    along = 0.5 if i == j else 0.3  # crossing edges: labelled near their start, apart
                    ax.text(right - 1 + along, 1 - i + along * (i - j), f"{weights[right][j, i].item():.2f}",
                            fontsize=9, color="C0", ha="center", va="center", backgroundcolor="white", zorder=2)
                elif i == j:  # a sigmoid: one output per input
                    ax.annotate("", (right - 0.12, 1 - i), (right - 0.88, 1 - i),
                                arrowprops={"arrowstyle": "->", "color": "C1"})
    for col, labels in enumerate(COLUMNS):
        for i, label in enumerate(labels):
            ax.scatter(col, 1 - i, s=900, color="white", edgecolor="k", zorder=3)
            ax.text(col, 1 - i, label, ha="center", va="center", fontsize=9, zorder=4)
    biases = (net.fc1.bias.detach().flatten()[0].item(), net.fc2.bias.detach().flatten()[0].item())
    for col, text in ((0.5, f"fc1 (+ {biases[0]:.2f})"), (1.5, "s1 = σ(z1)"), (2.5, f"fc2 (+ {biases[1]:.2f})"),
                      (3.5, "s2 = σ(z2)")):
        ax.text(col, 1.45, text, ha="center", fontsize=9)
    ax.set_xlim(-0.4, 4.4)
    ax.set_ylim(-0.4, 1.7)
    ax.axis("off")
    return ax.figure
