// The context tree: per model, the prefix tree /v1/studio/tree returns, drawn as
// an SVG graph. A branch point is a dot with the tokens (and KV pages) its
// branches share; a context is a filled dot, a snapshot ref a hollow square.

const ROW = 30;      // px per row
const INDENT = 18;   // px per level
const PAD = 14;
const MAX_INDENT = 8; // levels indented; deeper rows stay there and show their depth as a number
const NS = "http://www.w3.org/2000/svg";

function el(name, attrs = {}, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Rows in drawing order: {type: "branch"|"item", depth, node, parent}. The items of a
// node (a context and the snapshots taken of it as it is now) share one row, as
// the refs of one commit do in git.
function layout(node, depth, parentRow, rows) {
  let head = parentRow;
  if (node.items.length) {
    head = { type: "item", depth, node, parent: parentRow };
    rows.push(head);
  } else if (node.children.length > 1 || depth === 0) {
    head = { type: "branch", depth, node, parent: parentRow };
    rows.push(head);
  }
  const childDepth = head === parentRow ? depth : depth + 1;
  for (const c of node.children) layout(c, childDepth, head, rows);
}

function itemKey(item) {
  return item.kind === "context" ? `context:${item.name}` : `snapshot:${item.ref}`;
}

// Redraws keep the list where the reader scrolled it (a click or a poll redraws).
export function renderTree(container, forest, { selected, onOpen, leftOut = 0 }) {
  const scrolled = [];
  for (let e = container; e; e = e.parentElement) if (e.scrollTop) scrolled.push([e, e.scrollTop]);
  container.replaceChildren();
  drawForest(container, forest, selected, onOpen);
  if (leftOut > 0) {
    const more = document.createElement("p");
    more.className = "empty more";
    more.textContent = `${leftOut} more snapshot ref${leftOut === 1 ? "" : "s"} not shown`;
    container.append(more);
  }
  for (const [e, top] of scrolled) e.scrollTop = top;
}

function drawForest(container, forest, selected, onOpen) {
  if (!forest.length || forest.every((g) => !g.n_items)) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.textContent = "No contexts yet. Send a message to start one.";
    container.append(empty);
    return;
  }
  for (const group of forest) {
    if (!group.n_items) continue;
    const head = document.createElement("div");
    head.className = "tree-model";
    head.innerHTML = `<strong></strong><span class="mono"></span>`;
    head.querySelector("strong").textContent = group.model + (group.served ? "" : " (not served)");
    head.querySelector("span").textContent = group.weight_id.slice(0, 10);
    container.append(head);

    const rows = [];
    const root = group.root;
    if (root.items.length) layout(root, 0, null, rows);
    else for (const c of root.children) layout(c, 0, null, rows);

    const width = container.clientWidth || 320;
    const svg = el("svg", { class: "tree-svg", width: "100%", height: rows.length * ROW + 8,
      viewBox: `0 0 ${width} ${rows.length * ROW + 8}`, role: "tree" });
    const edges = el("g", { class: "edges" });
    svg.append(edges);
    rows.forEach((row, i) => {
      row.x = PAD + Math.min(row.depth, MAX_INDENT) * INDENT;
      row.y = i * ROW + ROW / 2 + 4;
    });
    for (const row of rows) {
      if (!row.parent) continue;
      const p = row.parent;
      const d = row.x === p.x ? `M${p.x},${p.y} L${row.x},${row.y}`
        : `M${p.x},${p.y} L${p.x},${row.y - 8} Q${p.x},${row.y} ${p.x + 8},${row.y} L${row.x},${row.y}`;
      edges.append(el("path", { d, class: "edge" }));
    }
    container.append(svg);  // in the document first: labels are measured to place the next one
    for (const row of rows) drawRow(svg, row, width, selected, onOpen);
  }
}

