// MathJax for the notebooks' $...$ and $$...$$ (the Markdown pages write no math); code and
// pre elements are skipped, so shell variables in commands are left alone.
window.MathJax = {
  tex: {
    inlineMath: [["$", "$"], ["\\(", "\\)"]],
    displayMath: [["$$", "$$"], ["\\[", "\\]"]],
    processEscapes: true
  },
  options: {
    skipHtmlTags: ["script", "noscript", "style", "textarea", "pre", "code"]
  }
};
document$.subscribe(() => {
  MathJax.typesetPromise();
});
