// The context tree: per model, the prefix tree /v1/studio/tree returns, drawn as
// an SVG graph. A branch point is a dot with the tokens (and KV pages) its
// branches share; a context is a filled dot, a snapshot ref a hollow square.

const ROW = 30;      // px per row
const INDENT = 18;   // px per level
const PAD = 14;
const NS = "http://www.w3.org/2000/svg";

function el(name, attrs = {}, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Rows in drawing order: {type: "branch"|"item", depth, node, item, parent}
function layout(node, depth, parentRow, rows) {
  let head = parentRow;
  if (node.items.length) {
    node.items.forEach((item, i) => {
      const row = { type: "item", depth, node, item, parent: i === 0 ? parentRow : head };
      rows.push(row);
      if (i === 0) head = row;
    });
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

export function renderTree(container, forest, { selected, onOpen }) {
  container.replaceChildren();
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
      row.x = PAD + row.depth * INDENT;
      row.y = i * ROW + ROW / 2 + 4;
    });
    for (const row of rows) {
      if (!row.parent) continue;
      const p = row.parent;
      const d = row.x === p.x ? `M${p.x},${p.y} L${row.x},${row.y}`
        : `M${p.x},${p.y} L${p.x},${row.y - 8} Q${p.x},${row.y} ${p.x + 8},${row.y} L${row.x},${row.y}`;
      edges.append(el("path", { d, class: "edge" }));
    }
    for (const row of rows) svg.append(drawRow(row, width, selected, onOpen));
    container.append(svg);
  }
}

function drawRow(row, width, selected, onOpen) {
  const g = el("g", { class: `row ${row.type}`, transform: `translate(0,${row.y})` });
  const { node } = row;
  if (row.type === "branch") {
    g.setAttribute("data-children", node.children.length);
    g.append(el("circle", { cx: row.x, cy: 0, r: 4, class: "dot branch-dot" }));
    const n = node.shared_pages;
    const pages = n ? ` · ${n} KV page${n === 1 ? "" : "s"} shared` : "";
    g.append(el("text", { x: row.x + 12, y: 4, class: "meta" },
      `${node.children.length} branches · ${node.n_tokens} tokens shared${pages}`));
    return g;
  }
  const item = row.item;
  const key = itemKey(item);
  g.setAttribute("data-kind", item.kind);
  g.setAttribute("data-key", key);
  g.setAttribute("tabindex", "0");
  g.setAttribute("role", "treeitem");
  if (key === selected) g.classList.add("selected");
  g.append(el("rect", { x: row.x - 8, y: -12, width: width - row.x + 2, height: 24, rx: 6, class: "hit" }));
  if (item.kind === "context") {
    g.append(el("circle", { cx: row.x, cy: 0, r: 5, class: `dot ctx-dot${item.busy ? " busy" : ""}` }));
  } else {
    g.append(el("rect", { x: row.x - 4.5, y: -4.5, width: 9, height: 9, rx: 2, class: "dot snap-dot" }));
  }
  const label = item.kind === "context" ? item.name : item.ref;
  g.append(el("text", { x: row.x + 12, y: 4, class: "label" }, label));
  let meta = `${item.n_tokens} tok`;
  if (node.children.length && item === node.items[0]) {
    meta += node.shared_pages ? ` · ${node.shared_pages} pg shared` : " · shared";
  }
  if (item.error) meta = "unreadable";
  g.append(el("text", { x: width - 8, y: 4, class: "meta", "text-anchor": "end" }, meta));
  const title = item.kind === "context"
    ? `context ${item.name}: ${item.n_tokens} tokens, ${item.n_pages} KV pages` +
      (node.shared_pages ? `, ${node.shared_pages} pages shared with its branches` : "")
    : `snapshot ${item.ref} (${item.snapshot_id?.slice(0, 12)}): ${item.n_tokens} tokens, ${item.n_pages} pages` +
      (item.error ? `: ${item.error}` : "");
  g.append(el("title", {}, title));
  const open = () => onOpen(item);
  g.addEventListener("click", open);
  g.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } });
  return g;
}