function drawRow(svg, row, width, selected, onOpen) {
  const g = el("g", { class: `row ${row.type}`, transform: `translate(0,${row.y})` });
  svg.append(g);
  const { node } = row;
  if (row.type === "branch") {
    g.setAttribute("data-children", node.children.length);
    g.append(el("circle", { cx: row.x, cy: 0, r: 4, class: "dot branch-dot" }));
    const n = node.shared_pages;
    const pages = n ? ` · ${n} KV page${n === 1 ? "" : "s"}` : "";
    g.append(el("text", { x: row.x + 12, y: 4, class: "meta" },
      `${node.children.length} branches · ${node.n_tokens} tok${pages} shared`));
    g.append(el("title", {}, `${node.children.length} branches share their first ${node.n_tokens} tokens` +
      (n ? ` and ${n} KV pages in memory (copy-on-write)` : "")));
    return;
  }
  // Contexts first: the row's dot and main label are the first item's.
  const items = [...node.items].sort((a, b) => (a.kind === "context" ? 0 : 1) - (b.kind === "context" ? 0 : 1));
  const first = items[0];
  const hit = el("rect", { x: row.x - 10, y: -12, width: Math.max(0, width - row.x + 4), height: 24, rx: 6,
    class: "hit" });
  hit.addEventListener("click", () => onOpen(first));
  g.append(hit);
  if (items.some((i) => itemKey(i) === selected)) g.classList.add("selected");
  if (first.kind === "context") {
    g.append(el("circle", { cx: row.x, cy: 0, r: 5, class: `dot ctx-dot${first.busy ? " busy" : ""}` }));
  } else {
    g.append(el("rect", { x: row.x - 4.5, y: -4.5, width: 9, height: 9, rx: 2, class: "dot snap-dot" }));
  }
  const meta = items.some((i) => i.error) ? "unreadable" : `${first.n_tokens} tok`;
  const metaText = el("text", { x: width - 8, y: 4, class: "meta", "text-anchor": "end" }, meta);
  g.append(metaText);
  const right = width - 14 - metaText.getComputedTextLength();
  let x = row.x + 12;
  if (row.depth > MAX_INDENT) {  // not indented further: say how deep it is
    const level = el("text", { x, y: 4, class: "meta depth" }, `${row.depth}`);
    level.append(el("title", {}, `${row.depth} levels deep`));
    g.append(level);
    x += level.getComputedTextLength() + 6;
  }
  for (const [k, item] of items.entries()) {
    const entry = entryOf(item, x, item === first, selected, onOpen);
    g.append(entry);
    fit(entry, item === first);
    const end = x + entry.getBBox().width;
    if (item !== first && end > width - 8) {  // no room: the rest are one "+N" chip
      entry.remove();
      const more = moreChip(items.slice(k), x, onOpen);
      g.append(more);  // measured once in the document
      more.querySelector(".chip-box").setAttribute("width", more.querySelector("text").getComputedTextLength() + 12);
      x = width;
      break;
    }
    x = end + 6;
  }
  if (x - 6 > right) metaText.remove();  // long names win over the token count (it is in the tooltip)
}

// The chips a row has no room for, as one: its tooltip names them, a click opens the first.
function moreChip(rest, x, onOpen) {
  const e = el("g", { class: "entry chip more", tabindex: "0", role: "treeitem" });
  e.append(el("rect", { x, y: -9, width: 10, height: 18, rx: 4, class: "chip-box" }));
  e.append(el("text", { x: x + 6, y: 4, class: "chip-label" }, `+${rest.length}`));
  e.append(el("title", {}, rest.map((i) => (i.kind === "context" ? i.name : i.ref)).join("\n")));
  const open = (ev) => { ev.stopPropagation(); onOpen(rest[0]); };
  e.addEventListener("click", open);
  e.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); open(ev); }
  });
  return e;
}

// One clickable entry of a row: the main label, or a chip for a snapshot ref beside it.
function entryOf(item, x, main, selected, onOpen) {
  const key = itemKey(item);
  const e = el("g", { class: `entry ${main ? "main" : "chip"}`, "data-key": key, "data-kind": item.kind,
    tabindex: "0", role: "treeitem" });
  if (key === selected) e.classList.add("selected");
  const label = item.kind === "context" ? item.name : item.ref;
  if (main) {
    e.append(el("text", { x, y: 4, class: "label" }, label));
  } else {
    e.append(el("rect", { x, y: -9, width: 10, height: 18, rx: 4, class: "chip-box" }));
    e.append(el("rect", { x: x + 5, y: -3, width: 6, height: 6, rx: 1, class: "chip-icon" }));
    e.append(el("text", { x: x + 15, y: 4, class: "chip-label" }, label));
  }
  const title = item.kind === "context"
    ? `context ${item.name}: ${item.n_tokens} tokens, ${item.n_pages} KV pages`
    : `snapshot ref ${item.ref} (${item.snapshot_id?.slice(0, 12)}): ${item.n_tokens} tokens, ` +
      `${item.n_pages ?? 0} pages` + (item.error ? `: ${item.error}` : "");
  e.append(el("title", {}, title));
  const open = (ev) => { ev.stopPropagation(); onOpen(item); };
  e.addEventListener("click", open);
  e.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); open(ev); } });
  return e;
}

// A chip's box sized to its text (which can be measured once it is in the document).
function fit(e, main) {
  if (main) return;
  e.querySelector(".chip-box").setAttribute("width", e.querySelector("text").getComputedTextLength() + 21);
}
