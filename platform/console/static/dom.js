// Building the page: every string goes in as a text node (never parsed as HTML), whatever a tenant wrote.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(el, props, children) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "style") throw new Error("inline styles are refused by the console's CSP: use a class");
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** An HTML element: h("td", {class: "mono"}, "text", otherNode). */
export function h(tag, props = {}, ...children) {
  return build(document.createElement(tag), props, children);
}

/** An SVG element (same rules as h). */
export function s(tag, props = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), props, children);
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return build(el, {}, children);
}

/** A table from column headers and rows of cells (strings or nodes). */
export function table(headers, rows, props = {}) {
  return h(
    "table",
    props,
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.map((cells) => (cells instanceof Node ? cells : h("tr", {}, cells.map((c) => h("td", {}, c)))))),
  );
}

export function when(seconds) {
  if (seconds === null || seconds === undefined) return "";
  return new Date(seconds * 1000).toLocaleString();
}

export function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
