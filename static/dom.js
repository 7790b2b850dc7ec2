// The small helpers the page's modules share.

/** A new element with a class and, if given, its text (always as text, never as markup). */
export function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** A count and its noun, the noun plural unless the count is one: "1 passage", "1,200 conversations". */
export function counted(count, noun, plural = `${noun}s`) {
  return `${count.toLocaleString("en")} ${count === 1 ? noun : plural}`;
}
