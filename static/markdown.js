// Model text as safe HTML: marked renders Markdown, DOMPurify sanitizes, highlight.js colours code.
// Raw HTML in the text is shown as text and images become links, so a reply can neither run
// script nor load anything remote (the page's Content-Security-Policy forbids both as well).
import { marked } from "/vendor/marked@18.2.1/lib/marked.esm.js";
import DOMPurify from "/vendor/dompurify@3.4.18/dist/purify.es.mjs";
import hljs from "/vendor/@highlightjs/cdn-assets@11.12.0/es/highlight.min.js";
import { element } from "./dom.js";

const escapeHtml = (text) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

marked.use({
  gfm: true,
  renderer: {
    html: ({ text }) => escapeHtml(text),
    image: ({ href, text }) => `<a href="${escapeHtml(href)}">${escapeHtml(text || href)}</a>`,
  },
});

const PURIFY = {
  FORBID_TAGS: ["style", "img", "svg", "math", "form", "input", "button", "textarea", "select", "iframe",
    "video", "audio", "source", "picture", "object", "embed", "link", "meta", "base"],
  FORBID_ATTR: ["style", "srcset", "action", "formaction", "background", "poster"],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

// How many blocks at the end are drawn again at every render. The last one is still being written, and
// the one before it can still change: marked reads a block by looking a line or two past it, so "2" after
// a list is a paragraph until "2." makes it the list's next item, and a line under a list item can turn
// out to continue it.
const OPEN_BLOCKS = 2;
// How many finished tokens (blank lines between blocks are a token too) are read again with the open
// blocks at every render, to check that a fresh reading still gives the same tokens: when marked changes
// its mind further back than OPEN_BLOCKS foresaw, everything is drawn again. Without this check, 3% of
// random texts of tricky pieces streamed one character at a time ended different from a full render;
// with one token, none of 21,700; two cost little more and none of 40,300 differed.
const RECHECKED = 2;
// Finished blocks are kept in sections of this many. A section off screen costs the browser no layout or
// paint (content-visibility in app.css), and one on screen that did not change is laid out from cache; so
// a frame lays out a few sections and the open blocks, not the thousands of blocks of a long reply.
const SECTION_BLOCKS = 24;

/**
 * Markdown drawn into an element, as often as its text grows. The first render draws the whole text at
 * once. After that, the finished top-level blocks are drawn once and kept, in sections; each render
 * reads and draws again only the open blocks at the end, so a streaming reply costs the size of its last
 * blocks per frame, not the size of the reply. When the text no longer starts with the finished blocks,
 * or a new reading disagrees with them, or a reference-link definition appears or changes (the finished
 * blocks may use it), everything is drawn again.
 */
export class MarkdownView {
  constructor(element) {
    this.element = element;
    this.restart();
    this.fresh = true;
  }

  /** Forget every block: the next render draws them all again. */
  restart() {
    this.element.replaceChildren();
    this.frozenText = ""; // the source of the finished blocks: a prefix of the text
    this.rechecked = []; // the last RECHECKED finished tokens, as {length, json}
    this.links = {}; // reference-link definitions in the finished blocks
    this.linksJson = ""; // every definition known when the finished blocks were drawn
    this.openNodes = []; // what the open blocks drew
    this.section = null; // the last section of finished blocks, while it has room
  }

  render(text) {
    text = text.replace(/\r\n?/g, "\n"); // as marked reads it, so that the blocks' sources add up to the text
    let tokens = this.readOn(text);
    if (!tokens) {
      this.restart();
      tokens = this.readOn(text);
    }
    for (const node of this.openNodes) node.remove();
    const finished = this.fresh ? 0 : countFinished(tokens);
    this.fresh = false;
    if (finished) this.freeze(tokens.slice(0, finished), tokens.links);
    this.openNodes = draw(tokens.slice(finished));
    this.element.append(...this.openNodes);
  }

  /** The tokens after the finished blocks, or null if the finished blocks no longer hold. */
  readOn(text) {
    if (!text.startsWith(this.frozenText)) return null;
    const lexer = new marked.Lexer();
    Object.assign(lexer.tokens.links, this.links); // definitions made earlier apply to the rest
    const recheckedLength = this.rechecked.reduce((sum, token) => sum + token.length, 0);
    const tokens = lexer.lex(text.slice(this.frozenText.length - recheckedLength));
    const again = tokens.splice(0, this.rechecked.length);
    if (this.rechecked.some((token, i) => JSON.stringify(again[i]) !== token.json)) return null;
    if (this.frozenText && JSON.stringify(tokens.links) !== this.linksJson) return null;
    return tokens;
  }

  /** Draw finished blocks for good, after those already drawn. */
  freeze(tokens, links) {
    for (const node of draw(tokens)) this.keep(node);
    this.frozenText += tokens.map((token) => token.raw).join("");
    const rechecked = tokens.map((token) => ({ length: token.raw.length, json: JSON.stringify(token) }));
    this.rechecked = [...this.rechecked, ...rechecked].slice(-RECHECKED);
    for (const token of tokens) {
      if (token.type === "def") this.links[token.tag] ??= { href: token.href, title: token.title };
    }
    this.linksJson = JSON.stringify(links);
  }

  /** Put a finished block's node at the end of the last section, or of a new one when that is full. */
  keep(node) {
    if (!this.section || this.section.childElementCount >= SECTION_BLOCKS) {
      this.section = document.createElement("div");
      this.section.className = "blocks";
      this.element.append(this.section);
    }
    this.section.append(node);
  }
}

// A page's first render compiles marked's and DOMPurify's code and each language's grammar: tens of
// milliseconds that would otherwise fall into the first frames of the first reply with code. So the
// page does it while idle, one piece per idle period, each short enough not to be a long task itself
// (under 25 ms on the test machine): samples of Markdown read, one kind of block at a time; all of
// them turned to HTML, then sanitized, then drawn; then the grammars of common languages. Java's and
// C#'s are left out: each takes 50-100 ms to compile, a long task wherever it falls.
const SAMPLES = ["# A\n", "Some *text*, `code` and a [link](https://example.org).\n", "- one\n1. two\n\n> quote\n",
  "| a | b |\n|---|---|\n| 1 | 2 |\n", "```text\nx\n```\n"];
const COMMON_LANGUAGES = ["python", "javascript", "typescript", "bash", "json", "sql", "xml", "css", "c", "cpp", "go",
  "rust", "yaml", "markdown"];

function warmUp() {
  const sample = SAMPLES.join("\n");
  const pieces = [
    ...SAMPLES.map((text) => () => marked.lexer(text)),
    () => marked.parser(marked.lexer(sample)),
    (html) => DOMPurify.sanitize(html, PURIFY),
    () => draw(marked.lexer(sample)),
    ...COMMON_LANGUAGES.map((language) => () => hljs.highlight("x = 1", { language })),
  ];
  let result; // each piece gets the one before's
  const next = () => {
    result = pieces.shift()(result);
    if (pieces.length) requestIdleCallback(next);
  };
  requestIdleCallback(next);
}
if (typeof requestIdleCallback === "function") warmUp();

/** How many leading tokens are finished: all but the last OPEN_BLOCKS blocks and the blank lines between. */
function countFinished(tokens) {
  let end = tokens.length;
  for (let open = 0; open < OPEN_BLOCKS; open += 1) {
    end = tokens.findLastIndex((token, i) => i < end && token.type !== "space");
    if (end < 0) return 0;
  }
  while (end > 0 && tokens[end - 1].type === "space") end -= 1;
  return end;
}

/** Top-level tokens as safe, highlighted nodes, not yet in the page. */
function draw(tokens) {
  const scratch = document.createElement("div");
  scratch.innerHTML = DOMPurify.sanitize(marked.parser(tokens), PURIFY);
  for (const code of scratch.querySelectorAll("pre > code")) dressCode(code);
  // A table or a code block wider than the column scrolls sideways: the keyboard can scroll it too.
  for (const wide of scratch.querySelectorAll("pre, table")) wide.tabIndex = 0;
  return [...scratch.childNodes];
}

/** A code block gets a bar above it: its language, said as the fence named it, and a Copy button, which
 * then never covers the code (on a phone, it did). */
function dressCode(code) {
  const language = /\blanguage-(\S+)/.exec(code.className)?.[1];
  if (language) hljs.highlightElement(code);
  const pre = code.parentElement;
  const block = element("div", "code-block");
  const head = element("div", "code-head");
  const copy = element("button", "copy", "Copy");
  copy.type = "button";
  copy.setAttribute("aria-label", "Copy code");
  head.append(element("span", "code-language", language ?? "text"), copy);
  pre.replaceWith(block);
  block.append(head, pre);
}

/** Copy the code of the block whose Copy button was pressed (one listener for the whole page). */
export async function copyCode(button) {
  const code = button.closest(".code-block").querySelector("code").textContent;
  try {
    await navigator.clipboard.writeText(code);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}
