"""The data-flow diagram (text → next-token distribution) as inline SVG, drawn at build time.

Each box links to the spec entry that defines its step when that entry exists, so the
diagram doubles as a map of the specification. Inline SVG needs no script and no
external asset (a Mermaid diagram would load its renderer from a CDN).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sitegen.markup import esc

WIDTH = 680
BOX_H = 44
GAP = 26
CENTER = WIDTH // 2
# What the drawing covers: the block's frame from CENTER - 230, the "residual" labels to
# about CENTER + 275. The view is cut to it, so that a phone, where the diagram keeps its
# size and scrolls, opens on the boxes rather than on an empty margin.
VIEW_X, VIEW_W = CENTER - 240, 525


@dataclass(frozen=True)
class Step:
    label: str
    detail: str
    shape: str  # the shape of what leaves this step
    entries: tuple[str, ...]  # candidate spec entry ids, the first that exists is linked


# Rows of the diagram, top to bottom; a row with two steps is drawn side by side.
FLOW: tuple[tuple[Step, ...], ...] = (
    (Step("text", "a Unicode string", "", ()),),
    (Step("tokenizer", "byte-level BPE: regex split, then ranked merges",
          "x: (T,) token ids", ("bpe_encode", "encode", "tokenize")),),
    (Step("one-hot", "X[t, v] = 1 if x_t = v", "X: (T, V)", ("one_hot",)),),
    (Step("token embedding", "E = X W_E (row selection)", "E: (T, d)",
          ("token_embedding", "token_embedding_one_hot")),
     Step("positional embedding", "P = rows 1…T of W_P", "P: (T, d)",
          ("positional_embedding",))),
    (Step("input representation", "H⁽⁰⁾ = E + P", "H: (T, d)", ("input_representation",)),),
)
BLOCK: tuple[Step, ...] = (
    Step("LayerNorm 1", "per row: γ ⊙ (x − μ)/√(σ² + ε) + β", "(T, d)", ("layer_norm",)),
    Step("causal multi-head attention", "softmax(Q Kᵀ/√d_k + M) V per head, then W_O",
         "(T, d), added to H", ("multi_head_attention", "scaled_dot_product_attention")),
    Step("LayerNorm 2", "per row", "(T, d)", ("layer_norm",)),
    Step("feed-forward", "GELU(x W_1 + b_1) W_2 + b_2", "(T, d), added to H",
         ("ffn_gelu_tanh", "ffn_gelu", "ffn_relu")),
)
TAIL: tuple[Step, ...] = (
    Step("final LayerNorm", "LN_f(H)", "(T, d)", ("final_layer_norm",)),
    Step("unembedding", "logits = H W_Eᵀ (tied)", "(T, V)", ("unembed_tied", "unembed_untied")),
    Step("next-token distribution", "softmax of the last row: P(x_{T+1} | x_1 … x_T)",
         "(V,)", ("next_token_distribution", "softmax")),
)


def _box(x: int, y: int, w: int, step: Step, href: str | None) -> str:
    body = (
        f'<rect x="{x}" y="{y}" width="{w}" height="{BOX_H}" rx="6" class="gs-box"/>'
        f'<text x="{x + w // 2}" y="{y + 18}" class="gs-label">{esc(step.label)}</text>'
        f'<text x="{x + w // 2}" y="{y + 35}" class="gs-detail">{esc(step.detail)}</text>'
    )
    if href:
        return f'<a href="{esc(href)}"><title>spec: {esc(step.label)}</title>{body}</a>'
    return body


def _arrow(x1: int, y1: int, x2: int, y2: int, label: str = "") -> str:
    line = (f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" class="gs-edge" '
            f'marker-end="url(#gs-arrow)"/>')
    if label:
        line += (f'<text x="{max(x1, x2) + 8}" y="{(y1 + y2) // 2 + 4}" '
                 f'class="gs-shape">{esc(label)}</text>')
    return line


def svg(href_for: Callable[[str], str | None]) -> str:
    """The diagram; ``href_for(entry_id)`` gives a page's URL, or None if there is none."""

    def href(step: Step) -> str | None:
        for entry_id in step.entries:
            url = href_for(entry_id)
            if url:
                return url
        return None

    parts: list[str] = []
    y = 10
    box_w = 440
    x = CENTER - box_w // 2
    prev_bottom: list[int] = []
    for row in FLOW:
        if len(row) == 1:
            for px in prev_bottom:
                parts.append(_arrow(px, y - GAP, CENTER, y))
            parts.append(_box(x, y, box_w, row[0], href(row[0])))
            prev_bottom = [CENTER]
            shape = row[0].shape
        else:
            half = (box_w - 20) // 2
            xs = (x, x + half + 20)
            for px in prev_bottom:
                for bx in xs:
                    parts.append(_arrow(px, y - GAP, bx + half // 2, y))
            for bx, step in zip(xs, row, strict=True):
                parts.append(_box(bx, y, half, step, href(step)))
            prev_bottom = [bx + half // 2 for bx in xs]
            shape = ""
        y += BOX_H + GAP
        if shape:
            parts.append(f'<text x="{CENTER + 8}" y="{y - GAP // 2 + 4}" class="gs-shape">'
                         f"{esc(shape)}</text>")
    # The repeated block, inside a frame. The residual stream runs down the centre; each
    # sub-layer's output is added back to it at a ⊕ (pre-LN: LN → sub-layer → add).
    top = y
    for px in prev_bottom:
        parts.append(_arrow(px, y - GAP, CENTER, y + 22))
    y += 22
    inner_w = box_w - 60
    ix = CENTER - inner_w // 2
    rx = ix + inner_w + 26  # the bypass lane, right of the boxes
    branch_y = y - 10  # where the stream branches off to bypass the next sub-layer
    for i, step in enumerate(BLOCK):
        if i and i % 2 == 0:
            parts.append(_arrow(CENTER, y - GAP, CENTER, y))
        elif i:
            parts.append(_arrow(CENTER, y - GAP, CENTER, y))
        parts.append(_box(ix, y, inner_w, step, href(step)))
        if i % 2 == 1:  # after attention and after the FFN: add the bypassed stream back
            add_y = y + BOX_H + GAP // 2
            parts.append(f'<path d="M {CENTER} {branch_y} H {rx} V {add_y} H {CENTER + 9}" '
                         f'class="gs-residual" marker-end="url(#gs-arrow)"/>')
            parts.append(f'<text x="{rx + 6}" y="{(branch_y + add_y) // 2}" '
                         f'class="gs-shape">residual</text>')
            parts.append(f'<circle cx="{CENTER}" cy="{add_y}" r="8" class="gs-box"/>'
                         f'<text x="{CENTER}" y="{add_y + 5}" class="gs-label">+</text>')
            parts.append(f'<line x1="{CENTER}" y1="{y + BOX_H}" x2="{CENTER}" '
                         f'y2="{add_y - 8}" class="gs-edge"/>')
            y = add_y + 8 + GAP - GAP // 2
            branch_y = y - GAP // 2 + 4
            y += GAP // 2
        else:
            y += BOX_H + GAP
    y -= GAP // 2
    frame_h = y - top - GAP + 12
    parts.insert(0, f'<rect x="{x - 10}" y="{top}" width="{box_w + 20}" height="{frame_h}" '
                    f'rx="10" class="gs-frame"/>'
                    f'<text x="{x}" y="{top + 15}" class="gs-frame-label">'
                    f"× L blocks (pre-LN, as GPT-2/3)</text>")
    y = top + frame_h + GAP
    prev = top + frame_h
    for step in TAIL:
        parts.append(_arrow(CENTER, prev, CENTER, y))
        parts.append(_box(x, y, box_w, step, href(step)))
        parts.append(f'<text x="{CENTER + 8}" y="{y + BOX_H + GAP // 2 + 4}" '
                     f'class="gs-shape">{esc(step.shape)}</text>')
        prev = y + BOX_H
        y += BOX_H + GAP
    height = y
    defs = ('<defs><marker id="gs-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
            'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            '<path d="M 0 0 L 10 5 L 0 10 z" class="gs-arrowhead"/></marker></defs>')
    return (f'<div class="gs-dataflow"><svg xmlns="http://www.w3.org/2000/svg" role="img" '
            f'aria-label="Data flow of a GPT, from text to the next-token distribution" '
            f'viewBox="{VIEW_X} 0 {VIEW_W} {height}" width="{VIEW_W}">{defs}{"".join(parts)}</svg></div>')
