// A conversation's own sampling (temperature, top_p, max tokens), beside its system prompt. An empty
// field is the model's default, which is then not sent (docs/protocol.md: `sampling`).
const FIELDS = ["temperature", "top_p", "max_tokens"];
const LABELS = { temperature: "temperature", top_p: "top p", max_tokens: "max tokens" };

/** Fill the dialog's inputs from a conversation's `sampling`. */
export function showSampling(form, sampling) {
  for (const name of FIELDS) form.elements[`sampling-${name}`].value = sampling?.[name] ?? "";
}

/** The PATCH's `sampling`: each field's number, or null for an empty one (back to the default). */
export function readSampling(form) {
  return Object.fromEntries(FIELDS.map((name) => {
    const value = form.elements[`sampling-${name}`].value;
    return [name, value === "" ? null : Number(value)];
  }));
}

/** A short line of the settings a conversation set ("" for none). */
export function samplingSummary(sampling) {
  return FIELDS.filter((name) => sampling?.[name] != null).map((name) => `${LABELS[name]} ${sampling[name]}`).join(", ");
}
