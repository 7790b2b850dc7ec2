// Versions of a message: a reply answered again, or an edited message (its editor is here too), is a new
// version beside the earlier ones. A message with versions shows `‹ 2/3 ›`; an arrow asks the server to
// show another (`switch`), and the server sends the new path (`path`) to every tab of the conversation.
import { element } from "./dom.js";

/** Draw the `‹ i/n ›` of a message in `box` (nothing when it has one version); redrawn only on change. */
export function renderVersions(box, message) {
  const versions = message.versions ?? [];
  const index = versions.indexOf(message.id);
  const key = index < 0 ? "" : `${message.id}:${versions.join()}`;
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.hidden = !key;
  if (!key) {
    box.replaceChildren();
    return;
  }
  const label = element("span", "versions-count", `${index + 1}/${versions.length}`);
  label.setAttribute("aria-label", `Version ${index + 1} of ${versions.length}`);
  const streaming = message.status === "streaming";
  box.replaceChildren(
    arrow("‹", "Previous version", versions[index - 1], streaming),
    label,
    arrow("›", "Next version", versions[index + 1], streaming),
  );
}

function arrow(text, label, target, locked) {
  const button = element("button", "icon version", text);
  button.type = "button";
  button.dataset.action = "switch";
  button.dataset.target = target ?? "";
  button.disabled = locked || !target;
  button.setAttribute("aria-label", label);
  return button;
}

/** While a reply streams, no other version can be shown (the server would refuse): the arrows wait. */
export function lockVersions(container, locked) {
  for (const button of container.querySelectorAll("button.version")) {
    button.disabled = locked || !button.dataset.target;
  }
}

/** The frame that shows the version an arrow names. */
export function switchFrame(button) {
  return { type: "switch", message_id: button.dataset.target };
}

/** A turn's message goes after its parent (at the start for none): the messages shown after it go.
 * False if the parent is not on screen: the page must resync. */
export function makeRoomAfter(transcript, parentId) {
  const index = parentId == null ? -1 : transcript.views.findIndex((view) => view.id === parentId);
  if (parentId != null && index < 0) return false;
  if (transcript.views.slice(index + 1).some((view) => !view.message.notice)) transcript.removeFrom(index + 1);
  return true;
}

/** Show a new path: the messages it shares with the one on screen stay (and the scroll with them). */
export function showPath(transcript, history) {
  const views = transcript.views;
  let same = 0;
  while (same < views.length && same < history.length && views[same].id === history[same].id) same += 1;
  transcript.removeFrom(same);
  for (const message of history.slice(same)) transcript.append(message);
}

/** Edit a message of the user's in place: "Send edited" gives `send(content, close)` the new text (a new
 * version of it, once sent; `close` closes the editor, called when its turn starts, so that a refused edit
 * stays open); Cancel or Escape closes it. */
export function startEdit(view, send) {
  const box = element("textarea", "edit-box");
  box.value = view.message.content;
  box.setAttribute("aria-label", "Edit your message");
  const save = element("button", "primary", "Send edited");
  save.type = "button";
  const cancel = element("button", "", "Cancel");
  cancel.type = "button";
  const editor = element("div", "editor");
  editor.append(box, save, cancel);
  view.body.hidden = true;
  view.root.insertBefore(editor, view.body);
  box.focus();
  const close = () => { editor.remove(); view.body.hidden = false; };
  cancel.addEventListener("click", close);
  save.addEventListener("click", () => {
    if (box.value.trim()) send(box.value, close);
  });
  box.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); save.click(); }
    if (event.key === "Escape") close();
  });
}
