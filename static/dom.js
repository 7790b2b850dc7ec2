// The one DOM helper the page's modules share.

/** A new element with a class and, if given, its text (always as text, never as markup). */
export function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}
