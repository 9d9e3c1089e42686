// Copies a snippet's text; navigator.clipboard needs a secure context, so plain http pages select and copy.
document.addEventListener("click", function (event) {
  var button = event.target.closest ? event.target.closest("button.copy") : null;
  if (!button) { return; }
  var pre = document.getElementById(button.getAttribute("data-copies"));
  var text = pre.textContent;
  function report(ok) {
    button.textContent = ok ? "Copied" : "Press Ctrl+C";
    setTimeout(function () { button.textContent = "Copy"; }, 1500);
  }
  function selectAndCopy() {
    var range = document.createRange();
    range.selectNodeContents(pre);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (error) { ok = false; }
    report(ok);
  }
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(function () { report(true); }, selectAndCopy);
  } else {
    selectAndCopy();
  }
});
