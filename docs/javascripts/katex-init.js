// Typeset the math that pymdownx.arithmatex left as \( … \) and \[ … \] in .arithmatex
// elements. document$ is Material's page-load observable (it also fires on the first load).
function gptspecRenderMath() {
  document.querySelectorAll(".arithmatex").forEach((el) => {
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
