// Model text as safe HTML: marked renders Markdown, DOMPurify sanitizes, highlight.js colours code.
// Raw HTML in the text is shown as text and images become links, so a reply can neither run
// script nor load anything remote (the page's Content-Security-Policy forbids both as well).
import { marked } from "/vendor/marked/lib/marked.esm.js";
import DOMPurify from "/vendor/dompurify/dist/purify.es.mjs";
import hljs from "/vendor/@highlightjs/cdn-assets/es/highlight.min.js";

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

// How many of the finished tokens are read again with the open block at every render (the blank lines
// between two blocks are a token too). marked decides where a block ends, and even what its text is, by
// looking a line or two past it (a list can take in the next line, a paragraph can give up a line to a
// heading underline or to a list), so a block is trusted as final only while a fresh reading gives the
// same token. One token is not enough for marked's rules; two held over 40,000 random texts, each
// compared with a full render at every character.
const RECHECKED = 2;

/**
 * Markdown drawn into an element, as often as its text grows. The first render draws the whole text at
 * once. After that, the finished top-level blocks (every block but the last) are drawn once and kept;
 * each render reads and draws again only the open last block, so a streaming reply costs the size of its
 * last block per frame, not the size of the reply. When the text no longer starts with the finished
 * blocks, or a reading disagrees with them (see RECHECKED), or a reference-link definition that they may
 * use appears, everything is drawn again from scratch.
 */
export class MarkdownView {
  constructor(element) {
    this.element = element;
    this.restart();
  }

  /** Forget every block: the next render draws the whole text at once. */
  restart() {
    this.element.replaceChildren();
    this.fresh = true;
    this.frozenText = ""; // the source of the finished blocks: a prefix of the text
    this.rechecked = []; // the last RECHECKED finished blocks: {length, json} of their tokens
    this.links = {}; // reference-link definitions in the finished blocks
    this.linksJson = ""; // every definition known when the finished blocks were drawn
    this.openNodes = []; // what the blocks after the finished ones drew
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
    const recheckedLength = this.rechecked.reduce((sum, block) => sum + block.length, 0);
    const tokens = lexer.lex(text.slice(this.frozenText.length - recheckedLength));
    const again = tokens.splice(0, this.rechecked.length);
    if (this.rechecked.some((block, i) => JSON.stringify(again[i]) !== block.json)) return null;
    if (this.frozenText && JSON.stringify(tokens.links) !== this.linksJson) return null;
    return tokens;
  }

  /** Draw finished blocks for good, after those already drawn. */
  freeze(tokens, links) {
    this.element.append(...draw(tokens));
    this.frozenText += tokens.map((token) => token.raw).join("");
    const blocks = tokens.map((token) => ({ length: token.raw.length, json: JSON.stringify(token) }));
    this.rechecked = [...this.rechecked, ...blocks].slice(-RECHECKED);
    for (const token of tokens) {
      if (token.type === "def") this.links[token.tag] ??= { href: token.href, title: token.title };
    }
    this.linksJson = JSON.stringify(links);
  }
}

/** How many leading tokens are finished blocks: all before the last block, less the blank lines before it. */
function countFinished(tokens) {
  let end = tokens.findLastIndex((token) => token.type !== "space");
  while (end > 0 && tokens[end - 1].type === "space") end -= 1;
  return Math.max(end, 0);
}

/** Top-level tokens as safe, highlighted nodes, not yet in the page. */
function draw(tokens) {
  const scratch = document.createElement("div");
  scratch.innerHTML = DOMPurify.sanitize(marked.parser(tokens), PURIFY);
  for (const code of scratch.querySelectorAll("pre > code")) {
    if (code.className.includes("language-")) {
      hljs.highlightElement(code);
    }
    addCopyButton(code.parentElement);
  }
  return [...scratch.childNodes];
}

function addCopyButton(pre) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = "Copy";
  button.setAttribute("aria-label", "Copy code");
  pre.prepend(button);
}

/** Copy the code of the block whose Copy button was pressed (one listener for the whole page). */
export async function copyCode(button) {
  const code = button.parentElement.querySelector("code").textContent;
  try {
    await navigator.clipboard.writeText(code);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 1500);
}
