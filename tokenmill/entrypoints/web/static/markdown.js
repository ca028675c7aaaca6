// A small markdown renderer for model answers: markdown text in, an HTML string out.
//
// Safety rule: the whole input is HTML-escaped first (& < > " '), and every rule after that works on
// escaped text and adds only its own tags, from this list: p br strong em del code pre h1-h6 ul ol li
// blockquote hr table thead tbody tr th td a. The only attributes are class="language-<[\w+#.-]>" on code,
// start="<digits>" on ol, align="left|center|right" on cells, and on links href (http, https, mailto or a
// relative path; anything else, javascript: included, stays text) with target and rel. So model text can
// never become markup of its own, and an answer still streaming renders (an unclosed fence is a code block).
//
// Blocks: ``` or ~~~ fences, # headings, > quotes, - * + and 1. lists (nested by indentation), pipe tables,
// --- rules, paragraphs (a single newline is a line break). Inline: `code`, **bold**, *em*, _em_, ~~del~~,
// [text](url).
(function (root) {
  "use strict";

  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const PLACEHOLDER = "\u0000";  // marks a code span pulled out of a line; removed from the input first

  function escapeHtml(text) {
    return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
  }

  // -- inline rules, on one escaped line or paragraph --------------------------------------------------
  const SAFE_URL = /^(https?:\/\/|mailto:|\.{0,2}\/|#)/i;
  const STASHED = new RegExp(PLACEHOLDER + "(\\d+)" + PLACEHOLDER, "g");

  function renderEmphasis(s) {
    s = s.replace(/\*\*(?=\S)([^*]*?\S)\*\*/g, "<strong>$1</strong>");
    s = s.replace(/(^|[^\w])__(?=\S)([^_]*?\S)__(?!\w)/g, "$1<strong>$2</strong>");
    s = s.replace(/(^|[^*\w])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?![*\w])/g, "$1<em>$2</em>");
    s = s.replace(/(^|[^\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>");
    return s.replace(/~~(?=\S)([^~]*?\S)~~/g, "<del>$1</del>");
  }

  function renderInline(escaped) {
    // code spans and links are set aside first, so no other rule reaches into them (or into an href)
    const stash = [];
    const put = (html) => PLACEHOLDER + (stash.push(html) - 1) + PLACEHOLDER;
    let s = escaped.replace(/`([^`\n]+)`/g, (_, code) => put(`<code>${code}</code>`));
    s = s.replace(/\[([^\]\n]+)\]\(([^()\s\u0000]+)\)/g, (whole, label, url) => SAFE_URL.test(url)
      ? put(`<a href="${url}" target="_blank" rel="noopener noreferrer">${renderEmphasis(label)}</a>`) : whole);
    return renderEmphasis(s).replace(STASHED, (_, i) => stash[+i]);
  }

  // -- block rules, on escaped lines -------------------------------------------------------------------
  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}&gt;\s?(.*)$/;
  const ITEM = /^( *)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_DIVIDER = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  function indentOf(line) {
    return line.length - line.trimStart().length;
  }

  function isBlockStart(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
  }

  function isTableStart(lines, i) {
    return lines[i].includes("|") && i + 1 < lines.length && lines[i + 1].includes("-") && TABLE_DIVIDER.test(lines[i + 1]);
  }

  function splitRow(line) {
    let s = line.trim();
    if (s.startsWith("|")) s = s.slice(1);
    if (s.endsWith("|")) s = s.slice(0, -1);
    return s.split("|").map((cell) => cell.trim());
  }

  function renderTable(lines, i, out) {
    const head = splitRow(lines[i]);
    const aligns = splitRow(lines[i + 1]).map((d) =>
      d.startsWith(":") && d.endsWith(":") ? "center" : d.endsWith(":") ? "right" : d.startsWith(":") ? "left" : "");
    const cell = (tag, text, k) => `<${tag}${aligns[k] ? ` align="${aligns[k]}"` : ""}>${renderInline(text)}</${tag}>`;
    out.push("<table><thead><tr>" + head.map((h, k) => cell("th", h, k)).join("") + "</tr></thead><tbody>");
    i += 2;
    for (; i < lines.length && lines[i].includes("|") && lines[i].trim(); i++) {
      const row = splitRow(lines[i]);
      out.push("<tr>" + head.map((_, k) => cell("td", row[k] || "", k)).join("") + "</tr>");
    }
    out.push("</tbody></table>");
    return i;
  }

  function renderList(lines, i, out) {
    const first = ITEM.exec(lines[i]);
    const base = first[1].length;
    const isOrdered = /\d/.test(first[2]);
    const start = isOrdered ? parseInt(first[2], 10) : 1;
    out.push(isOrdered ? (start !== 1 ? `<ol start="${start}">` : "<ol>") : "<ul>");
    while (i < lines.length) {
      const m = ITEM.exec(lines[i]);
      if (!m || m[1].length !== base || /\d/.test(m[2]) !== isOrdered) break;
      const body = [m[3]];
      i++;
      // the item's own lines: deeper-indented ones (nested lists, continued text) and lazy continuations
      while (i < lines.length) {
        const line = lines[i];
        if (!line.trim()) {
          if (i + 1 < lines.length && indentOf(lines[i + 1]) > base && lines[i + 1].trim()) {
            body.push("");
            i++;
            continue;
          }
          break;
        }
        if (indentOf(line) > base) body.push(line.slice(Math.min(indentOf(line), base + 2)));
        else if (!isBlockStart(line)) body.push(line);
        else break;
        i++;
      }
      let inner = renderBlocks(body);
      if (inner.startsWith("<p>") && inner.indexOf("<p>", 3) === -1) inner = inner.replace(/^<p>([\s\S]*?)<\/p>/, "$1");
      out.push(`<li>${inner}</li>`);
      // blank lines between items of one list (a "loose" list) keep the list going
      let next = i;
      while (next < lines.length && !lines[next].trim()) next++;
      const following = next < lines.length ? ITEM.exec(lines[next]) : null;
      if (next > i && !(following && following[1].length === base && /\d/.test(following[2]) === isOrdered)) break;
      i = next;
    }
    out.push(isOrdered ? "</ol>" : "</ul>");
    return i;
  }

  function renderBlocks(lines) {
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (!line.trim()) {
        i++;
      } else if ((m = FENCE.exec(line))) {
        const closing = new RegExp(`^ {0,3}${m[1][0] === "`" ? "`" : "~"}{${m[1].length},}\\s*$`);
        const body = [];
        for (i++; i < lines.length && !closing.test(lines[i]); i++) body.push(lines[i]);
        i++;  // the closing fence (or the end of an answer still streaming)
        const cls = m[2] ? ` class="language-${m[2]}"` : "";
        out.push(`<pre><code${cls}>${body.join("\n")}</code></pre>`);
      } else if ((m = HEADING.exec(line))) {
        const level = m[1].length;
        out.push(`<h${level}>${renderInline(m[2])}</h${level}>`);
        i++;
      } else if (RULE.test(line)) {
        out.push("<hr>");
        i++;
      } else if (QUOTE.test(line)) {
        const body = [];
        for (; i < lines.length && (m = QUOTE.exec(lines[i])); i++) body.push(m[1]);
        out.push(`<blockquote>${renderBlocks(body)}</blockquote>`);
      } else if (ITEM.test(line)) {
        i = renderList(lines, i, out);
      } else if (isTableStart(lines, i)) {
        i = renderTable(lines, i, out);
      } else {
        const para = [];
        for (; i < lines.length && lines[i].trim() && (para.length === 0 || !isBlockStart(lines[i]))
               && !isTableStart(lines, i); i++) {
          para.push(lines[i].trim());
        }
        out.push(`<p>${para.map(renderInline).join("<br>")}</p>`);
      }
    }
    return out.join("");
  }

  /** Markdown text -> an HTML string that contains only the renderer's own tags (see the top). */
  function renderMarkdown(text) {
    const escaped = escapeHtml(String(text).split(PLACEHOLDER).join("\uFFFD"));
    return renderBlocks(escaped.replace(/\r\n?/g, "\n").split("\n"));
  }

  const api = { renderMarkdown, escapeHtml };
  if (typeof module !== "undefined" && module.exports) module.exports = api;  // node, for the tests
  else root.TokenmillMarkdown = api;
})(typeof globalThis !== "undefined" ? globalThis : this);
