// The read-only page of a share link: the snapshot it holds, drawn as the chat page draws messages (the
// user's text as text, replies as sanitized Markdown: markdown.js). It sends no cookie and asks the
// server for this snapshot only.
import { element } from "./dom.js";
import { copyCode, MarkdownView } from "./markdown.js";

const token = location.pathname.split("/").pop();
const STATUS_TEXT = { stopped: "Stopped.", error: "This reply failed.", interrupted: "This reply was cut short." };

function draw(message) {
  const root = element("article", `message ${message.role}`);
  root.setAttribute("aria-label", message.role === "user" ? "User said" : "Assistant replied");
  const body = element("div", "body");
  root.append(body);
  if (message.role === "user") body.textContent = message.content;
  else new MarkdownView(body).render(message.content);
  if (STATUS_TEXT[message.status]) root.append(element("p", "notice", STATUS_TEXT[message.status]));
  return root;
}

async function show() {
  const title = document.getElementById("title");
  const response = await fetch(`/api/shared/${encodeURIComponent(token)}`, { credentials: "omit", cache: "no-store" });
  if (!response.ok) {
    title.textContent = "This link was revoked, or never existed.";
    return;
  }
  const shared = await response.json();
  title.textContent = shared.title || "Shared conversation";
  document.title = `${title.textContent} · PocketChat`;
  const when = new Date(shared.created_at * 1000).toLocaleString();
  document.getElementById("when").textContent = `A read-only copy, as it was on ${when}.`;
  document.getElementById("transcript").append(...shared.messages.map(draw));
}

document.getElementById("transcript").addEventListener("click", (event) => {
  const button = event.target.closest("button.copy");
  if (button) copyCode(button);
});
show();
