// Typeset the math that pymdownx.arithmatex left as \( … \) and \[ … \] in .arithmatex
// elements. document$ is Material's page-load observable (it also fires on the first load).
//
// A display equation (\[ … \]) is typeset as inline math in display style: KaTeX's display
// mode never breaks a line, so a long equation would run out of its column; inline math
// breaks after a relation (=) or a binary operator (+) at the top level, and the
// equation's block (.gs-display) centres it.
function gptspecDisplayAsBreakable(el) {
  const text = el.textContent.trim();
  if (el.tagName === "DIV" && text.startsWith("\\[") && text.endsWith("\\]")) {
    el.textContent = "\\(\\displaystyle " + text.slice(2, -2) + "\\)";
    el.classList.add("gs-display");
  }
}
function gptspecRenderMath() {
  document.querySelectorAll(".arithmatex").forEach((el) => {
    gptspecDisplayAsBreakable(el);
    renderMathInElement(el, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(gptspecRenderMath);
} else {
  document.addEventListener("DOMContentLoaded", gptspecRenderMath);
}
