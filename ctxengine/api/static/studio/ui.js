// Small pieces of UI the other modules share: a modal dialog, a toast, formatting.

export function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined && c !== false) e.append(c);
  return e;
}

const dialog = () => document.getElementById("dialog");

// A modal asking for one value (or only a yes, without `value`); resolves to the
// value, true, or null when cancelled.
export function ask({ title, message = "", value, confirm = "OK", danger = false }) {
  const d = dialog();
  const form = d.querySelector("form");
  d.querySelector(".dialog-title").textContent = title;
  d.querySelector(".dialog-message").textContent = message;
  const input = d.querySelector("input");
  input.hidden = value === undefined;
  input.required = value !== undefined;
  input.value = value ?? "";
  const ok = d.querySelector("button[value=ok]");
  ok.textContent = confirm;
  ok.classList.toggle("danger", danger);
  return new Promise((resolve) => {
    const done = () => {
      d.removeEventListener("close", done);
      if (d.returnValue !== "ok") return resolve(null);
      resolve(value === undefined ? true : input.value.trim() || null);
    };
    d.addEventListener("close", done);
    form.onsubmit = (e) => { e.preventDefault(); d.close("ok"); };
    d.querySelector("button[value=cancel]").onclick = () => d.close("cancel");
    d.returnValue = "";
    d.showModal();
    if (!input.hidden) { input.focus(); input.select(); }
  });
}

let toastTimer = null;
export function toast(message, kind = "info") {
  const t = document.getElementById("toast");
  t.textContent = message;
  t.className = `toast show ${kind}`;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.className = "toast"; }, kind === "error" ? 6000 : 3000);
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

export function ago(seconds) {
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(seconds * 1000).toLocaleDateString();
}

// A name like `base` that is not in `taken`: base, base-2, base-3, ...
export function freeName(base, taken) {
  if (!taken.has(base)) return base;
  for (let i = 2; ; i++) if (!taken.has(`${base}-${i}`)) return `${base}-${i}`;
}
