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

/** Render Markdown `text` into `element`, replacing what it held. */
export function renderMarkdown(element, text) {
  element.innerHTML = DOMPurify.sanitize(marked.parse(text), PURIFY);
  for (const code of element.querySelectorAll("pre > code")) {
    if (code.className.includes("language-")) {
      hljs.highlightElement(code);
    }
    addCopyButton(code.parentElement);
  }
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
