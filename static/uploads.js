// What the documents and the images share: their requests to a conversation's API, files uploaded one
// after the other with each refusal said, and the ways files come in (the attach button, a drop, a paste).

/** A request to the conversation's `kind` API (documents, images); a 401 means signed out. */
export function conversationRequest(conversationId, kind, onSignedOut, method, path, body) {
  const url = `/api/conversations/${encodeURIComponent(conversationId)}/${kind}${path}`;
  return fetch(url, { method, body }).then((response) => {
    if (response.status === 401) onSignedOut();
    return response;
  });
}

/** Upload `files` one after the other with `post(body)`: `added(answer)` for each one taken, each refusal
 * said through `onError`, and the others go on. */
export async function uploadEach(files, post, added, onError) {
  for (const file of files) {
    const body = new FormData();
    body.append("file", file, file.name);
    const response = await post(body).catch((error) => ({ ok: false, error }));
    if (response.ok) added(await response.json());
    else onError(await reason(response, `“${file.name}” could not be attached`, file.name));
  }
}

/** Why a request failed, for the user: the server's own words (which name the file, when they do). */
export async function reason(response, fallback, name) {
  if (response.error) return `${fallback}: ${response.error.message}`;
  const body = await response.json().catch(() => null);
  const detail = typeof body?.detail === "string" ? body.detail : `HTTP ${response.status}`;
  return name && detail.includes(name) ? detail : `${fallback}: ${detail}`;
}

/** Files picked with `picker` (the attach button's), dropped on `area` or pasted into `input` go to `attach`. */
export function acceptFiles(picker, area, input, attach) {
  picker.addEventListener("change", () => {
    attach([...picker.files]);
    picker.value = "";
  });
  area.addEventListener("dragover", (event) => {
    if (!event.dataTransfer?.types.includes("Files")) return;
    event.preventDefault(); // allows the drop
    area.classList.add("dropping");
  });
  area.addEventListener("dragleave", (event) => {
    if (!area.contains(event.relatedTarget)) area.classList.remove("dropping");
  });
  area.addEventListener("drop", (event) => {
    area.classList.remove("dropping");
    if (!event.dataTransfer?.files.length) return;
    event.preventDefault();
    attach([...event.dataTransfer.files]);
  });
  input.addEventListener("paste", (event) => {
    const files = [...(event.clipboardData?.files ?? [])];
    if (files.length === 0) return; // text is pasted as usual
    event.preventDefault();
    attach(files);
  });
}
